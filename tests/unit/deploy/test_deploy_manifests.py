"""deploy/kuberay/ agrees with parityserve: the ConfigMap's config passes the real loader and
`parityserve validate`, the frontend's command parses with the real CLI, the container and
Service ports are the config's, the probes hit open routes of the real router, the admin
token comes from a Secret, the worker pods can hold the replicas the config asks Ray for, and
the image pins the project's torch and the RayCluster's Ray. No cluster is needed (none was
used): this checks the manifests, not a deployment."""

from __future__ import annotations

import copy
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from starlette.routing import Route
from starlette.testclient import TestClient

from parityserve.cli import _server_with, _with_ray, build_parser, main
from parityserve.config import ServingConfig, is_loopback, load_config
from parityserve.runtime.fleet.placement_plan import deployment_members, group_size
from parityserve.runtime.frontend import http
from parityserve.runtime.frontend.auth import ENV_TOKEN, AuthPolicy
from parityserve.runtime.modelpath.metrics import Metrics
from tests.unit.runtime.frontend.test_http_frontend import FakeSystem

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy" / "kuberay"
Docs = dict[str, dict[str, Any]]  # kind -> the one document of that kind


def _load() -> Docs:
    docs: Docs = {}
    for path in sorted(DEPLOY.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            assert doc["kind"] not in docs, f"a second {doc['kind']} in {path.name}"
            docs[doc["kind"]] = doc
    return docs


@pytest.fixture
def docs() -> Docs:
    return _load()


def _groups(docs: Docs) -> list[dict[str, Any]]:
    spec = docs["RayCluster"]["spec"]
    return [spec["headGroupSpec"], *spec["workerGroupSpecs"]]


def _frontends(docs: Docs) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(group, container) for every container that runs `parityserve start`."""
    return [(g, c) for g in _groups(docs) for c in g["template"]["spec"]["containers"]
            if "parityserve start" in " ".join(c.get("command", []) + c.get("args", []))]


def _start_args(container: dict[str, Any]) -> Any:
    """The container's `parityserve start ...`, parsed by the real CLI parser."""
    line = " ".join(container["command"] + container["args"])
    words = shlex.split(line[line.index("parityserve start"):].split(";")[0])
    return build_parser().parse_args(words[1:])


def _config(docs: Docs, tmp_path: Path, group: dict[str, Any],
            container: dict[str, Any]) -> ServingConfig:
    """The config that container's `parityserve start` serves, read by the real loader from
    the ConfigMap its pod mounts where -c points (with its command-line overrides applied)."""
    args = _start_args(container)
    mount = next(m for m in container["volumeMounts"] if str(args.config).startswith(
        m["mountPath"] + "/"))
    volumes = {v["name"]: v for v in group["template"]["spec"]["volumes"]}
    configmap = docs["ConfigMap"]
    assert volumes[mount["name"]]["configMap"]["name"] == configmap["metadata"]["name"]
    key = str(args.config)[len(mount["mountPath"]) + 1:]
    path = tmp_path / key
    path.write_text(configmap["data"][key])
    config = load_config(path)
    ports = {k: v for k, v in (("http_port", args.port), ("grpc_port", args.grpc_port),
                               ("frontends", args.frontends)) if v is not None}
    if ports:
        config = config.model_copy(update={"server": _server_with(config.server, ports)})
    return _with_ray(config, args.ray_address) if args.ray_address else config


def _container_ports(container: dict[str, Any]) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container.get("ports", [])}


def check_ports(docs: Docs, config: ServingConfig, container: dict[str, Any]) -> None:
    s = config.server
    want = {"http": s.http_port, "grpc": s.grpc_listen_port()}
    if s.rpc_port:  # 0 (needed with frontends > 1): each shard picks its own worker port
        want["rpc"] = s.rpc_port
    ports = _container_ports(container)
    assert {k: ports.get(k) for k in want} == want, "container ports are not the config's"
    service = {p["name"]: p for p in docs["Service"]["spec"]["ports"]}
    assert set(service) == {"http", "grpc"}
    for name, port in service.items():
        target = port["targetPort"]
        assert ports.get(target, target) == want[name], f"Service port {name} misses"
        assert port["port"] == want[name], f"Service port {name} differs from the server's"


