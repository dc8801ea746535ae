"""Where gRPC throughput on one core goes: grpc.aio's own ceiling, a threaded alternative, and
parityserve started in the harness's session or in its own (the kernel's autogroups).

    python benchmarks/diagnostics/grpc_ceiling.py [--rounds 2] [--seconds 8]

Each server is pinned to core 1 and ``parityserve bench load --protocol grpc`` (64 in flight,
784 random floats per request) to core 0, as in ``benchmarks/frontend_wrk.py``; variants are
interleaved round by round and the report gives medians. The variants:

* ``aio-bare``: a grpc.aio servicer (uvloop) whose ModelInfer answers at once: no model, no
  dispatch. What grpc.aio itself costs per RPC on the core.
* ``sync-hop-64``: ``grpc.server`` with 64 threads, each RPC handed to an asyncio loop thread
  and waited for (the shape a threaded gRPC frontend over parityserve's loop would have).
* ``parityserve-shared-session``: ``parityserve start`` (``zoo:noop``, cache off) in this
  harness's session, so in its autogroup.
* ``parityserve-own-session``: the same server started with ``setsid``, as the benchmarks and
  service managers start it: its own autogroup.
* with ``--worker-nice N`` (root; writes ``/proc/PID/autogroup``), also
  ``parityserve-own-session-worker-nice-N``: the last, with its worker's autogroup at nice N.
  Inside an autogroup a plain ``renice`` changes nothing, which is why the autogroup's is set.
* ``parityserve-own-session-worker-sched-batch``: the own-session server with every thread of
  its worker moved to ``SCHED_BATCH`` (``chrt -b``; no root needed). Unlike a nice, that keeps
  the worker's share of the CPU; it only stops the worker's wake-ups from preempting the
  frontend.

Writes ``benchmarks/results/grpc-ceiling/NAME.{json,md}`` (``--name``, default
``grpc-ceiling``). Needs a 2-core Linux box
(``taskset``) and the bench extra.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from parityserve.bench.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "benchmarks/results/grpc-ceiling"
VARIANTS = ("aio-bare", "sync-hop-64", "parityserve-shared-session",
            "parityserve-own-session", "parityserve-own-session-worker-sched-batch")
SERVER_CORE, CLIENT_CORE = "1", "0"


# ---- the two no-model servers (run as: grpc_ceiling.py --serve KIND --port P) -------------
def _metadata(pb: Any) -> Any:
    spec = pb.ModelMetadataResponse.TensorMetadata
    return pb.ModelMetadataResponse(
        name="noop", versions=["1"], platform="diagnostic",
        inputs=[spec(name="input", datatype="FP32", shape=[-1, 784])],
        outputs=[spec(name="output", datatype="FP32", shape=[-1, 784])])


def _response(pb: Any, request: Any, raw: bytes) -> Any:
    out = pb.ModelInferResponse.InferOutputTensor(name="output", datatype="FP32", shape=[1, 784])
    return pb.ModelInferResponse(model_name="noop", model_version="1", id=request.id,
                                 outputs=[out], raw_output_contents=[raw])


def _serve_aio(port: int) -> None:
    import grpc
    import uvloop
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc as pb_grpc

    class Aio(pb_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
        async def ServerReady(self, request: Any, context: Any) -> Any:
            return pb.ServerReadyResponse(ready=True)

        async def ModelMetadata(self, request: Any, context: Any) -> Any:
            return _metadata(pb)

        async def ModelInfer(self, request: Any, context: Any) -> Any:
            return _response(pb, request, request.raw_input_contents[0])

    async def main() -> None:
        server = grpc.aio.server()
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(Aio(), server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        await server.wait_for_termination()

    uvloop.run(main())


def _serve_sync_hop(port: int, threads: int = 64) -> None:
    from concurrent import futures

    import grpc
    import uvloop
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc as pb_grpc

    loop = uvloop.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    async def on_loop(raw: bytes) -> bytes:  # a future answered on a later pass, as a model's
        future = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(future.set_result, raw)
        return await future

    class Hop(pb_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
        def ServerReady(self, request: Any, context: Any) -> Any:
            return pb.ServerReadyResponse(ready=True)

        def ModelMetadata(self, request: Any, context: Any) -> Any:
            return _metadata(pb)

        def ModelInfer(self, request: Any, context: Any) -> Any:
            raw = asyncio.run_coroutine_threadsafe(
                on_loop(request.raw_input_contents[0]), loop).result(30)
            return _response(pb, request, raw)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=threads))
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(Hop(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    server.wait_for_termination()


# ---- the harness -------------------------------------------------------------------------
def _start(variant: str, work: Path) -> tuple[subprocess.Popen[bytes], int]:
    grpc_port = free_port()
    own_session = not variant.startswith("parityserve-shared-session")
    if variant.startswith("parityserve"):
        from benchmarks.frontend_cases import load_case

        config = work / "noop.yaml"
        config.write_text(json.dumps(load_case("noop", None).parityserve_config(
            free_port(), grpc_port)))
        cmd = [str(Path(sys.executable).with_name("parityserve")), "start", "-c", str(config)]
    else:
        kind = "aio" if variant == "aio-bare" else "sync-hop"
        cmd = [sys.executable, __file__, "--serve", kind, "--port", str(grpc_port)]
    proc = subprocess.Popen(["taskset", "-c", SERVER_CORE, *cmd], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=own_session)
    return proc, grpc_port


def _load(port: int, concurrency: int, seconds: float, out: Path | None) -> None:
    tool = str(Path(sys.executable).with_name("parityserve"))
    cmd = ["taskset", "-c", CLIENT_CORE, tool, "bench", "load", f"127.0.0.1:{port}",
           "--protocol", "grpc", "--model", "noop", "--shape", "784", "--no-progress",
           "--concurrency", str(concurrency), "--duration", str(seconds)]
    subprocess.run(cmd + (["--json", str(out)] if out else []), check=True,
                   capture_output=True, timeout=seconds + 120)


def _ready(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode} before it served")
        try:
            _load(port, 1, 0.5, None)
            return
        except subprocess.CalledProcessError:
            time.sleep(0.5)
    raise SystemExit(f"no gRPC answer on port {port} within {timeout_s:g} s")


def _workers(server_pid: int) -> list[str]:
    found = subprocess.run(["pgrep", "-P", str(server_pid), "-f", "runtime.workers.worker"],
                           capture_output=True, text=True).stdout.split()
    if not found:
        raise SystemExit("no worker process found under the server")
    return found


def _nice_workers(server_pid: int, nice: int) -> None:
    """Set the autogroup nice of ``server_pid``'s worker processes (each its own session)."""
    for pid in _workers(server_pid):
        Path(f"/proc/{pid}/autogroup").write_text(str(nice))


