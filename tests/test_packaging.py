"""Packaging: one version for every package, wheels that install without a checkout, and an image
that installs them as the README says.

- Every package's version and its pins on siblings agree with `VERSION` (tools/wheels.py), and a
  package that disagrees is named; `set-version` rewrites the real pyprojects and only their
  version lines and sibling pins.
- The wheels build (as `nox -s wheels` builds them), `dlrover-shard` installs from them alone into a
  fresh venv (no torch, no master) and imports from outside the checkout, `dlrover-master` then
  installs with its libraries (still no torch) and its command runs, and the README's whole-system
  pip line resolves against them.
- The Dockerfile's pip lines are the README's, and everything it copies exists and is not excluded
  by `.dockerignore` (there is no Docker engine here to build it).
"""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"


def _load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dlrover_tools_wheels", ROOT / "tools" / "wheels.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


wheels = _load_tool()


def _write_package(root: Path, folder: str, text: str) -> Path:
    path = root / "packages" / folder / "pyproject.toml"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    return path


_FAKE_B = """\
[build-system]
requires = ["hatchling>=1.21"]

[project]
name = "dlrover-b"
version = "1.0.1"
description = "dlrover-a"
dependencies = [
    "dlrover-a>=1.0",
    "attrs>=23.1",
]

[project.optional-dependencies]
test = ["dlrover-a[x]; python_version >= '3.10'", "pytest>=8"]
"""


def test_every_package_carries_the_one_version() -> None:
    assert wheels.disagreements(ROOT) == []
    version = wheels.read_version(ROOT)
    found = wheels.packages(ROOT)
    assert {p.folder.name for p in found} == {p.name for p in (ROOT / "packages").iterdir() if p.is_dir()}
    assert all(p.version == version for p in found)


def test_a_disagreeing_version_or_pin_is_named_and_set_version_fixes_it(tmp_path: Path) -> None:
    (tmp_path / "VERSION").write_text("1.0.0\n")
    _write_package(tmp_path, "a", '[project]\nname = "dlrover-a"\nversion = "1.0.0"\ndependencies = []\n')
    b = _write_package(tmp_path, "b", _FAKE_B)

    problems = wheels.disagreements(tmp_path)

    assert any("packages/b/pyproject.toml: version is 1.0.1, but VERSION says 1.0.0" in p for p in problems)
    assert any("'dlrover-a>=1.0'" in p and "dlrover-a==1.0.0" in p for p in problems)
    assert any("dlrover-a[x]; python_version >= '3.10'" in p for p in problems)
    assert len(problems) == 3
    with pytest.raises(SystemExit, match="refusing to build"):
        wheels.build(tmp_path / "dist", root=tmp_path)
    assert not (tmp_path / "dist").exists()

    wheels.set_version("1.1.0", root=tmp_path)

    assert wheels.disagreements(tmp_path) == []
    text = b.read_text()
    assert '"dlrover-a==1.1.0",' in text
    assert "\"dlrover-a[x]==1.1.0; python_version >= '3.10'\"" in text
    # Only versions and requirements change: the name, a description naming a sibling, other pins.
    assert 'name = "dlrover-b"' in text
    assert 'description = "dlrover-a"' in text
    assert '"attrs>=23.1"' in text
    assert '"hatchling>=1.21"' in text
    assert (tmp_path / "VERSION").read_text() == "1.1.0\n"


def test_a_malformed_version_changes_nothing(tmp_path: Path) -> None:
    (tmp_path / "VERSION").write_text("1.0.0\n")
    a = _write_package(tmp_path, "a", '[project]\nname = "dlrover-a"\nversion = "1.0.0"\n')

    with pytest.raises(SystemExit, match="'v2' is not a release version"):
        wheels.set_version("v2", root=tmp_path)

    assert (tmp_path / "VERSION").read_text() == "1.0.0\n"
    assert 'version = "1.0.0"' in a.read_text()
    (tmp_path / "VERSION").write_text("one\n")
    with pytest.raises(SystemExit, match="'one' is not a release version"):
        wheels.disagreements(tmp_path)


def _fake_wheel(path: Path, name: str, version: str, requires: list[str]) -> None:
    lines = ["Metadata-Version: 2.4", f"Name: {name}", f"Version: {version}"]
    lines += [f"Requires-Dist: {r}" for r in requires]
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name.replace('-', '_')}-{version}.dist-info/METADATA", "\n".join(lines) + "\n")


