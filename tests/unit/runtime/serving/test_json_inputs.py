"""JSON inputs of models without a signature on the ServingSystem's Clipper path (issue 17):
converted to one array at the edge (``json_inputs: arrays``, the default) or passed on as
decoded (``json_inputs: python``), over the fake link and clock of ``test_system_overload``."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import orjson
import pytest
from test_system_overload import Rig, run

from parityserve.errors import InvalidInput
from parityserve.runtime.serving.applications import approx_bytes

PYTHON = {"json_inputs": "python"}


async def _predict(rig: Rig, item: Any, model: str = "a", uid: str | None = None) -> Any:
    """One query answered by the echo fakes; returns the prediction."""
    task = asyncio.ensure_future(rig.system.predict("app", [item], uid))
    await rig.answer_all(model)
    (prediction,) = await task
    return prediction


def _sent(rig: Rig, rid: str) -> list[dict[str, Any]]:
    """The payload descriptors of the batches sent to replica ``rid``."""
    return [header["in"] for r, header, _ in rig.link.sent if r == rid]


async def _sent_for(rig: Rig, item: Any) -> list[dict[str, Any]]:
    """What one query sends to model ``a``'s replica (then it is failed, unanswered)."""
    task = asyncio.ensure_future(rig.system.predict("app", [item]))
    for _ in range(100):  # the handler reads state (an await) before it queues
        if rig.link.predicts():
            break
        await asyncio.sleep(0)
    rig.path("a").fail_all("sent: that is all this test needs")
    await task
    return _sent(rig, "a/r0")


@pytest.mark.parametrize(("item", "dtype", "answer"), [
    ([0.5, 1.0, 2.0], "float64", b"[0.5,1.0,2.0]"),
    ([[1, 2], [3, 4]], "int64", b"[[1,2],[3,4]]"),
    ([1, 2.5], "float64", b"[1.0,2.5]"),  # one float makes the row float64
])
def test_numbers_travel_to_a_model_without_a_signature_as_one_array(
        item: list[Any], dtype: str, answer: bytes) -> None:
    async def body() -> None:
        rig = Rig(["a"], spec=None)
        rig.add("a")
        prediction = await _predict(rig, item)
        (desc,) = _sent(rig, "a/r0")
        assert desc["k"] == "nd" and np.dtype(desc["dtype"]) == np.dtype(dtype)
        assert rig.link.batch(0).tolist() == [item]
        # zoo:echo's answer as JSON: ints stay ints, floats stay floats.
        assert orjson.dumps(prediction.to_json()["output"]) == answer

    run(body)


def test_json_inputs_python_sends_the_decoded_list() -> None:
    async def body() -> None:
        rig = Rig(["a"], spec=None, settings={"a": PYTHON})
        rig.add("a")
        prediction = await _predict(rig, [0.5, 1.0, 2.0])
        assert _sent(rig, "a/r0") == [{"k": "obj", "v": [[0.5, 1.0, 2.0]]}]
        assert prediction.to_json()["output"] == [0.5, 1.0, 2.0]

    run(body)


@pytest.mark.parametrize("item", ["text", 3, None, {"a": [1.0]}, [True, 1.0], [[1.0, 2.0], [3.0]],
                                  [2**63], [2**53 + 1, 0.5], [], ["x", "y"]])
def test_other_inputs_travel_as_decoded(item: Any) -> None:
    async def body() -> None:
        rig = Rig(["a"], spec=None)
        rig.add("a")
        assert await _sent_for(rig, item) == [{"k": "obj", "v": [item]}]

    run(body)


def test_models_with_other_json_inputs_in_one_app_each_get_their_own_form() -> None:
    async def body() -> None:
        rig = Rig(["a", "b"], policy="exp4", spec=None, settings={"b": PYTHON})
        rig.add("a")
        rig.add("b")
        task = asyncio.ensure_future(rig.system.predict("app", [[1.0, 2.0]]))
        await rig.answer_all("a")
        await task
        assert [d["k"] for d in _sent(rig, "a/r0")] == ["nd"]
        assert _sent(rig, "b/r0") == [{"k": "obj", "v": [[1.0, 2.0]]}]

    run(body)


@pytest.mark.parametrize("lenient", ["a", "b"])
def test_a_lenient_model_does_not_let_non_finite_values_past_a_strict_one(lenient: str) -> None:
    # Two models with the same signature but another NaN rule are coerced separately, so the
    # strict one refuses 1e39 (infinity as FP32) whichever the app lists first.
    async def body() -> None:
        rig = Rig(["a", "b"], policy="exp4", settings={lenient: {"allow_nonfinite": True}})
        with pytest.raises(InvalidInput, match="non-finite"):
            await rig.system.predict("app", [[1e39, 1.0]])

    run(body)


@pytest.mark.parametrize(("first", "second", "shared"), [
    ([1.0, 2.0], [1.0, 2.0], True),
    ([1, 2.0], [1.0, 2.0], True),    # the same float64 array reaches the model
    ([1, 2], [1.0, 2.0], False),     # int64 and float64: as the lists' digests were
    ([1.0, 2.0], [2.0, 1.0], False),
    ([[1.0, 2.0]], [1.0, 2.0], False),
])
def test_cache_keys_follow_what_the_model_receives(first: Any, second: Any,
                                                   shared: bool) -> None:
    async def body() -> None:
        rig = Rig(["a"], spec=None)
        rig.add("a")
        await _predict(rig, first)
        task = asyncio.ensure_future(rig.system.predict("app", [second]))
        await asyncio.sleep(0)
        if not shared:
            await rig.answer_all("a")
        (prediction,) = await task
        assert prediction.cached is shared
        assert len(rig.link.predicts()) == (1 if shared else 2)

    run(body)


def test_feedback_remembers_the_array_and_finds_its_prediction_by_query_id() -> None:
    async def body() -> None:
        rig = Rig(["a"], spec=None)
        rig.add("a")
        scores = [0.1, 0.9, 0.0]  # echo answers these scores: class 1
        prediction = await _predict(rig, scores, uid="u")
        app = rig.system.router.apps["app"]
        record, size = app.queries[prediction.query_id]
        assert isinstance(record.item["a"], np.ndarray)
        assert size == approx_bytes({"a": np.zeros(3)})  # counted by nbytes
        result = await rig.system.update("app", "u", None, 1, prediction.query_id)
        assert result["losses"] == {"a": 0.0}
        assert len(rig.link.predicts()) == 1  # answered from the cache

    run(body)


def test_a_list_too_deep_for_the_wire_stays_a_list() -> None:
    # A worker takes arrays of at most wire.MAX_DIMS ranks, batch axis included.
    async def body() -> None:
        for depth, kind in [(31, "nd"), (32, "obj")]:
            rig = Rig(["a"], spec=None, limits={"max_json_depth": 40})
            rig.add("a")
            item: Any = 1.0
            for _ in range(depth):
                item = [item]
            assert [d["k"] for d in await _sent_for(rig, item)] == [kind]

    run(body)
