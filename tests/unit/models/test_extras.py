"""Which extras a deployment file needs (pure), and the one error that names them."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from parityserve.config import ServingConfig
from parityserve.errors import ConfigError
from parityserve.models.extras import Need, check_extras, needed_extras, source_extra
from parityserve.models.zoo import TORCH_ZOO_NAMES, ZOO_NAMES


def config(**extra: object) -> ServingConfig:
    return ServingConfig.model_validate({"models": [], **extra})


@pytest.mark.parametrize(("source", "extra"), [
    ("zoo:echo", None), ("zoo:noop", None), ("zoo:sleep", None), ("sklearn:m.joblib", None),
    ("python:pkg.mod:Class", None), ("zoo:lenet5", "torch"), ("zoo:resnet56", "torch"),
    ("zoo:parm-mlp", "torch"), ("torch:pkg.mod:Net", "torch"),
    ("torchscript:net.pt", "torch"), ("onnx:model.onnx", "onnx"),
])
def test_each_source_names_the_extra_it_loads_with(source: str, extra: str | None) -> None:
    assert source_extra(source) == extra


def test_a_plain_config_needs_nothing() -> None:
    plain = config(models=[{"name": "a", "source": "zoo:echo"},
                           {"name": "b", "source": "sklearn:model.joblib"}])
    assert needed_extras(plain) == []


def test_every_stateful_operator_needs_torch_whatever_its_source() -> None:
    graph = config(
        models=[{"name": "feat", "source": "zoo:echo"},
                {"name": "mine", "source": "python:ops:Counter"},
                {"name": "lstm", "source": "zoo:stream-lstm"}],
        graphs=[{"name": "g", "output": "seq2", "operators": [
            {"name": "f", "model": "feat", "inputs": ["frontend"]},
            {"name": "seq1", "model": "mine", "inputs": ["f"], "stateful": True},
            {"name": "seq2", "model": "lstm", "inputs": ["seq1"], "stateful": True}]}])
    assert needed_extras(graph) == [
        Need("torch", "model mine: a stateful graph operator"),
        Need("torch", "model lstm: a stateful graph operator")]


def test_parity_sources_state_stores_and_launchers_count_too() -> None:
    needs = needed_extras(config(
        models=[{"name": "m", "source": "zoo:echo", "redundancy": {"mode": "parm"},
                 "parity": {"source": "onnx:parity.onnx"}}],
        server={"state_store": "redis://127.0.0.1:6379/0"}, launcher={"kind": "ray"}))
    assert [n.extra for n in needs] == ["onnx", "redis", "ray"]
    assert needs[0].why == "model m: parity source onnx:parity.onnx"


def test_the_error_lists_every_missing_extra_once_in_the_pip_line() -> None:
    needs = [Need("torch", "model a: source zoo:lenet5"), Need("onnx", "model b: source onnx:x"),
             Need("torch", "model c: a stateful graph operator"), Need("redis", "store")]
    with pytest.raises(ConfigError) as refused:
        check_extras(needs, where="serving.yaml", installed=lambda module: module == "redis")
    message = str(refused.value)
    assert message.startswith("serving.yaml: optional dependencies are missing")
    assert "model a: source zoo:lenet5 needs the torch extra (torch is not installed)" in message
    assert "model b: source onnx:x needs the onnx extra (onnxruntime is not installed)" in message
    assert "store" not in message  # redis is installed
    assert message.endswith("pip install 'parityserve[onnx,torch]'")


def test_nothing_missing_raises_nothing() -> None:
    check_extras([Need("torch", "x")], installed=lambda module: True)


def test_the_torch_zoo_list_is_exactly_the_zoo_models_that_need_torch() -> None:
    """Every zoo model outside TORCH_ZOO_NAMES loads with torch absent, and every one inside
    fails without it: the list cannot drift from the builders."""
    script = textwrap.dedent(f"""
        import sys
        sys.modules["torch"] = None  # import torch now raises ImportError
        from parityserve.models.zoo import load_zoo
        for name in {list(ZOO_NAMES)!r}:
            try:
                load_zoo(name, options={{}})
            except ImportError:
                print("torch", name)
            except Exception as exc:  # e.g. missing published weights: not about torch
                print("other", name, type(exc).__name__)
            else:
                print("plain", name)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, check=True)
    kinds = dict(line.split()[1::-1] for line in done.stdout.splitlines())
    assert {n for n, k in kinds.items() if k == "plain"} == set(ZOO_NAMES) - set(TORCH_ZOO_NAMES)
    assert {n for n, k in kinds.items() if k == "torch"} == set(TORCH_ZOO_NAMES), done.stdout
