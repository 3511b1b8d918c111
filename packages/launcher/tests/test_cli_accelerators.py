"""dlrover-run counts accelerators without importing torch where no GPU driver is present: that
import costs the agent seconds of CPU before its node can register (every node start pays it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

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
