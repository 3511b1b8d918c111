"""Test support shared by DLRover's test suites; never imported by product code.

`dlrover_testsupport.kube` is a Kubernetes API server for tests (see testsupport/README.md).
"""
