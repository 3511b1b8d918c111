"""One task of a PS job, as the master's scheduler backend starts it.

    python .../dlrover/master/psjob/node.py -- PROGRAM [ARGS...]     (or: python -m dlrover.master.psjob.node)

The task's `TF_CONFIG` (set by the master) says its role. A parameter server or a worker runs TensorFlow's
standard server at its address until it is stopped; the chief and the evaluator run the user's program (this
process becomes it, so its exit status is the node's). TensorFlow is imported only by servers.

A standby (`DLROVER_STANDBY_FIFO` set) imports TensorFlow (a chief's also the installed libraries its program
imports first), says it is ready (`<fifo>.ready`), and waits on the FIFO; when the master writes the environment of
the task it is to become there, a chief runs the program in this warm interpreter (`runpy`, for `python script.py
...` with this interpreter; anything else is exec'd as usual) and a parameter server serves at the address its
`TF_CONFIG` gives: a relaunched task does not pay for importing TensorFlow again.

Only the standard library is imported here, and the master starts this file by its path: run as a module, it
would first import the `dlrover.master` package (most of a second, on every chief restart).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence

__all__ = [
    "ADDRESS_IN_USE_EXIT_CODE",
    "SERVER_ROLES",
    "STANDBY_FIFO_ENV_VAR",
    "WORKER_FAIL_FAST",
    "main",
    "run_server",
    "runs_in_this_interpreter",
    "wait_as_standby",
]

STANDBY_FIFO_ENV_VAR = "DLROVER_STANDBY_FIFO"
"""Set for a standby: the FIFO the master writes the environment of the task it becomes to (JSON)."""

ADDRESS_IN_USE_EXIT_CODE = 98
"""The exit status of a parameter server or worker that could not listen at its address (errno EADDRINUSE)."""

SERVER_ROLES = ("ps", "worker")
"""Roles whose tasks run TensorFlow's server instead of the user's program."""

USAGE = "usage: python -m dlrover.master.psjob.node -- PROGRAM [ARGS...]"


def _task(text: str) -> tuple[dict[str, list[str]], str, int]:
    try:
        config = json.loads(text)
        cluster, task = config["cluster"], config["task"]
        role, index = str(task["type"]), int(task["index"])
    except (ValueError, KeyError, TypeError) as exc:
        raise SystemExit(f"TF_CONFIG is not a task's configuration ({exc}): {text[:200]!r}") from exc
    return cluster, role, index


WORKER_FAIL_FAST = "false"
"""`GRPC_FAIL_FAST` in a worker's server (unless the job sets it): its calls to a parameter server wait for the
server to be reachable instead of failing at once.

