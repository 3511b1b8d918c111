"""The recommender of `recommender.py` trained with tf_keras `model.fit` and `ParameterServerStrategy`.

    dlrover-master ps-job --ps 2 --workers 2 --work-dir /tmp/job -- python examples/tf_ps/fit.py --out /tmp/job/out

`model.fit` under a parameter-server strategy builds its input on every worker from a `DatasetCreator`: the
dataset runs inside each worker's TensorFlow server, which has no Python to call the shard service from, so the
samples come from TensorFlow ops there (generated here; files in a real job), and a worker's lost position is
TensorFlow's at-least-once. Fault tolerance is Keras' `BackupAndRestore`: the chief restarted after a lost
parameter server or its own failure resumes at the epoch after the newest backup.

Writes `epoch-<n>.json` (the epoch's logs) and, at the end, `summary.json` (epochs, the epoch this incarnation
began at, first and last loss). `--pause-file` with `--pause-at` holds training at the end of that epoch while the
file exists.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

import tensorflow as tf
import tf_keras as keras
from chief_exit import exit_without_teardown
from recommender import Recommender, features


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True,
                   help="per-epoch logs, the summary, and the backup unless $DLROVER_CHECKPOINT_DIR (set by "
                   "dlrover-master ps-job) names its place")  # fmt: skip
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--steps-per-epoch", type=int, default=40)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--pause-file", default="", help="with --pause-at: hold training there while this file exists")
    p.add_argument("--pause-at", type=int, default=-1, help="the epoch to hold at the end of")
    return p.parse_args(argv)


class Progress(keras.callbacks.Callback):
    """Writes each epoch's logs, remembers where this incarnation began, and holds where asked."""

    def __init__(self, out: Path, args: argparse.Namespace) -> None:
        super().__init__()
        self.out, self.args = out, args
        self.first_epoch: int | None = None
        self.losses: list[float] = []

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if self.first_epoch is None:
            self.first_epoch = epoch

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        loss = float((logs or {})["loss"])
        self.losses.append(loss)
        record = {"epoch": epoch, "loss": loss, "node": os.environ.get("DLROVER_NODE_ID", "0"), "t": time.time()}
        (self.out / f"epoch-{epoch}.json").write_text(json.dumps(record))
        pause = Path(self.args.pause_file) if self.args.pause_file else None
        if pause is not None and epoch == self.args.pause_at:
            (self.out / f"at-epoch-{epoch}").touch()
            while pause.exists():
                time.sleep(0.05)


def dataset_fn(context: tf.distribute.InputContext, batch: int) -> tf.data.Dataset:
    """Each worker's input: the samples from a worker-specific start, in an endless stream."""
    start = context.input_pipeline_id * 1_000_003
    data = tf.data.Dataset.range(start, start + 1_000_000).map(lambda i: (features(i)[:2], features(i)[2]))
    return data.batch(batch).repeat()


def train(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    strategy = tf.distribute.ParameterServerStrategy(tf.distribute.cluster_resolver.TFConfigClusterResolver())
    with strategy.scope():
        model = Recommender()
        model.compile(keras.optimizers.Adagrad(args.lr), keras.losses.BinaryCrossentropy(from_logits=True),
                      steps_per_execution=5)  # fmt: skip
    progress = Progress(out, args)
    # The master's checkpoint directory when it gives one (it reads the model's size there), else our own.
    backup = keras.callbacks.BackupAndRestore(os.environ.get("DLROVER_CHECKPOINT_DIR") or str(out / "backup"))
    model.fit(
        keras.utils.experimental.DatasetCreator(lambda context: dataset_fn(context, args.batch)),
        epochs=args.epochs,
        steps_per_epoch=args.steps_per_epoch,
        callbacks=[backup, progress],
        verbose=2,
    )
    summary = {
        "epochs": args.epochs,
        "first_epoch": progress.first_epoch,
        "first_loss": progress.losses[0] if progress.losses else None,
        "last_loss": progress.losses[-1] if progress.losses else None,
    }
    (out / "summary.json").write_text(json.dumps(summary))
    print(json.dumps(summary), flush=True)


def main(argv: list[str]) -> NoReturn:
    train(parse(argv))
    exit_without_teardown(0)


if __name__ == "__main__":
    main(sys.argv[1:])
