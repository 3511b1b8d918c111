"""Fixtures of the test-support suites."""

from dlrover_testsupport.kube.fixtures import kube_api  # noqa: F401 (a fixture)
