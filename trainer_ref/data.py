"""Token shards for the reference trainer: build them from a local corpus, read them with plain file I/O.

Build (``python -m trainer_ref.data build --out DIR``): the corpus is the Python standard library sources of
the running interpreter (always present; optionally plus English text under ``/usr/share/doc``), sorted by
path; a byte-level BPE (GPT-2 style pre-tokenisation, ``tokenizers`` library) is trained locally on the
training documents, so nothing is downloaded. Documents are tokenised, each followed by the end-of-text
token, and streamed into fixed-size shards. Building twice on the same corpus gives byte-identical files.

On-disk format of a data directory::

    tokenizer.json        the BPE tokenizer (``tokenizers.Tokenizer.from_file``); absent for synthetic data
    train-00000.bin ...   raw little-endian token ids, no header; dtype uint16 (uint32 when vocab > 65536);
    val-00000.bin ...     every shard of a split holds ``shard_tokens`` tokens except the last
    index.json            written last (the commit): format, dtype, vocab_size, eot_id, tokenizer,
                          corpus description, and per split its shards with token count, bytes and sha256

Reading: :class:`TokenShards` reads token ranges with ``os.pread`` only (no mmap), so it works from any
path, the PCache FUSE mount included, and stays valid across ``fork``. The token stream of a split is cut into
windows of ``seq_len + 1`` tokens at stride ``seq_len`` (windows cross shard and document boundaries).
:class:`WindowSampler` assigns windows to data-parallel ranks deterministically and keeps the cursor that
checkpoints save; :class:`ShardDataset` turns that into ``(x, y)`` batches and supports deferring a batch
(the loss-spike handler skips it and retries it later).
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import gzip
import hashlib
import json
import logging
import os
import sys
import sysconfig
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from pcache.common.logs import setup_logging

if TYPE_CHECKING:
    import torch
    from tokenizers import Tokenizer

logger = logging.getLogger(__name__)

__all__ = [
    "EOT_TOKEN",
    "INDEX_FORMAT",
    "Batch",
    "BatchId",
    "BuildConfig",
    "DataError",
    "Document",
    "ShardDataset",
    "TokenShards",
    "WindowSampler",
    "build",
    "collect_corpus",
    "load_tokenizer",
    "main",
    "read_index",
    "train_tokenizer",
    "verify",
    "write_shards",
]

INDEX_FORMAT = "trainer_ref.token_shards/1"
INDEX_NAME = "index.json"
TOKENIZER_NAME = "tokenizer.json"
EOT_TOKEN = "<|endoftext|>"
SPLITS = ("train", "val")

_DOC_SUFFIXES = (".txt", ".md", ".rst")
_DOC_PREFIXES = ("readme", "news", "changelog")
_ENCODE_CHUNK_BYTES = 4 << 20  # bounds the memory of tokenizers' Encoding objects during a build
_MASK64 = (1 << 64) - 1


class DataError(RuntimeError):
    """A data directory is missing, incomplete, corrupt, or does not match a saved cursor."""


class Document(NamedTuple):
    """One corpus document: ``name`` is ``stdlib/<relpath>`` or ``doc/<relpath>``."""

    name: str
    text: str


class BatchId(NamedTuple):
    """Identifies a training batch of one split: the ``step``-th batch of ``epoch`` (the same on all DP ranks)."""

    epoch: int
    step: int


class Batch(NamedTuple):
    """``x`` and ``y``: int64 tensors of shape (micro_batch, seq_len), ``y`` is ``x`` shifted by one token."""

    x: torch.Tensor
    y: torch.Tensor
    batch_id: BatchId


# ---------------------------------------------------------------------------------------------------------
# Corpus and tokenizer


def _stdlib_documents() -> Iterator[tuple[str, Path]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    for dirpath, dirnames, filenames in os.walk(root):
        # Sorting in place makes os.walk itself deterministic; skipped dirs are pruned here.
        dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "dist-packages", "__pycache__"))
        for name in sorted(filenames):
            if name.endswith(".py"):
                path = Path(dirpath, name)
                yield "stdlib/" + path.relative_to(root).as_posix(), path


def _doc_documents(root: Path = Path("/usr/share/doc")) -> Iterator[tuple[str, Path]]:
    for dirpath, dirnames, filenames in os.walk(root):  # followlinks=False: Debian symlinks whole doc dirs
        dirnames[:] = sorted(dirnames)
        for name in sorted(filenames):
            path = Path(dirpath, name)
            base = name.lower().removesuffix(".gz")
            if path.is_symlink() or not (base.endswith(_DOC_SUFFIXES) or base.startswith(_DOC_PREFIXES)):
                continue
            yield "doc/" + path.relative_to(root).as_posix(), path


def _read_text(path: Path) -> str | None:
    try:
        data = path.read_bytes()
        if path.suffix == ".gz":
            data = gzip.decompress(data)
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile):
        return None  # a few stdlib test files are deliberately latin-1/koi8-r: skipped, and counted


def collect_corpus(*, max_bytes: int | None = None, with_docs: bool = False) -> tuple[list[Document], dict]:
    """Collect the build corpus: stdlib ``.py`` sources, then (optionally) ``/usr/share/doc`` text.

    Files that are not valid UTF-8 are skipped. With ``max_bytes``, documents are taken greedily in that
    order while the UTF-8 total stays within the budget (deterministic for a given interpreter).

    Returns:
        ``(documents, description)``; the description (sources, Python version, counts, bytes, sha256 over
        names and texts) goes into ``index.json``.
    """
    sources: list[Iterable[tuple[str, Path]]] = [_stdlib_documents()]
    if with_docs:
        sources.append(_doc_documents())
    docs: list[Document] = []
    total = skipped = 0
    digest = hashlib.sha256()
    for source in sources:
        for name, path in source:
            text = _read_text(path)
            if text is None or not text:
                skipped += 1
                continue
            size = len(text.encode("utf-8"))
            if max_bytes is not None and total + size > max_bytes:
                continue
            total += size
            docs.append(Document(name, text))
            digest.update(f"{name}\0{size}\0".encode())
            digest.update(text.encode("utf-8"))
    description = {
        "sources": ["stdlib:" + sysconfig.get_paths()["stdlib"]] + (["doc:/usr/share/doc"] if with_docs else []),
        "python": sys.version.split()[0],
        "documents": len(docs),
        "bytes": total,
        "skipped_files": skipped,  # empty, unreadable or not UTF-8
        "max_bytes": max_bytes,
        "sha256": digest.hexdigest(),
    }
    return docs, description


def train_tokenizer(texts: Sequence[str], vocab_size: int) -> Tokenizer:
    """Train a byte-level BPE on ``texts``; ``EOT_TOKEN`` gets id 0.

    Byte-level pre-tokenisation (GPT-2's regex and byte alphabet) makes ``decode(encode(s)) == s`` for any
    string. Training is deterministic: ``tokenizers`` breaks ties between equally frequent pairs by pair id,
    and ids follow the sorted byte alphabet, so the same texts give a byte-identical ``tokenizer.json`` on any
    number of threads. The result may hold fewer than ``vocab_size`` tokens on a tiny corpus.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer, length=len(texts))
    # A literal "<|endoftext|>" inside a document is text, not a document boundary.
    tokenizer.encode_special_tokens = True
    return tokenizer


