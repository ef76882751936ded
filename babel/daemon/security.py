"""Who may use the daemon's HTTP API, and what its jobs may touch.

* **Bearer token.** Every request but a bare ``GET /healthz`` carries
  ``Authorization: Bearer TOKEN``. The daemon takes the token from ``$BABEL_DAEMON_TOKEN`` (a
  Kubernetes Secret as an environment variable), else from its token file
  (``<state_dir>/daemon.token``), which it creates (0600, 256 random bits) on first start; the
  CLI on the same machine reads the same file. Compared in constant time.
* **Host header.** A loopback bind does not stop a web page whose name resolves to 127.0.0.1
  (DNS rebinding): the ``Host`` header must be an IP literal, ``localhost``, or a name the
  config allows (``allowed_hosts``), with the daemon's own port.
* **JSON only.** A request with a body must say ``Content-Type: application/json`` (an HTML form
  cannot, so a page in a browser on the host cannot submit a job: CSRF).
* **Endpoints.** An ``s3://``/``oss://`` URI may name ``endpoint_url`` only from the configured
  list (``allow_endpoints``), and never ``ca_bundle``: a job cannot point the daemon and its
  credentials at a host of the caller's choosing (SSRF).
* **URI prefixes.** A job or schedule may only name URIs under the configured prefixes
  (``allow``). The default allows the object stores (``s3://``, ``oss://``, ``pcache://``) and no
  ``file://`` path; a ``file://`` URI is compared after resolving ``..`` and symlinks, so a
  link inside an allowed directory cannot lead out of it.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import re
import secrets
from urllib.parse import parse_qsl

from babel.daemon.errors import Forbidden, RequestRejected

TOKEN_ENV = "BABEL_DAEMON_TOKEN"
TOKEN_FILE = "daemon.token"
DEFAULT_ALLOW = ("s3://", "oss://", "pcache://")
_HOST = re.compile(r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<name>[A-Za-z0-9.-]+))(?::(?P<port>[0-9]{1,5}))?$")


def token_path(state_dir: str) -> str:
    """Where the daemon of ``state_dir`` keeps its token."""
    return os.path.join(state_dir, TOKEN_FILE)


def server_token(state_dir: str, token_file: str = "") -> str:
    """The daemon's bearer token: ``$BABEL_DAEMON_TOKEN``, else the token file (created 0600
    when missing; one readable by others is made 0600 first).

    Raises:
        OSError: the file cannot be read or created.
        ValueError: the file or variable holds an empty token.
    """
    token = os.environ.get(TOKEN_ENV, "")
    if not token:
        path = token_file or token_path(state_dir)
        os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)  # ELOOP: a planted symlink is no token file
            if os.fstat(fd).st_mode & 0o077:
                os.fchmod(fd, 0o600)
            with os.fdopen(fd) as f:
                token = f.read().strip()
        else:
            token = secrets.token_urlsafe(32)
            with os.fdopen(fd, "w") as f:
                f.write(token + "\n")
    if not token:
        raise ValueError(f"empty daemon token (${TOKEN_ENV} or {token_file or token_path(state_dir)})")
    return token


def client_token(state_dir: str) -> str:
    """The token a client sends: ``$BABEL_DAEMON_TOKEN``, else the daemon's token file under
    ``state_dir`` ("" when neither exists: the daemon will answer 401)."""
    token = os.environ.get(TOKEN_ENV, "")
    if token:
        return token
    try:
        with open(token_path(state_dir)) as f:
            return f.read().strip()
    except OSError:
        return ""


def token_matches(header: str, token: str) -> bool:
    """Whether an ``Authorization`` header value carries ``token`` (constant-time compare)."""
    scheme, _, given = header.partition(" ")
    raw = given.strip().encode("utf-8", "replace")  # whatever a client sent: it can only fail to match
    return scheme.lower() == "bearer" and hmac.compare_digest(raw, token.encode())


def host_allowed(host_header: str, port: int, allowed_hosts: tuple[str, ...]) -> bool:
    """Whether a ``Host`` header names this daemon: an IP literal or ``localhost`` or an allowed
    name, with the daemon's ``port`` (default 80 when the header has none)."""
    match = _HOST.match(host_header or "")
    if match is None:  # userinfo, a path, a query, a zone id, a port that is not plain digits
        return False
    name = (match.group("v6") or match.group("name")).lower()
    port_text = match.group("port") or "80"
    if port_text.startswith("0") or int(port_text) != port:  # no leading zeros: one spelling per port
        return False
    if name == "localhost" or name in {h.lower() for h in allowed_hosts}:
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


JOB_QUERY_REFUSED = ("ca_bundle",)  # a path on the daemon's host: set AWS_CA_BUNDLE for the daemon instead


def check_endpoint(uri: str, field: str, endpoints: tuple[str, ...]) -> None:
    """Refuse an ``s3://``/``oss://`` URI whose ``endpoint_url`` is not one the daemon allows, or
    that names a local file (``ca_bundle``): a job must not make the daemon send its credentials
    or requests to a host of the caller's choosing (SSRF).

    Raises:
        Forbidden: ``field`` names the URI.
    """
    if not uri.startswith(("s3://", "oss://")) or "?" not in uri:
        return
    options = dict(parse_qsl(uri.split("?", 1)[1], keep_blank_values=True))
    for name in JOB_QUERY_REFUSED:
        if name in options:
            raise Forbidden(
                f"{field}: {name}= is not allowed in a daemon job (configure the daemon instead)", field=field
            )
    endpoint = options.get("endpoint_url")
    if endpoint is not None and endpoint.rstrip("/") not in {e.rstrip("/") for e in endpoints}:
        shown = ", ".join(endpoints) or "none"
        raise Forbidden(
            f"{field}: endpoint_url={endpoint} is not one this daemon allows ({shown}; see --allow-endpoint)",
            field=field,
        )


def check_allowed(uri: str, field: str, allow: tuple[str, ...]) -> None:
    """Refuse a URI outside the allowed prefixes.

    A prefix matches at a path-segment boundary (``file:///data`` allows ``file:///data/x``,
    not ``file:///database``); ``file://`` paths are compared after ``realpath``; any URI with
    a ``..`` segment is refused outright.

    Raises:
        Forbidden: outside every prefix (``field`` names it). RequestRejected: a ``..`` segment.
    """
    bare = uri.split("?", 1)[0] if not uri.startswith("file://") else uri
    scheme, sep, rest = bare.partition("://")
    if ".." in rest.split("/"):
        raise RequestRejected(f"{field}: '..' is not allowed in a job's URI", field=field)
    if scheme == "file" and sep:
        bare = "file://" + os.path.realpath("/" + rest.lstrip("/"))
    for prefix in allow:
        p = prefix
        if p.startswith("file://"):
            p = "file://" + os.path.realpath("/" + p[len("file://") :].lstrip("/"))
        if bare == p or bare.startswith(p if p.endswith(("/", "://")) else p + "/"):
            return
    shown = ", ".join(allow) or "none"
    raise Forbidden(f"{field}: {uri} is outside the prefixes this daemon allows ({shown}; see --allow)", field=field)
