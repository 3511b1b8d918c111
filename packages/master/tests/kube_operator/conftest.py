from __future__ import annotations

import sys
from pathlib import Path

from dlrover_testsupport.kube.fixtures import kube_api, kube_cluster  # noqa: F401 (fixtures)

# The shared builders of these tests (ej_builders.py) are imported by name.
sys.path.insert(0, str(Path(__file__).parent))
