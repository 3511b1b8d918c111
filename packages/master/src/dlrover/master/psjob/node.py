"""One task of a PS job, as the master's scheduler backend starts it.

    python .../dlrover/master/psjob/node.py -- PROGRAM [ARGS...]     (or: python -m dlrover.master.psjob.node)

The task's `TF_CONFIG` (set by the master) says its role. A parameter server or a worker runs TensorFlow's
standard server at its address until it is stopped; the chief and the evaluator run the user's program (this
process becomes it, so its exit status is the node's). TensorFlow is imported only by servers.

A standby chief (`DLROVER_STANDBY_FIFO` set) imports TensorFlow and the libraries the program imports, says it is
ready (`<fifo>.ready`), and waits on the FIFO; when the master writes the next chief's environment there, it runs
the program in this warm interpreter (`runpy`, for `python script.py ...`; anything else is exec'd as usual), so
a restarted chief does not pay for importing TensorFlow again.

Only the standard library is imported here, and the master starts this file by its path: run as a module, it
would first import the `dlrover.master` package (most of a second, on every chief restart).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence

__all__ = ["ADDRESS_IN_USE_EXIT_CODE", "SERVER_ROLES", "STANDBY_FIFO_ENV_VAR", "main", "run_server", "wait_as_standby"]

STANDBY_FIFO_ENV_VAR = "DLROVER_STANDBY_FIFO"
"""Set for a standby chief: the FIFO the master writes the next chief's environment to (JSON)."""

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


def run_server(cluster: dict[str, list[str]], role: str, index: int) -> None:
    """Serve as task `role:index` of `cluster` until the process is ended."""
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


def _python_script(args: Sequence[str]) -> str | None:
    """The script of `python SCRIPT ARGS...` (run in this interpreter by a standby); None for any other program."""
    if len(args) < 2 or not os.path.basename(args[0]).startswith("python") or not args[1].endswith(".py"):
        return None
    return args[1] if os.path.isfile(args[1]) else None


def _warm_up(script: str | None) -> None:
    """Import TensorFlow and the installed libraries `script` imports at its top level (not its own modules)."""
    import ast
    import importlib
    import importlib.util

    names = {"tensorflow"}
    if script is not None:
        try:
            with open(script, encoding="utf-8") as f:
                tree = ast.parse(f.read(), script)
        except (OSError, SyntaxError, ValueError):
            tree = None
        for node in tree.body if tree is not None else ():
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module)
    here = os.path.dirname(os.path.abspath(script)) if script else None
    for name in sorted(names):
        try:
            spec = importlib.util.find_spec(name)
            origin = spec.origin if spec is not None else None
            if origin is None or (here is not None and os.path.dirname(os.path.abspath(origin)) == here):
                continue  # not installed, or the program's own module (importing it could act)
            importlib.import_module(name)
        except Exception as exc:  # a warm-up only: the program imports it again and sees the error
            print(f"dlrover: standby chief: importing {name} failed ({exc}); the program will import it", flush=True)


def wait_as_standby(fifo: str, args: Sequence[str]) -> int:
    """Warm up, say so, wait for the master's go (the chief's environment), then run the program `args`."""
    script = _python_script(args)
    _warm_up(script)
    ready = fifo + ".ready"
    with open(ready + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(ready + ".tmp", ready)
    print(f"dlrover: standby chief ready (pid {os.getpid()}); waiting at {fifo}", flush=True)
    with open(fifo, encoding="utf-8") as f:  # blocks until the master opens it to write
        text = f.read()
    try:
        env = json.loads(text)["env"]
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise TypeError("env must map names to strings")
    except (ValueError, KeyError, TypeError) as exc:
        print(f"dlrover: standby chief: the master's go is not an environment ({exc}): {text[:200]!r}", file=sys.stderr)
        return 2
    os.environ.pop(STANDBY_FIFO_ENV_VAR, None)
    os.environ.update(env)
    print(f"dlrover: standby chief promoted to node {env.get('DLROVER_NODE_ID', '?')}", flush=True)
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
    if role in SERVER_ROLES:
        run_server(cluster, role, index)
        return 0
    if not args:
        print(f"{USAGE}\nthe {role} runs the training program, and none was given", file=sys.stderr)
        return 2
    fifo = os.environ.get(STANDBY_FIFO_ENV_VAR)
    if fifo and role == "chief":
        return wait_as_standby(fifo, args)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvp(args[0], args)  # noqa: S606 (the user's own training program, as they gave it)


if __name__ == "__main__":
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]  # run by path: this package's modules (core, spec, ...) must not shadow top-level ones
    sys.exit(main())