def load_tokenizer(root: str | os.PathLike) -> Tokenizer:
    """Load the tokenizer of a data directory (``index.json``'s ``tokenizer`` file); raises DataError if none."""
    from tokenizers import Tokenizer

    index = read_index(root)
    if not index.get("tokenizer"):
        raise DataError(f"{root}: data directory has no tokenizer (synthetic data)")
    tokenizer = Tokenizer.from_file(str(Path(root, index["tokenizer"])))
    tokenizer.encode_special_tokens = True
    return tokenizer


def _encode_documents(tokenizer: Tokenizer, texts: Sequence[str], eot_id: int, dtype: np.dtype) -> Iterator[np.ndarray]:
    """Yield token arrays (documents each followed by EOT), encoding ~4 MiB of text per call."""
    # encode_batch_fast skips offset tracking; both run on all cores (Rust threads), so no process pool.
    encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
    start = 0
    while start < len(texts):
        end, size = start, 0
        while end < len(texts) and (end == start or size < _ENCODE_CHUNK_BYTES):
            size += len(texts[end])
            end += 1
        pieces: list[np.ndarray] = []
        eot = np.array([eot_id], dtype=dtype)
        for encoding in encode(list(texts[start:end]), add_special_tokens=False):
            pieces.append(np.asarray(encoding.ids, dtype=dtype))
            pieces.append(eot)
        yield np.concatenate(pieces)
        start = end


# ---------------------------------------------------------------------------------------------------------
# Writing shards and the index


