"""Runs the HTTP frontend and the serving system on one asyncio loop.

``serve()`` is what ``parityserve start`` calls (blocking, with signal handling).
``start_in_thread()`` runs the same thing on a background thread for notebooks and tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
import socket
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import uvicorn

from parityserve.config import ServingConfig
from parityserve.core.edge_guards import HostAllowlist
from parityserve.models.sources import SourcePolicy
from parityserve.runtime.cluster.peers import PeerPlan, Peers, plan_group, signing_key
from parityserve.runtime.cluster.shard_mesh import ShardMesh
from parityserve.runtime.frontend.auth import AuthPolicy, ResolvedToken, resolve_token, vetted
from parityserve.runtime.frontend.connection import host_guard, uvicorn_settings
from parityserve.runtime.frontend.http import HotPaths, create_admin_app, create_app
from parityserve.runtime.serving.system import ServingSystem

__all__ = ["RunningServer", "ServerUrls", "auth_policy", "resolve_admin_token", "serve",
           "start_in_thread"]

T = TypeVar("T")


@dataclass(frozen=True)
class ServerUrls:
    http: str
    rpc: str
    admin: str | None = None  # the admin listener's base URL; None: admin is on ``http``
    grpc: str | None = None  # host:port of the V2 gRPC service; None: gRPC is off

    @property
    def admin_base(self) -> str:
        return self.admin or self.http

    def describe(self, config: ServingConfig) -> str:
        lines = [f"parityserve is serving on {self.http}",
                 f"  workers connect to  {self.rpc}",
                 f"  health              {self.http}/v2/health/ready",
                 f"  metrics             {self.http}/metrics",
                 f"  admin state         {self.admin_base}/admin/state"]
        if self.grpc:
            lines.append(f"  V2 gRPC             {self.grpc}")
        lines += [f"  app {a.name:<16} POST {self.http}/{a.name}/predict"
                  for a in config.applications]
        lines += [f"  model {m.name:<14} POST {self.http}/v2/models/{m.name}/infer"
                  for m in config.models]
        return "\n".join(lines)


def _bind(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    # proto=IPPROTO_TCP matters: asyncio only sets TCP_NODELAY on sockets that say they are
    # TCP, and without it Nagle plus delayed ACKs add ~40 ms to every response.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:  # a frontend shard: the kernel spreads connections over the shards
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def auth_policy(config: ServingConfig, token: ResolvedToken | None) -> AuthPolicy:
    """The frontend's policy: the resolved token, or open when the config turned it off."""
    s = config.server
    return AuthPolicy(token=token.token if token else None, protect_metrics=s.protect_metrics,
                      protect_inference=s.protect_inference, serve_admin=s.admin_host is None)


def resolve_admin_token(config: ServingConfig, base_dir: Path | None) -> ResolvedToken | None:
    """The token to serve with (generated if none exists), or None when turned off;
    ``ConfigError`` when it is too short (auth.vetted)."""
    if not config.server.require_admin_token:
        return None
    return vetted(resolve_token(config.server, base_dir))


def _uvicorn(app: object, config: ServingConfig, base_dir: Path | None,
             on_refuse: Callable[[str], None]) -> uvicorn.Server:
    # uvicorn_settings: the HTTP parser that enforces server.limits on every connection.
    # A HotPaths app itself (not a shard's or a peer stream's wrapper, which must see every
    # request) has its hot routes served without ASGI messages: runtime/frontend/hot_cycle.py.
    hosts = _allowed_hosts(config)
    settings = uvicorn_settings(config.server.limits, on_refuse,
                                hot=app if isinstance(app, HotPaths) else None, hosts=hosts)
    if settings["http"] == "h11":  # no protocol of ours to check Host: an ASGI wrapper does
        app = host_guard(app, hosts, on_refuse)
    tls, base = config.server.tls, base_dir or Path.cwd()
    if tls is not None:
        settings.update(ssl_certfile=str(base / tls.cert), ssl_keyfile=str(base / tls.key))
    uv = uvicorn.Server(uvicorn.Config(app, log_level=config.server.log_level,  # type: ignore[arg-type]
                                       access_log=False, lifespan="off", **settings))
    # Signals are ours (see _stop_on_signals). uvicorn's own capture would re-raise SIGTERM
    # after its shutdown and kill this process before the workers are stopped in order.
    uv.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]
    return uv


