"""Token shards: deterministic build, lossless tokenizer, plain-I/O reads, per-rank sampler and its cursor."""

from __future__ import annotations

import filecmp
import hashlib
import json
import mmap
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import torch

from trainer_ref.data import (
    EOT_TOKEN,
    BatchId,
    BuildConfig,
    DataError,
    ShardDataset,
    TokenShards,
    WindowSampler,
    _permutation,
    _split_documents,
    build,
    collect_corpus,
    load_tokenizer,
    read_index,
    verify,
    write_shards,
)

REPO = Path(__file__).resolve().parents[2]
SMALL = BuildConfig(out="", vocab_size=512, shard_tokens=8192, max_bytes=250_000, val_fraction=0.05)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data directory built from ~250 kB of stdlib sources (several shards per split)."""
    out = tmp_path_factory.mktemp("data") / "small"
    build(BuildConfig(**{**vars(SMALL), "out": str(out)}))
    return out


@pytest.fixture
def synthetic(tmp_path: Path) -> Path:
    """Tokens 0..9999 (so window contents are known), in shards of 1000 tokens that windows straddle."""
    write_shards(
        tmp_path / "syn",
        {"train": np.arange(10_000), "val": np.arange(2_000)},
        vocab_size=10_000,
        shard_tokens=1000,
    )
    return tmp_path / "syn"


def _files(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


def test_build_twice_is_byte_identical(built: Path, tmp_path: Path) -> None:
    again = tmp_path / "again"
    argv = [sys.executable, "-m", "trainer_ref.data", "build", "--out", str(again)]
    argv += ["--vocab-size", "512", "--shard-tokens", "8192", "--max-bytes", "250000", "--val-fraction", "0.05"]
    subprocess.run(argv, cwd=REPO, check=True, capture_output=True, timeout=120)
    assert _files(again) == _files(built)
    _, mismatch, errors = filecmp.cmpfiles(built, again, _files(built), shallow=False)
    assert mismatch == errors == []


def test_index_describes_the_shards(built: Path) -> None:
    index = read_index(built)
    assert index["dtype"] == "uint16" and index["vocab_size"] <= 512 and index["eot_id"] == 0
    assert index["tokenizer"] == "tokenizer.json" and index["corpus"]["bytes"] <= 250_000
    names = {"index.json", "tokenizer.json"}
    for split in ("train", "val"):
        shards = index["splits"][split]["shards"]
        assert shards and all(s["tokens"] == 8192 for s in shards[:-1])
        assert index["splits"][split]["tokens"] == sum(s["tokens"] for s in shards)
        for shard in shards:
            data = (built / shard["name"]).read_bytes()
            assert hashlib.sha256(data).hexdigest() == shard["sha256"] and len(data) == 2 * shard["tokens"]
            names.add(shard["name"])
    assert len(index["splits"]["train"]["shards"]) >= 3
    assert set(_files(built)) == names
    assert verify(built) == []


def test_shards_hold_the_documents_separated_by_eot(built: Path) -> None:
    tok = load_tokenizer(built)
    docs, _ = collect_corpus(max_bytes=SMALL.max_bytes)
    train_docs, val_docs = _split_documents(docs, SMALL.val_fraction)
    for split, expected in (("train", train_docs), ("val", val_docs)):
        with TokenShards(built, split) as shards:
            stream = shards.read(0, shards.num_tokens)
        assert stream[-1] == tok.token_to_id(EOT_TOKEN)
        pieces = np.split(stream, np.flatnonzero(stream == 0) + 1)[:-1]
        assert [tok.decode(p[:-1].tolist()) for p in pieces] == [d.text for d in expected]


def test_tokenizer_round_trips_stdlib_sources(built: Path) -> None:
    tok = load_tokenizer(built)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    # Files outside the tiny training subset, with non-ASCII identifiers, tabs, and long lines.
    for rel in ("os.py", "test/test_unicode_identifiers.py", "tabnanny.py", "email/_header_value_parser.py"):
        text = (stdlib / rel).read_text(encoding="utf-8")
        assert tok.decode(tok.encode(text).ids) == text
    odd = f"x = '{EOT_TOKEN}'\n\t\u00e9\u4e2d\U0001f600  \r\n"
    ids = tok.encode(odd).ids
    assert tok.token_to_id(EOT_TOKEN) not in ids and tok.decode(ids) == odd


def test_verify_and_open_detect_damage(built: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(built, copy)
    shard = copy / "train-00001.bin"
    data = bytearray(shard.read_bytes())
    data[10] ^= 1
    shard.write_bytes(bytes(data))
    assert [p.split(":")[0] for p in verify(copy)] == ["train/train-00001.bin"]
    with pytest.raises(DataError):
        TokenShards(copy, check_sha256=True)
    shard.write_bytes(bytes(data[:-2]))
    with pytest.raises(DataError, match="size"):
        TokenShards(copy)
    (copy / "index.json").unlink()
    with pytest.raises(FileNotFoundError):
        TokenShards(copy)


def test_reads_use_plain_file_io(synthetic: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("mmap used")

    moved = tmp_path / "elsewhere" / "data"
    shutil.copytree(synthetic, moved)
    monkeypatch.setattr(mmap, "mmap", forbidden)
    monkeypatch.setattr(np, "memmap", forbidden)
    monkeypatch.setattr(np, "fromfile", forbidden)
    monkeypatch.setattr(torch, "from_file", forbidden)
    with TokenShards(moved) as shards:
        assert shards.num_tokens == 10_000
        assert shards.read(995, 10).tolist() == list(range(995, 1005))  # across a shard boundary
        assert shards.read(0, 2500).tolist() == list(range(2500))  # across three shards
        with pytest.raises(IndexError):
            shards.read(9995, 6)
    with ShardDataset(moved, seq_len=7, micro_batch=3) as ds:
        batch = ds.next_batch()
    for row in range(3):
        start = int(batch.x[row, 0])
        assert start % 7 == 0
        assert batch.x[row].tolist() == list(range(start, start + 7))
    assert torch.equal(batch.y, batch.x + 1)
    assert batch.x.dtype == batch.y.dtype == torch.int64 and batch.x.shape == (3, 7)


def test_ranks_are_disjoint_and_cover_the_epoch() -> None:
    num_windows, micro_batch = 103, 4
    ranks = [WindowSampler(num_windows, micro_batch=micro_batch, dp_rank=r, dp_world=2, seed=5) for r in range(2)]
    assert ranks[0].batches_per_epoch == ranks[1].batches_per_epoch == 12
    seen = [[], []]
    for _ in range(12):
        for r, sampler in enumerate(ranks):
            batch_id = sampler.next_id()
            assert batch_id.epoch == 0
            seen[r].extend(sampler.windows(batch_id).tolist())
    assert not set(seen[0]) & set(seen[1])
    everything = seen[0] + seen[1]
    assert len(everything) == len(set(everything)) == 96
    perm = _permutation(num_windows, 5, 0).tolist()
    assert set(everything) == set(perm[:96])  # only the 103 % 8 = 7 tail windows are dropped
    assert ranks[0].next_id() == BatchId(1, 0)
    assert ranks[0].windows(BatchId(1, 0)).tolist() != ranks[0].windows(BatchId(0, 0)).tolist()


def test_permutation_is_pinned() -> None:
    # Integer hashing only, so the order cannot change with numpy or torch versions.
    assert _permutation(10, 0, 0).tolist() == [0, 7, 3, 1, 9, 5, 4, 6, 8, 2]
    assert _permutation(10, 0, 1).tolist() == [4, 5, 0, 8, 6, 3, 9, 1, 2, 7]
    assert sorted(_permutation(1000, 3, 2).tolist()) == list(range(1000))


def _take(ds: ShardDataset, n: int) -> list:
    return [ds.next_batch() for _ in range(n)]


def _same(a: list, b: list) -> bool:
    return all(
        x.batch_id == y.batch_id and torch.equal(x.x, y.x) and torch.equal(x.y, y.y) for x, y in zip(a, b, strict=True)
    )


def test_resume_reproduces_next_batches_bitwise(built: Path) -> None:
    kwargs = dict(seq_len=64, micro_batch=4, dp_rank=1, dp_world=2, seed=11)
    with ShardDataset(built, **kwargs) as run:
        per_epoch = run.batches_per_epoch
        _take(run, per_epoch - 3)
        state = json.loads(json.dumps(run.state_dict()))  # plain types only
        expected = _take(run, 8)  # crosses into epoch 1
    assert expected[3].batch_id == BatchId(1, 0)
    with ShardDataset(built, **kwargs) as resumed, ShardDataset(built, **kwargs) as fresh:
        assert _same(_take(resumed, 2), _take(fresh, 2))  # fresh starts agree too
        resumed.load_state_dict(state)
        assert _same(_take(resumed, 8), expected)


def test_deferred_batch_comes_back_and_survives_resume(built: Path) -> None:
    kwargs = dict(seq_len=64, micro_batch=2, seed=3)
    with ShardDataset(built, **kwargs) as run:
        _take(run, 5)
        spiked = run.next_batch()
        run.defer(spiked.batch_id, delay=3)
        with pytest.raises(ValueError, match="already deferred"):
            run.defer(spiked.batch_id)
        assert run.sampler.deferred == [spiked.batch_id]
        state = json.loads(json.dumps(run.state_dict()))  # saved between skip and retry
        rest = _take(run, 6)
    assert [b.batch_id for b in rest] == [
        BatchId(0, 6),
        BatchId(0, 7),
        BatchId(0, 8),
        spiked.batch_id,
        BatchId(0, 9),
        BatchId(0, 10),
    ]
    assert torch.equal(rest[3].x, spiked.x) and torch.equal(rest[3].y, spiked.y)
    with ShardDataset(built, **kwargs) as resumed:
        resumed.load_state_dict(state)
        assert resumed.sampler.deferred == [spiked.batch_id]
        assert _same(_take(resumed, 6), rest)
        assert resumed.sampler.deferred == []


def test_deferred_batch_from_previous_epoch(synthetic: Path) -> None:
    with ShardDataset(synthetic, seq_len=10, micro_batch=100) as ds:
        assert ds.batches_per_epoch == 9
        batches = _take(ds, 9)
        ds.defer(batches[-1].batch_id, delay=0)
        again = ds.next_batch()
        assert again.batch_id == BatchId(0, 8) and torch.equal(again.x, batches[-1].x)
        assert ds.next_batch().batch_id == BatchId(1, 0)


def test_state_must_match_layout_and_data(built: Path, synthetic: Path) -> None:
    with ShardDataset(built, seq_len=64, micro_batch=4, dp_world=2) as ds:
        state = ds.state_dict()
    with (
        ShardDataset(built, seq_len=64, micro_batch=4, dp_world=4) as other,
        pytest.raises(ValueError, match="dp_world"),
    ):
        other.load_state_dict(state)
    with ShardDataset(built, seq_len=64, micro_batch=4, dp_rank=1, dp_world=2) as other_rank:
        other_rank.load_state_dict(state)  # the cursor does not depend on the rank
    with ShardDataset(synthetic, seq_len=64, micro_batch=4, dp_world=2) as other_data, pytest.raises(DataError):
        other_data.load_state_dict(state)
    with pytest.raises(ValueError, match="fewer"):
        ShardDataset(synthetic, seq_len=1000, micro_batch=10)


def test_eval_batches_split_across_ranks(synthetic: Path) -> None:
    firsts = []
    for rank in range(2):
        with ShardDataset(synthetic, split="val", seq_len=10, micro_batch=4, dp_rank=rank, dp_world=2) as ds:
            batches = list(ds.eval_batches())
            assert len(batches) == 24 and len(list(ds.eval_batches(max_batches=3))) == 3
            assert ds.sampler.served == 0
            firsts.append({int(x) for b in batches for x in b.x[:, 0]})
    assert not firsts[0] & firsts[1] and len(firsts[0] | firsts[1]) == 192


def test_cli_usage_and_verify_exit_codes(built: Path, tmp_path: Path) -> None:
    from trainer_ref.data import main

    assert main(["verify", str(built)]) == 0
    with pytest.raises(SystemExit) as exc:
        main(["build"])
    assert exc.value.code == 3
    copy = tmp_path / "copy"
    shutil.copytree(built, copy)
    os.truncate(copy / "val-00000.bin", 10)
    assert main(["verify", str(copy)]) == 1
    assert main(["verify", str(tmp_path / "missing")]) == 2
