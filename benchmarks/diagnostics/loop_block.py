"""How long one request blocks the frontend's event loop, per route, as the request grows.

    python benchmarks/diagnostics/loop_block.py [--reps 3] [--name loop-block]

Method: a ``parityserve start`` subprocess serves ``zoo:noop`` (one float per row back, so
the answer costs nothing), a Clipper application and a one-operator graph on it. While one
request of N elements is in flight, a probe thread in this process asks ``GET
/v2/health/live`` back to back on its own keep-alive connection. The frontend answers a probe
only between the request's synchronous stretches, so the longest probe round trip that overlaps
the request, less the median idle round trip, is the longest stretch the loop was held (the
block: decoding, the checks, the cache digest, packing for the worker, the answer). It is
what an operator's health check or another client would wait. Each point is the median of
``--reps`` requests, each with a different first element (no cache hit); bodies are built
before the clock starts.

Two servers, one after the other:

* ``lifted``: ``server.limits`` raised out of the way, N from 2**14 to 2**20 elements: the
  cost per element of each route (the slope that sets the defaults);
* ``defaults``: the shipped limits; for each route the largest request they accept (the worst
  one client can make on this machine), then the refused requests that cost the most before
  their refusal (the most JSON, body or protobuf the size limits let in).

Elements are the cheapest to write per byte: ``0`` for numbers, ``""`` or ``b""`` for BYTES;
``[1, n, 1]`` and ``[n, 1]`` shapes put a JSON list around each number.
The machine is shared: the table states its load average and each point's spread. Writes
``benchmarks/results/loop-block/NAME.{json,md}``. Needs ``tritonclient`` (the bench extra).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import orjson
from tritonclient.grpc import service_pb2 as pb

from benchmarks.report import machine_info
from parityserve.bench.ports import free_port
from parityserve.bench.serverproc import ServerProcess, write_config
from parityserve.config import Limits
from parityserve.runtime.frontend import v2

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "benchmarks/results/loop-block"
CURVE = (1 << 14, 1 << 16, 1 << 18, 1 << 20)
GRAPH_WIDTH = 1024  # numbers per graph row: one shape throughout (the graph refuses a second)
BATCH_ROWS = 1024  # queries of a Clipper batch: max_batch_items, the per-query cost included
LIFTED = {"max_input_elements": 1 << 24, "max_request_elements": 1 << 24,
          "max_json_bytes": 64 << 20}  # (the body stays within max_body_bytes, 16 MiB)


# ---- what each route's request of n elements looks like --------------------------------------
@dataclass(frozen=True)
class Request:
    path: str  # an HTTP path, or "grpc"
    body: bytes
    headers: dict[str, str]


def _v2(array: np.ndarray, binary: bool) -> Request:
    if not binary:  # JSON of the fewest bytes per value: 0 (orjson writes 0.0 for FP32) or ""
        flat = array.reshape(-1)
        data = ([b.decode() for b in flat] if array.dtype == object
                else flat.astype(np.int64).tolist())
        return _json("/v2/models/noop/infer", {"inputs": [
            {"name": "x", "datatype": v2.dtype_to_datatype(array.dtype),
             "shape": list(array.shape), "data": data}]})
    body, headers = v2.encode_infer_request([("x", array)], binary=True)
    return Request("/v2/models/noop/infer", body, headers)


def _nested(n: int, rep: int) -> Request:
    """A V2 JSON tensor of shape [1, n, 1]: a list per number, the most lists per byte."""
    return _json("/v2/models/noop/infer", {"inputs": [
        {"name": "x", "datatype": "FP32", "shape": [1, n, 1],
         "data": [[[rep]] + [[0]] * (n - 1)]}]})


def _numbers(n: int, rep: int) -> np.ndarray:
    x = np.zeros((1, n), np.float32)
    x[0, 0] = rep  # a different body each repetition: no cache hit
    return x


def _strings(n: int, rep: int) -> np.ndarray:
    x = np.full((1, n), b"", dtype=object)
    x[0, 0] = str(rep).encode()
    return x


def _json(path: str, value: Any) -> Request:
    return Request(path, orjson.dumps(value), {"content-type": "application/json"})


def _rows(n: int, rows: int, rep: int) -> list[list[int]]:
    width = max(1, n // rows)
    batch = [[0] * width for _ in range(rows)]
    batch[0][0] = rep
    return batch


def _graph(n: int, rep: int) -> Request:
    """n // GRAPH_WIDTH rows of GRAPH_WIDTH numbers, a stream each."""
    rows = max(1, n // GRAPH_WIDTH)
    return _json("/g/predict", {"input_batch": _rows(rows * GRAPH_WIDTH, rows, rep),
                                "streams": [str(i) for i in range(rows)]})


def _grpc(array: np.ndarray, datatype: str, typed: bool) -> Request:
    tensor = pb.ModelInferRequest.InferInputTensor(name="x", datatype=datatype,
                                                   shape=list(array.shape))
    request = pb.ModelInferRequest(model_name="noop", inputs=[tensor])
    contents = request.inputs[0].contents  # the request holds a copy of ``tensor``
    if typed and datatype == "BYTES":
        contents.bytes_contents.extend(array.reshape(-1).tolist())
    elif typed:
        contents.fp32_contents.extend(array.reshape(-1).tolist())
    else:
        request.raw_input_contents.append(v2.array_to_raw(array, datatype))
    return Request("grpc", request.SerializeToString(), {})


# route -> its request of n elements (numbers or strings), and repetition r (for the cache)
ROUTES: dict[str, Callable[[int, int], Request]] = {
    "v2 json FP32": lambda n, r: _v2(_numbers(n, r), False),
    "v2 json FP32 [1, n, 1]": _nested,
    "v2 json BYTES": lambda n, r: _v2(_strings(n, r), False),
    "v2 binary FP32": lambda n, r: _v2(_numbers(n, r), True),
    "v2 binary BYTES": lambda n, r: _v2(_strings(n, r), True),
    "clipper json": lambda n, r: _json("/app/predict", {"input": [r] + [0] * (n - 1)}),
    # A '[' in the uid sends the body down the general path (orjson, scan), not simdjson's.
    "clipper json, general path": lambda n, r: _json(
        "/app/predict", {"input": [r] + [0] * (n - 1), "uid": "["}),
    "clipper json [n, 1]": lambda n, r: _json("/app/predict",
                                              {"input": [[r]] + [[0]] * (n - 1)}),
    "clipper batch": lambda n, r: _json("/app/predict",
                                        {"input_batch": _rows(n, BATCH_ROWS, r)}),
    "graph json": _graph,
    "grpc raw FP32": lambda n, r: _grpc(_numbers(n, r), "FP32", False),
    "grpc raw BYTES": lambda n, r: _grpc(_strings(n, r), "BYTES", False),
    "grpc typed FP32": lambda n, r: _grpc(_numbers(n, r), "FP32", True),
    "grpc typed BYTES": lambda n, r: _grpc(_strings(n, r), "BYTES", True),
}


def largest_accepted(limits: Limits, max_body: int) -> dict[str, int]:
    """Per route, the most elements the shipped limits accept. JSON values count the lists
    that hold them (and a body's object and other values): ``max_request_elements`` minus
    those. Binary numbers are bounded by the body alone."""
    cap, floats = limits.max_request_elements, (max_body - 1024) // 4
    return {"v2 json FP32": cap - 1, "v2 json FP32 [1, n, 1]": (cap - 2) // 2,
            "v2 json BYTES": cap - 1, "v2 binary FP32": floats, "v2 binary BYTES": cap,
            "clipper json": cap - 2, "clipper json, general path": cap - 3,
            "clipper json [n, 1]": (cap - 2) // 2,
            "clipper batch": (cap - 2 - BATCH_ROWS) // BATCH_ROWS * BATCH_ROWS,
            # the body, input_batch, streams; a list, its numbers and a stream name per row
            "graph json": (cap - 3) // (GRAPH_WIDTH + 2) * GRAPH_WIDTH,
            "grpc raw FP32": floats, "grpc raw BYTES": cap,
            # packed floats, 4 bytes each, in the message's parsed part (max_json_bytes)
            "grpc typed FP32": min(cap, (limits.max_json_bytes - 64) // 4),
            "grpc typed BYTES": cap}


def worst_refused(limits: Limits, max_body: int) -> dict[str, int]:
    """Refused requests that cost the most before their refusal: the most JSON (or protobuf)
    the size limits let through, written to hold the most values; n is elements."""
    json_bytes = min(limits.max_json_bytes, max_body) - 256
    return {"v2 json FP32 [1, n, 1]": json_bytes // 4,  # [0], per element
            "clipper json [n, 1]": json_bytes // 4,
            "v2 binary BYTES": min((max_body - 256) // 4, limits.max_input_elements),
            "grpc typed BYTES": (max_body - 256) // 2}  # a tag and a 0 length per element


# ---- the server ------------------------------------------------------------------------------
def config(http_port: int, grpc_port: int, limits: dict[str, int]) -> dict[str, Any]:
    return {
        "server": {"http_port": http_port, "grpc_port": grpc_port,
                   "require_admin_token": False, "limits": limits},
        # The Clipper app has a model of its own: a queue bound measured on the V2 routes'
        # one huge row per request would shed its 1,024-query batches.
        "models": [{"name": "noop", "source": "zoo:noop", "replicas": 1,
                    "timeout_ms": 60_000},
                   {"name": "rows", "source": "zoo:noop", "replicas": 1,
                    "timeout_ms": 60_000, "batching": {"max_batch_size": 1024}}],
        "applications": [{"name": "app", "models": ["rows"], "slo_ms": 60_000,
                          "default_output": -1}],
        "graphs": [{"name": "g", "fault_tolerance": "bare", "timeout_ms": 60_000,
                    "operators": [{"name": "op", "model": "noop", "inputs": ["frontend"]}],
                    "output": "op"}],
    }


@dataclass(frozen=True)
class Served:
    host: str
    http_port: int
    grpc_port: int
    pid: int  # the frontend's; its main thread runs the event loop


@contextmanager
def server(folder: Path, limits: dict[str, int]) -> Iterator[Served]:
    http_port, grpc_port = free_port(), free_port()
    path = write_config(config(http_port, grpc_port, limits), folder / "serving.yaml")
    with ServerProcess(path, port=http_port, log_dir=folder / "logs") as proc:
        assert proc.proc is not None
        yield Served("127.0.0.1", http_port, grpc_port, proc.proc.pid)


def loop_times(pid: int) -> tuple[float, float]:
    """(CPU seconds, run-queue seconds) of the frontend's event-loop thread so far: what a
    request costs it, and how long the shared machine kept it waiting for a core."""
    with open(f"/proc/{pid}/task/{pid}/schedstat") as f:
        on_cpu, waiting, _ = f.read().split()
    return int(on_cpu) / 1e9, int(waiting) / 1e9


# ---- the probe -------------------------------------------------------------------------------
class Probe:
    """``GET /v2/health/live`` back to back on one connection; (start, round trip) each."""

    REQUEST = b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"

    def __init__(self, host: str, port: int) -> None:
        self.sock = socket.create_connection((host, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.samples: list[tuple[float, float]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            start = time.perf_counter()
            self.sock.sendall(self.REQUEST)
            self._read_answer()
            self.samples.append((start, time.perf_counter() - start))

    def _read_answer(self) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += self.sock.recv(4096)
        head, _, rest = data.partition(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length"))
        while len(rest) < length:
            rest += self.sock.recv(4096)

    def longest_during(self, start: float, end: float) -> float:
        """The longest round trip of the probes that overlap [start, end]."""
        return max((rt for s, rt in list(self.samples) if s < end and s + rt > start),
                   default=0.0)

    def idle_median(self) -> float:
        return statistics.median(rt for _, rt in self.samples[-200:])

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.sock.close()


def _send(host: str, http_port: int, channel: grpc.Channel, request: Request) -> str:
    if request.path == "grpc":
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        try:
            call(request.body, timeout=120)
            return "OK"
        except grpc.RpcError as exc:
            return exc.code().name
    conn = http.client.HTTPConnection(host, http_port, timeout=120)
    try:
        conn.request("POST", request.path, request.body, request.headers)
        return str(conn.getresponse().status)
    finally:
        conn.close()


def _wait_ready(host: str, http_port: int, timeout_s: float = 60.0) -> None:
    """Until both models answer ready (a worker a request made fail has been restarted)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        conn = http.client.HTTPConnection(host, http_port, timeout=10)
        try:
            statuses = []
            for model in ("noop", "rows"):
                conn.request("GET", f"/v2/models/{model}/ready")
                response = conn.getresponse()
                response.read()
                statuses.append(response.status)
        finally:
            conn.close()
        if statuses == [200, 200]:
            return
        time.sleep(0.2)
    raise RuntimeError(f"the models were not ready again within {timeout_s:g} s")


def measure(served: Served, route: str, n: int, reps: int) -> dict[str, Any]:
    """Medians over ``reps`` requests of ``n`` elements on ``route``: the block a probe saw,
    the event-loop thread's CPU and run-queue time, and the request's wall time."""
    host, http_port, grpc_port = served.host, served.http_port, served.grpc_port
    blocks, cpus, waits, walls, statuses, size = [], [], [], [], [], 0
    _wait_ready(host, http_port)
    with grpc.insecure_channel(f"{host}:{grpc_port}", options=[
            ("grpc.max_send_message_length", 1 << 30),
            ("grpc.max_receive_message_length", 1 << 30)]) as channel:
        probe = Probe(host, http_port)
        probe.thread.start()
        try:
            for rep in range(reps):
                request = ROUTES[route](n, rep + 1)
                size = len(request.body)
                time.sleep(0.2)  # idle probes first: the baseline, and the GC settles
                idle = probe.idle_median()
                cpu, wait = loop_times(served.pid)
                start = time.perf_counter()
                statuses.append(_send(host, http_port, channel, request))
                end = time.perf_counter()
                cpu_after, wait_after = loop_times(served.pid)
                time.sleep(0.05)  # the probe in flight at the end comes back
                blocks.append(max(0.0, probe.longest_during(start, end) - idle))
                cpus.append(cpu_after - cpu)
                waits.append(wait_after - wait)
                walls.append(end - start)
        finally:
            probe.close()
    return {"route": route, "elements": n, "bytes": size, "status": sorted(set(statuses)),
            "block_ms": _ms(statistics.median(blocks)),
            "block_ms_range": [_ms(min(blocks)), _ms(max(blocks))],
            "loop_cpu_ms": _ms(statistics.median(cpus)),
            "loop_cpu_ms_range": [_ms(min(cpus)), _ms(max(cpus))],
            "loop_runqueue_ms": _ms(statistics.median(waits)),
            "wall_ms": _ms(statistics.median(walls))}


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 1)


# ---- the run ---------------------------------------------------------------------------------
def run(reps: int, routes: list[str], curve: tuple[int, ...]) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    shipped = Limits()
    with tempfile.TemporaryDirectory() as tmp:
        lifted = {k: v for k, v in LIFTED.items() if k in Limits.model_fields}
        with server(Path(tmp) / "lifted", lifted) as served:
            for route in routes:
                for n in curve:
                    rows.append({"server": "lifted", **measure(served, route, n, reps)})
                    print(json.dumps(rows[-1]), flush=True)
        with server(Path(tmp) / "defaults", {}) as served:
            for section, sizes in (("defaults", largest_accepted(shipped, _max_body())),
                                   ("refused", worst_refused(shipped, _max_body()))):
                for route in (r for r in routes if r in sizes):
                    rows.append({"server": section, **measure(served, route, sizes[route],
                                                              reps)})
                    print(json.dumps(rows[-1]), flush=True)
    return {"command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
            "machine": machine_info(), "load_average": os.getloadavg(), "reps": reps,
            "limits": shipped.model_dump(), "lifted": LIFTED, "rows": rows}


def _max_body() -> int:
    from parityserve.config import Server
    return Server().max_body_bytes


def ns_per_element(rows: list[dict[str, Any]], route: str) -> float | None:
    """The slope of the loop's CPU time over the lifted curve's two largest points, in ns per
    element (CPU time: the block less what the shared machine's other work adds to it)."""
    points = sorted((r["elements"], r["loop_cpu_ms"]) for r in rows
                    if r["server"] == "lifted" and r["route"] == route)
    if len(points) < 2 or points[-1][0] == points[-2][0]:
        return None
    (n1, b1), (n2, b2) = points[-2], points[-1]
    return round((b2 - b1) / (n2 - n1) * 1e6, 1)


_HEAD = ["| route | elements | bytes | status | block ms | range | loop CPU ms | range "
         "| loop run-queue ms | wall ms |", "|---|---|---|---|---|---|---|---|---|---|"]


def markdown(result: dict[str, Any]) -> str:
    rows, load = result["rows"], ", ".join(f"{x:.2f}" for x in result["load_average"])
    lines = [f"# {result['name']}", "", "Command:", "", "```",
             f"python benchmarks/diagnostics/{result['command']}", "```", "",
             f"Machine: {result['machine'].get('cpu_model')}, "
             f"{result['machine'].get('cpu_count')} cores, shared with other engineers' work "
             f"(load average at the end: {load}); python {result['machine'].get('python')}. "
             f"Each point is the median of {result['reps']} requests, the range beside it. "
             "*block*: the longest wait of a health probe during the request, less its idle "
             "round trip (what another client waited); *loop CPU*: the event-loop thread's "
             "CPU time during the request (its work, all stretches together); *run-queue*: "
             "time that thread was ready but the machine's cores were busy with others.", "",
             "## At the shipped limits: the largest request each route accepts", "", *_HEAD]
    lines += [_row(r) for r in rows if r["server"] == "defaults"]
    lines += ["", "## At the shipped limits: refused requests that cost the most before their "
              "refusal (the most JSON, body or protobuf the size limits let in)", "", *_HEAD]
    lines += [_row(r) for r in rows if r["server"] == "refused"]
    lines += ["", "## Limits lifted: the cost against elements "
              f"({', '.join(f'{k} = {v}' for k, v in result['lifted'].items())})", "", *_HEAD]
    lines += [_row(r) for r in rows if r["server"] == "lifted"]
    lines += ["", "## Loop CPU per element, over the two largest lifted points", "",
              "| route | ns per element |", "|---|---|"]
    for route in dict.fromkeys(r["route"] for r in rows if r["server"] == "lifted"):
        lines.append(f"| {route} | {ns_per_element(rows, route)} |")
    return "\n".join(lines) + "\n"


def _row(r: dict[str, Any]) -> str:
    low, high = r["block_ms_range"]
    cpu_low, cpu_high = r["loop_cpu_ms_range"]
    return (f"| {r['route']} | {r['elements']:,} | {r['bytes']:,} | {'/'.join(r['status'])} "
            f"| {r['block_ms']} | {low}-{high} | {r['loop_cpu_ms']} | {cpu_low}-{cpu_high} "
            f"| {r['loop_runqueue_ms']} | {r['wall_ms']} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--name", default="loop-block")
    parser.add_argument("--routes", nargs="*", default=list(ROUTES), choices=list(ROUTES))
    parser.add_argument("--curve", nargs="*", type=int, default=list(CURVE))
    args = parser.parse_args()
    result = {"name": args.name, **run(args.reps, args.routes, tuple(args.curve))}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{args.name}.json").write_text(json.dumps(result, indent=1) + "\n")
    (OUT / f"{args.name}.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
