"""The Ray launcher on a 3-node Ray cluster on this machine (``ray.cluster_utils.Cluster``).

A ParM k=2 model (2 data replicas + 1 parity replica: one coding group) and a plain model run
as Ray actors. Ray's own actor table (GCS) says where each replica runs: the coding group
spans three distinct nodes. Then one node crashes (its raylet and processes killed) under
load: every query is answered once and correctly (``zoo:echo`` returns its input, and ParM
decodes it exactly), and the lost replicas come back on the two surviving nodes.

Ray runs with the dashboard off. The public state API (``ray.util.state``) is served by the
dashboard, so the actor table is read from the GCS client that API sits on.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from conftest import model_state, start_server, wait_until

ray = pytest.importorskip("ray", reason="the Ray launcher needs ray: pip install "
                          "'parityserve[ray]'")


from benchmarks._ray_local import ClusterUnavailable, crash_node, local_cluster  # noqa: E402
from parityserve.client import Client  # noqa: E402
from parityserve.config import parse_config  # noqa: E402
from parityserve.runtime.fleet.placement_plan import deployment_members, slot_key  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.ray_cluster]

VECTOR = {"name": "input", "datatype": "FP32", "shape": [4]}


def _model(name: str, replicas: int, **extra: object) -> dict:
    return {"name": name, "source": "zoo:echo", "replicas": replicas, "input": VECTOR,
            "batching": {"max_batch_size": 4}, **extra}


MODELS = [_model("parm", 2, parity={"k": 2}), _model("plain", 2)]


@pytest.fixture(scope="module")
def cluster():
    """Started as benchmarks/_ray_local.py says (lean, a second attempt); when Ray cannot start
    on this machine at all, the tests are skipped with what each attempt died of."""
    stack = contextlib.ExitStack()
    try:
        local = stack.enter_context(local_cluster(nodes=3, cpus=3))
    except ClusterUnavailable as exc:
        pytest.skip(f"Ray could not start a 3-node cluster on this machine: {exc}")
    with stack:
        yield local.cluster, local.nodes


@pytest.fixture(scope="module")
def served(cluster, tmp_path_factory):
    c, _ = cluster
    config = {
        "server": {"http_port": 0, "grpc_port": 0, "cache_bytes": 0,
                   "heartbeat_timeout_ms": 3000},
        "launcher": {"kind": "ray", "address": c.address},
        "models": MODELS,
        "applications": [{"name": m["name"], "models": [m["name"]], "slo_ms": 20_000,
                          "default_output": "DEFAULT"} for m in MODELS],
    }
    server = start_server(config, tmp_path_factory.mktemp("ray"))
    yield server
    server.stop()
    left = {g["name"]: g["state"] for g in placement_groups().values() if g["state"] != "REMOVED"}
    assert not left, f"placement groups left after the server stopped: {left}"


def alive_actors() -> dict[str, str]:
    """Replica id -> node id of every live parityserve actor, from Ray's GCS actor table."""
    table = ray._private.state.actors()
    return {a["Name"]: a["Address"]["NodeID"] for a in table.values()
            if a["State"] == "ALIVE" and a["ActorClassName"] == "ReplicaActor"}


def placement_groups() -> dict[str, dict]:
    """Ray's placement-group table (GCS): name, strategy, state, bundle -> node."""
    return ray.util.placement_group_table()


def group_named(prefix: str) -> dict:
    """The live placement group for ``prefix`` (its name is ``prefix#TAG-N``)."""
    (group,) = [g for g in placement_groups().values()
                if g["name"].split("#")[0] == prefix and g["state"] != "REMOVED"]
    return group


def groups() -> dict[str, list[str]]:
    """Coding group -> its slot keys, from the deployment (what placement must spread)."""
    members = deployment_members(parse_config({"models": MODELS}).models)
    out: dict[str, list[str]] = {}
    for m in members:
        out.setdefault(m.group or m.key, []).append(m.key)
    return out


def nodes_by_slot() -> dict[str, str]:
    return {slot_key(rid): node for rid, node in alive_actors().items()}


def test_every_coding_group_spans_distinct_nodes(served) -> None:
    where = nodes_by_slot()
    assert len(where) == 5  # 2 + 1 parity + 2 plain
    parm_group = groups()["parm/v1/group0"]
    assert sorted(parm_group) == ["parm/v1/0", "parm/v1/1", "parm/v1/parity0-0"]
    assert len({where[k] for k in parm_group}) == 3
    assert where["plain/v1/0"] != where["plain/v1/1"]  # a model's replicas spread too
    # Ray's own placement groups: the coding group is STRICT_SPREAD over three nodes, member
    # i in bundle i; the plain model's replicas share one SPREAD group
    coded = group_named("parm/v1/group0")
    assert (coded["strategy"], coded["state"]) == ("STRICT_SPREAD", "CREATED")
    assert [coded["bundles_to_node_id"][i] for i in range(3)] == [where[k] for k in parm_group]
    plain = group_named("plain/v1/spread")
    assert (plain["strategy"], len(plain["bundles"])) == ("SPREAD", 2)
    assert sorted(plain["bundles_to_node_id"].values()) == sorted(
        [where["plain/v1/0"], where["plain/v1/1"]])


