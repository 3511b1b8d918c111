"""What `dlrover-run` loads to start: every node start and every relaunch pays it before its
workers can start."""

from __future__ import annotations

import pytest

from dlrover.common.lazy import lazy_export_problems, modules_loaded_by

pytestmark = pytest.mark.timeout(180)


def test_the_agent_loads_no_master_core_no_classifier_rules_and_no_numpy() -> None:
    heavy = (
        "dlrover.master.master",  # the master's composition (a standalone agent imports it when it embeds one)
        "dlrover.master.lifecycle",
        "dlrover.master.autoscaler",
        "dlrover.diagnosis.rules",  # the classifier's compiled rules: the master reads logs, not the agent
        "numpy",  # the direct-I/O writer's buffers: imported when a checkpoint is first persisted
        "torch",
    )
    assert modules_loaded_by("import dlrover.launcher.cli", heavy) == []


@pytest.mark.parametrize("package", ["dlrover.master", "dlrover.diagnosis"])
def test_every_public_name_resolves_lazily_to_its_modules_own(package: str) -> None:
    import importlib

    module = importlib.import_module(package)
    assert lazy_export_problems(module, module._EXPORTS) == []