def test_built_wheels_of_another_version_or_with_loose_pins_are_named(tmp_path: Path) -> None:
    (tmp_path / "VERSION").write_text("1.0.0\n")
    _write_package(tmp_path, "a", '[project]\nname = "dlrover-a"\nversion = "1.0.0"\n')
    _write_package(tmp_path, "b", '[project]\nname = "dlrover-b"\nversion = "1.0.0"\n')
    _write_package(tmp_path, "c", '[project]\nname = "dlrover-c"\nversion = "1.0.0"\n')
    out = tmp_path / "out"
    out.mkdir()
    _fake_wheel(out / "dlrover_a-1.0.0-py3-none-any.whl", "dlrover-a", "1.0.0", ["attrs>=23.1"])
    _fake_wheel(out / "dlrover_a-0.9.0-py3-none-any.whl", "dlrover-a", "0.9.0", [])
    _fake_wheel(out / "dlrover_b-1.0.0-py3-none-any.whl", "dlrover-b", "1.0.1", ["dlrover-a"])

    problems = wheels.check_artifacts(out, "1.0.0", root=tmp_path, sdist=False)

    assert any("dlrover_a-0.9.0-py3-none-any.whl" in p for p in problems), problems
    assert any("dlrover_b-1.0.0-py3-none-any.whl: metadata version 1.0.1" in p for p in problems), problems
    assert any("'dlrover-a' must pin the sibling as dlrover-a==1.0.0" in p for p in problems), problems
    assert any("expected dlrover_c-1.0.0-py3-none-any.whl" in p for p in problems), problems
    assert len(problems) == 4


def test_set_version_rewrites_only_versions_and_sibling_pins_of_the_real_packages(tmp_path: Path) -> None:
    shutil.copy(ROOT / "VERSION", tmp_path / "VERSION")
    originals = {}
    for pyproject in (ROOT / "packages").glob("*/pyproject.toml"):
        originals[pyproject.parent.name] = _write_package(tmp_path, pyproject.parent.name, pyproject.read_text())
    old = wheels.read_version(ROOT)

    wheels.set_version("9.8.7", root=tmp_path)

    assert wheels.disagreements(tmp_path) == []
    for folder, copy in originals.items():
        before = (ROOT / "packages" / folder / "pyproject.toml").read_text()
        # Undoing exactly the version line and the sibling pins gives the original back.
        undone = copy.read_text().replace('version = "9.8.7"', f'version = "{old}"', 1)
        undone = re.sub(r'"(dlrover-[a-z]+)==9\.8\.7"', rf'"\1=={old}"', undone)
        assert undone == before, folder


def _closure(dist: Path, name: str) -> dict[str, Path]:
    """`name` and the siblings its built wheel requires (not through an extra), by name: their wheels."""
    found: dict[str, Path] = {}
    todo = [name]
    while todo:
        current = todo.pop()
        if current in found:
            continue
        (wheel,) = dist.glob(f"{current.replace('-', '_')}-*.whl")
        found[current] = wheel
        _, requires = wheels.wheel_metadata(wheel)
        for requirement in requires:
            if "extra ==" in requirement:
                continue
            dep, _, _ = wheels.split_requirement(requirement)
            assert dep != "torch", f"{current} requires torch: {requirement}"
            if dep.startswith("dlrover-"):
                todo.append(dep)
    return found


def _clean_env() -> dict[str, str]:
    """This environment without what points Python at the checkout's sources."""
    env = dict(os.environ)
    for name in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSAFEPATH"):
        env.pop(name, None)
    return env