def check_probes(config: ServingConfig, container: dict[str, Any]) -> None:
    """Each probe is a GET, without a token, to a route the real router serves with 200."""
    s = config.server
    auth = AuthPolicy(token="t" * 32, protect_metrics=s.protect_metrics,
                      protect_inference=s.protect_inference)
    app = http.create_app(FakeSystem(), metrics=Metrics(), auth=auth)
    served = {r.path for r in app.app.routes if isinstance(r, Route) and "GET" in r.methods}
    want = {"startupProbe": "/v2/health/live", "livenessProbe": "/v2/health/live",
            "readinessProbe": "/v2/health/ready"}
    client = TestClient(app)
    for probe, path in want.items():
        get = container[probe]["httpGet"]
        assert get["path"] == path and path in served, f"{probe} asks {get['path']}"
        port = get["port"]
        assert _container_ports(container).get(port, port) == s.http_port
        assert client.get(path).status_code == 200, f"{path} is not open to a probe"


def test_every_kind_is_there_once(docs: Docs) -> None:
    assert set(docs) == {"ConfigMap", "RayCluster", "Service"}
    assert docs["RayCluster"]["apiVersion"] == "ray.io/v1"
    assert [g["groupName"] for g in docs["RayCluster"]["spec"]["workerGroupSpecs"]] == [
        "replicas", "frontends"]


def test_the_config_is_valid_and_runs_on_this_pods_ray_node(docs, tmp_path, capsys) -> None:
    for group, container in _frontends(docs):
        config = _config(docs, tmp_path, group, container)
        assert (config.launcher.kind, config.launcher.address) == ("ray", "auto")
        # workers dial the pod's IP: bound to every interface, reachable() puts Ray's node IP
        assert config.server.host in ("0.0.0.0", "::") and not is_loopback(config.server.host)
        assert config.server.admin_token is None and config.server.require_admin_token
        path = tmp_path / _start_args(container).config.name
        assert main(["validate", "-c", str(path)]) == 0, capsys.readouterr().err


def test_frontends_are_one_spec_with_the_configs_ports_and_probes(docs, tmp_path) -> None:
    found = _frontends(docs)
    assert [g.get("groupName", "head") for g, _ in found] == ["head", "frontends"]
    assert found[0][1] == found[1][1], "the head's and the frontends group's frontend differ"
    config = _config(docs, tmp_path, *found[0])
    check_ports(docs, config, found[0][1])
    check_probes(config, found[0][1])


def test_a_port_or_probe_mismatch_is_caught(docs, tmp_path) -> None:
    (group, container), *_ = _frontends(docs)
    config = _config(docs, tmp_path, group, container)
    service = copy.deepcopy(docs)
    service["Service"]["spec"]["ports"][0]["port"] = 8080
    with pytest.raises(AssertionError, match="differs"):
        check_ports(service, config, container)
    moved = config.model_copy(update={"server": _server_with(config.server, {"rpc_port": 6000})})
    with pytest.raises(AssertionError, match="container ports"):
        check_ports(docs, moved, container)
    probe = copy.deepcopy(container)
    probe["readinessProbe"]["httpGet"]["path"] = "/healthz"
    with pytest.raises(AssertionError, match="readinessProbe"):
        check_probes(config, probe)


def test_the_service_selects_the_frontend_pods_only(docs) -> None:
    selector = docs["Service"]["spec"]["selector"]
    name = docs["RayCluster"]["metadata"]["name"]
    for group in _groups(docs):
        labels = {**group["template"].get("metadata", {}).get("labels", {}),
                  "ray.io/cluster": name}  # KubeRay's label on every pod
        runs_frontend = any(g is group for g, _ in _frontends(docs))
        assert selector.items() <= labels.items() if runs_frontend else (
            not selector.items() <= labels.items())