def _allowed_hosts(config: ServingConfig) -> HostAllowlist:
    """The Host names every listener answers: its addresses, localhost names, the
    operator's ``allowed_hosts``, and this machine's name when bound to every interface."""
    s = config.server
    bound = [s.host, *([s.admin_host] if s.admin_host else [])]
    return HostAllowlist(bound, s.allowed_hosts, machine_names=[socket.gethostname()])


def _bind_grpc(config: ServingConfig, system: ServingSystem, policy: AuthPolicy,
               base_dir: Path | None, reuse_port: bool = False) -> tuple[Any, str | None]:
    """The V2 gRPC service bound beside HTTP (same host, TLS and limits), or (None, None)."""
    s = config.server
    port = s.grpc_listen_port()
    if port is None:
        return None, None
    from parityserve.runtime.frontend.grpc_v2 import (
        bind_grpc,  # grpcio loads only when serving gRPC
    )

    base = base_dir or Path.cwd()
    tls = None if s.tls is None else ((base / s.tls.key).read_bytes(),
                                      (base / s.tls.cert).read_bytes())
    server, bound = bind_grpc(system, host=s.host, port=port, auth=policy, limits=s.limits,
                              max_message_bytes=s.max_body_bytes, version=_package_version(),
                              tls=tls, reuse_port=reuse_port)
    return server, f"{s.host}:{bound}"


def _package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("parityserve")
    except PackageNotFoundError:
        return "0+unknown"


