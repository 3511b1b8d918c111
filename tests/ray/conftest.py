"""The Ray suites share one real local Ray cluster per module (see dlrover_testsupport.ray)."""

from dlrover_testsupport.ray.fixtures import ray_cluster  # noqa: F401 (fixture)
