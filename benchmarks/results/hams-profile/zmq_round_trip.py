"""CPU per ZeroMQ round trip between two processes over a Unix socket (PAIR, 20-byte
messages, each side polling as the graph's processes do), all threads counted: what one
message costs on this VM. ``python benchmarks/results/hams-profile/zmq_round_trip.py``."""

from __future__ import annotations

import multiprocessing as mp
import os
import time

import zmq

N = 5000


def _echo(address: str) -> None:
    sock = zmq.Context().socket(zmq.PAIR)
    sock.connect(address)
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    start = time.process_time()
    for _ in range(N):
        poller.poll(1000)
        sock.recv_multipart(copy=False)
        sock.send_multipart([b"x" * 20])
    used_us = 1e6 * (time.process_time() - start) / N
    print(f"echo side: {used_us:.1f} us of CPU per round trip\n", end="", flush=True)


def main() -> None:
    address = f"ipc:///tmp/zmq-round-trip-{os.getpid()}.sock"
    sock = zmq.Context().socket(zmq.PAIR)
    sock.bind(address)
    echo = mp.Process(target=_echo, args=(address,))
    echo.start()
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(N):
        sock.send_multipart([b"y" * 20])
        poller.poll(1000)
        sock.recv_multipart(copy=False)
    print(f"sender side: {1e6 * (time.process_time() - cpu) / N:.1f} us of CPU, "
          f"{1e6 * (time.perf_counter() - wall) / N:.1f} us wall per round trip")
    echo.join()  # (its line may come first)


if __name__ == "__main__":
    main()