def _load(url: str, app: str, stop: threading.Event, seed: int) -> list[tuple[list, dict]]:
    """Queries one after another until ``stop``: (input, answer) for each."""
    rng = np.random.default_rng(seed)
    out = []
    with Client(url, timeout=60) as client:
        while not stop.is_set():
            x = rng.uniform(-1, 1, size=4).astype(np.float32).tolist()
            out.append((x, client.predict(app, x)))
    return out


def _states(client: Client) -> list[str]:
    return [r["state"] for name in ("parm", "plain") for r in model_state(client, name)[
        "replicas"]]


def _replicas(served) -> list:
    """The frontend's replicas, read from the test's thread while the server's event loop
    may be replacing them. ``list()`` copies each dict in one step under the GIL; a
    comprehension over the live views runs Python between items and can see a dict change
    size mid-walk (it did: RuntimeError, then a hung load pool)."""
    return [r for p in list(served.system.models.values()) for r in list(p.replicas.values())]


def _diagnosis(served, survivors: set[str]) -> str:
    """What the frontend and Ray each say, for a failure's message."""
    replicas = {r.rid: (r.state, r.process.node_id in survivors)
                for r in _replicas(served)}
    actors = {a["Name"]: (a["State"], a["Address"]["NodeID"] in survivors)
              for a in ray._private.state.actors().values()
              if a["ActorClassName"] == "ReplicaActor"}
    pgs = {g["name"]: (g["state"], g["bundles_to_node_id"])
           for g in placement_groups().values()}
    return f"frontend {replicas}; Ray actors {actors}; placement groups {pgs}"


def test_node_killed_under_load_loses_no_query_and_replicas_come_back(cluster, served) -> None:
    c, nodes = cluster
    before = nodes_by_slot()
    # a node with a plain replica (so that Ray must reschedule a SPREAD bundle) and, when
    # one does, ParM's data replica 0 (so that answers are rebuilt by decoding)
    plain_nodes = [before["plain/v1/0"], before["plain/v1/1"]]
    victim_id = before["parm/v1/0"] if before["parm/v1/0"] in plain_nodes else plain_nodes[0]
    victim = next(n for n in nodes if n.node_id == victim_id)
    survivors = {n.node_id for n in nodes if n is not victim}
    stop, seen = threading.Event(), Counter()
    with ThreadPoolExecutor(6) as pool, Client(served.url) as admin:
        futures = [pool.submit(_load, served.url, app, stop, i)
                   for i, app in enumerate(["parm", "plain"] * 3)]
        time.sleep(1.0)  # load is flowing before the kill
        killed_at = time.monotonic()
        crash_node(c, victim)

        def serving_again() -> bool:
            """Every replica ready, each pinned to a surviving node (the frontend's view)."""
            seen.update(_states(admin))
            pinned = [r.process.node_id for r in _replicas(served)]
            return (len(pinned) == 5 and set(pinned) <= survivors
                    and set(_states(admin)) == {"ready"})

        def ray_agrees() -> bool:
            where = nodes_by_slot()
            return len(where) == 5 and set(where.values()) <= survivors

        try:  # the load stops however this ends, or the pool's exit waits on it forever
            try:
                wait_until(serving_again, timeout_s=60)
            except AssertionError:
                raise AssertionError(
                    f"not serving again: {_diagnosis(served, survivors)}") from None
            recovery_s = time.monotonic() - killed_at
            wait_until(ray_agrees, timeout_s=60)  # Ray's actor table, once it has seen it
            ray_s = time.monotonic() - killed_at
        finally:
            stop.set()
        results = [r for f in futures for r in f.result()]
    rebuilt = Counter(a.get("reconstructed") for _, a in results)
    print(f"replicas ready on survivors {recovery_s:.1f}s after the kill (Ray's actor table "
          f"{ray_s:.1f}s); {len(results)} queries, rebuilt: {dict(rebuilt)}; "
          f"replica states seen: {dict(seen)}")
    assert seen["ready"] and len(seen) > 1, seen  # readiness showed the replicas being replaced
    # every query answered, once (one reply per request), with its own input echoed back
    assert len(results) > 20
    for x, answer in results:
        assert answer["default"] is False, answer
        np.testing.assert_allclose(answer["output"], x, rtol=1e-4, atol=1e-5)
    # Ray reschedules the plain model's lost bundle on a survivor once its health checks
    # give up on the victim; the replacement may be in it already, or run outside it as an
    # interim replica meanwhile (its bundle was on a suspect node, or being moved), and come
    # back at its next restart. The coding group cannot be STRICT_SPREAD over two nodes, so
    # its replacement runs outside it while its two survivors stay in it
    def bundles_moved() -> bool:
        return set(group_named("plain/v1/spread")["bundles_to_node_id"].values()) <= survivors

    wait_until(bundles_moved, timeout_s=60)
    assert group_named("parm/v1/group0")["state"] != "REMOVED"
    # survivors kept their nodes; the victim's replicas moved to surviving nodes
    after = nodes_by_slot()
    for key, node in before.items():
        if node == victim.node_id:
            assert after[key] in survivors, key
        else:
            assert after[key] == node, key
