"""Reading a TensorFlow checkpoint's sizes without TensorFlow.

The index files under data/tf_checkpoint were written by TensorFlow 2.21 (`keras`: a tf_keras model with an Adagrad
optimizer and a few extra variables, saved by a CheckpointManager; `ps`: the example recommender's checkpoint from a
job with two parameter servers, its embeddings partitioned in two; `compiled`: a compiled tf_keras model). The
expected shapes are what `tf.train.list_variables` printed for them; tests/tensorflow compares the two on a live
job's checkpoint too.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlrover.master.psjob.tf_checkpoint import CheckpointReadError, newest_checkpoint, read_index, sizes_of

pytestmark = pytest.mark.timeout(60)

DATA = Path(__file__).parent / "data" / "tf_checkpoint"
KERAS_INDEX = DATA / "keras" / "ckpt-5.index"
PS_INDEX = DATA / "ps" / "ckpt-100.index"

FLOAT32, INT64, STRING, HALF = 1, 9, 7, 19


def test_every_tensor_of_a_keras_checkpoint_with_its_dtype_shape_and_bytes() -> None:
    entries = {e.name: e for e in read_index(KERAS_INDEX)}
    assert sorted(entries) == [
        "_CHECKPOINTABLE_OBJECT_GRAPH",
        "h/.ATTRIBUTES/VARIABLE_VALUE",
        "model/layer_with_weights-0/embeddings/.ATTRIBUTES/VARIABLE_VALUE",
        "model/layer_with_weights-1/bias/.ATTRIBUTES/VARIABLE_VALUE",
        "model/layer_with_weights-1/kernel/.ATTRIBUTES/VARIABLE_VALUE",
        "optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE",
        "optimizer/_learning_rate/.ATTRIBUTES/VARIABLE_VALUE",
        "optimizer/_variables/1/.ATTRIBUTES/VARIABLE_VALUE",
        "optimizer/_variables/2/.ATTRIBUTES/VARIABLE_VALUE",
        "optimizer/_variables/3/.ATTRIBUTES/VARIABLE_VALUE",
        "s/.ATTRIBUTES/VARIABLE_VALUE",
        "save_counter/.ATTRIBUTES/VARIABLE_VALUE",
        "step/.ATTRIBUTES/VARIABLE_VALUE",
    ]
    embeddings = entries["model/layer_with_weights-0/embeddings/.ATTRIBUTES/VARIABLE_VALUE"]
    assert (embeddings.dtype, embeddings.shape, embeddings.nbytes) == (FLOAT32, (1000, 16), 1000 * 16 * 4)
    assert entries["h/.ATTRIBUTES/VARIABLE_VALUE"].dtype == HALF
    assert entries["h/.ATTRIBUTES/VARIABLE_VALUE"].nbytes == 3 * 2
    assert entries["step/.ATTRIBUTES/VARIABLE_VALUE"].shape == ()
    assert entries["step/.ATTRIBUTES/VARIABLE_VALUE"].dtype == INT64
    assert entries["s/.ATTRIBUTES/VARIABLE_VALUE"].dtype == STRING


def test_the_model_is_counted_apart_from_the_optimizer_and_every_byte_of_the_data_file_is_summed() -> None:
    sizes = sizes_of(DATA / "keras" / "ckpt-5")
    assert sizes.parameter_count == 1000 * 16 + 16 * 4 + 4
    assert sizes.model_bytes == sizes.parameter_count * 4
    # What TensorFlow wrote in ckpt-5.data-00000-of-00001: the index accounts for every byte of it.
    assert sizes.total_bytes == 130053
    assert sizes.shard_bytes == (130053 - 1466,), "the object graph (1,466 bytes) is no server's state"
    assert sizes.tensors == 12


def test_a_partitioned_variable_is_one_tensor_its_slices_hold_its_bytes_and_each_server_has_a_file() -> None:
    entries = read_index(PS_INDEX)
    users = [e for e in entries if e.sliced_from == "model/users/embeddings/.ATTRIBUTES/VARIABLE_VALUE"]
    assert sorted(e.shape for e in users) == [(48, 8), (49, 8)]
    full = next(e for e in entries if e.name == "model/users/embeddings/.ATTRIBUTES/VARIABLE_VALUE")
    assert (full.shape, full.nbytes) == ((97, 8), 0)
    assert {e.shard for e in users} == {0, 2}  # one slice on each parameter server's file
    sizes = sizes_of(DATA / "ps" / "ckpt-100")
    # users 97x8, items 53x8, user and item biases, a global bias
    assert sizes.parameter_count == 97 * 8 + 53 * 8 + 97 + 53 + 1
    assert sizes.model_bytes == sizes.parameter_count * 4
    # The three data files as TensorFlow wrote them (5,144, 1,689 and 5,684 bytes), less the object graph in the
    # chief's: a server's file holds its slices of the variables, the chief's the counters.
    assert sizes.shard_bytes == (5144, 1689 - 1681, 5684)
    assert sizes.total_bytes == 5144 + 1689 + 5684


def test_a_compiled_models_optimizer_is_not_counted_as_the_model() -> None:
    # compiled/: a compiled tf_keras model (embedding 100x8, dense 24x1) with Adam, checkpointed as `model`: Keras
    # tracks the optimizer under the model, so its slots are `model/optimizer/_variables/N`.
    names = [e.name for e in read_index(DATA / "compiled" / "ckpt-1.index")]
    assert "model/optimizer/_variables/1/.ATTRIBUTES/VARIABLE_VALUE" in names
    sizes = sizes_of(DATA / "compiled" / "ckpt-1")
    assert sizes.parameter_count == 100 * 8 + 24 + 1
    assert sizes.model_bytes == sizes.parameter_count * 4


def test_the_newest_checkpoint_is_the_one_the_state_file_names(tmp_path: Path) -> None:
    assert newest_checkpoint(DATA / "ps") == DATA / "ps" / "ckpt-100"
    assert newest_checkpoint(tmp_path) is None  # nothing saved yet
    (tmp_path / "checkpoint").write_text(f'model_checkpoint_path: "{tmp_path}/ckpt-\\303\\251\\"7"\n')
    assert newest_checkpoint(tmp_path) == tmp_path / 'ckpt-é"7'
    keras = tmp_path / "backup"
    (keras / "chief").mkdir(parents=True)
    (keras / "chief" / "checkpoint").write_text('model_checkpoint_path: "ckpt-3"\n')
    assert newest_checkpoint(keras) == keras / "chief" / "ckpt-3", "Keras' BackupAndRestore keeps it in chief/"
    (tmp_path / "checkpoint").write_text("all_model_checkpoint_paths: nothing\n")
    with pytest.raises(CheckpointReadError, match="names no model_checkpoint_path"):
        newest_checkpoint(tmp_path)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda b: b[:30], "shorter than an index's footer"),
        (lambda b: b[:-1] + b"\x00", "lacks the table magic number"),
        (lambda b: b[:-48] + b"\xff" * 40 + b[-8:], "varint|outside"),
        (lambda b: b"", "shorter than an index's footer"),
    ],
)
def test_a_damaged_index_is_named_and_refused(tmp_path: Path, damage: object, message: str) -> None:
    bad = tmp_path / "ckpt-1.index"
    bad.write_bytes(damage(KERAS_INDEX.read_bytes()))  # type: ignore[operator]
    with pytest.raises(CheckpointReadError, match=message) as info:
        sizes_of(tmp_path / "ckpt-1")
    assert str(bad) in str(info.value)


def test_a_compressed_block_is_refused_not_misread(tmp_path: Path) -> None:
    data = bytearray(KERAS_INDEX.read_bytes())
    # The first data block starts at 0; its trailer's type byte follows it. Its size is the first handle of the
    # index block, which the reader would use: find it the reader's way, by trying every type byte position.
    for position in range(len(data) - 48):
        if data[position] == 0 and data[position + 1 : position + 5] != b"\0\0\0\0":
            candidate = bytearray(data)
            candidate[position] = 1  # snappy
            path = tmp_path / f"ckpt-{position}.index"
            path.write_bytes(bytes(candidate))
            try:
                sizes_of(tmp_path / f"ckpt-{position}")
            except CheckpointReadError as exc:
                if "compressed" in str(exc):
                    return
    pytest.fail("no block trailer was found to mark compressed")


def test_a_missing_index_is_named(tmp_path: Path) -> None:
    with pytest.raises(CheckpointReadError, match="cannot be read"):
        sizes_of(tmp_path / "ckpt-9")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_any_corruption_is_a_clear_error_or_a_reading_never_anything_else(tmp_path: Path, data: st.DataObject) -> None:
    original = bytearray(PS_INDEX.read_bytes())
    for _ in range(data.draw(st.integers(1, 8))):
        original[data.draw(st.integers(0, len(original) - 1))] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(original)))
    path = tmp_path / "fuzz" / "ckpt-1.index"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(bytes(original[:cut] if data.draw(st.booleans()) else original))
    try:
        sizes = sizes_of(path.with_suffix(""))
    except CheckpointReadError:
        return
    assert sizes.total_bytes >= 0
    assert sizes.parameter_count >= 0
    shutil.rmtree(path.parent)
