"""CLOCK prediction cache and input digests (parityserve.core.cache)."""

from __future__ import annotations

import copy
import dataclasses
import enum

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from parityserve.core import cache
from parityserve.core.cache import CacheStats, ClockCache, cache_key, input_digest
from parityserve.errors import ConfigError


def test_public_names() -> None:
    assert sorted(cache.__all__) == ["CacheStats", "ClockCache", "cache_key", "input_digest"]


# --- ClockCache -------------------------------------------------------------------------


def test_get_after_put_and_stats() -> None:
    c: ClockCache[str, int] = ClockCache(100)
    assert c.put("a", 1, 10)
    assert c.get("a") == 1
    assert c.get("b") is None
    assert "a" in c and "b" not in c and len(c) == 1
    assert c.statistics() == CacheStats(
        hits=1, misses=1, entries=1, bytes_used=10, capacity_bytes=100, evictions=0)


def test_peek_touches_neither_stats_nor_reference_bit() -> None:
    c: ClockCache[str, int] = ClockCache(2)
    c.put("a", 1, 1)
    c.put("b", 2, 1)
    assert c.peek("a") == 1 and c.peek("zzz") is None
    c.put("c", 3, 1)  # "a" was only peeked: no second chance, it is evicted first
    assert "a" not in c and "b" in c and "c" in c
    stats = c.statistics()
    assert (stats.hits, stats.misses, stats.evictions) == (0, 0, 1)


def test_clock_gives_referenced_entries_a_second_chance() -> None:
    c: ClockCache[str, str] = ClockCache(3)
    for key in "abc":
        c.put(key, key.upper(), 1)
    assert c.get("a") == "A"  # sets a's reference bit
    c.put("d", "D", 1)  # the hand skips a (clearing its bit) and evicts b
    assert set(k for k in "abcd" if k in c) == {"a", "c", "d"}
    c.put("e", "E", 1)  # next unreferenced entry after the hand: c
    assert set(k for k in "abcde" if k in c) == {"a", "d", "e"}
    c.put("f", "F", 1)  # a's second chance is used up: now it goes
    assert set(k for k in "abcdef" if k in c) == {"d", "e", "f"}
    assert c.statistics().evictions == 3


def test_all_referenced_entries_still_make_room() -> None:
    c: ClockCache[int, int] = ClockCache(3)
    for k in range(3):
        c.put(k, k, 1)
        c.get(k)
    assert c.put(3, 3, 1)
    assert 0 not in c and {1, 2, 3} <= {k for k in range(4) if k in c}


def test_evicts_several_entries_to_fit_a_large_one() -> None:
    c: ClockCache[str, int] = ClockCache(10)
    for i, key in enumerate("abcde"):
        c.put(key, i, 2)
    assert c.put("big", 99, 7)
    stats = c.statistics()
    assert stats.bytes_used <= 10 and c.get("big") == 99
    assert stats.evictions == 4 and "e" in c


def test_item_bigger_than_capacity_is_not_stored() -> None:
    c: ClockCache[str, int] = ClockCache(10)
    c.put("a", 1, 5)
    assert not c.put("huge", 2, 11)
    assert "huge" not in c and c.get("a") == 1  # nothing evicted for a hopeless item
    assert c.statistics().evictions == 0


def test_replacing_a_key_adjusts_the_size() -> None:
    c: ClockCache[str, int] = ClockCache(10)
    c.put("a", 1, 4)
    c.put("a", 2, 7)
    assert c.get("a") == 2 and len(c) == 1
    assert c.statistics().bytes_used == 7
    assert not c.put("a", 3, 11)  # an oversized replacement drops the stale value too
    assert c.get("a") is None and c.statistics().bytes_used == 0


def test_discard() -> None:
    c: ClockCache[str, int] = ClockCache(10)
    c.put("a", 1, 4)
    c.discard("a")
    c.discard("never-there")
    assert "a" not in c and c.statistics().bytes_used == 0


def test_zero_capacity_disables_the_cache() -> None:
    c: ClockCache[str, int] = ClockCache(0)
    assert not c.put("a", 1, 0)  # not even a zero-byte entry
    assert not c.put("b", 1, 1)
    assert c.get("a") is None and c.get("b") is None
    assert len(c) == 0 and c.statistics().misses == 2


def test_zero_byte_entries_fit_and_stats_are_frozen() -> None:
    c: ClockCache[str, int] = ClockCache(1)
    assert c.put("z", 0, 0) and c.get("z") == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.statistics().hits = 5  # type: ignore[misc]