def _url(config: ServingConfig, sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"{'https' if config.server.tls else 'http'}://{host}:{port}"


async def _run(config: ServingConfig, system: ServingSystem,
               on_ready: Callable[[ServerUrls], None], install_signals: bool,
               stop: asyncio.Event | None = None, tune_gc: bool = False,
               token: ResolvedToken | None = None, base_dir: Path | None = None,
               shard: ShardMesh | None = None, peers: PeerPlan | None = None) -> None:
    stop = asyncio.Event() if stop is None else stop
    if install_signals:
        _stop_on_signals(stop)
    s = config.server
    reuse = shard is not None
    socks = [_bind(s.host, s.http_port, reuse)]
    if s.admin_host is not None and s.admin_port is not None:
        socks.append(_bind(s.admin_host, s.admin_port, reuse))
    admin_sock = socks[1] if len(socks) > 1 else None
    policy = auth_policy(config, token)
    grpc_server: Any = None
    stream: Peers | None = None
    try:
        grpc_server, grpc_url = _bind_grpc(config, system, policy, base_dir, reuse)
        if shard is None:  # one process is its own group; a shard's parent planned the group
            peers = await asyncio.to_thread(plan_group, config)
        if peers is not None:
            stream = Peers(peers, policy.token,
                           key=signing_key(s, token, base_dir).token)
        if not await _unless_stopped(system.start(), stop):
            return  # Ctrl-C or SIGTERM while the workers were still loading
        sources = SourcePolicy.for_server(s, system.base_dir)
        apps: list[object] = [create_app(system, metrics=system.metrics, auth=policy,
                                         max_body_bytes=s.max_body_bytes, sources=sources,
                                         limits=s.limits, overload_status=s.overload_status)]
        if len(socks) > 1:
            apps.append(create_admin_app(system, metrics=system.metrics, auth=policy,
                                         max_body_bytes=s.max_body_bytes, sources=sources))
        admin_app: Any = apps[-1]  # the app serving /admin (its own listener's, if any)
        local = admin_app  # this process alone
        if shard is not None:  # public listeners act for all shards; the control port, that
            # the peers call, for this one alone
            local = shard.local(apps[0], apps[1] if len(apps) > 1 else None)
            apps = [shard.wrap(app) for app in apps]
        if stream is not None:  # outermost: a change is published once the shards all have it
            apps[-1] = stream.wrap(apps[-1])  # the listener that serves /admin
        if shard is not None:
            apps.append(local)
            socks.append(_bind("127.0.0.1", shard.control_port, reuse_port=True))
        servers = [_uvicorn(app, config, base_dir, system.metrics.connection_refused)
                   for app in apps]
        # The admin changes made before this process started are applied before the public
        # listeners open, so that the first connection it takes sees what its peers see: the
        # other hosts' from the stream (in-process), then, for a restarted shard, its own
        # host's from the journal (through the control port, the last listener).
        public = len(servers) - 1 if shard is not None else len(servers)
        if stream is not None:
            await stream.replay(local)
        tasks = await _listen(servers[public:], socks[public:])
        if shard is not None:
            await shard.started()
        _follow(stream, shard, admin_app)
        tasks = await _listen(servers[:public], socks[:public]) + tasks
        if tune_gc:
            _tune_gc_for_serving()
        if grpc_server is not None:
            await grpc_server.start()
        admin = _url(config, admin_sock) if admin_sock is not None else None
        on_ready(ServerUrls(_url(config, socks[0]), system.rpc_address, admin, grpc_url))
        await _wait_stop(tasks, servers, stop, grpc_server, _drain_grace_s(system))
        grpc_server = None  # stopped, its accepted calls answered
    finally:
        if grpc_server is not None:
            await grpc_server.stop(grace=1.0)  # answers in flight finish, new calls are refused
        if stream is not None:
            await stream.close()
        await system.close()
        for sock in socks:
            sock.close()


def _follow(stream: Peers | None, shard: ShardMesh | None, admin_app: Any) -> None:
    """One process per group applies the other hosts' admin changes: this one, or shard 0
    through the mesh (so that its shards all get them) once every shard listens."""
    if stream is None or (shard is not None and shard.index != 0):
        return
    if shard is None:
        stream.follow(admin_app)
    else:
        stream.follow(shard.wrap(admin_app), shard.siblings_listening)


async def _listen(servers: list[uvicorn.Server], socks: list[socket.socket]
                  ) -> list[asyncio.Task[None]]:
    """Each server serving on its socket: their tasks, once all serve (or one has ended)."""
    tasks = [asyncio.create_task(uv.serve(sockets=[sock]))
             for uv, sock in zip(servers, socks, strict=True)]
    while not all(uv.started for uv in servers) and not any(t.done() for t in tasks):
        await asyncio.sleep(0.01)
    return tasks


# Young-generation collections every this many net allocations instead of CPython's 700.
_GC_YOUNG_THRESHOLD = 20_000


def _tune_gc_for_serving() -> None:
    """Fewer, cheaper cyclic-GC passes once the server is up (process-wide; ``serve`` only).

    Why: a request allocates a few hundred short-lived objects (ASGI scope, task, futures,
    response), so at the default threshold the collector runs every few requests and, every
    hundred or so, walks the whole heap of imported modules. Measured at saturation on the
    no-op model, that was about a tenth of the frontend's CPU. Freezing what startup built
    takes it out of every later walk; the higher threshold makes the young walks rarer. Cycles
    are still collected, just in larger sweeps.
    """
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(_GC_YOUNG_THRESHOLD, older, oldest)


def _stop_on_signals(stop: asyncio.Event) -> None:
    """SIGINT and SIGTERM ask for a graceful stop: HTTP first, then the workers in order."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)


async def _unless_stopped(starting: Coroutine[object, object, None], stop: asyncio.Event) -> bool:
    """Run ``starting`` to completion unless ``stop`` is set first (then cancel it)."""
    task = asyncio.create_task(starting)
    waiter = asyncio.create_task(stop.wait())
    await asyncio.wait([task, waiter], return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return False
    task.result()  # re-raise a startup failure
    return True


async def _wait_stop(tasks: list[asyncio.Task[None]], servers: list[uvicorn.Server],
                     stop: asyncio.Event, grpc_server: Any = None, grace_s: float = 0.0) -> None:
    """Until ``stop`` (or a listener ends): then gRPC and the public HTTP listener stop taking
    queries at once, each answering what it accepted; the other listeners stop after, in turn.

    gRPC refuses new calls from its ``stop`` on and cancels those left after ``grace_s``, so
    it must start with HTTP's drain (a call it took during that drain could be cut short) and
    its grace outlast every accepted query's deadline (by then each has had its answer).
    """
    waiter = asyncio.create_task(stop.wait())
    await asyncio.wait([*tasks, waiter], return_when=asyncio.FIRST_COMPLETED)
    grpc_stopped = None if grpc_server is None else asyncio.ensure_future(
        grpc_server.stop(grace=grace_s))
    for uv, task in zip(servers, tasks, strict=True):
        uv.should_exit = True
        await task
    if grpc_stopped is not None:
        await grpc_stopped
    waiter.cancel()


# After a query's deadline the scheduler answers it (the default, or 504): what a call may
# still need then is its answer's writing, well within this.
_ANSWER_MARGIN_S = 5.0


def _drain_grace_s(system: ServingSystem) -> float:
    """How long a stopping gRPC server lets its accepted calls run: past the longest deadline
    a query served now can have (a model's ``timeout_ms``, an application's ``slo_ms``)."""
    deadlines_ms = [p.deployment.timeout_ms for p in system.models.values()]
    deadlines_ms += [a.config.slo_ms for a in system.apps.values()]
    return max(deadlines_ms, default=0.0) / 1000 + _ANSWER_MARGIN_S


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop when installed: it cuts the frontend's per-request overhead noticeably."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def serve(config: ServingConfig, *, base_dir: Path | None = None, data_dir: Path | None = None,
          on_ready: Callable[[ServerUrls], None] = lambda urls: None,
          log_dir: Path | None = None, token: ResolvedToken | None = None,
          shard: ShardMesh | None = None, peers: PeerPlan | None = None) -> None:
    """Serve until SIGINT/SIGTERM; workers are stopped before this returns.

    ``token``: the admin token already resolved (``parityserve start`` does so to say where
    it is); when None and the config requires one, it is resolved here. With
    ``server.frontends`` > 1 this process supervises that many shards (runtime/cluster/shards.py),
    each called with its ``shard`` and its group's ``peers`` (runtime/cluster/peers.py).
    """
    token = token or resolve_admin_token(config, base_dir)
    if config.server.frontends > 1 and shard is None:
        from parityserve.runtime.cluster.shards import serve_sharded  # only when sharded

        return serve_sharded(serve, config, base_dir=base_dir, data_dir=data_dir, on_ready=on_ready,
                             log_dir=log_dir, token=token)
    system = ServingSystem(config, base_dir=base_dir, data_dir=data_dir, log_dir=log_dir)
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(_run(config, system, on_ready, install_signals=True, tune_gc=True,
                        token=token, base_dir=base_dir, shard=shard, peers=peers))


class RunningServer:
    """A server on a background thread. Use as a context manager, or call ``stop()``."""

    def __init__(self, config: ServingConfig, *, base_dir: Path | None = None,
                 data_dir: Path | None = None, log_dir: Path | None = None) -> None:
        self.config = config
        self.base_dir = base_dir
        self.auth = resolve_admin_token(config, base_dir)
        # The admin token this server accepts (None when require_admin_token is false).
        self.token: str | None = self.auth.token if self.auth else None
        self.system = ServingSystem(config, base_dir=base_dir, data_dir=data_dir, log_dir=log_dir)
        self.urls: ServerUrls | None = None
        self._loop = (_loop_factory() or asyncio.new_event_loop)()
        self._stop = asyncio.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="parityserve", daemon=True)

    @property
    def url(self) -> str:
        assert self.urls is not None
        return self.urls.http

    @property
    def grpc_url(self) -> str | None:
        """host:port of the V2 gRPC service (what ``tritonclient.grpc`` takes), or None."""
        assert self.urls is not None
        return self.urls.grpc

    @property
    def admin_url(self) -> str:
        """Where /admin is served: the admin listener, or the main one."""
        assert self.urls is not None
        return self.urls.admin_base

    def _main(self) -> None:
        try:
            self._loop.run_until_complete(
                _run(self.config, self.system, self._on_ready, False, self._stop,
                     token=self.auth, base_dir=self.base_dir))
        except BaseException as exc:  # surfaced to the starting thread by start()
            self._error = exc
            self._ready.set()
        finally:
            self._loop.close()

    def _on_ready(self, urls: ServerUrls) -> None:
        self.urls = urls
        self._ready.set()

    def start(self, timeout_s: float = 180.0) -> RunningServer:
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise TimeoutError(f"server did not start within {timeout_s:.0f}s")
        if self._error is not None:
            raise self._error
        return self

    def call(self, coro_fn: Callable[[], Coroutine[Any, Any, T]], timeout_s: float = 60.0) -> T:
        """Run a coroutine function on the server's loop (admin calls from tests)."""
        future = asyncio.run_coroutine_threadsafe(coro_fn(), self._loop)
        return future.result(timeout_s)

    def stop(self, timeout_s: float = 30.0) -> None:
        if self._thread.is_alive():
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(timeout_s)

    def __enter__(self) -> RunningServer:
        return self.start() if not self._thread.is_alive() else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_in_thread(config: ServingConfig, **kwargs: object) -> RunningServer:
    return RunningServer(config, **kwargs).start()  # type: ignore[arg-type]
