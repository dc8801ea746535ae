"""LoadedModel: input casting, the one-output-per-query check, and error translation."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import parityserve.models as models
from parityserve.config import TensorSpec
from parityserve.errors import PredictError
from parityserve.models import LoadedModel, Model

FP32_4 = TensorSpec(datatype="FP32", shape=(4,))


def _loaded(fn, **kw) -> LoadedModel:
    return LoadedModel(fn, platform="python", source="test:model", **kw)


def test_public_names_are_pinned() -> None:
    assert models.__all__ == ["SCHEMES", "ZOO_NAMES", "LoadedModel", "Model", "load_model"]


def test_importing_models_does_not_import_torch_or_sklearn() -> None:
    code = "import sys, parityserve.models; print('torch' in sys.modules, 'sklearn' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_numpy_input_is_cast_to_the_input_spec_dtype() -> None:
    seen = []
    model = _loaded(lambda b: seen.append(b.dtype) or b, input_spec=FP32_4)
    model.predict(np.ones((3, 4), dtype=np.float64))
    assert seen == [np.float32]


def test_list_input_is_passed_through_unchanged() -> None:
    model = _loaded(lambda b: [len(x) for x in b], input_spec=FP32_4)
    assert model.predict(["ab", "c"]) == [2, 1]


def test_uncastable_input_is_a_predict_error() -> None:
    model = _loaded(lambda b: b, input_spec=FP32_4)
    with pytest.raises(PredictError, match="cannot cast"):
        model.predict(np.array([["x"] * 4], dtype=object))


@pytest.mark.parametrize("out", [np.zeros(2), [0, 1]], ids=["array", "list"])
def test_wrong_number_of_outputs_is_a_predict_error(out) -> None:
    model = _loaded(lambda b: out)
    with pytest.raises(PredictError, match="returned 2 outputs for 3 queries"):
        model.predict(np.zeros((3, 4)))


@pytest.mark.parametrize("out", [np.float32(1.0), None, "abc"])
def test_non_batch_output_is_a_predict_error(out) -> None:
    with pytest.raises(PredictError, match="numpy array or a list"):
        _loaded(lambda b: out).predict([1])


def test_tuple_output_becomes_a_list() -> None:
    assert _loaded(lambda b: (1, 2)).predict([0, 0]) == [1, 2]


def test_exception_in_predict_is_translated() -> None:
    def boom(batch):
        raise ZeroDivisionError("oops")

    with pytest.raises(PredictError, match="ZeroDivisionError: oops") as info:
        _loaded(boom).predict([1])
    assert isinstance(info.value.__cause__, ZeroDivisionError)


def test_with_specs_overrides_only_what_is_given() -> None:
    out_spec = TensorSpec(name="y", shape=(2,))
    model = _loaded(lambda b: b, input_spec=FP32_4, output_spec=out_spec)
    new = model.with_specs(input_spec=TensorSpec(datatype="INT64", shape=(4,)))
    assert new.input_spec.datatype == "INT64" and new.output_spec == out_spec
    assert new.predict(np.ones((1, 4))).dtype == np.int64


def test_model_base_class_defaults() -> None:
    model = Model()
    assert model.setup() is None and Model.input_spec is None
    with pytest.raises(NotImplementedError):
        model.predict([1])
