"""What the babel CLI prints: the summary table of a dry run, the job list in a narrow terminal."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from babel.cli.common import print_report
from babel.cli.main import cli
from babel.sync import SyncReport


def test_dry_run_says_would_delete(capsys) -> None:
    report = SyncReport(
        job="j", src="file:///a", dst="file:///b", state="ok", dry_run=True, deleted=3, planned_delete=3
    )
    print_report(report, as_json=False)
    err = capsys.readouterr().err
    assert "would delete" in err and "would copy" in err
    report.dry_run = False
    print_report(report, as_json=False)
    err = capsys.readouterr().err
    assert "would" not in err and "deleted" in err


def test_jobs_table_keeps_the_whole_id_in_80_columns(tmp_path: Path) -> None:
    job_id = "20261201-060843-20a061"
    (tmp_path / job_id).mkdir()
    (tmp_path / job_id / "job.json").write_text(
        json.dumps({"id": job_id, "kind": "sync", "state": "interrupted", "phase": "copying", "updated": 0,
                    "src": "file:///data/shards", "dst": "s3://train/shards?endpoint_url=http://10.0.0.5:9000"})
    )  # fmt: skip
    result = CliRunner().invoke(cli, ["jobs", "--state-dir", str(tmp_path)], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert job_id in result.output


def test_progress_has_a_total_in_every_phase_that_knows_one() -> None:
    """Copying counts bytes of the bytes to copy; planning, deleting and verifying count objects
    of theirs (a bar and an ETA); listing, whose total nobody knows yet, counts what it found."""
    from babel.cli.common import RichProgress

    with RichProgress(enabled=False) as bar:
        bar.phase("listing", 0, 0)
        bar.advance(0, 500)
        assert bar.bar.tasks[-1].total is None and bar.bar.tasks[-1].fields["amount"] == "500 found"
        bar.phase("planning", 0, 40)
        bar.advance(0, 10)
        task = bar.bar.tasks[-1]
        assert (task.completed, task.total, task.fields["amount"]) == (10, 40, "10 of 40 obj")
        bar.phase("copying", 1 << 20, 4)
        bar.advance(1 << 19, 2)
        task = bar.bar.tasks[-1]
        assert (task.completed, task.total) == (1 << 19, 1 << 20)
        assert task.fields["amount"].startswith("512.0 KiB of 1.0 MiB") and task.fields["objects"] == 2
        bar.phase("verifying", 0, 4)
        bar.advance(0, 4)
        assert bar.bar.tasks[-1].finished


def test_jobs_started_within_one_second_list_newest_first(tmp_path: Path) -> None:
    """Job ids are sortable to the second only: their random part must not decide which of two
    jobs of one second is the newest (`babel jobs` listed a failed earlier job above the one
    just run, and the daemon resumed queued jobs out of order)."""
    from babel.journal import Journal, list_jobs

    first, second = "20261205-223810-ffffff", "20261205-223810-000000"  # the later one sorts first by name
    for job_id, state in ((first, "failed"), (second, "ok")):
        journal = Journal(str(tmp_path), job_id, create=True)
        journal.update(state=state)
        journal.close()
    older = "20261205-223809-aaaaaa"
    (tmp_path / older).mkdir()
    (tmp_path / older / "job.json").write_text(json.dumps({"id": older, "state": "ok"}))  # written before `created`
    assert [j["id"] for j in list_jobs(str(tmp_path))] == [second, first, older]
    result = CliRunner().invoke(cli, ["jobs", "--state-dir", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    assert [j["state"] for j in json.loads(result.output)] == ["ok", "failed", "ok"]


def test_a_chunk_of_a_shared_job_is_not_resumed_alone(tmp_path: Path) -> None:
    """A process that lost its lease leaves its chunk's journal, which ``babel jobs`` lists as
    interrupted; resumed with ``--resume`` it copied beside the shard's owner with no claim and
    no fencing. It is refused, naming the command that resumes it."""
    from babel.journal import Journal

    chunk = "j1.000005.0005"
    journal = Journal(str(tmp_path), chunk, create=True)
    journal.update(kind="shared", shared="j1", src="file:///a", dst="file:///b", options={}, state="running")
    journal.close()
    result = CliRunner().invoke(cli, ["sync", "--resume", chunk, "--state-dir", str(tmp_path)])
    assert result.exit_code != 0  # the CLI's entry point prints it as one line (exit 3)
    assert "chunk of shared job 'j1'" in str(result.exception) and "--etcd HOST:PORT --job j1" in str(result.exception)
