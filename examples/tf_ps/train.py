"""A small recommender trained with TensorFlow's parameter-server strategy under `dlrover-master ps-job`.

    dlrover-master ps-job --ps 2 --workers 2 --work-dir /tmp/job -- python examples/tf_ps/train.py --out /tmp/job/out

The chief runs this script: a `ClusterCoordinator` schedules each step on a worker, the variables live on the
parameter servers. The chief reads sample indices from the master's shard service (exactly once: a batch's
samples are acknowledged only after its step finished), and every `--checkpoint-every` steps it saves the model,
the optimizer and the data position together. Started again (its own failure, or a lost parameter server), it
restores all three from the newest checkpoint and goes on from there. On SIGTERM (the master's planned stop) it
checkpoints at the next step and exits.

Keras: `tf.keras` in TensorFlow 2.21 is Keras 3, which has no parameter-server training; this script uses
`tf_keras` (`pip install tf-keras`), the Keras 2 that TensorFlow keeps for it.

The model and the samples are `recommender.py`'s. `--pause-file` with `--pause-at` holds training at that step
while the file exists; tests use it to act at a known step.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, NoReturn

import tensorflow as tf
import tf_keras as keras
from chief_exit import exit_without_teardown
from recommender import Recommender, features

from dlrover.common import load_token
from dlrover.shard import DatasetSpec, DeliveryMode, IndexSource, ShardClient, ShardClientConfig
from dlrover.shard.tf_data import ShardTFDataset

DATASET = "tf-ps-example"


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True,
                   help="the committed-sample ledger, the summary, and the checkpoints unless $DLROVER_CHECKPOINT_DIR "
                   "(set by dlrover-master ps-job) names their place")  # fmt: skip
    p.add_argument("--samples", type=int, default=6400)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--join-every", type=int, default=5, help="steps in flight before they are joined and committed")
    p.add_argument("--checkpoint-every", type=int, default=20, help="steps between checkpoints")
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--pause-file", default="", help="with --pause-at: hold training there while this file exists")
    p.add_argument("--pause-at", type=int, default=-1, help="the step to hold at (after the steps before it joined)")
    p.add_argument("--until-file", default="", help="end the training at the next step once this file exists")
    return p.parse_args(argv)


class Checkpoints:
    """Model, optimizer, step and data position, saved together and restored together."""

    def __init__(self, directory: Path, checkpoint: tf.train.Checkpoint) -> None:
        self.dir = directory
        self.manager = tf.train.CheckpointManager(checkpoint, str(directory), max_to_keep=3)
        self.checkpoint = checkpoint

    def save(self, step: int, data_state: dict[str, Any]) -> None:
        # The data position first: a checkpoint is used only once its data position is there too.
        tmp = self.dir / f".data-{step}.json.tmp"
        tmp.write_text(json.dumps(data_state))
        os.replace(tmp, self.dir / f"data-{step}.json")
        self.manager.save(checkpoint_number=step)

    def restore(self) -> tuple[int, dict[str, Any]] | None:
        """(step, data position) of the newest complete checkpoint restored; None when there is none."""
        for path in reversed(self.manager.checkpoints):
            step = int(path.rsplit("-", 1)[1])
            data = self.dir / f"data-{step}.json"
            if data.exists():
                self.checkpoint.restore(path).assert_existing_objects_matched()
                return step, json.loads(data.read_text())
        return None


class Stopped(Exception):
    """SIGTERM arrived; the newest state is checkpointed."""


def main(argv: list[str]) -> NoReturn:
    try:
        Trainer(parse(argv)).run()
    except Stopped:
        exit_without_teardown(128 + signal.SIGTERM)
    exit_without_teardown(0)


class Trainer:
    """The chief's side of the job: variables on the parameter servers, steps on the workers, data and
    checkpoints here."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.incarnation = os.environ.get("DLROVER_NODE_ID", "0")
        self.started = time.monotonic()
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        # The embeddings are sharded over every parameter server (one shard per server, each at least 256 bytes),
        # so a job restarted with more servers restores them re-sharded.
        servers = len(resolver.cluster_spec().as_dict().get("ps", []))
        partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
            min_shard_bytes=256, max_shards=servers
        )
        self.strategy = tf.distribute.ParameterServerStrategy(resolver, variable_partitioner=partitioner)
        self.coordinator = tf.distribute.coordinator.ClusterCoordinator(self.strategy)
        with self.strategy.scope():
            self.model = Recommender()
            self.model((tf.zeros([1], tf.int64), tf.zeros([1], tf.int64)))
            self.optimizer = keras.optimizers.Adagrad(args.lr)
            self.step_var = tf.Variable(0, dtype=tf.int64, name="step")
            self.applied = tf.Variable(0, dtype=tf.int64, name="applied_updates")
        # Built on the chief before the first step, so restoring fills them instead of deferring.
        self.optimizer.build(self.model.trainable_variables)
        self.client = ShardClient(os.environ["DLROVER_MASTER_ADDR"], load_token(), DATASET, "chief",
                                  config=ShardClientConfig(prefetch_shards=0))  # fmt: skip
        self.client.register(
            DatasetSpec(name=DATASET, source=IndexSource(args.samples), batch_size=args.batch, batches_per_shard=2,
                        num_epochs=args.epochs, shuffle=True, seed=args.seed, delivery=DeliveryMode.EXACTLY_ONCE)
        )  # fmt: skip
        self.feed = ShardTFDataset(self.client)
        # The master's checkpoint directory when it gives one (it reads the model's size there), else our own.
        checkpoints = Path(os.environ.get("DLROVER_CHECKPOINT_DIR") or self.out / "checkpoints")
        checkpoints.mkdir(parents=True, exist_ok=True)
        checkpoint = tf.train.Checkpoint(model=self.model, optimizer=self.optimizer, step=self.step_var)
        self.checkpoints = Checkpoints(checkpoints, checkpoint)
        self.losses: list[float] = []
        self.in_flight: list[tuple[Any, list[list[int]]]] = []
        self.ledger = (self.out / "committed.jsonl").open("a")
        # The master stops the chief with SIGTERM before a planned restart (a parameter server added): checkpoint at
        # the next step boundary, so the restart redoes nothing.
        self.stop_requested = threading.Event()
        signal.signal(signal.SIGTERM, lambda _signum, _frame: self.stop_requested.set())

    @tf.function
    def train_step(self, user: tf.Tensor, item: tf.Tensor, label: tf.Tensor) -> tf.Tensor:
        def replica(user: tf.Tensor, item: tf.Tensor, label: tf.Tensor) -> tf.Tensor:
            with tf.GradientTape() as tape:
                logits = self.model((user, item))
                loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=logits))
            variables = self.model.trainable_variables
            self.optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables, strict=True))
            self.applied.assign_add(1)
            return loss

        return self.strategy.run(replica, args=(user, item, label))

    def join_and_commit(self, step: int) -> None:
        """Wait for the steps in flight, then acknowledge their samples, in the order they were scheduled."""
        self.coordinator.join()
        for loss, cursors in self.in_flight:
            self.losses.append(float(loss.fetch()))
            self.feed.commit(cursors)
            entry = {"node": self.incarnation, "step": step, "t": time.time(), "cursors": cursors}
            self.ledger.write(json.dumps(entry) + "\n")
        self.ledger.flush()
        self.in_flight.clear()

    def hold_if_asked(self, step: int) -> None:
        pause = Path(self.args.pause_file) if self.args.pause_file else None
        if pause is not None and step == self.args.pause_at and pause.exists():
            self.join_and_commit(step)
            (self.out / f"at-step-{step}").touch()
            while pause.exists():
                time.sleep(0.05)

    def run(self) -> None:
        args = self.args
        restored = self.checkpoints.restore()
        if restored is not None:
            self.feed.load_state_dict(restored[1])
            print(f"restored step {restored[0]} and its data position", flush=True)
        step = int(self.step_var.numpy())
        applied_at_start = int(self.applied.numpy())  # a fresh variable after a restart: this incarnation's
        data = self.feed.dataset().map(lambda i, c: (*features(i), c)).batch(args.batch)
        until = Path(args.until_file) if args.until_file else None
        while not self.feed.finished and not (until is not None and until.exists()):
            for user, item, label, cursors in data:
                if until is not None and until.exists():
                    break
                self.hold_if_asked(step)
                if self.stop_requested.is_set():
                    self.join_and_commit(step)
                    self.step_var.assign(step)
                    self.checkpoints.save(step, self.feed.state_dict())
                    print(f"stopped by SIGTERM: checkpointed step {step}", flush=True)
                    self.ledger.close()
                    self.client.close()
                    raise Stopped
                loss = self.coordinator.schedule(self.train_step, args=(user, item, label))
                self.in_flight.append((loss, cursors.numpy().tolist()))
                step += 1
                if len(self.in_flight) >= args.join_every or step % args.checkpoint_every == 0:
                    self.join_and_commit(step)
                if step % args.checkpoint_every == 0:
                    self.step_var.assign(step)
                    self.checkpoints.save(step, self.feed.state_dict())
            self.join_and_commit(step)
        self.step_var.assign(step)
        self.checkpoints.save(step, self.feed.state_dict())
        summary = {
            "node": self.incarnation,
            "steps": step,
            "restored_step": None if restored is None else restored[0],
            "checkpoint_dir": str(self.checkpoints.dir),
            "first_loss": self.losses[0] if self.losses else None,
            "last_loss": sum(self.losses[-10:]) / len(self.losses[-10:]) if self.losses else None,
            "updates_applied": int(self.applied.numpy()) - applied_at_start,
            # A ShardedVariable lists its shards (one per parameter server here); a plain variable is one.
            "embedding_shards": len(getattr(self.model.users.embeddings, "variables", [0])),
            "seconds": time.monotonic() - self.started,
        }
        (self.out / "summary.json").write_text(json.dumps(summary))
        print(json.dumps(summary), flush=True)
        self.ledger.close()
        self.client.close()


if __name__ == "__main__":
    main(sys.argv[1:])