def _batch_workers(server_pid: int) -> None:
    """Every thread of ``server_pid``'s worker processes to SCHED_BATCH."""
    for pid in _workers(server_pid):
        subprocess.run(["chrt", "-b", "-a", "-p", "0", pid], check=True, capture_output=True)


def measure(variant: str, seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        proc, port = _start(variant, work)
        try:
            _ready(port, proc)
            if "-worker-nice-" in variant:
                _nice_workers(proc.pid, int(variant.rsplit("-", 1)[1]))
            if variant.endswith("-sched-batch"):
                _batch_workers(proc.pid)
            _load(port, 8, 2.0, None)  # warm-up
            _load(port, 64, seconds, work / "run.json")
            run = json.loads((work / "run.json").read_text())["run"]
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    return {k: run[k] for k in ("throughput_rps", "n", "p50_ms", "p99_ms", "p999_ms",
                                "tool_cpu_us_per_request")}


def report(state: dict[str, Any]) -> str:
    lines = ["# gRPC on one core: grpc.aio's ceiling and the kernel's process grouping", "",
             f"Command: `{state['command']}`", "",
             "Server on core 1, `parityserve bench load --protocol grpc` (64 in flight) on "
             "core 0; variants interleaved per round; medians over rounds, each round's req/s "
             "listed; p50 / p99 / p99.9 from the median round, with its answers (n).", "",
             "| variant | req/s | rounds | p50 / p99 / p99.9 ms | n |", "|---|---|---|---|---|"]
    for variant in state["runs"]:
        runs = state["runs"][variant]
        if not runs:
            continue
        rates = [r["throughput_rps"] for r in runs]
        mid = sorted(runs, key=lambda r: r["throughput_rps"])[len(runs) // 2]
        lines.append(f"| {variant} | {statistics.median(rates):,.0f} | "
                     f"{[round(x) for x in rates]} | {mid['p50_ms']:.1f} / {mid['p99_ms']:.1f} "
                     f"/ {mid['p999_ms']:.1f} | {mid['n']:,} |")
    lines += ["", f"Machine: {state['machine']}", ""]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--worker-nice", type=int, help="also the own-session server with its "
                        "worker's autogroup at this nice (root)")
    parser.add_argument("--variants", help="comma list of the variants to run (default: all)")
    parser.add_argument("--name", default="grpc-ceiling",
                        help="results file stem under benchmarks/results/grpc-ceiling/ (a "
                             "subset of variants should not overwrite the full table)")
    parser.add_argument("--serve", choices=("aio", "sync-hop"), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        (_serve_aio if args.serve == "aio" else _serve_sync_hop)(args.port)
        return 0
    sys.path.insert(0, str(ROOT))
    from benchmarks.report import machine_info

    info = machine_info()
    variants = args.variants.split(",") if args.variants else list(VARIANTS)
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        raise SystemExit(f"unknown variants {sorted(unknown)}; choose from {list(VARIANTS)}")
    flags = f" --variants {args.variants}" if args.variants else ""
    if args.name != "grpc-ceiling":
        flags += f" --name {args.name}"
    if args.worker_nice is not None:
        variants.append(f"parityserve-own-session-worker-nice-{args.worker_nice}")
        flags += f" --worker-nice {args.worker_nice}"
    state: dict[str, Any] = {
        "command": "python benchmarks/diagnostics/grpc_ceiling.py "
                   f"--rounds {args.rounds} --seconds {args.seconds:g}{flags}",
        "machine": f"{info.get('cpu_model')}, {info.get('cpu_count')} cores, "
                   f"{info.get('date')}",
        "runs": {v: [] for v in variants}}
    for round_ in range(args.rounds):
        for variant in variants:
            print(f"round {round_ + 1}: {variant}", file=sys.stderr, flush=True)
            state["runs"][variant].append(measure(variant, args.seconds))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{args.name}.json").write_text(json.dumps(state, indent=2))
    (OUT / f"{args.name}.md").write_text(report(state))
    print(report(state))
    return 0


if __name__ == "__main__":
    sys.exit(main())
