"""The daemon's request errors and their HTTP statuses (one table, used both ways)."""

from __future__ import annotations

import errno

from babel.errors import BabelError


class FieldError(BabelError):
    """An error about one field of a request, named by ``field``."""

    def __init__(self, message: str = "", *, field: str = "", uri: str | None = None) -> None:
        super().__init__(message, uri=uri)
        self.field = field


class RequestRejected(FieldError, ValueError):
    """A malformed request (HTTP 400): a bad URI, an unknown option, a wrong type; ``field`` names it."""

    errno_code = errno.EINVAL


class NotFound(BabelError, FileNotFoundError):
    """No job or schedule with that id (HTTP 404)."""

    errno_code = errno.ENOENT


class Conflict(BabelError):
    """The job is queued or running already, here or in another live process (HTTP 409)."""

    errno_code = errno.EBUSY


class Unauthorized(BabelError, PermissionError):
    """No bearer token, or not the daemon's (HTTP 401)."""

    errno_code = errno.EACCES


class Forbidden(FieldError, PermissionError):
    """A URI outside the allowed prefixes, or a Host header that does not name the daemon (HTTP
    403); ``field`` names the field."""

    errno_code = errno.EACCES


class UnsupportedMediaType(BabelError, ValueError):
    """A body that is not ``application/json`` (HTTP 415)."""

    errno_code = errno.EINVAL


# the one table between the error tree and HTTP, both ways (the client maps ``type`` back)
HTTP_STATUS: dict[type[BabelError], int] = {
    RequestRejected: 400, Unauthorized: 401, Forbidden: 403, NotFound: 404, Conflict: 409, UnsupportedMediaType: 415,
}  # fmt: skip
BY_NAME: dict[str, type[BabelError]] = {cls.__name__: cls for cls in HTTP_STATUS}
