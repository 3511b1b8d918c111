"""What a training process pays to import the flash checkpoint library."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(120)


def test_the_training_side_does_not_import_grpc_or_protobuf() -> None:
    # A restarted training process imports this library before it restores its state: gRPC and
    # protobuf (over 0.1 s) would add to every recovery and buy it nothing.
    code = (
        "import sys\n"
        "from dlrover.flashckpt import FlashCheckpointer, MemoryReader, StagerConfig, torch_distributed_agree\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'grpc' or m.startswith('google.protobuf')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"


def test_the_saver_does_not_import_torch() -> None:
    code = "import sys\nfrom dlrover.flashckpt import Saver, SaverHost, persist_rank\nprint('torch' in sys.modules)\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"


def test_every_public_name_is_its_modules_own() -> None:
    import dlrover.flashckpt
    from dlrover.common.lazy import lazy_export_problems

    assert lazy_export_problems(dlrover.flashckpt, dlrover.flashckpt._EXPORTS) == []
