"""What a server's zygote imports once (``runtime/fleet/zygote.preload_for``): only what the
children it will fork need, so that a server of ``zoo:echo`` replicas does not pay torch's
import (~2 CPU-s) for nothing, and a torch model's replicas or a graph's operators do not
pay it each."""

from __future__ import annotations

from parityserve.config import parse_config
from parityserve.runtime.fleet.zygote import fork_server_for, preload_for
from parityserve.runtime.fleet.zygote_server import OPERATOR_PRELOAD, WORKER_PRELOAD

ECHO = {"name": "echo", "source": "zoo:echo"}
GRAPH = {
    "models": [ECHO, {"name": "lstm", "source": "zoo:stream-lstm",
                      "options": {"input_size": 4, "outputs": 1}}],
    "graphs": [{"name": "g", "stream_key": "k", "fault_tolerance": "hams",
                "operators": [{"name": "seq", "model": "lstm", "inputs": ["frontend"],
                               "stateful": True},
                              {"name": "out", "model": "echo", "inputs": ["seq"]}],
                "output": "out"}],
}


def test_local_replicas_preload_the_worker_and_torch_only_when_a_model_needs_it() -> None:
    echo = preload_for(parse_config({"models": [ECHO]}), local_replicas=True)
    assert echo == WORKER_PRELOAD and "torch" not in echo
    lenet = parse_config({"models": [ECHO, {"name": "l", "source": "zoo:lenet5"}]})
    assert preload_for(lenet, local_replicas=True) == (*WORKER_PRELOAD, "torch")


def test_a_stateful_graph_preloads_the_operators_code_and_ray_replicas_nothing() -> None:
    graph = parse_config(GRAPH)
    both = preload_for(graph, local_replicas=True)
    assert set(both) == {*WORKER_PRELOAD, *OPERATOR_PRELOAD} and len(both) == len(set(both))
    assert preload_for(graph, local_replicas=False) == OPERATOR_PRELOAD
    ray_only = parse_config({"models": [ECHO]})
    assert preload_for(ray_only, local_replicas=False) == ()
    assert fork_server_for(True, None, ()) is None  # no child to fork: no zygote


def test_graph_members_on_ray_preload_nothing_here() -> None:
    """With the Ray launcher a graph's members are Ray actors (issue 41): a zygote importing
    torch for them on the frontend's host would fork nothing."""
    graph = parse_config(GRAPH)
    assert preload_for(graph, local_replicas=False, local_operators=False) == ()
