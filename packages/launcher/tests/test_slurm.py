"""`srun dlrover-run`: the step's environment fills in the job's nodes and meeting point."""

from __future__ import annotations

import pytest

from dlrover.common import ConfigError
from dlrover.launcher.args import NodeRange, parse_args
from dlrover.launcher.slurm import SlurmStep, expand_hostlist, slurm_step


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("node1", ["node1"]),
        ("a,b", ["a", "b"]),
        ("node[1-3]", ["node1", "node2", "node3"]),
        ("node[01-03,7]", ["node01", "node02", "node03", "node7"]),  # each range has its own width
        ("gpu[8-10]", ["gpu8", "gpu9", "gpu10"]),
        ("gpu[08-10]", ["gpu08", "gpu09", "gpu10"]),
        ("x[1-2]-ib,y", ["x1-ib", "x2-ib", "y"]),
        ("r[1-2]n[3-4]", ["r1n3", "r1n4", "r2n3", "r2n4"]),
        (" a , b[1-1] ", ["a", "b1"]),
    ],
)
def test_hostlists_expand_in_order(text: str, hosts: list[str]) -> None:
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("node[1-3", "leaves a bracket open"),
        ("node1-3]", "closes a bracket it never opened"),
        ("n[[1]]", "nests brackets"),
        ("n[3-1]", "descending range"),
        ("n[a-b]", "bad range"),
        ("", "names no host"),
        ("n[0-9999999]", "more than"),
        ("r[1-100000]n[1-100000]", "more than"),  # each range is small; their product is not
    ],
)
def test_bad_hostlists_are_refused(text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        expand_hostlist(text)


STEP = {
    "SLURM_JOB_ID": "4242",
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_NUM_NODES": "3",
    "SLURM_NODEID": "1",
    "SLURM_STEP_NODELIST": "gpu[07-09]",
    "SLURM_JOB_NODELIST": "gpu[01-09]",
}


def test_a_multi_node_step_is_read_from_the_environment() -> None:
    assert slurm_step(STEP) == SlurmStep("4242", "0", 3, 1, "gpu07")
    assert slurm_step(STEP).run_id == "4242.0"  # type: ignore[union-attr]
    # An allocation without a step (sbatch's script itself): the job's node list.
    batch = {k: v for k, v in STEP.items() if not k.startswith("SLURM_STEP")} | {"SLURM_NNODES": "9"}
    assert slurm_step(batch) == SlurmStep("4242", "", 9, 1, "gpu01")


@pytest.mark.parametrize(
    "env",
    [
        {},  # not under Slurm
        {**STEP, "SLURM_STEP_NUM_NODES": "1", "SLURM_STEP_NODELIST": "gpu07"},  # one node: nothing to meet
        {k: v for k, v in STEP.items() if k != "SLURM_NODEID"},
    ],
)
def test_no_multi_node_step(env: dict[str, str]) -> None:
    assert slurm_step(env) is None


def test_a_contradicting_step_is_refused() -> None:
    with pytest.raises(ConfigError, match="names 3 nodes, the step has 4"):
        slurm_step({**STEP, "SLURM_STEP_NUM_NODES": "4"})
    with pytest.raises(ConfigError, match="SLURM_NODEID=5 is not below"):
        slurm_step({**STEP, "SLURM_NODEID": "5"})


def test_srun_fills_in_the_nodes_the_meeting_point_and_the_run_id() -> None:
    cfg = parse_args(["--nproc-per-node=2", "--token-file=/shared/t", "train.py"], env=STEP)
    assert cfg.nodes == NodeRange(3, 3)
    assert (cfg.rdzv_backend, cfg.master_addr, cfg.node_rank) == ("static", "gpu07", 1)
    assert cfg.rdzv_id == "4242.0"
    assert cfg.slurm == slurm_step(STEP)
    # A port and a run id given on the command line are kept.
    cfg = parse_args(["--master-port=6000", "--rdzv-id=mine", "train.py"], env=STEP)
    assert (cfg.master_port, cfg.rdzv_id) == (6000, "mine")


@pytest.mark.parametrize(
    "flags",
    [
        ["--nnodes=1"],  # the user's own choice wins
        ["--standalone"],
        ["--master=head:5000"],
        ["--rdzv-backend=c10d", "--rdzv-endpoint=head:29400"],
        ["--nnodes=3", "--node-rank=2", "--master-addr=head"],
        ["--master-addr=head-ib0"],  # where they meet, e.g. another interface of the first host
    ],
)
def test_a_command_line_that_names_its_nodes_is_left_alone(flags: list[str]) -> None:
    cfg = parse_args([*flags, "train.py"], env=STEP)
    assert cfg.slurm is None


def test_outside_slurm_one_node_is_the_default() -> None:
    assert parse_args(["train.py"], env={}).nodes == NodeRange(1, 1)
    assert parse_args(["train.py"], env={"DLROVER_MASTER_ADDR": "h:1", **STEP}).slurm is None
