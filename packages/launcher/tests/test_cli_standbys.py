"""`dlrover-run` starts its standby workers before it imports the agent, so that their imports (torch's)
run beside its own start rather than after it: on the path of every node start, a replacement's included."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

# Parses a command line as dlrover-run does, starts the standbys, and says what was imported by then.
_PROBE = """
import json, sys
from dlrover.launcher.args import parse_args
from dlrover.launcher.cli import early_standbys

pool = early_standbys(parse_args(sys.argv[1:]))
loaded = {name: name in sys.modules for name in ("dlrover.launcher.agent", "grpc", "dlrover.master", "torch")}
try:
    warm = pool is not None and pool.wait_warm(120.0)
    print(json.dumps({"pool": pool is not None, "warm": warm, "loaded": loaded}))
finally:
    if pool is not None:
        pool.close()
"""


def _probe(tmp_path: Path, *flags: str) -> dict[str, object]:
    script = tmp_path / "train.py"
    script.write_text("print('trained')\n")
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, "--standalone", *flags, str(script)],
        capture_output=True,
        text=True,
        timeout=150,
        check=True,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def test_the_standbys_start_before_the_agent_grpc_or_the_master_is_imported(tmp_path: Path) -> None:
    probe = _probe(tmp_path, "--nproc-per-node=2", "--prewarm=json")
    assert probe["pool"], probe
    assert probe["warm"], probe
    assert probe["loaded"] == {"dlrover.launcher.agent": False, "grpc": False, "dlrover.master": False, "torch": False}


@pytest.mark.parametrize("flags", [("--prewarm=none",), ("--no-python",)])
def test_no_standbys_start_early_without_prewarm_or_for_a_program_a_standby_cannot_run(
    tmp_path: Path, flags: tuple[str, ...]
) -> None:
    assert _probe(tmp_path, "--nproc-per-node=2", *flags)["pool"] is False
