"""The object-store error tree (Babel's, and PCache's under-store errors); S3 error codes are
mapped to it by one table, :data:`ERRORS_BY_CODE`, for both S3 clients
(:mod:`objstore.s3`, :mod:`objstore.s3fast`)."""

from __future__ import annotations

import errno as _errno


class StoreError(OSError):
    """Base of every object-store error; ``retryable`` decides retries, never message text.

    ``request_id`` is the object store's id of the failed request (S3 ``x-amz-request-id``,
    OSS ``x-oss-request-id``) when there was one: what the store's operators ask for.
    """

    errno_code = _errno.EIO
    retryable = False

    def __init__(self, message: str = "", *, uri: str | None = None, request_id: str = "") -> None:
        super().__init__(self.errno_code, message)
        self.message = message
        self.uri = uri
        self.request_id = request_id

    def __str__(self) -> str:
        text = f"{self.message}: {self.uri}" if self.uri else self.message
        return f"{text} (request id {self.request_id})" if self.request_id else text


class BadURI(StoreError, ValueError):
    """A store URI that cannot be parsed, or a scheme with no backend."""

    errno_code = _errno.EINVAL


class NoSuchBucket(StoreError, FileNotFoundError):
    """The bucket (or root directory) does not exist."""

    errno_code = _errno.ENOENT


class NoSuchKey(StoreError, FileNotFoundError):
    """The object does not exist."""

    errno_code = _errno.ENOENT


class NoSuchUpload(StoreError, FileNotFoundError):
    """The multipart upload does not exist (completed, aborted or expired)."""

    errno_code = _errno.ENOENT


class PreconditionFailed(StoreError):
    """A conditional request's condition failed: the object is no longer the version asked for."""

    errno_code = _errno.ESTALE


class AccessDenied(StoreError, PermissionError):
    """Wrong credentials or no permission."""

    errno_code = _errno.EACCES


class Throttled(StoreError):
    """503 SlowDown / throttling: back off and retry."""

    errno_code = _errno.EAGAIN
    retryable = True


class TransientError(StoreError, ConnectionError):
    """A connection reset, timeout or 5xx: retry."""

    retryable = True


class Corrupt(TransientError):
    """The bytes a store sent did not match the checksum it keeps for them (botocore's
    ``FlexibleChecksumError`` on a whole GET): retried, as a transfer can damage them; one that
    stays is damage at rest (``babel verify`` reports it as the content check's failure)."""

    errno_code = _errno.EIO


#: S3 error codes (and HTTP statuses) to the error each stands for (:mod:`objstore.s3`)
ERRORS_BY_CODE: dict[str, type[StoreError]] = {
    "NoSuchBucket": NoSuchBucket,
    "NoSuchKey": NoSuchKey,
    "NoSuchUpload": NoSuchUpload,
    "404": NoSuchKey,
    "NotFound": NoSuchKey,
    "AccessDenied": AccessDenied,
    "403": AccessDenied,
    "InvalidAccessKeyId": AccessDenied,
    "SignatureDoesNotMatch": AccessDenied,
    "PreconditionFailed": PreconditionFailed,
    "412": PreconditionFailed,
    "SlowDown": Throttled,
    "Throttling": Throttled,
    "ThrottlingException": Throttled,
    "RequestLimitExceeded": Throttled,
    "TooManyRequests": Throttled,  # S3-compatible stores and gateways that throttle with 429
    "TooManyRequestsException": Throttled,
    "429": Throttled,
    "503": Throttled,
    "RequestTimeout": TransientError,  # S3's 400 for a connection idle too long: send again
    "InternalError": TransientError,
    "500": TransientError,
}
