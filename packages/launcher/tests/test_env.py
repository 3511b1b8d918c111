from __future__ import annotations

from dlrover.launcher import WorkerIdentity, worker_env

TORCHRUN_VARIABLES = {
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
}


def _identity(local_world_size: int = 2) -> WorkerIdentity:
    return WorkerIdentity(
        rank=3,
        local_rank=1,
        world_size=4,
        local_world_size=local_world_size,
        group_rank=1,
        group_world_size=2,
        role_rank=3,
        role_world_size=4,
    )


def test_worker_env_sets_the_torchrun_contract() -> None:
    env = worker_env(
        {"PATH": "/bin"},
        _identity(),
        master_addr="10.0.0.1",
        master_port=29500,
        run_id="job",
        restart_count=2,
        max_restarts=5,
        extra={"DLROVER_NODE_ID": "n1"},
    )
    assert env.keys() >= TORCHRUN_VARIABLES
    assert env["RANK"] == "3"
    assert env["LOCAL_RANK"] == "1"
    assert env["GROUP_WORLD_SIZE"] == "2"
    assert env["TORCHELASTIC_RESTART_COUNT"] == "2"
    assert env["TORCHELASTIC_MAX_RESTARTS"] == "5"
    assert env["MASTER_PORT"] == "29500"
    assert env["DLROVER_NODE_ID"] == "n1"
    assert env["PATH"] == "/bin"
    assert env["OMP_NUM_THREADS"] == "1"


def test_users_omp_setting_and_single_worker_are_left_alone() -> None:
    kwargs = {"master_addr": "h", "master_port": 1, "run_id": "r", "restart_count": 0, "max_restarts": 0}
    assert worker_env({"OMP_NUM_THREADS": "4"}, _identity(), **kwargs)["OMP_NUM_THREADS"] == "4"  # type: ignore[arg-type]
    assert "OMP_NUM_THREADS" not in worker_env({}, _identity(local_world_size=1), **kwargs)  # type: ignore[arg-type]


def test_virtual_local_rank_shows_each_worker_only_its_own_gpu_as_device_0() -> None:
    import pytest

    from dlrover.common import ConfigError

    kw = {"master_addr": "h", "master_port": 1, "run_id": "r", "restart_count": 0, "max_restarts": 0}
    env = worker_env({"CUDA_VISIBLE_DEVICES": "4, 6"}, _identity(), virtual_local_rank=True, **kw)  # type: ignore[arg-type]
    assert (env["LOCAL_RANK"], env["CUDA_VISIBLE_DEVICES"]) == ("0", "6")
    env = worker_env({}, _identity(), virtual_local_rank=True, **kw)  # type: ignore[arg-type]
    assert (env["LOCAL_RANK"], env["CUDA_VISIBLE_DEVICES"]) == ("0", "1")
    plain = worker_env({"CUDA_VISIBLE_DEVICES": "4,6"}, _identity(), **kw)  # type: ignore[arg-type]
    assert (plain["LOCAL_RANK"], plain["CUDA_VISIBLE_DEVICES"]) == ("1", "4,6")
    with pytest.raises(ConfigError, match="local rank 1 has no device"):
        worker_env({"CUDA_VISIBLE_DEVICES": "4"}, _identity(), virtual_local_rank=True, **kw)  # type: ignore[arg-type]
