"""`resolve_identity`: job and run ids, rank and world size as a pure function of the environment,
torch.distributed's state and the launching process."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlrover.common import ConfigError
from dlrover.common.process import ProcessIdentity
from dlrover.flashckpt import FlashCheckpointer, StagerConfig
from dlrover.flashckpt.job_env import (
    JOB_ID_ENV_VAR,
    LOCAL_JOB_ID,
    DistState,
    resolve_identity,
    run_id_for,
    safe_job_id,
)
from dlrover.flashckpt.segment import validate_id

NO_DIST = DistState(False)
AGENT = ProcessIdentity(4321, 98765)
URL = "/ckpt"


def _resolve(env: dict[str, str], dist: DistState = NO_DIST, **given: object) -> tuple[str, str, int, int]:
    ident = resolve_identity(env, dist, storage_url=URL, launcher=AGENT, **given)  # type: ignore[arg-type]
    return ident.job_id, ident.run_id, ident.rank, ident.world_size


def test_dlrover_run_names_the_job_and_torch_distributed_the_ranks() -> None:
    env = {JOB_ID_ENV_VAR: "b0c1-uuid", "TORCHELASTIC_RUN_ID": "other", "RANK": "1", "WORLD_SIZE": "2"}
    assert _resolve(env) == ("b0c1-uuid", run_id_for(URL), 1, 2)
    # An initialised default group wins over the environment.
    assert _resolve(env, DistState(True, 3, 4)) == ("b0c1-uuid", run_id_for(URL), 3, 4)


def test_torchrun_run_id_names_the_job_made_safe_for_file_names() -> None:
    uuid_run = "0f8e5a2c-1b7d-4c55-9d0e-3f2a1b4c5d6e"
    assert _resolve({"TORCHELASTIC_RUN_ID": uuid_run, "RANK": "0", "WORLD_SIZE": "2"})[0] == uuid_run
    odd = _resolve({"TORCHELASTIC_RUN_ID": "my.job/7", "RANK": "0", "WORLD_SIZE": "1"})[0]
    assert validate_id("job", odd) == odd
    assert odd.startswith("my-job-7-")
    assert odd != _resolve({"TORCHELASTIC_RUN_ID": "my.job.7"})[0]  # distinct ids stay distinct


def test_torchrun_without_a_run_id_names_the_job_after_its_agent() -> None:
    job = _resolve({"TORCHELASTIC_RUN_ID": "none", "RANK": "0", "WORLD_SIZE": "2"})[0]
    assert job == "torchrun-4321-98765"
    with pytest.raises(ConfigError, match=r"TORCHELASTIC_RUN_ID is 'none'.*--rdzv-id"):
        resolve_identity({"TORCHELASTIC_RUN_ID": "none"}, NO_DIST, storage_url=URL, launcher=None)


def test_no_launcher_is_one_local_process() -> None:
    ident = resolve_identity({}, NO_DIST, storage_url=URL)
    assert (ident.job_id, ident.rank, ident.world_size, ident.rank_source) == (LOCAL_JOB_ID, 0, 1, "single process")
    assert "no launcher names the job" in ident.reason


def test_the_run_id_follows_the_storage_location() -> None:
    assert run_id_for("/a") != run_id_for("/b")
    assert run_id_for("/a") == run_id_for("/a")
    assert validate_id("run", run_id_for("s3://bucket/prefix")) == run_id_for("s3://bucket/prefix")
    assert run_id_for(None) == "ck"


def test_explicit_arguments_override_the_environment() -> None:
    env = {JOB_ID_ENV_VAR: "envjob", "RANK": "1", "WORLD_SIZE": "2"}
    assert _resolve(env, job_id="mine", run_id="r9", rank=0, world_size=1) == ("mine", "r9", 0, 1)
    assert _resolve(env, DistState(True, 1, 2), rank=0) == ("envjob", run_id_for(URL), 0, 2)
    ident = resolve_identity(env, NO_DIST, storage_url=URL, job_id="mine")
    assert "job id 'mine' given" in ident.reason
    assert "rank 1 of 2 from RANK/WORLD_SIZE" in ident.reason


@pytest.mark.parametrize(
    ("env", "given", "message"),
    [
        ({"RANK": "1"}, {}, r"RANK=1 is set but WORLD_SIZE is not"),
        ({"WORLD_SIZE": "2"}, {}, r"WORLD_SIZE=2 is set but RANK is not"),
        ({"RANK": "x", "WORLD_SIZE": "2"}, {}, r"RANK must be an integer, got 'x'"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, {}, r"rank 2 is not within world size 2 \(from RANK/WORLD_SIZE\)"),
        ({}, {"rank": 1}, r"rank= was given but not world_size="),
        ({}, {"world_size": 2}, r"world_size= was given but not rank="),
        ({JOB_ID_ENV_VAR: "a/b"}, {}, r"DLROVER_JOB_ID='a/b' must be"),
    ],
)
def test_an_ambiguous_or_malformed_environment_is_refused_naming_what_is_missing(
    env: dict[str, str], given: dict[str, int], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve_identity(env, NO_DIST, storage_url=URL, launcher=AGENT, **given)  # type: ignore[arg-type]


def test_safe_job_id() -> None:
    assert safe_job_id("abc_D-9") == "abc_D-9"
    long = "x" * 100
    assert len(safe_job_id(long)) <= 64
    assert safe_job_id(long) != safe_job_id(long + "y")
    with pytest.raises(ConfigError):
        safe_job_id("")


def test_the_one_liner_takes_its_identity_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, shm: Path
) -> None:
    monkeypatch.setenv("DLROVER_FLASHCKPT_SHM_DIR", str(shm))
    for name in ("TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE", "DLROVER_FLASHCKPT_HOST"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(JOB_ID_ENV_VAR, "onelinerjob")
    ckpt = FlashCheckpointer(tmp_path / "ck", saver="none")
    try:
        c = ckpt.config
        assert (c.job_id, c.run_id, c.rank, c.world_size) == ("onelinerjob", run_id_for(str(tmp_path / "ck")), 0, 1)
        assert c.shm_dir == str(shm)
        assert "DLROVER_JOB_ID" in ckpt.identity_reason
    finally:
        ckpt.close(job_end=True)
    assert not list(shm.iterdir())


def test_ids_beside_a_stager_config_or_a_directory_twice_are_refused(tmp_path: Path, job_id: str) -> None:
    cfg = StagerConfig(job_id=job_id, run_id="r")
    with pytest.raises(ConfigError, match="rank given beside a StagerConfig"):
        FlashCheckpointer(cfg, str(tmp_path), saver="none", rank=0)
    with pytest.raises(ConfigError, match="passed twice"):
        FlashCheckpointer(str(tmp_path), str(tmp_path), saver="none")
    with pytest.raises(ConfigError, match="passed twice"):
        FlashCheckpointer(cfg, config=cfg, storage_dir=str(tmp_path), saver="none")


def test_several_ranks_without_a_process_group_fail_at_load_naming_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, shm: Path
) -> None:
    # Saving needs no process group (each rank writes its own memory); agreeing on what to load does.
    monkeypatch.setenv("DLROVER_FLASHCKPT_SHM_DIR", str(shm))
    monkeypatch.delenv("DLROVER_FLASHCKPT_HOST", raising=False)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "nogroup")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    ckpt = FlashCheckpointer(str(tmp_path / "ck"), saver="none")
    try:
        assert ckpt.save(1, {"w": __import__("torch").ones(4)}).saved
        with pytest.raises(ConfigError, match=r"world size 2 \(from RANK/WORLD_SIZE\).*init_process_group"):
            ckpt.load()
    finally:
        ckpt.close(job_end=True)
