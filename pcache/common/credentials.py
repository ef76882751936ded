"""Where credentials live on disk: the cluster's key file, and the tokens clients find by themselves.

* **Key file** (``master.keys_file``, default ``<data_dir>/keys.json``; 0600, created at the
  master's first start): the key ring that signs master tokens and the one that signs block
  tokens (:mod:`pcache.common.auth`). Every master of an HA pair must be given the same file.
* **Tokens file** (``~/.pcache/tokens.json``, 0600; ``$PCACHE_TOKENS_FILE`` moves it): master
  address -> token, as ``~/.docker/config.json`` keeps one credential per registry.
  ``pcache up`` (:class:`pcache.local.LocalCluster`) records its default tenant's token there
  for each master address, so the CLI, the SDK, the FUSE mount, Babel's ``pcache://`` backend
  and ``ckpt_adapter`` connect with no set-up.

A client's token is, in order: ``ClientConfig.token``, ``$PCACHE_TOKEN``, the file named by
``$PCACHE_TOKEN_FILE`` (a Kubernetes Secret mounted as a file), the tokens file entry of one of
its master addresses.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat as stat_mod
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pcache.common.auth import KeyRing
from pcache.common.errors import InvalidArgument

TOKEN_ENV = "PCACHE_TOKEN"
TOKEN_FILE_ENV = "PCACHE_TOKEN_FILE"
TOKENS_FILE_ENV = "PCACHE_TOKENS_FILE"


def check_private_path(path: str | os.PathLike[str], what: str) -> None:
    """Refuse ``path`` when another user could replace it or what it holds (keys, tokens, block
    files, sockets), as OpenSSH's ``StrictModes`` does: it, every directory above it and every
    symbolic link on the way (the path as given, and the path it resolves to) must belong to this
    process's user or root, and none may be writable by every user, or by a group this process is
    not in, except a directory with the sticky bit (``/tmp``), where nobody renames another's
    entries. A missing ``path`` is checked from its first existing parent (it is made 0700 after).

    Raises:
        InvalidArgument: the path names the owner or the mode that lets another user in.
    """
    euid = os.geteuid()
    groups = {os.getegid(), 0, *os.getgroups()}
    given = os.path.abspath(path)
    for start, follow in ((given, False), (os.path.realpath(given), True)):
        current = start
        while True:
            try:
                st = os.stat(current) if follow else os.lstat(current)
            except FileNotFoundError:
                st = None
            if st is not None:
                if st.st_uid not in (euid, 0):
                    raise InvalidArgument(
                        f"{what} {path}: {current} belongs to uid {st.st_uid}, not to this process's user ({euid})"
                        " or root: that user could replace the keys, tokens or sockets in it"
                    )
                link = stat_mod.S_ISLNK(st.st_mode)  # its own mode means nothing; its owner does
                sticky_dir = stat_mod.S_ISDIR(st.st_mode) and st.st_mode & stat_mod.S_ISVTX
                if not link and not sticky_dir:
                    if st.st_mode & 0o002:
                        raise InvalidArgument(
                            f"{what} {path}: {current} is writable by every user (chmod o-w it, or choose another place)"
                        )
                    if st.st_mode & 0o020 and st.st_gid not in groups:
                        raise InvalidArgument(
                            f"{what} {path}: {current} is writable by group {st.st_gid}, which this process is not in"
                            " (chmod g-w it)"
                        )
            parent = os.path.dirname(current)
            if parent == current:
                break
            current = parent


@dataclass
class ClusterKeys:
    """The key rings of one cluster: master tokens and block tokens."""

    tokens: KeyRing
    blocks: KeyRing

    @classmethod
    def generate(cls) -> ClusterKeys:
        return cls(KeyRing.generate(), KeyRing.generate())

    def to_json(self) -> str:
        return json.dumps({"token_keys": self.tokens.format(), "block_keys": self.blocks.format()}, indent=1) + "\n"

    @classmethod
    def load(cls, path: str) -> ClusterKeys:
        """Read a key file.

        Raises:
            InvalidArgument: missing, unreadable, malformed, readable by any user, or replaceable
                by another user (:func:`check_private_path`).
        """
        check_private_path(path, "key file")
        try:
            if os.stat(path).st_mode & 0o007:  # group-readable passes: a Kubernetes Secret with fsGroup is 0440
                raise InvalidArgument(f"key file {path} is readable by any user: chmod 600 it")
            with open(path) as f:
                doc = json.load(f)
            return cls(KeyRing.parse(doc["token_keys"]), KeyRing.parse(doc["block_keys"]))
        except OSError as exc:
            raise InvalidArgument(f"cannot read the key file {path}: {exc.strerror}") from exc
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidArgument(f"key file {path} is not a PCache key file ({exc!r})") from exc

    @classmethod
    def load_or_create(cls, path: str) -> ClusterKeys:
        """Read ``path``, or write fresh keys there (0600, never over an existing file).

        Raises:
            InvalidArgument: as :meth:`load`, or it cannot be created.
        """
        keys = cls.generate()
        check_private_path(path, "key file")
        try:
            os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return cls.load(path)
        except OSError as exc:
            raise InvalidArgument(f"cannot create the key file {path}: {exc.strerror}") from exc
        with os.fdopen(fd, "w") as f:
            f.write(keys.to_json())
            f.flush()
            os.fsync(f.fileno())
        return keys


def write_secret(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only (atomic rename over any old copy)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()  # a stale or planted one: never written through
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def tokens_file() -> Path:
    """``$PCACHE_TOKENS_FILE``, else ``~/.pcache/tokens.json``."""
    return Path(os.environ.get(TOKENS_FILE_ENV) or Path.home() / ".pcache" / "tokens.json")


@contextlib.contextmanager
def _locked_tokens() -> Iterator[dict[str, str]]:
    """The tokens file's map, under an exclusive lock; written back (0600) on exit."""
    path = tokens_file()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            tokens = json.loads(path.read_text()) if path.exists() else {}
        except ValueError:
            tokens = {}
        yield tokens
        write_secret(path, json.dumps(tokens, indent=1, sort_keys=True) + "\n")


