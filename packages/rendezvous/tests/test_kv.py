from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlrover.common import ConfigError
from dlrover.rendezvous import InvalidRequestError, KeyValueStore, KvLimits, StoreFullError


def test_set_get_and_multi() -> None:
    kv = KeyValueStore()
    assert kv.get("a") is None
    kv.set("a", b"1")
    kv.multi_set(["b", "c"], [b"2", b""])
    assert kv.multi_get(["a", "b", "c", "d"]) == [b"1", b"2", b"", None]
    assert kv.check(["a", "c"])
    assert not kv.check(["a", "d"])
    assert kv.num_keys() == 3
    assert kv.delete_key("a")
    assert not kv.delete_key("a")
    assert kv.num_keys() == 2


def test_add_counts_from_zero_and_rejects_non_integers() -> None:
    kv = KeyValueStore()
    assert kv.add("n", 3) == 3
    assert kv.add("n", -5) == -2
    assert kv.get("n") == b"-2"
    kv.set("s", b"abc")
    with pytest.raises(InvalidRequestError, match="'s' holds b'abc', not an integer"):
        kv.add("s", 1)
    with pytest.raises(InvalidRequestError, match="int64"):
        kv.add("n", 2**64)
    assert kv.get("n") == b"-2"


def test_compare_set_follows_torch_semantics() -> None:
    kv = KeyValueStore()
    assert kv.compare_set("k", b"x", b"y") == b"x"
    assert kv.get("k") is None
    assert kv.compare_set("k", b"", b"first") == b"first"
    assert kv.compare_set("k", b"wrong", b"second") == b"first"
    assert kv.compare_set("k", b"first", b"second") == b"second"


def test_bad_input_changes_nothing() -> None:
    kv = KeyValueStore(KvLimits(max_key_bytes=8, max_value_bytes=4, max_keys=2))
    kv.set("a", b"1")
    with pytest.raises(InvalidRequestError, match="non-empty string"):
        kv.set("", b"1")
    with pytest.raises(InvalidRequestError, match="max_key_bytes=8"):
        kv.set("x" * 9, b"1")
    with pytest.raises(InvalidRequestError, match="5 bytes, more than max_value_bytes=4"):
        kv.multi_set(["b", "c"], [b"1", b"12345"])
    with pytest.raises(InvalidRequestError, match="2 keys but 1 values"):
        kv.multi_set(["b", "c"], [b"1"])
    with pytest.raises(StoreFullError, match="max_keys=2"):
        kv.multi_set(["b", "c"], [b"1", b"2"])
    assert kv.multi_get(["a", "b", "c"]) == [b"1", None, None]
    with pytest.raises(ConfigError, match="max_keys"):
        KvLimits(max_keys=0)


@given(st.lists(st.tuples(st.sampled_from(["set", "add", "del", "cas"]), st.sampled_from("abc"), st.integers(0, 3))))
def test_matches_a_dict_model(ops: list[tuple[str, str, int]]) -> None:
    kv, model = KeyValueStore(), {}
    for op, key, n in ops:
        value = str(n).encode()
        if op == "set":
            kv.set(key, value)
            model[key] = value
        elif op == "add":
            if key in model and not model[key].lstrip(b"-").isdigit():
                continue
            expected = int(model.get(key, b"0")) + n
            assert kv.add(key, n) == expected
            model[key] = str(expected).encode()
        elif op == "del":
            assert kv.delete_key(key) == (model.pop(key, None) is not None)
        else:
            current = model.get(key)
            answer = kv.compare_set(key, value, b"9")
            if current == value:
                model[key] = b"9"
            assert answer == model.get(key, value)
        assert kv.num_keys() == len(model)
        assert kv.multi_get(list("abc")) == [model.get(k) for k in "abc"]


def test_total_bytes_are_bounded_and_a_refused_write_changes_nothing() -> None:
    kv = KeyValueStore(KvLimits(max_total_bytes=100))
    kv.set("a", b"x" * 50)  # 51 bytes with its key
    with pytest.raises(StoreFullError, match="max_total_bytes=100"):
        kv.multi_set(["b", "c"], [b"y" * 10, b"z" * 40])
    assert (kv.num_keys(), kv.get("b"), kv.get("c")) == (1, None, None)
    with pytest.raises(StoreFullError):
        kv.compare_set("a", b"x" * 50, b"w" * 100)
    assert kv.get("a") == b"x" * 50
    kv.set("a", b"x" * 10)  # shrinking a value frees room
    kv.set("b", b"y" * 80)
    assert kv.delete_key("a")
    kv.set("c", b"z" * 9)
    for i in range(3):
        kv.add(f"n{i}", 7)
    with pytest.raises(StoreFullError):
        kv.set("d", b"q" * 5)


def test_items_and_restore_round_trip_and_keep_the_byte_budget() -> None:
    kv = KeyValueStore(KvLimits(max_total_bytes=100))
    kv.set("a", b"x" * 40)
    kv.add("n", 3)
    copy = KeyValueStore(KvLimits(max_total_bytes=100))
    copy.restore(kv.items())
    assert copy.items() == {"a": b"x" * 40, "n": b"3"}
    # The restored byte count is enforced: the store is as full as the original.
    with pytest.raises(StoreFullError, match="max_total_bytes=100"):
        copy.set("b", b"y" * 60)
    kv.set("b", b"y" * 50)
    small = KeyValueStore(KvLimits(max_total_bytes=60))
    small.set("keep", b"1")
    with pytest.raises(StoreFullError, match="cannot restore"):
        small.restore(kv.items())
    with pytest.raises(InvalidRequestError):
        small.restore({"": b"1"})
    assert small.items() == {"keep": b"1"}  # a refused restore changes nothing
