"""What a training process pays to import the flash checkpoint library."""

from __future__ import annotations

import pytest

from dlrover.common.lazy import modules_loaded_by

pytestmark = pytest.mark.timeout(120)


def test_the_training_side_does_not_import_grpc_or_protobuf() -> None:
    # A restarted training process imports this library before it restores its state: gRPC and
    # protobuf (over 0.1 s) would add to every recovery and buy it nothing.
    statement = "from dlrover.flashckpt import FlashCheckpointer, MemoryReader, StagerConfig, torch_distributed_agree"
    assert modules_loaded_by(statement) == []


def test_the_saver_does_not_import_torch() -> None:
    assert modules_loaded_by("from dlrover.flashckpt import Saver, SaverHost, persist_rank", packages=("torch",)) == []


def test_every_public_name_is_its_modules_own() -> None:
    import dlrover.flashckpt
    from dlrover.common.lazy import lazy_export_problems

    assert lazy_export_problems(dlrover.flashckpt, dlrover.flashckpt._EXPORTS) == []
