"""One version for every package, and the sdists and wheels built with it.

    python tools/wheels.py check                 every pyproject agrees with VERSION (exit 1 naming what does not)
    python tools/wheels.py set-version 0.2.0     write VERSION, every package's version and its pins on siblings
    python tools/wheels.py build [--out dist]    check, then build every package's sdist and wheel into --out

`VERSION` at the repository root is the one source of truth. Each `packages/<pkg>/pyproject.toml`
repeats it as a static `version` (so every packaging tool reads it without a plug-in) and pins
each sibling it depends on to exactly that version (`dlrover-common==0.1.0`): a wheel of one
release never installs beside a sibling of another. `check` and `build` refuse a tree where a
package says otherwise; `set-version` is the one way to change it.

`build` needs `build` and `hatchling` in the running interpreter (the `wheels` nox session and
the development `.venv` install both, pinned in constraints.txt). It builds without isolation,
each wheel from its sdist (so an sdist that lacks a file fails the build), after removing the
`dlrover_*` files an earlier build left in --out (other files there are left alone), and then
checks the built metadata: one sdist and one wheel per package, each with the version, its
Requires-Dist pins on siblings equal to it.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
VERSION_FILE = "VERSION"
# Where `build` puts the artifacts unless told otherwise; the Dockerfile copies from here.
DIST = "dist"
# A public release version (PEP 440 without epochs or local labels): what we publish.
_VERSION = re.compile(r"\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?")
# A requirement string: name, optional extras, the rest (specifier and marker).
_REQUIREMENT = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*)", re.DOTALL)
# A quoted TOML string holding only a requirement on `name`: what `set-version` rewrites.
_QUOTED_REQUIREMENT = re.compile(r'"([A-Za-z0-9][A-Za-z0-9._-]*)(\s*\[[^\]"]*\])?(\s*[<>=!~][^";]*)?(;[^"]*)?"')
_PROJECT_VERSION = re.compile(r'^version\s*=\s*"[^"]*"', re.MULTILINE)


@dataclass(frozen=True)
class Package:
    """One distribution of the monorepo: its folder and what its pyproject.toml declares."""

    folder: Path
    name: str
    version: str
    requirements: tuple[str, ...]

    @property
    def pyproject(self) -> Path:
        return self.folder / "pyproject.toml"


def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares it (`Dlrover_Common` is `dlrover-common`)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_version(root: Path = ROOT) -> str:
    """The release version in `root/VERSION`.

    Raises:
        SystemExit: the file is missing or does not hold one public release version.
    """
    path = root / VERSION_FILE
    try:
        version = path.read_text().strip()
    except OSError as e:
        raise SystemExit(f"{path}: cannot read the version ({e})") from e
    if not _VERSION.fullmatch(version):
        raise SystemExit(f"{path}: {version!r} is not a release version such as 0.1.0 or 1.2.0rc1")
    return version


def packages(root: Path = ROOT) -> list[Package]:
    """Every package under `root/packages/`, sorted by folder."""
    found = []
    for pyproject in sorted((root / "packages").glob("*/pyproject.toml")):
        with pyproject.open("rb") as f:
            project = tomllib.load(f)["project"]
        requirements = list(project.get("dependencies", []))
        for extra in project.get("optional-dependencies", {}).values():
            requirements += extra
        found.append(
            Package(
                folder=pyproject.parent,
                name=normalize(project["name"]),
                version=str(project.get("version", "")),
                requirements=tuple(requirements),
            )
        )
    return found


def split_requirement(requirement: str) -> tuple[str, str, str]:
    """(normalized name, extras, specifier) of a requirement string; the marker is dropped."""
    match = _REQUIREMENT.fullmatch(requirement.split(";", maxsplit=1)[0])
    if match is None:
        return "", "", requirement
    return normalize(match.group(1)), match.group(2) or "", re.sub(r"\s+", "", match.group(3))


def pin_problems(where: str, requirements: Iterable[str], siblings: set[str], version: str) -> list[str]:
    """What is wrong with the pins on siblings among `requirements` (each must be `==version`)."""
    problems = []
    for requirement in requirements:
        name, _, specifier = split_requirement(requirement)
        if name in siblings and specifier != f"=={version}":
            problems.append(
                f"{where}: requirement {requirement!r} must pin the sibling as {name}=={version} "
                f"(every package is released with one version)"
            )
    return problems


def disagreements(root: Path = ROOT) -> list[str]:
    """Every way a package disagrees with `root/VERSION`; empty when all agree.

    Raises:
        SystemExit: VERSION is missing or malformed.
    """
    version = read_version(root)
    found = packages(root)
    siblings = {p.name for p in found}
    problems = []
    for package in found:
        where = str(package.pyproject.relative_to(root))
        if not re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", package.name):
            problems.append(f"{where}: name {package.name!r} is not a plain distribution name")
        if package.version != version:
            shown = package.version or "no static version"
            problems.append(f"{where}: version is {shown}, but {VERSION_FILE} says {version}")
        problems += pin_problems(where, package.requirements, siblings, version)
    if not found:
        problems.append(f"{root / 'packages'}: no package found")
    return problems


def set_version(version: str, root: Path = ROOT) -> list[Path]:
    """Write `version` into VERSION, every package's `version` and every pin on a sibling.

    Returns:
        The files rewritten.

    Raises:
        SystemExit: `version` is not a release version, or a pyproject has no static version line.
    """
    if not _VERSION.fullmatch(version):
        raise SystemExit(f"{version!r} is not a release version such as 0.1.0 or 1.2.0rc1")
    found = packages(root)
    siblings = {p.name for p in found}

    def repin(match: re.Match[str]) -> str:
        name, extras, _, marker = match.groups()
        if normalize(name) not in siblings:
            return match.group(0)
        return f'"{name}{(extras or "").strip()}=={version}{marker or ""}"'

    written = []
    for package in found:
        text = package.pyproject.read_text()
        if not _PROJECT_VERSION.search(text):
            raise SystemExit(f'{package.pyproject}: no `version = "..."` line to rewrite')
        lines = _PROJECT_VERSION.sub(f'version = "{version}"', text, count=1).splitlines(keepends=True)
        new = "".join(
            _QUOTED_REQUIREMENT.sub(repin, line) if in_requirements else line
            for line, in_requirements in zip(lines, _requirement_lines(lines), strict=True)
        )
        if new != text:
            package.pyproject.write_text(new)
            written.append(package.pyproject)
    (root / VERSION_FILE).write_text(version + "\n")
    written.append(root / VERSION_FILE)
    problems = disagreements(root)
    if problems:  # a pin written in a form this rewrite does not know
        raise SystemExit("rewritten, but still disagreeing (fix by hand):\n  " + "\n  ".join(problems))
    return written


def _requirement_lines(lines: list[str]) -> list[bool]:
    """For each line of a pyproject.toml, whether it holds requirements: `[project]`'s
    `dependencies` array (one line or several) or a line of `[project.optional-dependencies]`."""
    table = ""
    in_dependencies = False
    marks = []
    for line in lines:
        stripped = line.split("#")[0].strip()
        if stripped.startswith("[") and not in_dependencies:
            table = stripped.strip("[] ")
            marks.append(False)
            continue
        if table == "project" and re.match(r"dependencies\s*=", stripped):
            in_dependencies = True
        marks.append(in_dependencies or table == "project.optional-dependencies")
        if in_dependencies and stripped.endswith("]"):
            in_dependencies = False
    return marks


def _artifact_prefix(name: str) -> str:
    """How a distribution's name starts its sdist and wheel file names (PEP 625, PEP 427)."""
    return name.replace("-", "_")