def test_tokens_come_from_secrets_and_the_readme_makes_the_admin_one(docs) -> None:
    readme = (ROOT / "docs" / "cluster.md").read_text()  # the KubeRay section, from the README
    for _, container in _frontends(docs):
        env = {e["name"]: e for e in container["env"]}
        ref = env[ENV_TOKEN]["valueFrom"]["secretKeyRef"]
        assert re.search(rf"kubectl create secret generic {ref['name']} "
                         rf"--from-literal={ref['key']}=", readme)
        # KubeRay puts Ray's token on its own container only; the driver needs it too
        if docs["RayCluster"]["spec"].get("authOptions", {}).get("mode") == "token":
            assert env["RAY_AUTH_MODE"]["value"] == "token"
            assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"] == {
                "name": docs["RayCluster"]["metadata"]["name"], "key": "auth_token"}


def test_the_frontend_shares_tmp_ray_with_its_pods_ray_container(docs) -> None:
    """address: auto finds the pod's Ray node (and the driver its raylet's sockets) there."""
    for group, container in _frontends(docs):
        ray_container = group["template"]["spec"]["containers"][0]
        mounts = [{m["name"] for m in c["volumeMounts"] if m["mountPath"] == "/tmp/ray"}
                  for c in (ray_container, container)]
        assert mounts[0] and mounts[0] == mounts[1]


def _cpu(quantity: str | int) -> float:
    text = str(quantity)
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


def _bytes(quantity: str) -> float:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "K": 1e3, "M": 1e6, "G": 1e9}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return float(quantity[:-len(suffix)]) * factor
    return float(quantity)


def test_the_worker_pods_hold_what_the_config_asks_ray_for(docs, tmp_path) -> None:
    found = _frontends(docs)
    config = _config(docs, tmp_path, *found[0])
    groups = {g.get("groupName", "head"): g for g in _groups(docs)}
    for name in ("head", "frontends"):  # no replica lands beside a frontend
        assert groups[name]["rayStartParams"]["num-cpus"] == "0"
    for _, container in found:  # a core per shard
        assert _cpu(container["resources"]["requests"]["cpu"]) >= config.server.frontends
    workers = groups["replicas"]
    limits = workers["template"]["spec"]["containers"][0]["resources"]["limits"]
    members = deployment_members(config.models)
    # every replica fits a pod; the head's frontend's replicas fit the pods together
    assert all(m.demand.cpu <= _cpu(limits["cpu"]) for m in members)
    assert all(m.demand.memory <= _bytes(limits["memory"]) for m in members)
    shards = config.server.frontends * (1 + groups["frontends"]["replicas"])
    assert shards * sum(m.demand.cpu for m in members) <= (
        workers["replicas"] * _cpu(limits["cpu"]))
    # a coding group's members each on a pod of their own (STRICT_SPREAD)
    assert max(group_size(d) for d in config.models) <= workers["replicas"]


def test_the_image_pins_the_projects_python_torch_and_the_clusters_ray(docs) -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    minor = re.fullmatch(r">=(3\.\d+)", project["requires-python"]).group(1)
    assert re.search(rf"^FROM python:{re.escape(minor)}-slim$", dockerfile, re.M)
    (torch,) = project["optional-dependencies"]["torch"]
    assert torch == "torch==2.13.0" and f"pip install --no-cache-dir {torch} " in dockerfile
    assert '".[ray,torch]"' in dockerfile
    ray_version = docs["RayCluster"]["spec"]["rayVersion"]
    assert f'"ray[default]=={ray_version}"' in dockerfile
    images = {c["image"] for g in _groups(docs) for c in g["template"]["spec"]["containers"]}
    assert images == {f"parityserve:{project['version']}"}, "one image, the project's version"
