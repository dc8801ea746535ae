"""``server.frontends: N``: N frontend processes on one HTTP (and gRPC) port, and their parent.

The parent reserves the public ports and one loopback control port per shard (bound with
SO_REUSEPORT, never listening, so the port stays ours across a shard's restart and the kernel
hands connections only to the shards), then starts each shard as a whole ``serve()`` in a
spawned process. Each shard owns its workers (README, "Sharded frontends", says why);
runtime/cluster/shard_mesh.py makes them answer as one server.

A shard that dies is restarted here, logged, and counted in
``parityserve_frontend_restarts_total``. What happens to the requests it held: they lived on
its TCP connections, so their clients see the connection reset (or closed) with no answer;
its workers die with it (PR_SET_PDEATHSIG), so nothing it accepted is answered later or twice.
Requests on the other shards' connections are untouched, and new connections go to the live
shards. The new shard replays the admin journal (and, with a Redis state store, the admin
stream up to where its group started: runtime/cluster/peers.py) before it listens on the public
ports, so the first query it takes already sees every admin change its peers made.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import multiprocessing.connection
import os
import queue
import signal
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from parityserve.config import ServingConfig
from parityserve.errors import ParityServeError
from parityserve.runtime.cluster.peers import PeerPlan, plan_group
from parityserve.runtime.cluster.shard_mesh import ShardMesh
from parityserve.runtime.fleet.health import STARTUP_TIMEOUT_S
from parityserve.runtime.frontend.auth import ResolvedToken

__all__ = ["cores_warning", "serve_sharded"]

log = logging.getLogger(__name__)

_MIN_RESTART_GAP_S = 1.0  # a shard that keeps crashing is restarted at most this often


def cores_warning(frontends: int, cores: int | None) -> str | None:
    """A warning when shards outnumber cores: they would only take turns on them."""
    if cores is not None and frontends > cores:
        return (f"server.frontends: {frontends} is more than this host's {cores} cores: the "
                "shards will share cores and add context switches, not throughput")
    return None


@contextlib.contextmanager
def _reserved(host: str, port: int) -> Iterator[int]:
    """``host:port`` (0: a free one) held with SO_REUSEPORT, not listening; the port."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ParityServeError(f"cannot bind {host}:{port}: {exc.strerror}") from None
    with sock:
        yield sock.getsockname()[1]


def _shard_config(config: ServingConfig, stack: contextlib.ExitStack, tmp: Path
                  ) -> tuple[ServingConfig, tuple[int, ...]]:
    """The config every shard runs (ports fixed, a shared store) and the control ports."""
    s = config.server
    ports: dict[str, Any] = {"http_port": stack.enter_context(_reserved(s.host, s.http_port))}
    grpc = s.grpc_listen_port()
    ports["grpc_port"] = 0 if grpc is None else stack.enter_context(_reserved(s.host, grpc))
    if s.admin_host is not None and s.admin_port is not None:
        ports["admin_port"] = stack.enter_context(_reserved(s.admin_host, s.admin_port))
    if s.state_store == "memory":  # selection state must be one for all shards
        ports["state_store"] = f"sqlite:{tmp / 'selection.sqlite'}"
        log.info("frontends: %d: selection state shared in %s", s.frontends, tmp)
    control = tuple(stack.enter_context(_reserved("127.0.0.1", 0)) for _ in range(s.frontends))
    server = s.model_copy(update=ports)
    return config.model_copy(update={"server": server}), control


def _shard_main(serve: Callable[..., None], config: ServingConfig, mesh: ShardMesh,
                peers: PeerPlan | None, paths: dict[str, Path | None],
                token: ResolvedToken | None, ready: Any) -> None:
    """A shard's process: a whole frontend (``serve``, server.py's) that tells the parent
    when it serves. ``serve`` comes in as an argument so that this module need not import it."""
    def on_ready(urls: Any) -> None:
        ready.put((mesh.index, os.getpid(), urls, None))
    try:
        serve(config, base_dir=paths["base"], data_dir=paths["data"], log_dir=paths["log"],
              token=token, shard=mesh, peers=peers, on_ready=on_ready)
    except BaseException as exc:
        ready.put((mesh.index, os.getpid(), None, f"{type(exc).__name__}: {exc}"))
        raise


