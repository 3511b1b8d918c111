"""dlrover-run counts accelerators only where its flags size the node by them, and without importing
torch where no GPU driver is present: that import costs the agent seconds of CPU before its node can
register (every node start pays it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dlrover.common import ConfigError
from dlrover.launcher import cli
from dlrover.launcher.cli import _accelerator_driver_present


@pytest.mark.parametrize(
    "made",
    [(), ("dev/nvidiactl",), ("dev/nvidia0",), ("proc/driver/nvidia/",), ("dev/kfd",), ("dev/nvidia-uvm",)],
)
def test_a_gpu_driver_is_recognised_by_its_device_files_or_proc_entry(tmp_path: Path, made: tuple[str, ...]) -> None:
    (tmp_path / "dev").mkdir()
    (tmp_path / "proc").mkdir()
    for name in made:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir() if name.endswith("/") else path.touch()
    # nvidia-uvm alone is no GPU device (it comes with the driver, beside nvidiactl and nvidiaN).
    expected = bool(made) and made != ("dev/nvidia-uvm",)
    assert _accelerator_driver_present(tmp_path / "dev", tmp_path / "proc") is expected


@pytest.mark.timeout(120)
def test_without_a_driver_counting_accelerators_imports_no_torch() -> None:
    if _accelerator_driver_present():
        pytest.skip("this host has a GPU driver: torch counts its devices")
    code = "import sys\nfrom dlrover.launcher import cli\nprint(cli._visible_accelerators(), 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100, check=True)
    assert out.stdout.split() == ["0", "False"], out.stdout + out.stderr


@pytest.mark.parametrize(("flags", "counted"), [((), False), (("--nproc-per-node=gpu",), True)])
def test_on_a_gpu_host_the_node_registers_without_counting_unless_its_flags_size_it_by_the_count(
    monkeypatch: pytest.MonkeyPatch, flags: tuple[str, ...], counted: bool
) -> None:
    counts: list[int] = []
    started: list[bool] = []

    def count() -> int:
        counts.append(2)
        return 2

    def fake_run(cfg: object, *, sample_gpus: bool, standby: object) -> None:
        started.append(sample_gpus)
        raise ConfigError("stop here")  # what run does with the node is not this test's

    monkeypatch.setattr(cli, "_accelerator_driver_present", lambda: True)
    monkeypatch.setattr(cli, "_visible_accelerators", count)
    monkeypatch.setattr(cli, "early_standbys", lambda cfg: None)
    monkeypatch.setattr(cli, "run", fake_run)
    assert cli._main(["--standalone", *flags, sys.executable]) == 2
    assert started == [True]  # the GPUs are sampled (NVML finds them) ...
    assert counts == ([2] if counted else [])  # ... and counted only for the flag that needs the count


@pytest.mark.parametrize(("visible", "sampled"), [(None, True), ("0,1", True), ("", False), (" -1", False)])
def test_a_job_that_hides_every_gpu_samples_none(
    monkeypatch: pytest.MonkeyPatch, visible: str | None, sampled: bool
) -> None:
    monkeypatch.setattr(cli, "_accelerator_driver_present", lambda: True)
    environ = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    assert cli._samples_gpus(environ) is sampled