def test_invalid_arguments() -> None:
    with pytest.raises(ConfigError, match="capacity"):
        ClockCache(-1)
    with pytest.raises(ValueError, match="nbytes"):
        ClockCache[str, int](10).put("a", 1, -1)


ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.integers(0, 15), st.integers(0, 40)),
        st.tuples(st.just("get"), st.integers(0, 15), st.just(0)),
        st.tuples(st.just("discard"), st.integers(0, 15), st.just(0)),
    ),
    max_size=120,
)


@given(capacity=st.integers(0, 64), operations=ops)
def test_model_based_invariants(capacity: int, operations: list[tuple[str, int, int]]) -> None:
    c: ClockCache[int, tuple[int, int]] = ClockCache(capacity)
    latest: dict[int, tuple[int, int]] = {}  # what a put last stored under each key
    sizes: dict[int, int] = {}
    for step, (op, key, nbytes) in enumerate(operations):
        if op == "put":
            stored = c.put(key, (key, step), nbytes)
            assert stored == (capacity > 0 and nbytes <= capacity)
            assert c.get(key) == ((key, step) if stored else None)
            latest[key], sizes[key] = (key, step), nbytes
        elif op == "get":
            got = c.get(key)
            assert got is None or got == latest[key]  # never a stale or foreign value
        else:
            c.discard(key)
            assert key not in c
        stats = c.statistics()
        assert stats.bytes_used <= capacity
        assert stats.bytes_used == sum(sizes[k] for k in latest if k in c)
        assert stats.entries == len(c)


# --- digests ----------------------------------------------------------------------------


def test_digest_is_16_bytes_and_deterministic() -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    d = input_digest(x)
    assert isinstance(d, bytes) and len(d) == 16
    assert d == input_digest(x.copy())


def test_digest_distinguishes_dtype_and_shape() -> None:
    base = np.arange(6, dtype=np.int32)
    variants = [
        base,
        base.reshape(2, 3),
        base.reshape(3, 2),
        base.view(np.float32),  # same bytes, other dtype
        base.astype(np.int64),
        base.astype(">i4"),  # same values, other byte order
    ]
    assert len({input_digest(v) for v in variants}) == len(variants)


def test_non_contiguous_arrays_hash_like_their_contiguous_copy() -> None:
    x = np.arange(24, dtype=np.float64).reshape(4, 6)
    for view in (x.T, x[:, ::2], x[::-1]):
        assert not view.flags.c_contiguous
        assert input_digest(view) == input_digest(np.ascontiguousarray(view))
    assert input_digest(x.T) != input_digest(x)


def test_python_values_digest_canonically() -> None:
    value = {"b": [1, 2.5, "x"], "a": None, "c": {"z": True, "y": b"\x00"}}
    reordered = {"c": {"y": b"\x00", "z": True}, "a": None, "b": (1, 2.5, "x")}
    assert input_digest(value) == input_digest(reordered)
    distinct = [[1, 2], [2, 1], [[1], 2], [1, [2]], "12", [1.0, 2.0], [True, 2], [], [[]],
                None, 0, "", b"", {}, ["a", "b"], ["ab"], {"a": 1}, {"a": "1"}]
    assert len({input_digest(v) for v in distinct}) == len(distinct)


def test_arrays_nested_in_lists_and_numpy_scalars() -> None:
    a = np.ones(3, dtype=np.float32)
    assert input_digest([a, 1]) == input_digest([a.copy(), 1])
    assert input_digest([a, 1]) != input_digest([a.astype(np.float64), 1])
    assert input_digest(np.float32(1.5)) != input_digest(np.float64(1.5))
    assert input_digest(np.float32(1.5)) == input_digest(np.array(1.5, dtype=np.float32))


def test_object_arrays_hash_their_values_not_pointers() -> None:
    a = np.array(["x", 1, None], dtype=object)
    b = np.array(["x", 1, None], dtype=object)
    assert input_digest(a) == input_digest(b)
    assert input_digest(a) != input_digest(np.array(["x", 2, None], dtype=object))


