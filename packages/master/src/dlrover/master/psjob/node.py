"""One task of a PS job, as the master's scheduler backend starts it.

    python .../dlrover/master/psjob/node.py -- PROGRAM [ARGS...]     (or: python -m dlrover.master.psjob.node)

The task's `TF_CONFIG` (set by the master) says its role. A parameter server or a worker runs TensorFlow's
standard server at its address until it is stopped; the chief and the evaluator run the user's program (this
process becomes it, so its exit status is the node's). TensorFlow is imported only by servers.

Only the standard library is imported here, and the master starts this file by its path: run as a module, it
would first import the `dlrover.master` package (most of a second, on every chief restart).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence

__all__ = ["ADDRESS_IN_USE_EXIT_CODE", "SERVER_ROLES", "main", "run_server"]

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
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvp(args[0], args)  # noqa: S606 (the user's own training program, as they gave it)


if __name__ == "__main__":
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]  # run by path: this package's modules (core, spec, ...) must not shadow top-level ones
    sys.exit(main())
