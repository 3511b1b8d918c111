"""The TensorFlow parameter-server suite runs in its own nox session (`tests-tensorflow`), with TensorFlow and
tf_keras installed; without them it fails rather than skips there (`DLROVER_REQUIRE_TENSORFLOW=1`)."""

from __future__ import annotations

import importlib.util
import os

import pytest


@pytest.fixture(autouse=True, scope="session")
def _tensorflow_present() -> None:
    for module in ("tensorflow", "tf_keras"):
        if importlib.util.find_spec(module) is None:
            if os.environ.get("DLROVER_REQUIRE_TENSORFLOW") == "1":
                pytest.fail(f"DLROVER_REQUIRE_TENSORFLOW=1 but {module} is not installed", pytrace=False)
            pytest.skip(f"{module} is not installed; `nox -s tests-tensorflow` runs this suite")
