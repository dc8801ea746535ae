"""What the ASGI layer costs per request on one core: the same V2 work on Starlette and on a
plain httptools protocol, under wrk.

    python benchmarks/diagnostics/asgi_layer.py [--rounds 3] [--seconds 5]   # about 1 min
    python benchmarks/diagnostics/asgi_layer.py --quick                      # 1 round x 2 s

Both servers answer ``POST /v2/models/noop/infer`` in the V2 binary tensor extension with
parityserve's own codec (``runtime/frontend/v2``), taking each request's first value as the answer,
as ``frontend_apps.py bare`` does:

* ``starlette``: ``benchmarks/frontend_apps.py bare``, Starlette on uvicorn (httptools,
  uvloop): the issue 17 ceiling.
* ``httptools``: an ``asyncio.Protocol`` around ``httptools.HttpRequestParser`` on uvloop, one
  task per request and one write per answer; no ASGI messages, no Request or Response objects,
  no header checks. It is a measuring stick only: it keeps no limits, no timeouts, no flow
  control, and does not belong in a server.

The servers are pinned to core 1 and wrk to core 0 (64 connections, the 2,000 distinct
bodies of ``frontend_wrk.py``'s no-op case), one fresh server per variant and round, variants
alternating. The gap between the two is what uvicorn's ASGI cycle and Starlette cost per
request: the motivation for ``parityserve/runtime/frontend/hot_cycle.py``, which keeps uvicorn's
protocol and skips the ASGI messages on the hot routes. Writes
``benchmarks/results/frontend-profile/asgi-layer.{json,md}``. Needs ``wrk``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import frontend_wrk as fw  # noqa: E402
from benchmarks.frontend_cases import load_case  # noqa: E402
from benchmarks.report import machine_info  # noqa: E402
from parityserve.bench.ports import free_port  # noqa: E402

OUT = ROOT / "benchmarks/results/frontend-profile"
VARIANTS = ("starlette", "httptools")
PATH = "/v2/models/noop/infer"


# ---- the plain protocol (run as: asgi_layer.py --serve PORT) -------------------------------
def _serve_plain(port: int) -> None:
    import httptools
    import uvloop

    from parityserve.runtime.frontend import v2

    class Plain(asyncio.Protocol):
        def __init__(self) -> None:
            self.parser = httptools.HttpRequestParser(self)
            self.headers: dict[bytes, bytes] = {}
            self.body: list[bytes] = []

        def connection_made(self, transport: Any) -> None:
            self.transport = transport

        def data_received(self, data: bytes) -> None:
            self.parser.feed_data(data)

        def on_header(self, name: bytes, value: bytes) -> None:
            self.headers[name.lower()] = value

        def on_body(self, body: bytes) -> None:
            self.body.append(body)

        def on_message_complete(self) -> None:
            body, headers = b"".join(self.body), self.headers
            self.body, self.headers = [], {}
            asyncio.get_running_loop().create_task(self.answer(body, headers))

        async def answer(self, body: bytes, headers: dict[bytes, bytes]) -> None:
            length = headers.get(b"inference-header-content-length")
            decoded = v2.decode_infer_request(body, int(length) if length else None)
            out = decoded.inputs[0].array[0][:1][None]
            encoded, extra = v2.encode_infer_response(
                "noop", "1", decoded.id, [("output", out)],
                {"output": decoded.wants_binary("output")})
            head = [b"HTTP/1.1 200 OK", b"content-length: %d" % len(encoded)]
            head += [k.encode() + b": " + v.encode() for k, v in extra.items()]
            self.transport.writelines([b"\r\n".join(head) + b"\r\n\r\n", encoded])

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Plain, "127.0.0.1", port)
        print("ready", flush=True)
        await server.serve_forever()

    uvloop.run(main())


# ---- the measurement ------------------------------------------------------------------------
def _start(variant: str, port: int) -> subprocess.Popen[bytes]:
    if variant == "starlette":
        cmd = [sys.executable, "-m", "benchmarks.frontend_apps", "bare", "--port", str(port)]
    else:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--serve", str(port)]
    proc = subprocess.Popen(["taskset", "-c", fw.SERVER_CORE, *cmd], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    fw._wait_listening(port, None, proc)
    return proc


def _measure(variant: str, spec: dict[str, Any], lua: Path, seconds: float) -> dict[str, Any]:
    port = free_port()
    proc = _start(variant, port)
    try:
        url = f"http://127.0.0.1:{port}{PATH}"
        args = argparse.Namespace(duration=seconds, connections=64)
        return fw._http_point(proc.pid, url, spec, lua, args, fw._BatchCounter("none", ""))
    finally:
        fw._stop(proc)


def report(state: dict[str, Any]) -> str:
    lines = ["# The ASGI layer's cost per request (a diagnostic)", "",
             f"Command: `{state['command']}`", "",
             "V2 binary, no-op answer, parityserve's codec in both; server on core 1, wrk on "
             "core 0, 64 connections, 2,000 distinct bodies; one fresh server per variant and "
             "round, alternating; medians over rounds (each round's req/s listed). CPU per "
             "request from /proc. The httptools variant keeps no limits or flow control: a "
             "measuring stick, not a server.", "",
             "| variant | req/s | rounds | vs starlette | server us/req | p50 / p99 / p99.9 ms "
             "@64 | n | p50 1-conn ms |", "|---" * 8 + "|"]
    base = None
    for variant in VARIANTS:
        runs = state["runs"].get(variant, [])
        if not runs:
            continue
        rps = statistics.median(r["rps"] for r in runs)
        base = base or rps
        mid = sorted(runs, key=lambda r: r["rps"])[len(runs) // 2]
        cpu = statistics.median(r["frontend_cpu_us_per_request"] for r in runs)
        lines.append(f"| {variant} | {rps:,.0f} | {[round(r['rps']) for r in runs]} | "
                     f"{rps / base:.2f} | {cpu:,.0f} | {mid['p50_ms']:.2f} / "
                     f"{mid['p99_ms']:.2f} / {mid['p999_ms']:.2f} | {mid['requests']:,} | "
                     f"{statistics.median(r['p50_1conn_ms'] for r in runs):.3f} |")
    m = state["machine"]
    lines += ["", "Tail columns are the median round's.", "",
              f"Machine: {m['cpu_model']}, {m['cpu_count']} cores, {m['date']}", ""]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0, help="per 64-connection run")
    parser.add_argument("--quick", action="store_true", help="1 round of 2 s runs")
    parser.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.seconds = 1, 2.0
    if args.serve is not None:
        _serve_plain(args.serve)
        return 0
    case = load_case("noop", None)
    state: dict[str, Any] = {
        "command": f"python benchmarks/diagnostics/asgi_layer.py --rounds {args.rounds} "
                   f"--seconds {args.seconds:g}",
        "machine": machine_info(), "runs": {}}
    with fw.wrk_workspace("asgi-layer-") as (work, lua):
        spec = fw._write_bodies(work, case)["v2-binary/distinct"]
        for round_ in range(args.rounds):
            order = VARIANTS if round_ % 2 == 0 else VARIANTS[::-1]
            for variant in order:
                point = _measure(variant, spec, lua, args.seconds)
                state["runs"].setdefault(variant, []).append(point)
                print(f"round {round_ + 1}: {variant} {point['rps']:,.0f} req/s", flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "asgi-layer.json").write_text(json.dumps(state, indent=1, default=str))
    text = report(state)
    (OUT / "asgi-layer.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
