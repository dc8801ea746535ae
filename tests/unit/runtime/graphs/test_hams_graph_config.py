"""Graphs in the YAML config: a valid one becomes a topology; a bad one is refused with the
reason (cycle, unknown operator, a join input that does not exist, undeployed model)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from parityserve.config import parse_config
from parityserve.errors import ConfigError

GOOD = """
models:
  - {name: features, source: "zoo:noop"}
  - {name: lstm, source: "zoo:noop"}
  - {name: scorer, source: "zoo:noop"}
graphs:
  - name: stocks
    stream_key: ticker
    operators:
      - {name: feat, model: features, inputs: [frontend]}
      - {name: seq, model: lstm, inputs: [feat], stateful: true}
      - {name: side, model: features, inputs: [frontend]}
      - {name: score, model: scorer, inputs: [seq, side]}
    output: score
"""


def graph_config(**change: Any) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(GOOD)
    data["graphs"][0].update(change)
    return data


def test_a_graph_in_yaml_becomes_a_topology_with_its_join() -> None:
    graph = parse_config(yaml.safe_load(GOOD)).graphs[0]
    topology = graph.topology()
    assert topology.stateful == {"seq"} and topology.exits == ("score",)
    assert topology.preds["score"] == ("seq", "side")
    assert topology.next_stateful("feat") == ("seq",)
    assert graph.fault_tolerance == "hams" and graph.stream_key == "ticker"


def ops(*extra: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"name": "a", "model": "lstm", "inputs": ["frontend"]}, *extra]


@pytest.mark.parametrize(("change", "message"), [
    ({"operators": ops({"name": "b", "model": "lstm", "inputs": ["a", "c"]},
                       {"name": "c", "model": "lstm", "inputs": ["b"]}), "output": "c"},
     "cycle"),
    ({"operators": ops({"name": "j", "model": "scorer", "inputs": ["a", "ghost"]}),
      "output": "j"}, "unknown operator 'ghost'"),
    ({"operators": ops(), "output": "nowhere"}, "unknown operator 'nowhere'"),
    ({"operators": ops({"name": "b", "model": "lstm", "inputs": ["a"]}), "output": "a"},
     "'b' has no output"),
    ({"operators": ops({"name": "b", "model": "missing", "inputs": ["a"]}), "output": "b"},
     "undeployed models"),
    ({"name": "admin"}, "reserved"),
    ({"fault_tolerance": "raid"}, "fault_tolerance"),
    ({"replicas": 2}, "replicas"),
])
def test_bad_graphs_are_refused_with_the_reason(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(graph_config(**change))


def test_graphs_and_applications_share_one_route_space() -> None:
    data = graph_config()
    data["applications"] = [{"name": "stocks", "models": ["lstm"]}]
    with pytest.raises(ConfigError, match="route space"):
        parse_config(data)


def test_a_stateful_operators_model_serves_nothing_else() -> None:
    from parityserve.runtime.serving.system import ServingSystem

    data = graph_config()
    data["graphs"][0]["operators"][2]["model"] = "lstm"  # also stateless in 'side'
    with pytest.raises(ConfigError, match=r"\['lstm'\] are stateful graph operators"):
        ServingSystem(parse_config(data))


def test_two_stateful_operators_need_two_model_entries() -> None:
    from parityserve.runtime.serving.system import ServingSystem

    data = graph_config()
    data["graphs"][0]["operators"][1]["model"] = "features"
    data["graphs"][0]["operators"][0]["stateful"] = True
    data["graphs"][0]["operators"][2]["model"] = "scorer"
    data["graphs"][0]["operators"][3]["model"] = "lstm"
    with pytest.raises(ConfigError, match="more than one stateful operator"):
        ServingSystem(parse_config(data))


@pytest.mark.parametrize(("body", "message"), [
    ({}, "exactly one of 'input' and 'input_batch'"),
    ({"input": [1.0], "input_batch": [[1.0]]}, "exactly one of"),
    ({"input_batch": []}, "non-empty list"),
    ({"input": "text"}, "numbers"),
    ({"input": []}, "non-empty"),
    ({"input_batch": [[1.0], [1.0, 2.0]]}, "share one shape"),
    ({"input_batch": [[1.0]], "labels": [1, 2]}, "one label per input"),
    ({"input": [1.0], "ticker": 5}, "every stream must be a str"),
    ({"input": [1.0], "label": 1.5}, "every label must be a int"),
])
def test_bad_graph_bodies_are_refused_with_the_reason(body: dict[str, Any], message: str
                                                      ) -> None:
    from parityserve.errors import RequestError
    from parityserve.runtime.graphs.registry import graph_items

    with pytest.raises(RequestError, match=message):
        graph_items(body, "ticker")


def test_a_graph_body_names_each_rows_stream_and_label() -> None:
    from parityserve.runtime.graphs.registry import graph_items

    rows, streams, labels = graph_items({"input": [1, 2], "ticker": "ibm", "label": 3}, "ticker")
    assert rows[0].dtype.name == "float32" and streams == ["ibm"] and labels == [3]
    rows, streams, labels = graph_items({"input_batch": [[1], [2]]}, "ticker")
    assert len(rows) == 2 and streams == ["", ""] and labels == [-1, -1]


def test_a_graph_declares_the_shape_of_its_rows() -> None:
    assert parse_config(graph_config()).graphs[0].input_shape is None  # default: none
    graph = parse_config(graph_config(input_shape=[2, 4])).graphs[0]
    assert graph.input_shape == (2, 4)


@pytest.mark.parametrize(("shape", "message"), [
    ([0], "positive"), ([4, -1], "positive"), ([], "1 to 8"), ([1] * 9, "1 to 8"),
    ([4.5], "input_shape"), (["4"], "input_shape"), ([True], "input_shape"),
])
def test_a_bad_input_shape_is_refused(shape: list[Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(graph_config(input_shape=shape))


def test_an_input_shape_no_entry_model_takes_is_refused() -> None:
    data = graph_config(input_shape=[4])
    data["models"][0]["input"] = {"name": "x", "datatype": "FP32", "shape": [2, 2]}
    with pytest.raises(ConfigError, match="graph 'stocks'.*no row fits both"):
        parse_config(data)
    data["models"][0]["input"]["shape"] = [-1]
    assert parse_config(data).graphs[0].door(parse_config(data).models) == (4,)
