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
* **URI prefixes.** A job or schedule may only name URIs under the configured prefixes
  (``allow``). The default allows the object stores (``s3://``, ``oss://``, ``pcache://``) and no
  ``file://`` path; a ``file://`` URI is compared after resolving ``..`` and symlinks, so a
  link inside an allowed directory cannot lead out of it.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import secrets
from urllib.parse import urlparse

from babel.daemon.errors import Forbidden, RequestRejected

TOKEN_ENV = "BABEL_DAEMON_TOKEN"
TOKEN_FILE = "daemon.token"
DEFAULT_ALLOW = ("s3://", "oss://", "pcache://")


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
            if os.stat(path).st_mode & 0o077:
                os.chmod(path, 0o600)
            with open(path) as f:
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
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


def host_allowed(host_header: str, port: int, allowed_hosts: tuple[str, ...]) -> bool:
    """Whether a ``Host`` header names this daemon: an IP literal or ``localhost`` or an allowed
    name, with the daemon's ``port`` (default 80 when the header has none)."""
    if not host_header:
        return False
    try:
        parsed = urlparse("//" + host_header)
        name, given_port = (parsed.hostname or "").lower(), parsed.port or 80
    except ValueError:  # a port that is not a number
        return False
    if given_port != port or not name:
        return False
    if name == "localhost" or name in {h.lower() for h in allowed_hosts}:
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


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
