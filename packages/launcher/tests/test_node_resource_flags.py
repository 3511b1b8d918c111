"""`dlrover-run --standalone --node-cpu/--node-memory/--node-gpus/--node-gpu-type`: checked when parsed, and
handed to the master the agent runs."""

from __future__ import annotations

import pytest

from dlrover.autoscale import Resources
from dlrover.common import ConfigError
from dlrover.launcher import parse_args
from dlrover.launcher.peer_master import embedded_lifecycle

pytestmark = pytest.mark.timeout(120)


def test_no_resource_flag_asks_for_nothing() -> None:
    cfg = parse_args(["--standalone", "t.py"])
    assert cfg.node_resources is None
    assert embedded_lifecycle(cfg).node_resources is None


def test_resource_flags_reach_the_embedded_masters_worker_group() -> None:
    cfg = parse_args(
        ["--standalone", "--node-cpu=2", "--node_memory=1.5Gi", "--node-gpus=1", "--node-gpu-type=nvidia-h100", "t.py"]
    )
    expected = Resources(cpu=2, memory_mb=1536, gpu=1, gpu_type="nvidia-h100")
    assert cfg.node_resources == expected
    assert embedded_lifecycle(cfg).worker_group.resources == expected


@pytest.mark.parametrize(
    ("flag", "match"),
    [
        ("--node-memory=8G", r"--node-memory: memory size '8G' is not understood"),
        ("--node-cpu=x", r"--node-cpu must be a number, got 'x'"),
        ("--node-gpu-type=nvidia-h100", r"--node-gpu-type 'nvidia-h100' needs --node-gpus"),
    ],
)
def test_malformed_resource_flags_are_refused_naming_the_value(flag: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_args(["--standalone", flag, "t.py"])