class _Shards:
    """The parent's bookkeeping: start, watch, restart and stop the shard processes."""

    def __init__(self, serve: Callable[..., None], config: ServingConfig, mesh: ShardMesh,
                 peers: PeerPlan | None, paths: dict[str, Path | None],
                 token: ResolvedToken | None) -> None:
        self.ctx, self.serve = mp.get_context("spawn"), serve
        self.config, self.mesh, self.paths, self.token = config, mesh, paths, token
        self.peers = peers  # the group's plan for the admin stream (runtime/cluster/peers.py)
        self.restarts: Any = self.ctx.Array("i", len(mesh.control_ports))
        mesh.restarts = self.restarts
        self.ready: Any = self.ctx.Queue()
        self.procs: list[BaseProcess] = []
        self.started_at: list[float] = []
        self.stopping = False

    def start(self, index: int, replay: bool) -> BaseProcess:
        mesh = ShardMesh(index, self.mesh.control_ports, self.mesh.token, self.mesh.journal,
                         self.restarts, self.mesh.scheme, replay)
        log_dir = self.paths["log"]
        paths = {**self.paths, "log": None if log_dir is None else log_dir / f"shard-{index}"}
        proc = self.ctx.Process(target=_shard_main, name=f"parityserve-frontend-{index}",
                                args=(self.serve, self.config, mesh, self.peers, paths,
                                      self.token, self.ready))
        proc.start()
        return proc

    def start_all(self) -> Any:
        """Start every shard; shard 0's URLs once all of them serve."""
        self.procs = [self.start(i, replay=False) for i in range(len(self.mesh.control_ports))]
        self.started_at = [time.monotonic()] * len(self.procs)
        waiting, urls = set(range(len(self.procs))), None
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while waiting:
            if self.stopping or time.monotonic() > deadline:
                raise ParityServeError("frontend shards did not all start "
                                       f"(waiting for {sorted(waiting)})")
            with contextlib.suppress(queue.Empty):
                index, _pid, shard_urls, error = self.ready.get(timeout=0.5)
                if error is not None:
                    raise ParityServeError(f"frontend shard {index} failed to start: {error}")
                waiting.discard(index)
                urls = shard_urls if index == 0 else urls
        return urls

    def watch(self) -> None:
        """Until asked to stop: restart every shard that exits."""
        while not self.stopping:
            mp.connection.wait([p.sentinel for p in self.procs], timeout=0.5)
            self._drain_ready()
            for index, proc in enumerate(self.procs):
                if not self.stopping and not proc.is_alive() and self._may_restart(index):
                    self._restart(index, proc)

    def _may_restart(self, index: int) -> bool:
        return time.monotonic() - self.started_at[index] >= _MIN_RESTART_GAP_S

    def _restart(self, index: int, dead: BaseProcess) -> None:
        log.warning("frontend shard %d (pid %s) died (%s); its open connections were reset. "
                    "Restarting it.", index, dead.pid, _exit_text(dead.exitcode))
        with self.restarts.get_lock():
            self.restarts[index] += 1
        self.procs[index] = self.start(index, replay=True)
        self.started_at[index] = time.monotonic()

    def _drain_ready(self) -> None:
        with contextlib.suppress(queue.Empty):
            while True:
                index, pid, _urls, error = self.ready.get_nowait()
                if error is None:
                    log.warning("frontend shard %d is back (pid %d)", index, pid)

    def stop(self, timeout_s: float = 30.0) -> None:
        self.stopping = True
        for proc in self.procs:
            if proc.is_alive() and proc.pid is not None:
                os.kill(proc.pid, signal.SIGTERM)  # each stops its own workers in order
        deadline = time.monotonic() + timeout_s
        for proc in self.procs:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join()


def _exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"exit status {code}"


def serve_sharded(serve: Callable[..., None], config: ServingConfig, *, base_dir: Path | None,
                  data_dir: Path | None, on_ready: Callable[[Any], None], log_dir: Path | None,
                  token: ResolvedToken | None) -> None:
    """Serve with ``server.frontends`` shards until SIGINT/SIGTERM (``serve()`` calls this)."""
    warning = cores_warning(config.server.frontends, os.cpu_count())
    if warning:
        log.warning(warning)
    with tempfile.TemporaryDirectory(prefix="parityserve-shards-") as tmp, \
            contextlib.ExitStack() as stack:
        shard_config, control = _shard_config(config, stack, Path(tmp))
        mesh = ShardMesh(0, control, token.token if token else None, Path(tmp) / "admin.jsonl",
                         (), "https" if config.server.tls else "http")
        # One origin and one starting point on the admin stream for all shards: each replays
        # the stream up to it, so all begin from the same changes.
        peers = plan_group(config, Path(tmp) / "peers-cursor.json")
        shards = _Shards(serve, shard_config, mesh, peers, {"base": base_dir, "data": data_dir,
                                                     "log": log_dir}, token)
        previous = {sig: signal.signal(sig, lambda *_: setattr(shards, "stopping", True))
                    for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            on_ready(shards.start_all())
            shards.watch()
        finally:
            shards.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