def remember_token(master: str, token: str) -> None:
    """Record ``token`` for every address of ``master`` (``a:port[,b:port]``) in the tokens file."""
    with _locked_tokens() as tokens:
        for address in _addresses(master):
            tokens[address] = token


def forget_token(master: str, token: str) -> None:
    """Drop the tokens file's entries of ``master`` that still hold ``token``."""
    with contextlib.suppress(OSError), _locked_tokens() as tokens:
        for address in _addresses(master):
            if tokens.get(address) == token:
                del tokens[address]


def clean_token(token: str, source: str) -> str:
    """``token`` without the whitespace around it (a file's or a Kubernetes Secret's trailing
    newline), as sent in the ``authorization`` header.

    Raises:
        InvalidArgument: nothing is left, or it holds a character no token has (a space, a line
            break, a non-ASCII character): ``source`` is named, the token is never printed.
    """
    token = token.strip()
    if not token:
        raise InvalidArgument(f"{source} is empty: give a tenant's token (pcache tenant token NAME writes one)")
    if not all("!" <= ch <= "~" for ch in token):
        raise InvalidArgument(
            f"{source} holds characters no token has (a space, a line break or a non-ASCII character"
            " inside it: a token is one word of printable ASCII)"
        )
    return token


def find_token(master: str) -> str:
    """The token a client of ``master`` sends when its config names none ("" if none is found).

    Raises:
        InvalidArgument: ``$PCACHE_TOKEN`` is set but empty (an unset variable substituted, as in
            ``PCACHE_TOKEN=$TEAM_TOKEN``: the default tenant's token would be used for it), or
            either source holds no token (:func:`clean_token`); ``$PCACHE_TOKEN_FILE`` names a
            file that cannot be read.
    """
    if TOKEN_ENV in os.environ:
        return clean_token(os.environ[TOKEN_ENV], f"${TOKEN_ENV} (unset it to use the tokens file)")
    if os.environ.get(TOKEN_FILE_ENV):
        path = os.environ[TOKEN_FILE_ENV]
        try:
            text = Path(path).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidArgument(f"${TOKEN_FILE_ENV}={path}: {getattr(exc, 'strerror', None) or exc}") from exc
        return clean_token(text, f"${TOKEN_FILE_ENV}={path}")
    try:
        tokens = json.loads(tokens_file().read_text())
    except (OSError, ValueError):
        return ""
    for address in _addresses(master):
        if isinstance(tokens.get(address), str):
            return tokens[address]
    return ""


TLS_DIR_ENV = "PCACHE_TLS_DIR"
_TLS_PREFIX = "tls:"  # tokens file entries naming a cluster's TLS directory, per master address


def remember_tls(master: str, directory: str) -> None:
    """Record the TLS directory of ``master``'s cluster (``pcache up --tls``) in the tokens file."""
    with _locked_tokens() as tokens:
        for address in _addresses(master):
            tokens[_TLS_PREFIX + address] = directory


def forget_tls(master: str, directory: str) -> None:
    """Drop the tokens file's TLS entries of ``master`` that still name ``directory``."""
    with contextlib.suppress(OSError), _locked_tokens() as tokens:
        for address in _addresses(master):
            if tokens.get(_TLS_PREFIX + address) == directory:
                del tokens[_TLS_PREFIX + address]


def find_tls_dir(master: str) -> str:
    """The TLS directory a client of ``master`` uses when its config names none: $PCACHE_TLS_DIR,
    else the tokens file's entry for the address that still exists ("" : plaintext). An entry of a
    cluster that was not stopped cleanly outlives its directory, and the address may serve another
    cluster now: it named a deleted directory to every client of that address."""
    if os.environ.get(TLS_DIR_ENV):
        return os.environ[TLS_DIR_ENV]
    try:
        tokens = json.loads(tokens_file().read_text())
    except (OSError, ValueError):
        return ""
    for address in _addresses(master):
        recorded = tokens.get(_TLS_PREFIX + address)
        if isinstance(recorded, str) and os.path.isdir(recorded):
            return recorded
    return ""


def _addresses(master: str) -> list[str]:
    return [a.strip() for a in master.split(",") if a.strip()]
