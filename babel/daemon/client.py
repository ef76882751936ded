"""The daemon's client: what ``babel sync --daemon`` and ``babel jobs --daemon`` call (synchronous, as the CLI is)."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import asdict
from typing import Any

from babel.daemon.config import split_addr
from babel.daemon.errors import BY_NAME, Forbidden, RequestRejected
from babel.daemon.security import client_token
from babel.errors import BabelError, TransientError
from babel.journal import default_state_dir
from babel.options import SyncOptions

CLIENT_TIMEOUT = 10.0  # seconds per client call


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """The daemon never redirects: a redirect would carry the bearer token to another host."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # type: ignore[no-untyped-def]
        return None


# no proxies: the daemon is on loopback or in the cluster, where http_proxy would only get in the way
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())


def _call(
    addr: str, method: str, path: str, body: Any = None, *, token: str | None, timeout: float = CLIENT_TIMEOUT
) -> Any:
    host, port = split_addr(addr)
    host = f"[{host}]" if ":" in host else host
    data = None if body is None else json.dumps(body).encode()
    token = client_token(default_state_dir()) if token is None else token
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
    req = urllib.request.Request(f"http://{host}:{port}{path}", data=data, method=method, headers=headers)
    try:
        with _OPENER.open(req, timeout=timeout) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        try:
            doc = json.loads(exc.read())
        except (ValueError, OSError):
            doc = {}
        message = doc.get("error") or f"HTTP {exc.code}"
        cls = BY_NAME.get(doc.get("type", ""))
        if cls in (RequestRejected, Forbidden):
            raise cls(message, field=doc.get("field", "")) from exc
        if cls is not None:
            raise cls(message) from exc
        if exc.code >= 500:
            raise TransientError(f"babel daemon at {addr}: {message}") from exc
        raise BabelError(f"babel daemon at {addr}: {message}") from exc
    except (urllib.error.URLError, OSError) as exc:  # refused, unresolvable, timed out
        reason = getattr(exc, "reason", None) or exc
        raise TransientError(f"babel daemon at {addr} is not reachable ({reason})") from exc


def submit(
    addr: str,
    src: str,
    dst: str,
    options: SyncOptions | None = None,
    *,
    token: str | None = None,
    timeout: float = CLIENT_TIMEOUT,
) -> dict:
    """Queue ``babel sync SRC DST`` in the daemon at ``addr`` (HOST:PORT); ``timeout`` in seconds;
    ``token`` the daemon's bearer token (None: :func:`~babel.daemon.security.client_token` of the
    default state directory).

    Returns:
        ``{"id": JOB, "state": "queued"}``.

    Raises:
        RequestRejected: a bad URI or option (``field`` names it). Forbidden: a URI outside the
            daemon's allowed prefixes. Unauthorized: a missing or wrong token.
        TransientError: the daemon is not reachable (or did not answer within ``timeout``).
    """
    return _call(addr, "POST", "/jobs", {"src": src, "dst": dst, "options": asdict(options or SyncOptions())},
                 token=token, timeout=timeout)  # fmt: skip


def fetch_jobs(addr: str, *, token: str | None = None, timeout: float = CLIENT_TIMEOUT) -> list[dict]:
    """The job history of the daemon at ``addr``: every job.json, newest first.

    Raises:
        TransientError: the daemon is not reachable. Unauthorized: a missing or wrong token.
    """
    return _call(addr, "GET", "/jobs", token=token, timeout=timeout)


def fetch_job(addr: str, job_id: str, *, token: str | None = None, timeout: float = CLIENT_TIMEOUT) -> dict:
    """One job's job.json (state, phase, summary) from the daemon at ``addr``.

    Raises:
        NotFound: no such job.
        TransientError: the daemon is not reachable.
    """
    return _call(addr, "GET", f"/jobs/{urllib.parse.quote(job_id, safe='')}", token=token, timeout=timeout)


def cancel_job(addr: str, job_id: str, *, token: str | None = None, timeout: float = CLIENT_TIMEOUT) -> dict:
    """Ask the daemon at ``addr`` to cancel a queued or running job (it ends ``canceled``).

    Raises:
        NotFound: no such job. Conflict: not queued or running there. TransientError: unreachable.
    """
    return _call(addr, "POST", f"/jobs/{urllib.parse.quote(job_id, safe='')}/cancel", token=token, timeout=timeout)
