"""What CURVE costs the worker round trip: a no-op PREDICT -> RESULT, with and without it.

The frontend side is the real ``WorkerLink`` on an asyncio loop; the worker side is a plain
DEALER in a child process that answers each batch at once (no model), so the round trip is
framing, ZeroMQ, encryption and the two event loops only. Prints the median round trip of each
repetition and the median of those medians.

    PYTHONPATH=. python benchmarks/diagnostics/curve_cost.py [--calls 2000] [--reps 5]
        [--rows 1 --cols 4]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import statistics
import time

import numpy as np
import zmq

from parityserve.runtime.workers import wire
from parityserve.runtime.workers.keys import ClientKeys, ServerKeys
from parityserve.runtime.workers.rpc import WorkerLink


def _echo(address: str, keys: ClientKeys | None) -> None:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, b"w")
    if keys is not None:
        sock.curve_serverkey, sock.curve_publickey = keys.server_public, keys.public
        sock.curve_secretkey = keys.secret
    sock.connect(address)
    sock.send_multipart(wire.encode({"t": wire.HELLO}))
    while True:
        header, buffers = wire.decode(sock.recv_multipart(copy=False))
        if header["t"] == wire.STOP:
            break
        desc = header["in"]
        reply = {"t": wire.RESULT, "bid": header["bid"], "ok": True, "out": desc}
        sock.send_multipart(wire.encode(reply, buffers), copy=False)
    sock.close(linger=0)


async def _run(curve: bool, calls: int, reps: int, shape: tuple[int, int]) -> list[float]:
    keys = ServerKeys.in_memory() if curve else None
    client = keys.client() if keys is not None else None
    waiting: dict[int, asyncio.Future[None]] = {}
    hello = asyncio.get_running_loop().create_future()

    def on_message(rid: str, header: dict, buffers: list) -> None:
        if header["t"] == wire.HELLO and not hello.done():
            hello.set_result(None)
        elif header["t"] == wire.RESULT:
            waiting.pop(header["bid"]).set_result(None)

    link = WorkerLink(keys=keys)
    link.start(on_message)
    child = mp.get_context("spawn").Process(target=_echo, args=(link.address, client))
    child.start()
    await hello
    desc, frames = wire.pack_payload(np.zeros(shape, np.float32))
    medians = []
    for rep in range(reps + 1):  # the first repetition warms up and is not counted
        times = []
        for bid in range(calls):
            future = waiting[bid] = asyncio.get_running_loop().create_future()
            started = time.perf_counter()
            link.send("w", {"t": wire.PREDICT, "bid": bid, "in": desc}, frames)
            await future
            times.append(time.perf_counter() - started)
        if rep:
            medians.append(statistics.median(times) * 1e6)
    link.send("w", {"t": wire.STOP})
    child.join(10)
    await link.close()
    return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--rows", type=int, default=1, help="batch rows sent and echoed")
    parser.add_argument("--cols", type=int, default=4, help="float32 values per row")
    args = parser.parse_args()
    for curve in (False, True):
        medians = asyncio.run(_run(curve, args.calls, args.reps, (args.rows, args.cols)))
        label = f"{'CURVE' if curve else 'plain'} {args.rows}x{args.cols} float32"
        print(f"{label}: median round trip {statistics.median(medians):.1f} us "
              f"(per repetition: {', '.join(f'{m:.1f}' for m in medians)})")


if __name__ == "__main__":
    main()
