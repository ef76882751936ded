"""The one error tree of PCache.

Every error PCache raises is a :class:`PCacheError`. Each subclass also
inherits the matching built-in exception (``FileNotFoundError``,
``ConnectionError``, ``TimeoutError`` ...) and carries its ``errno``, so callers
that know nothing of PCache still catch the right thing and the FUSE layer maps
an error to ``FuseOSError(err.errno)`` without a table of its own.

Errors cross process boundaries by class name (:data:`ERRORS_BY_NAME`): the
gRPC boundary in :mod:`pcache.common.rpc` and the data-plane frames in
:mod:`pcache.common.framing` both use it. Whether an operation is retried is
decided by :attr:`PCacheError.retryable`, never by message text.
"""

from __future__ import annotations

import errno as _errno


class PCacheError(OSError):
    """Base of every PCache error; an ``OSError`` with an errno."""

    errno_code: int = _errno.EIO
    retryable: bool = False

    epoch: int = 0  # the epoch a master stamped on the failed answer (0: none)
    leader: str = ""  # the leader a NotLeader answer named ("" when unknown)
    setup_refused: bool = False  # the connection was refused as it was set up (a TLS mismatch): no retry mends it

    def __init__(self, message: str = "", *, path: str | None = None) -> None:
        super().__init__(self.errno_code, message)
        self.message = message
        if path is not None:
            self.filename = path

    def __str__(self) -> str:
        if self.filename is not None:
            return f"{self.message}: {self.filename}"
        return self.message

    def __reduce__(self):  # keep pickling (multiprocessing) working
        return (_rebuild, (type(self).__name__, self.message, self.filename))


def _rebuild(name: str, message: str, path: str | None) -> PCacheError:
    return from_name(name, message, path=path)


class NotFound(PCacheError, FileNotFoundError):
    """The path, inode or block does not exist."""

    errno_code = _errno.ENOENT


class AlreadyExists(PCacheError, FileExistsError):
    """The path exists and the operation needed it not to."""

    errno_code = _errno.EEXIST


class NotADirectory(PCacheError, NotADirectoryError):
    """A path component, or the target, is not a directory."""

    errno_code = _errno.ENOTDIR


class IsADirectory(PCacheError, IsADirectoryError):
    """A file operation was given a directory."""

    errno_code = _errno.EISDIR


class DirectoryNotEmpty(PCacheError):
    """rmdir or a replacing rename hit a non-empty directory."""

    errno_code = _errno.ENOTEMPTY


class InvalidArgument(PCacheError, ValueError):
    """A request argument is malformed."""

    errno_code = _errno.EINVAL


class InvalidPath(InvalidArgument):
    """A path is not absolute, has ``..``, NUL, or an empty component."""


class InvalidEncoding(InvalidPath):
    """A name is not valid UTF-8 (PCache stores and sends names as UTF-8 strings)."""

    errno_code = _errno.EILSEQ


class NameTooLong(InvalidPath):
    """A path component is longer than 255 bytes, or the path than 4096."""

    errno_code = _errno.ENAMETOOLONG


class SymlinkLoop(InvalidPath):
    """Too many symbolic links were followed resolving a path."""

    errno_code = _errno.ELOOP


class Conflict(PCacheError):
    """The file changed under a writer (another writer committed first); nothing was committed."""

    errno_code = _errno.ESTALE


class StaleHandle(PCacheError):
    """A handle's view names data that a later commit removed (the file shrank under a reader)."""

    errno_code = _errno.ESTALE


class ReadOnly(PCacheError):
    """A change under a path bound read-only to an under-store (``pcache bind --mode ro``)."""

    errno_code = _errno.EROFS


class Busy(PCacheError):
    """A bind point, or a directory above one, cannot be renamed or deleted (``pcache unbind``)."""

    errno_code = _errno.EBUSY


class NoSpace(PCacheError):
    """No worker (or not this one) has room for the block."""

    errno_code = _errno.ENOSPC


class QuotaExceeded(PCacheError):
    """The tenant's byte or inode quota would be passed (``pcache tenant quota``); nothing written
    before is lost."""

    errno_code = _errno.EDQUOT


class CrossTenant(PCacheError):
    """A rename between two tenants' trees (an admin's; as rename(2) across file systems)."""

    errno_code = _errno.EXDEV


class FileTooLarge(PCacheError):
    """A size or offset beyond the largest file PCache stores."""

    errno_code = _errno.EFBIG


class TooLarge(InvalidArgument):
    """A value past a fixed size limit (an extended attribute's, as setxattr(2)'s E2BIG)."""

    errno_code = _errno.E2BIG


class PermissionDenied(PCacheError, PermissionError):
    """The tenant token or block token does not allow the operation."""

    errno_code = _errno.EACCES


class NotPermitted(PCacheError, PermissionError):
    """The operation is never allowed on this kind of object (a hard link to a directory: EPERM)."""

    errno_code = _errno.EPERM


class NotSupported(PCacheError):
    """The operation is not supported here."""

    errno_code = _errno.EOPNOTSUPP


class Unavailable(PCacheError, ConnectionError):
    """A master or worker cannot be reached (refused, reset, gone)."""

    errno_code = _errno.EIO
    retryable = True


class NotLeader(Unavailable):
    """This master is not the leader (a follower, or a leader whose lease ran out): ask another.

    The message names the leader when the master knows it (``leader HOST:PORT``).
    """


class Timeout(PCacheError, TimeoutError):
    """A remote call did not finish within its deadline."""

    errno_code = _errno.ETIMEDOUT
    retryable = True


class StoreUnavailable(Unavailable):
    """The under-store (object storage) behind a bound path refused or failed a request: the
    master or worker that says so is up (a client does not fail over to another master)."""


class StoreTimeout(Timeout):
    """The under-store behind a bound path did not answer in time (the master or worker that
    says so is up: a client does not fail over to another master)."""


class CorruptBlock(PCacheError):
    """A block replica failed its CRC32C check."""

    errno_code = _errno.EIO
    retryable = True


class StaleEpoch(PCacheError):
    """The peer's epoch is older than one already seen (fenced leader)."""

    errno_code = _errno.ESTALE
    retryable = True


class ProtocolError(PCacheError):
    """A data-plane frame was malformed."""

    errno_code = _errno.EPROTO


ERRORS_BY_NAME: dict[str, type[PCacheError]] = {
    cls.__name__: cls
    for cls in (
        PCacheError,
        NotFound,
        AlreadyExists,
        NotADirectory,
        IsADirectory,
        DirectoryNotEmpty,
        InvalidArgument,
        InvalidPath,
        InvalidEncoding,
        NameTooLong,
        SymlinkLoop,
        Conflict,
        StaleHandle,
        ReadOnly,
        Busy,
        NoSpace,
        QuotaExceeded,
        CrossTenant,
        FileTooLarge,
        TooLarge,
        PermissionDenied,
        NotPermitted,
        NotSupported,
        Unavailable,
        NotLeader,
        Timeout,
        StoreUnavailable,
        StoreTimeout,
        CorruptBlock,
        StaleEpoch,
        ProtocolError,
    )
}


def from_name(name: str, message: str, *, path: str | None = None) -> PCacheError:
    """Rebuild an error sent by name; unknown names become ``PCacheError``."""
    return ERRORS_BY_NAME.get(name, PCacheError)(message, path=path)