def _dtype_for(vocab_size: int) -> np.dtype:
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class _ShardWriter:
    """Streams token arrays of one split into ``<split>-NNNNN.bin`` files of exactly ``shard_tokens`` tokens."""

    def __init__(self, out: Path, split: str, dtype: np.dtype, shard_tokens: int):
        self.out, self.split, self.dtype, self.shard_tokens = out, split, dtype, shard_tokens
        self.shards: list[dict] = []
        self._buf: list[np.ndarray] = []
        self._buffered = 0

    def add(self, tokens: np.ndarray) -> None:
        tokens = np.asarray(tokens, dtype=self.dtype)
        while len(tokens):
            take = min(len(tokens), self.shard_tokens - self._buffered)
            self._buf.append(tokens[:take])
            self._buffered += take
            tokens = tokens[take:]
            if self._buffered == self.shard_tokens:
                self._flush()

    def close(self) -> list[dict]:
        if self._buffered:
            self._flush()
        return self.shards

    def _flush(self) -> None:
        data = np.concatenate(self._buf).astype(self.dtype, copy=False).tobytes()
        name = f"{self.split}-{len(self.shards):05d}.bin"
        _write_atomic(self.out / name, data)
        self.shards.append(
            {"name": name, "tokens": self._buffered, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        )
        self._buf, self._buffered = [], 0


def write_shards(
    out: str | os.PathLike,
    splits: Mapping[str, np.ndarray | Iterable[np.ndarray]],
    *,
    vocab_size: int,
    eot_id: int = 0,
    shard_tokens: int = 1 << 21,
    tokenizer: str | None = None,
    corpus: Mapping[str, Any] | None = None,
    build: Mapping[str, Any] | None = None,
) -> dict:
    """Write token shards for each split, then ``index.json`` as the commit point.

    An existing ``index.json`` is removed first and stale ``<split>-*.bin`` files are deleted, so a reader
    never sees an index that names half-rewritten shards. Every file is written to a temporary name,
    fsynced and renamed. Also used by tests to make synthetic data (``tokenizer=None``).

    Args:
        out: directory (created if missing).
        splits: split name -> token ids (one array, or an iterable of arrays streamed in order).
        vocab_size: ids must be below it; chooses uint16 (<= 65536) or uint32 shards.
        eot_id: end-of-text token id, recorded in the index.
        shard_tokens: tokens per shard file (the last one of a split may hold fewer).
        tokenizer: file name of the tokenizer inside ``out``, or None.
        corpus, build: descriptions recorded verbatim in the index.

    Returns:
        The index, as written.
    """
    if shard_tokens <= 0:
        raise ValueError(f"shard_tokens must be positive, got {shard_tokens}")
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    (root / INDEX_NAME).unlink(missing_ok=True)
    for stale in sorted(root.glob("*-[0-9][0-9][0-9][0-9][0-9].bin")):
        if stale.name.split("-")[0] in splits:
            stale.unlink()
    _fsync_dir(root)
    dtype = _dtype_for(vocab_size)
    index: dict[str, Any] = {
        "format": INDEX_FORMAT,
        "dtype": dtype.name,
        "byteorder": "little",
        "vocab_size": vocab_size,
        "eot_id": eot_id,
        "tokenizer": tokenizer,
        "corpus": dict(corpus or {}),
        "build": dict(build or {}),
        "splits": {},
    }
    for split, tokens in splits.items():
        if not split.isidentifier():
            raise ValueError(f"bad split name {split!r}")
        writer = _ShardWriter(root, split, dtype, shard_tokens)
        for array in [tokens] if isinstance(tokens, np.ndarray) else tokens:
            if len(array) and not 0 <= int(np.min(array)) <= int(np.max(array)) < vocab_size:
                raise ValueError(f"{split}: token ids outside [0, {vocab_size})")
            writer.add(array)
        shards = writer.close()
        index["splits"][split] = {"tokens": sum(s["tokens"] for s in shards), "shards": shards}
    _fsync_dir(root)
    _write_atomic(root / INDEX_NAME, (json.dumps(index, indent=2, sort_keys=True) + "\n").encode())
    _fsync_dir(root)
    return index


def _split_documents(docs: Sequence[Document], val_fraction: float) -> tuple[list[Document], list[Document]]:
    """Deterministic train/val split by the sha256 of each document's name (stable as the corpus grows)."""
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    n_val = round(val_fraction * len(docs))
    if val_fraction > 0 and len(docs) >= 2:
        n_val = max(1, n_val)
    ranked = sorted(docs, key=lambda d: hashlib.sha256(d.name.encode()).digest())
    val_names = {d.name for d in ranked[:n_val]}
    return [d for d in docs if d.name not in val_names], [d for d in docs if d.name in val_names]


@dataclass
class BuildConfig:
    """Options of ``python -m trainer_ref.data build``."""

    out: str
    """Output directory (shards, tokenizer.json, index.json)."""
    vocab_size: int = 8192
    """BPE vocabulary size including the EOT token (a tiny corpus may yield fewer)."""
    shard_tokens: int = 1 << 21
    """Tokens per shard file (2 Mi tokens = 4 MiB of uint16)."""
    max_bytes: int | None = None
    """Corpus budget in bytes of UTF-8 text; None takes the whole corpus."""
    val_fraction: float = 0.01
    """Fraction of documents held out as the ``val`` split (at least one document when > 0)."""
    with_docs: bool = False
    """Also use English text under /usr/share/doc (varies by machine, so off by default)."""
    tokenizer_bytes: int = 8 << 20
    """The BPE is trained on an evenly strided subset of the train documents of at most this many bytes."""


def build(cfg: BuildConfig) -> dict:
    """Build a data directory: corpus -> BPE -> shards -> index. Returns the index.

    Raises:
        DataError: the corpus is empty.
    """
    t0 = time.perf_counter()
    docs, corpus = collect_corpus(max_bytes=cfg.max_bytes, with_docs=cfg.with_docs)
    if not docs:
        raise DataError("empty corpus")
    train_docs, val_docs = _split_documents(docs, cfg.val_fraction)
    t1 = time.perf_counter()
    logger.info(
        "corpus: %d documents, %d bytes (%d train, %d val)", len(docs), corpus["bytes"], len(train_docs), len(val_docs)
    )

    train_bytes = sum(len(d.text.encode("utf-8")) for d in train_docs)
    stride = max(1, -(-train_bytes // cfg.tokenizer_bytes))
    sample = [d.text for d in train_docs[::stride]]
    tokenizer = train_tokenizer(sample, cfg.vocab_size)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    tok_json = tokenizer.to_str(pretty=True).encode()
    t2 = time.perf_counter()
    eot_id = tokenizer.token_to_id(EOT_TOKEN)
    if eot_id is None:
        raise DataError(f"trained tokenizer lacks {EOT_TOKEN}")
    vocab_size = tokenizer.get_vocab_size()
    dtype = _dtype_for(vocab_size)
    logger.info("tokenizer: %d tokens trained on %d documents in %.1fs", vocab_size, len(sample), t2 - t1)

    splits = {
        "train": _encode_documents(tokenizer, [d.text for d in train_docs], eot_id, dtype),
        "val": _encode_documents(tokenizer, [d.text for d in val_docs], eot_id, dtype),
    }
    build_info = dataclasses.asdict(cfg)
    del build_info["out"]
    build_info.update(
        tokenizers_version=_tokenizers_version(),
        documents={"train": len(train_docs), "val": len(val_docs)},
        tokenizer_sha256=hashlib.sha256(tok_json).hexdigest(),
    )
    (out / INDEX_NAME).unlink(missing_ok=True)  # the old index must not outlive the new tokenizer
    _write_atomic(out / TOKENIZER_NAME, tok_json)
    index = write_shards(
        out,
        splits,
        vocab_size=vocab_size,
        eot_id=eot_id,
        shard_tokens=cfg.shard_tokens,
        tokenizer=TOKENIZER_NAME,
        corpus=corpus,
        build=build_info,
    )
    t3 = time.perf_counter()
    logger.info(
        "shards: %d train + %d val tokens in %.1fs; total %.1fs",
        index["splits"]["train"]["tokens"],
        index["splits"]["val"]["tokens"],
        t3 - t2,
        t3 - t0,
    )
    return index


def _tokenizers_version() -> str:
    import tokenizers

    return tokenizers.__version__


# ---------------------------------------------------------------------------------------------------------
# Reading


def read_index(root: str | os.PathLike) -> dict:
    """Read and check ``index.json`` of a data directory.

    Raises:
        FileNotFoundError: no index (never built, or a build is in progress).
        DataError: unknown format.
    """
    with open(Path(root, INDEX_NAME), "rb") as f:
        index = json.loads(f.read())
    if index.get("format") != INDEX_FORMAT:
        raise DataError(f"{root}: unknown index format {index.get('format')!r}")
    return index


def verify(root: str | os.PathLike) -> list[str]:
    """Check every shard's size and sha256 against the index; returns the problems found (empty: all good)."""
    index = read_index(root)
    problems = []
    for split, meta in index["splits"].items():
        for shard in meta["shards"]:
            path = Path(root, shard["name"])
            try:
                with open(path, "rb") as f:
                    digest = hashlib.file_digest(f, "sha256").hexdigest()
                size = path.stat().st_size
            except OSError as e:
                problems.append(f"{split}/{shard['name']}: {e}")
                continue
            if size != shard["bytes"]:
                problems.append(f"{split}/{shard['name']}: {size} bytes, index says {shard['bytes']}")
            elif digest != shard["sha256"]:
                problems.append(f"{split}/{shard['name']}: sha256 {digest}, index says {shard['sha256']}")
    if index.get("tokenizer"):
        tok = Path(root, index["tokenizer"])
        want = index.get("build", {}).get("tokenizer_sha256")
        if not tok.is_file():
            problems.append(f"{tok.name}: missing")
        elif want and hashlib.sha256(tok.read_bytes()).hexdigest() != want:
            problems.append(f"{tok.name}: sha256 does not match the index")
    return problems


class TokenShards:
    """The token stream of one split, read with ``os.pread`` from shard files (no mmap, no whole-file loads).

    File descriptors are opened lazily and ``pread`` keeps no file offset, so an instance may be used after
    ``fork``. Works on any file system, the PCache FUSE mount included.

    Raises:
        FileNotFoundError: no index.
        DataError: unknown split, missing shard, or a shard whose size disagrees with the index.
    """

    def __init__(self, root: str | os.PathLike, split: str = "train", *, check_sha256: bool = False):
        self.root = Path(root)
        self.index = read_index(self.root)
        if split not in self.index["splits"]:
            raise DataError(f"{root}: no split {split!r} (have {sorted(self.index['splits'])})")
        self.split = split
        self.dtype = np.dtype(self.index["dtype"]).newbyteorder("<")
        self.vocab_size: int = self.index["vocab_size"]
        self.eot_id: int = self.index["eot_id"]
        self.shards: list[dict] = self.index["splits"][split]["shards"]
        self._starts = [0]
        for shard in self.shards:
            try:
                size: int | None = (self.root / shard["name"]).stat().st_size
            except FileNotFoundError:
                size = None
            if size != shard["tokens"] * self.dtype.itemsize:
                raise DataError(f"{self.root / shard['name']}: size {size}, index says {shard['tokens']} tokens")
            self._starts.append(self._starts[-1] + shard["tokens"])
        self.num_tokens: int = self._starts[-1]
        self._fds: dict[int, int] = {}
        if check_sha256:
            problems = [p for p in verify(self.root) if p.startswith(f"{split}/")]
            if problems:
                raise DataError("; ".join(problems))

    @property
    def fingerprint(self) -> str:
        """sha256 over the split's shard digests: identifies the exact token stream."""
        return hashlib.sha256("".join(s["sha256"] for s in self.shards).encode()).hexdigest()

    def num_windows(self, seq_len: int) -> int:
        """Number of ``seq_len + 1``-token windows at stride ``seq_len``."""
        return max(0, (self.num_tokens - 1) // seq_len)

    def read(self, start: int, count: int) -> np.ndarray:
        """Tokens ``[start, start + count)`` of the split's stream (crossing shards as needed), in shard dtype.

        Raises:
            IndexError: range outside the stream.
            DataError: a shard is shorter than the index says.
        """
        if start < 0 or count < 0 or start + count > self.num_tokens:
            raise IndexError(f"tokens [{start}, {start + count}) outside [0, {self.num_tokens})")
        out = bytearray(count * self.dtype.itemsize)
        view = memoryview(out)
        done = 0
        shard = bisect.bisect_right(self._starts, start) - 1
        while done < count:
            offset = start + done - self._starts[shard]
            n = min(count - done, self._starts[shard + 1] - self._starts[shard] - offset)
            self._pread_into(shard, view[done * self.dtype.itemsize : (done + n) * self.dtype.itemsize], offset)
            done += n
            shard += 1
        return np.frombuffer(out, dtype=self.dtype)

    def window(self, i: int, seq_len: int) -> np.ndarray:
        """Window ``i``: tokens ``[i * seq_len, (i + 1) * seq_len + 1)``."""
        return self.read(i * seq_len, seq_len + 1)

    def _pread_into(self, shard: int, buf: memoryview, token_offset: int) -> None:
        fd = self._fds.get(shard)
        if fd is None:
            fd = self._fds[shard] = os.open(self.root / self.shards[shard]["name"], os.O_RDONLY)
        pos = token_offset * self.dtype.itemsize
        got = 0
        while got < len(buf):  # FUSE and network file systems may return short reads
            n = os.preadv(fd, [buf[got:]], pos + got)
            if n == 0:
                raise DataError(f"{self.shards[shard]['name']}: unexpected end of file at byte {pos + got}")
            got += n

    def close(self) -> None:
        """Close the open shard files."""
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            os.close(fd)

    def __enter__(self) -> TokenShards:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------------------------------------
# Sampling


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 arrays: a bijection, defined by integer arithmetic only."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    """A permutation of ``range(n)`` that depends only on (n, seed, epoch).

    Sorts indices by a keyed bijective hash instead of using a library RNG, whose stream may change between
    numpy/torch versions; keys are distinct, so the order has no ties.
    """
    key = int(_mix64(np.array([(seed * 0x9E3779B97F4A7C15 + epoch) & _MASK64], dtype=np.uint64))[0])
    keys = _mix64(np.arange(n, dtype=np.uint64) + np.uint64(key))
    return np.argsort(keys, kind="stable")


class WindowSampler:
    """Deterministic per-DP-rank order of window indices, with a resumable cursor and deferred batches.

    Epoch ``e`` visits a permutation of all windows fixed by ``(seed, e)``. Its ``step``-th global batch is
    the slice ``perm[step * dp_world * micro_batch :][: dp_world * micro_batch]``; rank ``r`` takes the
    ``r``-th ``micro_batch`` of it. Ranks never overlap, every rank has ``batches_per_epoch`` batches, and the
    last ``num_windows % (dp_world * micro_batch)`` windows of each permutation are dropped.

    ``defer(batch_id, delay)`` re-injects a batch: it is served again in place of a fresh batch once
    ``delay`` more batches have been served. The cursor (epoch, step, served count, deferred queue) is the
    same on every rank as long as all ranks defer the same batches (the trainer decides skips globally), so a
    state saved on any rank of the same world size may be loaded on any other.
    """

    def __init__(self, num_windows: int, *, micro_batch: int, dp_rank: int = 0, dp_world: int = 1, seed: int = 0):
        if not 0 <= dp_rank < dp_world:
            raise ValueError(f"dp_rank {dp_rank} outside [0, {dp_world})")
        if micro_batch <= 0:
            raise ValueError(f"micro_batch must be positive, got {micro_batch}")
        self.num_windows, self.micro_batch, self.seed = num_windows, micro_batch, seed
        self.dp_rank, self.dp_world = dp_rank, dp_world
        self.batches_per_epoch = num_windows // (micro_batch * dp_world)
        if self.batches_per_epoch == 0:
            raise ValueError(f"{num_windows} windows are fewer than dp_world * micro_batch = {dp_world * micro_batch}")
        self.epoch = 0
        self.step = 0
        self.served = 0
        self._deferred: list[tuple[BatchId, int]] = []  # (batch, served count at which it is due), FIFO
        self._perms: dict[int, np.ndarray] = {}

    def next_id(self) -> BatchId:
        """Advance the cursor: the first due deferred batch if any, else the next fresh batch."""
        due = next((i for i, (_, due_at) in enumerate(self._deferred) if due_at <= self.served), None)
        if due is not None:
            batch_id = self._deferred.pop(due)[0]
        else:
            batch_id = BatchId(self.epoch, self.step)
            self.step += 1
            if self.step == self.batches_per_epoch:
                self.epoch, self.step = self.epoch + 1, 0
        self.served += 1
        return batch_id

    def windows(self, batch_id: BatchId) -> np.ndarray:
        """This rank's window indices (int64, length micro_batch) for ``batch_id``; does not move the cursor."""
        epoch, step = batch_id
        if not 0 <= step < self.batches_per_epoch or epoch < 0:
            raise IndexError(f"{batch_id} outside an epoch of {self.batches_per_epoch} batches")
        perm = self._perms.get(epoch)
        if perm is None:
            if len(self._perms) >= 2:  # current epoch + one for a deferred batch of the previous epoch
                self._perms.pop(min(self._perms))
            perm = self._perms[epoch] = _permutation(self.num_windows, self.seed, epoch)
        start = (step * self.dp_world + self.dp_rank) * self.micro_batch
        return perm[start : start + self.micro_batch].astype(np.int64)

    def defer(self, batch_id: BatchId, delay: int = 16) -> None:
        """Serve ``batch_id`` again after ``delay`` (>= 0) more batches.

        Raises:
            ValueError: the batch is already deferred, or a negative delay.
        """
        batch_id = BatchId(*batch_id)
        if delay < 0:
            raise ValueError(f"delay must be >= 0, got {delay}")
        if any(b == batch_id for b, _ in self._deferred):
            raise ValueError(f"{batch_id} is already deferred")
        self._deferred.append((batch_id, self.served + delay))

    @property
    def deferred(self) -> list[BatchId]:
        """Batches waiting to be served again, in queue order."""
        return [b for b, _ in self._deferred]

    def state_dict(self) -> dict[str, Any]:
        """The cursor as plain ints and lists (JSON- and ``torch.distributed.checkpoint``-friendly)."""
        return {
            "epoch": self.epoch,
            "step": self.step,
            "served": self.served,
            "deferred": [[b.epoch, b.step, due] for b, due in self._deferred],
            "seed": self.seed,
            "num_windows": self.num_windows,
            "micro_batch": self.micro_batch,
            "dp_world": self.dp_world,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a cursor saved by ``state_dict`` (any rank of the same layout).

        Raises:
            ValueError: the state was saved with another seed, window count, micro batch or DP world size.
        """
        for key in ("seed", "num_windows", "micro_batch", "dp_world"):
            if int(state[key]) != getattr(self, key):
                raise ValueError(f"sampler state has {key}={state[key]}, this sampler has {getattr(self, key)}")
        self.epoch, self.step, self.served = int(state["epoch"]), int(state["step"]), int(state["served"])
        self._deferred = [(BatchId(int(e), int(s)), int(due)) for e, s, due in state["deferred"]]


class ShardDataset:
    """Batches of ``(x, y)`` windows for one data-parallel rank, read from a data directory.

    Each batch reads only its ``micro_batch`` windows (one ``pread`` per window, two where a window crosses
    a shard boundary); nothing else is held in memory. ``next_batch`` after ``load_state_dict(state)`` returns
    bitwise the same batches as the run that saved ``state``.

    Args:
        root: data directory (any path; in the main job, on the PCache FUSE mount).
        seq_len: tokens per sample; windows are ``seq_len + 1`` tokens.
        micro_batch: samples per batch on this rank.
        split: ``train`` or ``val``.
        dp_rank, dp_world: this rank and the data-parallel world size.
        seed: shuffling seed.

    Raises:
        FileNotFoundError, DataError: see :class:`TokenShards`.
        ValueError: too few windows for one batch on every rank.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        *,
        seq_len: int,
        micro_batch: int,
        split: str = "train",
        dp_rank: int = 0,
        dp_world: int = 1,
        seed: int = 0,
    ):
        if seq_len <= 0:
            raise ValueError(f"seq_len must be positive, got {seq_len}")
        self.seq_len, self.micro_batch = seq_len, micro_batch
        self.shards = TokenShards(root, split)
        self.sampler = WindowSampler(
            self.shards.num_windows(seq_len), micro_batch=micro_batch, dp_rank=dp_rank, dp_world=dp_world, seed=seed
        )

    @property
    def vocab_size(self) -> int:
        """Vocabulary size recorded in the index (every token id is below it)."""
        return self.shards.vocab_size

    @property
    def eot_id(self) -> int:
        """Id of the end-of-text token that follows every document."""
        return self.shards.eot_id

    @property
    def batches_per_epoch(self) -> int:
        """Batches each rank serves per epoch."""
        return self.sampler.batches_per_epoch

    def next_batch(self) -> Batch:
        """The next batch on this rank (a due deferred batch first); advances the cursor."""
        return self.get_batch(self.sampler.next_id())

    def get_batch(self, batch_id: BatchId) -> Batch:
        """Batch ``batch_id`` of this rank, without moving the cursor."""
        windows = self.sampler.windows(batch_id)
        return self._assemble(windows, BatchId(*batch_id))

    def defer(self, batch_id: BatchId, delay: int = 16) -> None:
        """Re-inject ``batch_id`` after ``delay`` more batches (see :meth:`WindowSampler.defer`)."""
        self.sampler.defer(batch_id, delay)

    def eval_batches(self, max_batches: int | None = None) -> Iterator[Batch]:
        """Sequential (unshuffled) batches for evaluation, independent of the cursor.

        Window ``i`` goes to rank ``i % dp_world``; every rank yields the same number of batches, at most
        ``max_batches``. Batch ids are ``BatchId(-1, k)``.
        """
        sampler = self.sampler
        per_rank = sampler.num_windows // sampler.dp_world
        count = per_rank // self.micro_batch
        if max_batches is not None:
            count = min(count, max_batches)
        mine = np.arange(sampler.dp_rank, sampler.num_windows, sampler.dp_world, dtype=np.int64)
        for k in range(count):
            yield self._assemble(mine[k * self.micro_batch : (k + 1) * self.micro_batch], BatchId(-1, k))

    def state_dict(self) -> dict[str, Any]:
        """Sampler cursor plus ``seq_len`` and the data fingerprint (plain ints, strings and lists)."""
        return {**self.sampler.state_dict(), "seq_len": self.seq_len, "fingerprint": self.shards.fingerprint}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the cursor.

        Raises:
            DataError: the shards differ from those the state was saved with.
            ValueError: a different sampling layout (see :meth:`WindowSampler.load_state_dict`).
        """
        if state.get("fingerprint") != self.shards.fingerprint:
            raise DataError(f"{self.shards.root}: the data differs from the data of the saved cursor")
        if int(state["seq_len"]) != self.seq_len:
            raise ValueError(f"saved seq_len {state['seq_len']}, this dataset has {self.seq_len}")
        self.sampler.load_state_dict(state)

    def close(self) -> None:
        """Close the shard files."""
        self.shards.close()

    def __enter__(self) -> ShardDataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _assemble(self, windows: np.ndarray, batch_id: BatchId) -> Batch:
        import torch  # here, so that building shards does not import torch

        buf = np.empty((len(windows), self.seq_len + 1), dtype=np.int64)
        for row, w in enumerate(windows):
            buf[row] = self.shards.window(int(w), self.seq_len)
        x = torch.from_numpy(np.ascontiguousarray(buf[:, :-1]))
        y = torch.from_numpy(np.ascontiguousarray(buf[:, 1:]))
        return Batch(x, y, batch_id)


# ---------------------------------------------------------------------------------------------------------
# Command line


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(3, f"{self.prog}: error: {message}\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m trainer_ref.data", description="Token shards for the reference trainer.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    defaults = BuildConfig(out="")
    b = sub.add_parser(
        "build",
        help="tokenize the local corpus into shards plus index.json",
        epilog="example: python -m trainer_ref.data build --out /mnt/pcache/data/stdlib --vocab-size 8192",
    )
    b.add_argument("--out", required=True, help="output directory")
    b.add_argument("--vocab-size", type=int, default=defaults.vocab_size, help="BPE vocabulary size")
    b.add_argument("--shard-tokens", type=int, default=defaults.shard_tokens, help="tokens per shard file")
    b.add_argument("--max-bytes", type=int, default=None, help="corpus budget in bytes (default: all)")
    b.add_argument("--val-fraction", type=float, default=defaults.val_fraction, help="held-out document fraction")
    b.add_argument("--with-docs", action="store_true", help="add English text from /usr/share/doc")
    b.add_argument("--tokenizer-bytes", type=int, default=defaults.tokenizer_bytes, help="BPE training budget")
    v = sub.add_parser(
        "verify",
        help="check shard sizes and sha256 against index.json",
        epilog="example: python -m trainer_ref.data verify /mnt/pcache/data/stdlib",
    )
    v.add_argument("root", help="data directory")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; exit codes 0 ok, 1 verification found problems, 2 fatal, 3 usage."""
    args = _parser().parse_args(argv)
    setup_logging("DEBUG" if args.verbose else "INFO", fmt="%(asctime)s %(message)s")
    try:
        if args.command == "build":
            cfg = BuildConfig(
                out=args.out,
                vocab_size=args.vocab_size,
                shard_tokens=args.shard_tokens,
                max_bytes=args.max_bytes,
                val_fraction=args.val_fraction,
                with_docs=args.with_docs,
                tokenizer_bytes=args.tokenizer_bytes,
            )
            logger.info("build: %s", cfg)
            index = build(cfg)
            for split, meta in index["splits"].items():
                print(f"{split}: {meta['tokens']} tokens in {len(meta['shards'])} shards")
            return 0
        problems = verify(args.root)
        for problem in problems:
            print(problem)
        return 1 if problems else 0
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    except (OSError, DataError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