def wheel_metadata(wheel: Path) -> tuple[str, list[str]]:
    """The version and the Requires-Dist lines of a built wheel."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        headers = HeaderParser().parsestr(z.read(meta).decode())
    return headers["Version"], headers.get_all("Requires-Dist") or []


def _sdist_version(sdist: Path) -> str:
    with tarfile.open(sdist) as tar:
        member = next(m for m in tar.getmembers() if m.name.count("/") == 1 and m.name.endswith("/PKG-INFO"))
        extracted = tar.extractfile(member)
        assert extracted is not None  # PKG-INFO is a regular file
        return str(HeaderParser().parsestr(extracted.read().decode())["Version"])


def check_artifacts(out: Path, version: str, root: Path = ROOT, sdist: bool = True) -> list[str]:
    """What is wrong with the built files in `out`: each package needs exactly one wheel (and one
    sdist) of `version`, whose metadata pins its siblings to `version`; empty when all is right."""
    found = packages(root)
    siblings = {p.name for p in found}
    problems = []
    for package in found:
        prefix = _artifact_prefix(package.name)
        wheels = sorted(out.glob(f"{prefix}-*.whl"))
        sdists = sorted(out.glob(f"{prefix}-*.tar.gz"))
        expected = [f"{prefix}-{version}-py3-none-any.whl"]
        if [w.name for w in wheels] != expected:
            problems.append(f"{out}: expected {expected[0]} for {package.name}, found {[w.name for w in wheels]}")
            continue
        wheel_version, requires = wheel_metadata(wheels[0])
        if wheel_version != version:
            problems.append(f"{wheels[0].name}: metadata version {wheel_version}, expected {version}")
        problems += pin_problems(wheels[0].name, requires, siblings, version)
        if sdist:
            expected_sdist = f"{prefix}-{version}.tar.gz"
            if [s.name for s in sdists] != [expected_sdist]:
                found_sdists = [s.name for s in sdists]
                problems.append(f"{out}: expected {expected_sdist} for {package.name}, found {found_sdists}")
            elif (sdist_version := _sdist_version(sdists[0])) != version:
                problems.append(f"{sdists[0].name}: metadata version {sdist_version}, expected {version}")
    return problems


def build(out: Path, root: Path = ROOT, sdist: bool = True) -> list[Path]:
    """Build every package's sdist (unless `sdist` is false) and wheel into `out`, with one version.

    Returns:
        The wheels built, one per package.

    Raises:
        SystemExit: a package disagrees with VERSION, a build fails, or the built metadata is wrong.
    """
    problems = disagreements(root)
    if problems:
        raise SystemExit("refusing to build:\n  " + "\n  ".join(problems))
    version = read_version(root)
    out.mkdir(parents=True, exist_ok=True)
    names = {_artifact_prefix(p.name) for p in packages(root)}
    for stale in out.iterdir():
        if stale.is_file() and stale.name.split("-")[0] in names:
            stale.unlink()
    for package in packages(root):
        # Without isolation: the running interpreter's pinned hatchling builds every package (no
        # download per build); `build` still checks it satisfies each [build-system] requires.
        kind = [] if sdist else ["--wheel"]
        cmd = [sys.executable, "-m", "build", "--no-isolation", "--quiet", *kind, "--outdir", str(out)]
        cmd.append(str(package.folder))
        result = subprocess.run(cmd, cwd=root, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise SystemExit(f"building {package.name} failed ({result.returncode}):\n{result.stdout}{result.stderr}")
    problems = check_artifacts(out, version, root, sdist=sdist)
    if problems:
        raise SystemExit("the built files are wrong:\n  " + "\n  ".join(problems))
    return sorted(out.glob("*.whl"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("check", help="every package agrees with VERSION")
    setter = commands.add_parser("set-version", help="write one version into VERSION and every package")
    setter.add_argument("version")
    builder = commands.add_parser("build", help="build every package's sdist and wheel")
    builder.add_argument("--out", type=Path, default=ROOT / DIST, help=f"output folder (default: {DIST}/)")
    builder.add_argument("--no-sdist", action="store_true", help="build the wheels only")
    args = parser.parse_args(argv)
    if args.command == "check":
        problems = disagreements()
        for problem in problems:
            print(problem, file=sys.stderr)
        if not problems:
            print(f"every package is at {read_version()}")
        return 1 if problems else 0
    if args.command == "set-version":
        for path in set_version(args.version):
            print(f"wrote {path.relative_to(ROOT)}")
        return 0
    wheels = build(args.out.resolve(), sdist=not args.no_sdist)
    kinds = "wheels" if args.no_sdist else "wheels (and their sdists)"
    print(f"{len(wheels)} {kinds} of {read_version()} in {args.out}:")
    for wheel in wheels:
        print(f"  {wheel.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
