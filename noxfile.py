"""Every developer and CI task, as nox sessions over one shared helper.

    nox -s tests              every package's tests and the cross-package scenarios in tests/
    nox -s tests-shard        one package's tests (tests-common, tests-flashckpt, ...)
    nox -s tests-testsupport  the shared test support's tests (testsupport/)
    nox -s tests-kubernetes   the Kubernetes suite (test API server and kubelet, backend, operator)
    nox -s tests-ray          the Ray suite (a real local multi-node Ray cluster)
    nox -s tests-local-backend  jobs the master grows, shrinks and relaunches on the local backend
    nox -s tests-tensorflow   TensorFlow: the tf.data adapter and parameter-server jobs (real TF processes)
    nox -s lint typecheck     ruff; mypy over every src/
    nox -s proto              regenerate protobuf code (`-- --check` fails if it is stale)
    nox -s isolation          each package installed alone, with only its declared dependencies
    nox -s wheels             every package's sdist and wheel, one version (VERSION), into dist/
    nox -s bench              benchmarks/
    nox -s demo               the README's main job

`python3 dev.py test` runs lint, typecheck, the proto check and tests in its prepared `.venv`
(nox --no-venv --no-install), then the isolation sessions in fresh environments.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import nox
import tomllib

ROOT = Path(__file__).parent
# Dependency order: a package comes after everything it needs.
PACKAGES = ["common", "shard", "rendezvous", "flashckpt", "diagnosis", "autoscale", "master", "launcher"]
# Optional extras the full test run exercises.
TEST_EXTRAS = {
    "shard": ["torch"],
    "rendezvous": ["torch"],
    "diagnosis": ["torch"],
    "flashckpt": ["s3", "s3test", "hf"],
}
TORCH_PIN = "torch==2.13.0"
# The Ray version the Ray suite runs against (PLATFORMS.md measured this one).
RAY_PIN = "ray==2.60.0"
# Ray Train (pyarrow, tensorboardX beside Ray), the baseline benchmarks/ray_recovery.py measures.
RAY_TRAIN_PIN = "ray[train]==2.60.0"
CONSTRAINTS = ("-c", str(ROOT / "constraints.txt"))
# What tools/wheels.py builds the sdists and wheels with (pinned in constraints.txt).
BUILD_TOOLS = ["build", "hatchling"]
DEV_TOOLS = [
    "nox",
    "ruff",
    "mypy",
    "types-protobuf",
    "grpc-stubs",
    "grpcio-tools",
    "pytest",
    "pytest-timeout",
    "hypothesis",
    # tools/wheels.py builds without isolation with these (tests/test_packaging.py runs it).
    *BUILD_TOOLS,
    # tools/goodput_sim draws its plots with it (tests/test_goodput_sim.py draws them).
    "matplotlib",
]
# What the shared test support (testsupport/, see its README) needs: the official Kubernetes
# client, for the contract tests of the test API server and the suites that use it.
TESTSUPPORT_DEPS = ["kubernetes"]
TESTSUPPORT_TESTS = "testsupport/tests"
# The Kubernetes suite (the test API server and kubelet, the master's backend, the operator, jobs
# with real processes in pods): its own session, `tests-kubernetes`; `tests` leaves it out.
KUBERNETES_TESTS = [
    "testsupport/tests/kube",
    "packages/master/tests/kube_operator",
    "packages/master/tests/test_kube_backend.py",
    "packages/master/tests/test_kube_config.py",
    "packages/master/tests/test_kube_pods.py",
    "packages/master/tests/test_kube_watch.py",
    "tests/test_kube_master.py",
]
# The Ray suite (tests on a real local multi-node Ray cluster: the test cluster itself, the master's
# Ray backend, jobs on Ray): its own session, `tests-ray`; `tests` leaves it out.
RAY_TESTS = [
    "testsupport/tests/ray",
    "tests/ray",
]

# Jobs whose master starts, grows, shrinks and relaunches nodes on the local backend (real agents and
# workers, minutes each): the `tests-local-backend` session; `tests` leaves them out, so `dev.py test`
# can run them beside it.
LOCAL_BACKEND_TESTS = [
    "tests/test_autoscale_local.py",
    "tests/test_profiles_local.py",
    "tests/test_resize_local.py",
    "tests/test_spares_local.py",
]

# TensorFlow parameter-server jobs: the `tests-tensorflow` session; `tests` leaves them out.
TENSORFLOW_TESTS = ["tests/tensorflow"]

nox.options.default_venv_backend = "venv"
nox.options.reuse_venv = "yes"
nox.options.sessions = ["lint", "typecheck", "proto", "tests"]


def _project(pkg: str) -> dict[str, object]:
    with open(ROOT / "packages" / pkg / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]  # type: ignore[no-any-return]


def _dist_to_pkg() -> dict[str, str]:
    return {str(_project(p)["name"]): p for p in PACKAGES}


def _requirement_names(pkg: str) -> list[str]:
    names = []
    for req in _project(pkg).get("dependencies", []):  # type: ignore[attr-defined]
        name = str(req).split(";")[0]
        for sep in "<>=!~[ ":
            name = name.split(sep)[0]
        names.append(name.strip().lower())
    return names


def local_closure(pkg: str) -> list[str]:
    """`pkg` and every local package it depends on, in dependency order."""
    by_dist = _dist_to_pkg()
    seen: set[str] = set()

    def visit(p: str) -> None:
        if p in seen:
            return
        seen.add(p)
        for name in _requirement_names(p):
            if name in by_dist:
                visit(by_dist[name])

    visit(pkg)
    return [p for p in PACKAGES if p in seen]


def needs_torch(pkgs: list[str]) -> bool:
    return any("torch" in _requirement_names(p) for p in pkgs)


def dev_install_args() -> list[str]:
    """pip arguments that install every package editable with its test extras, and the tools.

    torch must already be installed (pinned); dev.py uses the same list for `.venv`.
    """
    specs = [*CONSTRAINTS]
    for pkg in PACKAGES:
        extras = ",".join(["test", *TEST_EXTRAS.get(pkg, [])])
        specs += ["-e", str(ROOT / "packages" / f"{pkg}[{extras}]")]
    return specs + DEV_TOOLS + TESTSUPPORT_DEPS


def ray_install_args() -> list[str]:
    """pip arguments that add the Ray suite's needs to a dev install: the master's `ray` extra,
    Ray pinned; dev.py uses the same list for `.venv`."""
    return [*CONSTRAINTS, RAY_PIN, "-e", str(ROOT / "packages" / "master[ray]")]


def install_dev(session: nox.Session) -> None:
    """torch first (pinned, CPU wheel), then every package editable with its test extras."""
    session.install(TORCH_PIN)
    session.install(*dev_install_args())


def _has_tests(path: Path) -> bool:
    if path.is_file():
        return path.name.startswith("test_")
    return path.is_dir() and any(path.rglob("test_*.py"))


def _pytest(session: nox.Session, *paths: str, ignore: tuple[str, ...] = ()) -> None:
    present = [p for p in paths if _has_tests(ROOT / p)]
    if not present:
        session.error(f"no tests found under {', '.join(paths)}")
    # With arguments (`-k NAME`, a test id) a suite that selects none of its tests has not failed: pytest's
    # exit code 5 says so, and `dev.py test` hands the same arguments to the main, Kubernetes and Ray suites.
    codes = [0, 5] if session.posargs else [0]
    session.run("pytest", *present, *[f"--ignore={p}" for p in ignore], *session.posargs, success_codes=codes)


@nox.session
def tests(session: nox.Session) -> None:
    """Every package's tests, then the cross-package scenarios (the Kubernetes, Ray, local-backend and
    TensorFlow suites have their own sessions)."""
    install_dev(session)
    paths = [f"packages/{p}/tests" for p in PACKAGES]
    suites = (*KUBERNETES_TESTS, *RAY_TESTS, *LOCAL_BACKEND_TESTS, *TENSORFLOW_TESTS)
    _pytest(session, *paths, TESTSUPPORT_TESTS, "tests", ignore=suites)


@nox.session(name="tests-local-backend")
def tests_local_backend(session: nox.Session) -> None:
    """Jobs whose master starts, grows, shrinks and relaunches nodes on the local backend: capacity
    changes, spares, the autoscaler and profiles (real agents and workers)."""
    install_dev(session)
    _pytest(session, *LOCAL_BACKEND_TESTS)


@nox.session(name="tests-kubernetes")
def tests_kubernetes(session: nox.Session) -> None:
    """The Kubernetes suite: the test API server and kubelet, the master's backend, the operator, and jobs
    whose master and workers run as pods on the test kubelet."""
    install_dev(session)
    _pytest(session, *KUBERNETES_TESTS)


@nox.session(name="tests-ray")
def tests_ray(session: nox.Session) -> None:
    """The Ray suite: the Ray test cluster (testsupport/), the master's Ray backend and jobs on a real local
    multi-node Ray cluster. Ray missing fails it rather than skipping."""
    install_dev(session)
    session.install(*ray_install_args())
    session.env["DLROVER_REQUIRE_RAY"] = "1"
    _pytest(session, *RAY_TESTS)


def _package_tests(pkg: str) -> None:
    @nox.session(name=f"tests-{pkg}")
    def _run(session: nox.Session) -> None:
        install_dev(session)
        _pytest(session, f"packages/{pkg}/tests")

    _run.__doc__ = f"dlrover.{pkg}'s tests only."


for _pkg in PACKAGES:
    _package_tests(_pkg)


@nox.session(name="tests-testsupport")
def tests_testsupport(session: nox.Session) -> None:
    """The shared test support's own tests (the Kubernetes test API server; the Ray test cluster's run in
    tests-ray)."""
    install_dev(session)
    _pytest(session, TESTSUPPORT_TESTS, ignore=tuple(RAY_TESTS))


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check over the repository."""
    session.install(*CONSTRAINTS, "ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy --strict over every package's src/ and the shared test support."""
    install_dev(session)
    session.run("mypy", *[f"packages/{p}/src" for p in PACKAGES], "testsupport/src")


@nox.session
def proto(session: nox.Session) -> None:
    """Regenerate checked-in protobuf/gRPC code; `-- --check` only verifies it is current."""
    session.install(*CONSTRAINTS, "grpcio-tools")
    session.run("python", "tools/gen_proto.py", *session.posargs)


@nox.session(name="tests-tensorflow")
def tests_tensorflow(session: nox.Session) -> None:
    """Everything that needs TensorFlow, in one venv with it (its absence fails them): dlrover.shard's tf.data
    adapter, and parameter-server jobs under `dlrover-master ps-job` (real chief, parameter servers and workers;
    tf_keras, the Keras that has parameter-server training)."""
    session.install(*CONSTRAINTS, *[arg for p in _tensorflow_packages() for arg in ("-e", p)], "tf-keras")
    env = {"DLROVER_REQUIRE_TENSORFLOW": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    session.run("pytest", "packages/shard/tests", "-m", "tensorflow", *session.posargs, env=env)
    session.run("pytest", *TENSORFLOW_TESTS, *session.posargs, env=env)


def _tensorflow_packages() -> list[str]:
    """The master and what it needs, with TensorFlow through the shard and master `tf` extras."""
    extras = {"shard": "[tf,test]", "master": "[tf,test,k8s]"}  # k8s: PS jobs on the test Kubernetes cluster
    return [f"packages/{p}{extras.get(p, '')}" for p in PACKAGES if p not in ("flashckpt", "launcher")]


@nox.session(name="tests-flashckpt-deepspeed")
def tests_flashckpt_deepspeed(session: nox.Session) -> None:
    """dlrover.flashckpt's DeepSpeed adapter on CPU, in a venv with DeepSpeed (its absence fails them)."""
    session.install(TORCH_PIN)
    session.install(*CONSTRAINTS, "-e", "packages/common", "-e", "packages/flashckpt[deepspeed,test]")
    # DeepSpeed's CPU backend JIT-builds its shared-memory collective op inside init_distributed,
    # behind a lock file in the extensions folder that a killed build leaves behind: every later
    # rank then waits on it for ever. Build it once, up front, in a folder this run owns, so a
    # compile error shows as itself and no lock from elsewhere can hang the ranks. It lives in the session's
    # own tmp folder, not the system temp dir, where a test session running beside this one (`dev.py test`
    # runs the main session beside it) would find a folder that no process of its own made, and report it as
    # its leak: while the op builds, no pytest of this session runs for the leak check to see.
    with tempfile.TemporaryDirectory(prefix="ds-extensions-", dir=session.create_tmp()) as extensions:
        env = {"DLROVER_REQUIRE_DEEPSPEED": "1", "DS_ACCELERATOR": "cpu", "TORCH_EXTENSIONS_DIR": extensions}
        build = "import deepspeed.accelerator as a; a.get_accelerator().create_op_builder('ShareMemCommBuilder').load()"
        session.run("python", "-c", build, env=env)
        session.run(
            "pytest",
            "packages/flashckpt/tests/test_deepspeed.py",
            "packages/flashckpt/tests/test_deepspeed_state.py",
            *session.posargs,
            env=env,
        )


@nox.session
@nox.parametrize("pkg", PACKAGES)
def isolation(session: nox.Session, pkg: str) -> None:
    """Install one package alone with only its declared dependencies, and run its unit tests."""
    closure = local_closure(pkg)
    if needs_torch(closure):
        session.install(TORCH_PIN)
    specs = [f"packages/{p}" for p in closure if p != pkg] + [f"packages/{pkg}[test]"]
    session.install(*CONSTRAINTS, *specs)
    session.run("python", "-c", f"import dlrover.{pkg}")
    test_dir = ROOT / "packages" / pkg / "tests"
    if not _has_tests(test_dir):
        session.skip(f"dlrover-{pkg} installs and imports alone, but has no unit tests yet")
    # Run from a folder outside the repository so imports resolve to the installed package.
    session.chdir(session.create_tmp())
    session.run(
        "pytest",
        "-c",
        str(ROOT / "pyproject.toml"),
        "--rootdir",
        str(ROOT),
        "-m",
        "not integration",
        "-p",
        "no:cacheprovider",
        str(test_dir),
        *session.posargs,
    )


@nox.session
def wheels(session: nox.Session) -> None:
    """Every package's sdist and wheel with the one version in VERSION, into dist/ (`-- --out DIR`
    elsewhere, `-- --no-sdist` for wheels only); refuses a package whose version or pins disagree."""
    session.install(*CONSTRAINTS, *BUILD_TOOLS)
    session.run("python", "tools/wheels.py", "build", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """Run every benchmark under benchmarks/ (or those named after --) and print their tables."""
    install_dev(session)
    # benchmarks/ray_recovery.py runs Ray Train's TorchTrainer beside DLRover's Ray backend.
    session.install(*ray_install_args(), RAY_TRAIN_PIN)
    scripts = session.posargs or sorted(str(p) for p in (ROOT / "benchmarks").glob("*_*.py"))
    if not scripts:
        session.error("no benchmarks found under benchmarks/")
    for script in scripts:
        session.run("python", script)


@nox.session
def demo(session: nox.Session) -> None:
    """The README's main job: a small GPT trained under dlrover-run, with a worker killed part-way."""
    install_dev(session)
    demo_script = ROOT / "examples" / "demo.py"
    if not demo_script.exists():
        session.error("the demo job is not built yet (it arrives with the dlrover-run issue)")
    session.run("python", str(demo_script), *session.posargs)
