"""Test support stays out of the product: no package's code imports it, no package depends on it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import tomllib

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
TESTSUPPORT = "dlrover_testsupport"


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_the_scan_finds_an_import(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("from dlrover_testsupport.kube import ApiServer\n")
    assert TESTSUPPORT in {n.split(".")[0] for n in _imports(probe)}


def test_no_product_module_imports_test_support() -> None:
    sources = sorted(ROOT.glob("packages/*/src/**/*.py"))
    assert sources, "the scan found no product sources"
    offenders = [str(p.relative_to(ROOT)) for p in sources if any(n.split(".")[0] == TESTSUPPORT for n in _imports(p))]
    assert offenders == []


def test_no_package_declares_test_support_as_a_dependency() -> None:
    for pyproject in sorted(ROOT.glob("packages/*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text())["project"]
        declared = [*project.get("dependencies", [])]
        for extra in project.get("optional-dependencies", {}).values():
            declared += extra
        assert not [d for d in declared if "testsupport" in d], pyproject