def test_lists_of_bytes_or_strings_digest_their_values_and_boundaries() -> None:
    # One pass over the lengths and the joined data (a V2 BYTES tensor's object array): the
    # lengths tell apart values whose data joins alike, and bytes never pass for str.
    splits = [[b"ab", b""], [b"", b"ab"], [b"a", b"b"], [b"ab"], [b"a", b"", b"b"], []]
    assert len({input_digest(v) for v in splits}) == len(splits)
    assert input_digest([b"a", b"b"]) != input_digest(["a", "b"])
    assert input_digest(["\u00e9", "\ud800"]) == input_digest(["\u00e9", "\ud800"])
    assert input_digest(["\u00e9"]) != input_digest(["\u00e9", ""])
    strings = np.array([[b"x", b""], [b"yz", b"x"]], dtype=object)
    assert input_digest(strings) == input_digest(strings.copy())
    assert input_digest(strings) != input_digest(strings.reshape(1, 4))
    assert input_digest(np.array([b"x", "x"], dtype=object)) != input_digest(
        np.array([b"x", b"x"], dtype=object))


@given(st.lists(st.binary(max_size=4), max_size=6), st.lists(st.binary(max_size=4), max_size=6))
def test_lists_of_bytes_share_a_digest_only_when_equal(a: list[bytes], b: list[bytes]) -> None:
    assert (input_digest(a) == input_digest(b)) == (a == b)


def test_int_enum_hashes_as_its_value_and_unknown_types_fail() -> None:
    class Color(enum.IntEnum):
        RED = 1

    assert input_digest(Color.RED) == input_digest(1)
    with pytest.raises(TypeError, match="object"):
        input_digest(object())


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(json_values)
def test_equal_python_values_have_equal_digests(value: object) -> None:
    assert input_digest(value) == input_digest(copy.deepcopy(value))


@given(st.lists(st.integers(-(2**31), 2**31 - 1), max_size=20), st.sampled_from(["<i4", ">i8"]))
def test_arrays_digest_by_content(values: list[int], dtype: str) -> None:
    a = np.array(values, dtype=dtype)
    assert input_digest(a) == input_digest(np.array(values, dtype=dtype))
    if values:
        changed = a.copy()
        changed[:1] += 1  # an array op wraps at the dtype's edge without a warning
        assert input_digest(changed) != input_digest(a)


def test_true_and_false_have_different_digests() -> None:
    # A model fed booleans (a JSON feature flag) must not get False's cached answer for True.
    assert input_digest(True) != input_digest(False)
    assert input_digest([True, False]) != input_digest([False, True])
    assert input_digest({"flag": True}) != input_digest({"flag": False})


def test_cache_key_separates_models_and_versions() -> None:
    d = input_digest([1, 2, 3])
    assert cache_key("m", 1, d) == ("m", 1, d)
    keys = {cache_key("m", 1, d), cache_key("m", 2, d), cache_key("n", 1, d)}
    assert len(keys) == 3


# --- the vectorised encoding of number lists (JSON inputs) ------------------------------

numbers = st.floats(allow_nan=False, allow_infinity=False) | st.integers(-(2**60), 2**60)


@given(st.lists(numbers, min_size=1, max_size=50))
def test_number_lists_digest_by_value_and_type(values: list[float | int]) -> None:
    assert input_digest(values) == input_digest(list(values)) == input_digest(tuple(values))
    changed = [*values]
    changed[0] = changed[0] + 1 if isinstance(changed[0], int) else float(changed[0]) * 2 + 1
    if changed[0] != values[0]:
        assert input_digest(changed) != input_digest(values)
    retyped = [*values]
    retyped[0] = float(values[0]) if isinstance(values[0], int) else int(values[0])
    assert input_digest(retyped) != input_digest(values)  # 3 and 3.0 are different inputs


def test_number_lists_keep_what_the_general_encoding_told_apart() -> None:
    distinct = [[1, 2], [1.0, 2.0], [1, 2.0], [1.0, 2], [0.0], [-0.0], [True, 2], [1, True],
                [2**70, 1], [2**70, 1.0], [2**53 + 1, 0.5], [[1.0, 2.0]], [1.0, [2.0]], [],
                [1.0, 2.0, 3.0], [1, 2, 3]]
    assert len({input_digest(v) for v in distinct}) == len(distinct)
    assert input_digest([[0.5] * 3] * 2) == input_digest([[0.5, 0.5, 0.5], [0.5, 0.5, 0.5]])


def test_huge_ints_still_digest_exactly() -> None:
    assert input_digest([2**70, 1]) != input_digest([2**70 + 1, 1])
    assert input_digest([2**60 + 1, 0.5]) != input_digest([2**60, 0.5])