def _pip(venv_python: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    # The running interpreter's pip installs into the venv (`--python`), so the venv needs no pip.
    cmd = [sys.executable, "-m", "pip", "--python", str(venv_python), *args]
    result = subprocess.run(cmd, cwd=cwd, env=_clean_env(), capture_output=True, text=True, timeout=480, check=False)
    assert result.returncode == 0, f"{shlex.join(cmd)} failed:\n{result.stdout[-4000:]}{result.stderr[-4000:]}"
    return result


_PROBE = """
import importlib.metadata, importlib.util, json, dlrover.shard, dlrover.common
print(json.dumps({
    "shard": dlrover.shard.__file__,
    "common": dlrover.common.__file__,
    "version": importlib.metadata.version("dlrover-shard"),
    "torch": importlib.util.find_spec("torch") is not None,
    "master": importlib.util.find_spec("dlrover.master") is not None,
    "exported": sorted(dlrover.shard.__all__)[:3],
}))
"""


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_wheels_build_and_install_without_a_checkout(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    dist.mkdir()
    # An earlier release's wheel is removed before building; what is not ours stays.
    (dist / "dlrover_shard-0.0.1-py3-none-any.whl").write_text("stale")
    (dist / "notes.txt").write_text("kept")
    built = wheels.build(dist)  # what `nox -s wheels` runs, into a folder of this test's own
    assert not (dist / "dlrover_shard-0.0.1-py3-none-any.whl").exists()
    assert (dist / "notes.txt").read_text() == "kept"
    version = wheels.read_version(ROOT)
    assert len(built) == len(wheels.packages(ROOT))
    assert len(list(dist.glob("*.tar.gz"))) == len(built)
    assert all(f"-{version}-py3-none-any.whl" in w.name for w in built)

    shard = _closure(dist, "dlrover-shard")
    assert set(shard) == {"dlrover-shard", "dlrover-common"}
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    # The README's whole-system line, resolved in the fresh venv (not installed: torch is large)
    # against the built wheels: every dlrover distribution comes from them, torch is the pinned one.
    report = tmp_path / "report.json"
    _pip(
        python, "install", "--dry-run", "--quiet", "--report", str(report), "-c", str(ROOT / "constraints.txt"),
        *map(str, built), "dlrover-master[k8s]", cwd=tmp_path,
    )  # fmt: skip
    resolved = {
        item["metadata"]["name"]: (item["metadata"]["version"], item["download_info"]["url"])
        for item in json.loads(report.read_text())["install"]
    }
    for wheel in built:
        name = wheel.name.split("-")[0].replace("_", "-")
        assert resolved[name] == (version, wheel.as_uri()), name
    assert resolved["torch"][0].split("+")[0] == "2.13.0"
    assert "kubernetes" in resolved

    # README: `pip install -c constraints.txt dist/dlrover_common-*.whl dist/dlrover_shard-*.whl`.
    _pip(python, "install", "-c", str(ROOT / "constraints.txt"), *map(str, shard.values()), cwd=tmp_path)
    _pip(python, "check", cwd=tmp_path)

    # -I: no PYTHONPATH, no user site, not the current folder; run outside the checkout.
    probe = subprocess.run(
        [str(python), "-I", "-c", _PROBE],
        cwd=tmp_path,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert probe.returncode == 0, probe.stderr
    found = json.loads(probe.stdout)
    site = str(env_dir.resolve())
    assert found["shard"].startswith(site), found
    assert found["common"].startswith(site), found
    assert found["version"] == version
    assert not found["torch"], "dlrover-shard pulled torch in"
    assert not found["master"]
    assert found["exported"]

    # The master needs no torch either, and its command runs from the wheels alone.
    master = _closure(dist, "dlrover-master")
    libraries = ("common", "shard", "rendezvous", "diagnosis", "autoscale", "master")
    assert set(master) == {f"dlrover-{p}" for p in libraries}
    _pip(python, "install", "-c", str(ROOT / "constraints.txt"), *map(str, master.values()), cwd=tmp_path)
    _pip(python, "check", cwd=tmp_path)
    command = subprocess.run(
        [str(env_dir / "bin" / "dlrover-master"), "--help"],
        cwd=tmp_path,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert command.returncode == 0, command.stderr
    assert "usage: dlrover-master" in command.stdout
    assert not list((env_dir / "lib").glob("python*/site-packages/torch")), "dlrover-master pulled torch in"

    # The Dockerfile copies the wheels from dist/: its patterns match what the build wrote.
    for source in _copy_sources():
        if source.startswith(f"{wheels.DIST}/"):
            assert list(tmp_path.glob(source)), f"COPY {source} matches nothing the build writes"


# --- the Dockerfile --------------------------------------------------------------------------


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined, comments dropped."""
    joined: list[str] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        joined.append(pending + line)
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in joined]


def _dockerfile_pip_commands() -> list[list[str]]:
    """The pip commands of the Dockerfile's RUN lines, with ARG defaults substituted, as tokens."""
    args: dict[str, str] = {}
    commands = []
    for instruction, rest in _instructions():
        if instruction == "ARG" and "=" in rest:
            name, default = rest.split("=", 1)
            args[name.strip()] = default.strip()
        if instruction != "RUN":
            continue
        for part in rest.split("&&"):
            expanded = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m.group(1) or m.group(2)], part)
            tokens = shlex.split(expanded)
            if tokens[:2] == ["pip", "install"]:
                commands.append(tokens)
    return commands


def _readme_pip_commands() -> list[list[str]]:
    """The `pip install` lines of the README's Install section's code blocks, as tokens."""
    text = README.read_text()
    section = text.split("\n## Install\n", 1)[1].split("\n## ", 1)[0]
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", section, re.DOTALL):
        for line in block.splitlines():
            tokens = shlex.split(line, comments=True)
            if tokens[:2] == ["pip", "install"]:
                commands.append(tokens)
    return commands


def _copy_sources() -> list[str]:
    sources = []
    for instruction, rest in _instructions():
        if instruction in ("COPY", "ADD"):
            assert instruction == "COPY", "ADD fetches and unpacks; the image only copies"
            tokens = [t for t in shlex.split(rest) if not t.startswith("--")]
            sources += tokens[:-1]
    return sources


def test_the_dockerfile_installs_with_the_readmes_pip_lines() -> None:
    docker = _dockerfile_pip_commands()
    readme = _readme_pip_commands()

    assert docker, "the Dockerfile installs nothing with pip"
    assert docker == readme[: len(docker)], f"Dockerfile: {docker}\nREADME: {readme}"
    # torch first, alone and pinned; then the wheels under the constraints.
    assert docker[0][:3] == ["pip", "install", "torch==2.13.0"]
    assert all(not t.startswith("torch") or t == "torch==2.13.0" for command in docker for t in command)
    assert docker[1][2:4] == ["-c", "constraints.txt"]
    assert "dist/*.whl" in docker[1]


def _ignored(path: str, patterns: list[str]) -> bool:
    """Whether `.dockerignore`'s patterns keep `path` out of the build context (the last pattern that
    matches the path or a folder above it decides, as Docker's does)."""
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        body = pattern.lstrip("!").rstrip("/")
        if any(fnmatch.fnmatchcase(c, body) or fnmatch.fnmatchcase(c, body.removeprefix("**/")) for c in candidates):
            ignored = not negated
    return ignored


def test_everything_the_dockerfile_copies_exists_and_is_in_the_context() -> None:
    patterns = [
        line.strip() for line in DOCKERIGNORE.read_text().splitlines() if line.strip() and not line.startswith("#")
    ]
    sources = _copy_sources()

    assert "constraints.txt" in sources
    assert f"{wheels.DIST}/*.whl" in sources
    for source in sources:
        if source.startswith(f"{wheels.DIST}/"):
            # Written by the wheels build (test_wheels_build_and_install_without_a_checkout checks
            # the pattern matches what it writes); a checkout has none.
            sample = source.replace("*", "dlrover_common-0.1.0-py3-none-any")
        else:
            matches = sorted(p for p in ROOT.glob(source.rstrip("/")) if p.exists())
            assert matches, f"COPY {source}: no such file in the repository"
            files = [m for m in matches if m.is_file()] or sorted(
                f for m in matches for f in m.rglob("*.py") if f.is_file() and "__pycache__" not in f.parts
            )
            assert files, f"COPY {source}: nothing to copy"
            sample = str(files[0].relative_to(ROOT))
        assert not _ignored(sample, patterns), f"COPY {source}: .dockerignore excludes {sample}"
    # The README says the image holds the GPT example the example ElasticJob trains.
    assert "examples/" in sources
    assert (ROOT / "examples" / "gpt" / "train.py").is_file()
    assert not _ignored("examples/gpt/train.py", patterns)
    # The context is kept small: the development venv, nox's venvs and git are never sent.
    for heavy in (".venv/bin/python", ".nox/tests/bin/python", ".git/HEAD", "packages/master/src/x.py"):
        assert _ignored(heavy, patterns), heavy
