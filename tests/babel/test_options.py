"""Sync options: one set of rules, applied alike by ``babel sync`` and by the daemon."""

from __future__ import annotations

import json
from dataclasses import asdict, fields
from pathlib import Path

import pytest

from babel.cli.main import main as babel_main
from babel.options import RULES, BadOption, SyncOptions, options_from_dict

MiB = 1 << 20


def test_every_option_has_a_rule_and_the_defaults_pass() -> None:
    assert set(RULES) == {f.name for f in fields(SyncOptions)}
    assert SyncOptions().check() == SyncOptions()
    opts = SyncOptions(include=("*.pt",), part_size=5 * MiB, memory=8 * MiB, bwlimit=1.5e6, verify="full")
    assert options_from_dict(json.loads(json.dumps(asdict(opts)))) == opts


# (flag, value on the command line, option name, value in JSON): each refused by both
REFUSED = [
    ("--memory", "1K", "memory", 1024),
    ("--part-size", "512K", "part_size", 512 * 1024),
    ("--bwlimit", "0", "bwlimit", 0),
    ("--checkers", "0", "checkers", 0),
    ("--transfers", "2000", "transfers", 2000),
    ("--samples", "1", "samples", 1),
    ("--include", "", "include", [""]),
    ("--exclude", "", "exclude", [""]),
    ("--part-size", "6G", "part_size", 6 << 30),  # S3's largest part is 5 GiB
    ("--bwlimit", "1e400", "bwlimit", float("inf")),
    ("--memory", "1e30", "memory", 10**30),
]


@pytest.mark.parametrize(("flag", "arg", "name", "value"), REFUSED, ids=[r[0] for r in REFUSED])
def test_the_cli_and_the_daemon_refuse_the_same_values(
    tmp_path: Path, capsys: pytest.CaptureFixture, flag: str, arg: str, name: str, value: object
) -> None:
    (tmp_path / "src").mkdir()
    dst = tmp_path / "dst"
    rc = babel_main(["sync", f"file://{tmp_path}/src", f"file://{dst}", flag, arg, "--state-dir", str(tmp_path / "s")])
    assert rc == 3, capsys.readouterr().err
    assert flag in capsys.readouterr().err
    assert not dst.exists() and not (tmp_path / "s").exists()  # refused before anything was created
    with pytest.raises(BadOption) as info:
        options_from_dict({name: value})
    assert info.value.field == name and str(info.value).startswith(name)


def test_sizes_in_json_take_the_cli_forms() -> None:
    assert options_from_dict({"memory": "512M", "part_size": 8 * MiB * 1.0, "bwlimit": "10M"}) == SyncOptions(
        memory=512 * MiB, part_size=8 * MiB, bwlimit=10 * MiB
    )
    for bad, why in [({"memory": "lots"}, "is not a size"), ({"memory": True}, "whole number of bytes")]:
        with pytest.raises(BadOption, match=why):
            options_from_dict(bad)


def test_a_library_caller_is_refused_too(tmp_path: Path) -> None:
    import asyncio

    from babel.sync import run_sync

    with pytest.raises(BadOption, match="memory must be at least 1.0 MiB"):
        asyncio.run(run_sync(f"file://{tmp_path}", "file:///nonexistent-dst", SyncOptions(memory=1),
                             state_dir=str(tmp_path / "s")))  # fmt: skip
    assert not (tmp_path / "s").exists()
