"""Fixtures of the test-support suites."""

from dlrover_testsupport.kube.fixtures import kube_api, kube_cluster  # noqa: F401 (fixtures)
from dlrover_testsupport.ray.fixtures import ray_cluster  # noqa: F401 (fixture)