TensorFlow's default (`use_caller`) fails a worker's call to a parameter server at once while the worker's channel
to it is in gRPC's reconnect backoff, which lasts up to a few seconds after a relaunched server listens again. The
chief restarted for that server then sees its first steps fail with `UnavailableError` from the server, and its
`ClusterCoordinator` gives up after three such reports (`TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES`): the restart
fails and costs a relaunch. Measured with TensorFlow 2.21: a coordinator started the moment a server killed three
seconds earlier listened again failed 4 times in 4 with the default and 0 in 4 with this. Waiting is safe here: the
master, not the coordinator, notices a lost parameter server, and it kills the chief whose steps wait on it."""


def run_server(cluster: dict[str, list[str]], role: str, index: int) -> None:
    """Serve as task `role:index` of `cluster` until the process is ended."""
    if role == "worker":
        os.environ.setdefault("GRPC_FAIL_FAST", WORKER_FAIL_FAST)  # before TensorFlow reads it (see the constant)
    import tensorflow as tf  # only servers need TensorFlow in this process

    try:
        server = tf.distribute.Server(
            tf.train.ClusterSpec(cluster), job_name=role, task_index=index, protocol="grpc", start=True
        )
    except tf.errors.UnknownError as exc:  # TensorFlow's only word for a port it could not bind
        print(f"dlrover: {role}:{index} cannot listen at {cluster[role][index]}: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(ADDRESS_IN_USE_EXIT_CODE) from None
    print(f"dlrover: {role}:{index} serving at {cluster[role][index]}", flush=True)
    server.join()


def runs_in_this_interpreter(args: Sequence[str]) -> str | None:
    """The script of `python SCRIPT ARGS...` when that `python` is this interpreter (a standby can run it in
    itself, as a fresh process would); None for any other program."""
    if len(args) < 2 or not args[1].endswith(".py") or not os.path.isfile(args[1]):
        return None
    import shutil

    found = shutil.which(args[0])
    if found is None or os.path.realpath(found) != os.path.realpath(sys.executable):
        return None
    # Two venvs on one base Python link to the same binary: the same venv has the same bin directory too.
    if not os.path.samefile(os.path.dirname(os.path.abspath(found)), os.path.dirname(os.path.abspath(sys.executable))):
        return None
    return args[1]


def _installed(origin: str) -> bool:
    """Whether a module file belongs to an installed library (site-packages, the standard library)."""
    import site
    import sysconfig

    paths = [sysconfig.get_paths().get(key) for key in ("purelib", "platlib", "stdlib", "platstdlib")]
    paths += [*site.getsitepackages(), site.getusersitepackages()]
    roots = {os.path.realpath(p) for p in paths if p}
    path = os.path.realpath(origin)
    return any(path.startswith(root + os.sep) for root in roots)


def _leading_imports(script: str) -> set[str]:
    """The modules `script` imports before its first other statement (after it, the program may have set the
    environment a library reads when imported)."""
    import ast

    try:
        with open(script, encoding="utf-8") as f:
            tree = ast.parse(f.read(), script)
    except (OSError, SyntaxError, ValueError):
        return set()
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            if node.module and node.module != "__future__":
                names.add(node.module)
        elif not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):  # a docstring
            break
    return names


def _warm_up(script: str | None) -> None:
    """Import TensorFlow and the installed libraries the program imports first (never the program's own modules:
    importing them could act)."""
    import importlib
    import importlib.machinery
    import importlib.util

    names = {"tensorflow", *(_leading_imports(script) if script is not None else ())}
    here = [os.path.dirname(os.path.abspath(script))] if script is not None else []
    for name in sorted(names):
        try:
            top_name = name.split(".")[0]
            if here and importlib.machinery.PathFinder.find_spec(top_name, here) is not None:
                continue  # the program's own module, first on its path: it shadows an installed one of that name
            top = importlib.util.find_spec(top_name)  # a top-level name: found without importing anything
            if top is None or top.origin is None or not _installed(top.origin):
                continue
            importlib.import_module(name)
        except Exception as exc:  # a warm-up only: the program imports it again and sees the error
            print(f"dlrover: standby: importing {name} failed ({exc}); the program will import it", flush=True)


def _wait_for_go(fifo: str) -> dict[str, str] | None:
    """Say this standby is ready and wait for the master's go: the task's environment (None: not one)."""
    import select

    # Open before saying ready: the master, once it sees ready, always finds a reader.
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        ready = fifo + ".ready"
        with open(ready + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(ready + ".tmp", ready)
        print(f"dlrover: standby ready (pid {os.getpid()}); waiting at {fifo}", flush=True)
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        poller.poll()  # until the master writes (a FIFO no writer has opened yet shows nothing)
        os.set_blocking(fd, True)
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    text = b"".join(chunks).decode("utf-8", "replace")
    try:
        env = json.loads(text)["env"]
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise TypeError("env must map names to strings")
    except (ValueError, KeyError, TypeError) as exc:
        print(f"dlrover: standby: the master's go is not an environment ({exc}): {text[:200]!r}", file=sys.stderr)
        return None
    os.environ.pop(STANDBY_FIFO_ENV_VAR, None)
    os.environ.update(env)
    print(f"dlrover: standby promoted to node {env.get('DLROVER_NODE_ID', '?')}", flush=True)
    return env


def wait_as_standby(fifo: str, role: str, args: Sequence[str]) -> int:
    """Warm up, then wait for the master's go and become the task it names: a chief runs the program `args` in
    this interpreter; a parameter server or worker serves (its address from the go's `TF_CONFIG`)."""
    if role not in SERVER_ROLES and not args:
        print(f"{USAGE}\nthe {role} runs the training program, and none was given", file=sys.stderr)
        return 2
    script = runs_in_this_interpreter(args) if role not in SERVER_ROLES else None
    _warm_up(script)
    env = _wait_for_go(fifo)
    if env is None:
        return 2
    if role in SERVER_ROLES:
        cluster, role, index = _task(os.environ.get("TF_CONFIG", ""))
        run_server(cluster, role, index)
        return 0
    if script is None:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execvp(args[0], list(args))  # noqa: S606 (the user's own training program, as they gave it)
    import runpy

    sys.argv = [script, *args[2:]]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: serve, or become the user's program."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--"]:
        args = args[1:]
    text = os.environ.get("TF_CONFIG", "")
    if not text:
        print(f"{USAGE}\nTF_CONFIG is not set: the PS job's master sets it for every task", file=sys.stderr)
        return 2
    cluster, role, index = _task(text)
    fifo = os.environ.get(STANDBY_FIFO_ENV_VAR)
    if fifo:
        return wait_as_standby(fifo, role, args)
    if role in SERVER_ROLES:
        run_server(cluster, role, index)
        return 0
    if not args:
        print(f"{USAGE}\nthe {role} runs the training program, and none was given", file=sys.stderr)
        return 2
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvp(args[0], args)  # noqa: S606 (the user's own training program, as they gave it)


if __name__ == "__main__":
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]  # run by path: this package's modules (core, spec, ...) must not shadow top-level ones
    sys.exit(main())
