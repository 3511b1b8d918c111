"""Where an embedded master (``dlrover-run --standalone``) writes the job's event log."""

from __future__ import annotations

from pathlib import Path

from dlrover.launcher.args import parse_args
from dlrover.launcher.cli import _event_log_path


def test_with_a_log_dir_each_run_gets_its_own_event_log_there(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    cfg = parse_args(["--standalone", f"--log-dir={logs}", "train.py"])
    first = Path(_event_log_path(cfg, "team/job 1") or "")
    second = Path(_event_log_path(cfg, "team/job 1") or "")
    # In the log dir, named after the job (a path separator cannot move it elsewhere), one per run.
    assert first.parent == second.parent == logs
    assert first.name.startswith("team_job_1_")
    assert first.name.endswith("_events.jsonl")
    assert first != second
    assert oct(first.stat().st_mode & 0o777) == oct(0o600)


def test_without_a_log_dir_there_is_none(tmp_path: Path) -> None:
    assert _event_log_path(parse_args(["--standalone", "train.py"]), "standalone") is None
