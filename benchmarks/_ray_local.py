"""A multi-node Ray cluster on this machine (``ray.cluster_utils.Cluster``) that comes up on a
busy 2-core box, or says plainly why it could not.

The integration test (tests/integration/test_ray_cluster.py) and ``benchmarks.ray_cluster``
both start one. Ray waits a fixed 30 s for a new raylet to register with the GCS (node.py;
no setting raises it in Ray 2.60), and a raylet waits a fixed 15 s for its dashboard and
runtime-env agents to write their port files. On a loaded machine those Python agents can
miss that window, and the node then "timed out during startup ... GCS overloaded". The levers
left are less work at startup and a second attempt:

- fewer processes: dashboard off, no autoscaler monitor, no log monitor (nothing reads the
  workers' stdout through the driver here), the smallest object store Ray accepts;
- no idle workers started ahead of demand (``prestart_worker_first_driver``,
  ``enable_worker_prestart``: each is a Python process importing Ray), and a longer wait for
  a worker to register (``worker_register_timeout_seconds``) while the box is busy;
- a private temp dir per attempt, so that a failed attempt's processes are found (by the dir
  on their command line) and killed, and its raylet's own error is quoted in the reason.

``local_cluster`` raises ``ClusterUnavailable`` only after every attempt failed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["SYSTEM_CONFIG", "ClusterUnavailable", "LocalCluster", "crash_node", "local_cluster"]

OBJECT_STORE_BYTES = 80 * 2**20  # Ray refuses less than 75 MiB
SYSTEM_CONFIG: dict[str, Any] = {
    "prestart_worker_first_driver": False,
    "enable_worker_prestart": False,
    "worker_register_timeout_seconds": 120,
}
_NODE_ARGS: dict[str, Any] = {"include_log_monitor": False,
                              "object_store_memory": OBJECT_STORE_BYTES}
_HEAD_ARGS: dict[str, Any] = {"num_cpus": 0, "include_dashboard": False, "no_monitor": True,
                              "_system_config": SYSTEM_CONFIG, **_NODE_ARGS}


class ClusterUnavailable(RuntimeError):
    """Ray could not start the cluster on this machine; the message says what each attempt
    died of."""


@dataclass
class LocalCluster:
    cluster: Any  # ray.cluster_utils.Cluster
    nodes: list[Any]  # its worker nodes (ray._private.node.Node), the head excluded
    startup_s: float
    attempts: int
    cpus: float = 3
    temp_dir: str = ""

    def add_node(self, timeout_s: float = 60) -> Any:
        """One more worker node like the others (a machine back after a crash), once the
        GCS lists it; it joins ``nodes``."""
        node = _add_worker(self.cluster, self.cpus, self.temp_dir)
        self.cluster.wait_for_nodes(timeout=timeout_s)
        self.nodes.append(node)
        return node


@contextmanager
def local_cluster(nodes: int = 3, cpus: float = 3, attempts: int = 2,
                  say: Callable[[str], None] = print) -> Iterator[LocalCluster]:
    """A head with no CPUs (the driver's node) and ``nodes`` nodes of ``cpus`` CPUs each,
    the driver connected to it; everything stopped on exit."""
    failures: list[str] = []
    started = time.monotonic()
    for attempt in range(1, attempts + 1):
        temp_dir = tempfile.mkdtemp(prefix="psray-")
        try:
            cluster, workers = _start(nodes, cpus, temp_dir)
        except Exception as exc:  # Ray raises plain Exception for a node's startup timeout
            failures.append(f"attempt {attempt}: {_one_line(exc)}{_raylet_errors(temp_dir)}")
            say(f"ray cluster: {failures[-1]}")
            _kill_leftovers(temp_dir)
            shutil.rmtree(temp_dir, ignore_errors=True)
            continue
        say(f"ray cluster up in {time.monotonic() - started:.1f}s (attempt {attempt})")
        try:
            yield LocalCluster(cluster, workers, time.monotonic() - started, attempt, cpus,
                               temp_dir)
        finally:
            _stop(cluster, temp_dir)
        return
    raise ClusterUnavailable("; ".join(failures))


def crash_node(cluster: Any, node: Any) -> float:
    """A machine's crash: its raylet and every actor on it die at once, and so does every
    process those actors started (a replica's worker, a graph operator). (Killing only the
    raylet of a logical node leaves its actors running on this host until Ray's health checks
    notice; a real machine takes them down with it.) The actors' children are SIGKILLed
    too, not left to their death-with-parent signal: that is a SIGTERM, and a graph operator
    under load took over 2 s to act on it and went on answering meanwhile (a make test run
    whose "crashed" primary served every request of the event, and failed over after it).

    Returns the ``time.monotonic()`` of the first SIGKILL: the crash's instant. Listing the
    node's actors before it is a read of Ray's actor table (50-100 ms here), the harness's
    own bookkeeping, which a benchmark timing the failover from the crash must not count."""
    import ray

    pids = [a["Pid"] for a in ray._private.state.actors().values()
            if a["State"] == "ALIVE" and a["Address"]["NodeID"] == node.node_id]
    # the node's own processes (its raylet among them), its actors and what they started,
    # all SIGKILLed in one instant, and the node removed after. Removing it first took 1.3 s
    # under load, and the members on it died one at a time meanwhile (one crash seen as
    # two); killing only the actors first left the raylet up, and a replacement placed on
    # the "crashed" node was started there and died with it seconds later
    own = [info.process.pid for infos in getattr(node, "all_processes", {}).values()
           for info in infos if getattr(info, "process", None) is not None]
    doomed = own + pids + [child for pid in pids for child in _descendants(pid)]
    crashed_at = time.monotonic()
    for pid in doomed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    cluster.remove_node(node, allow_graceful=False)
    return crashed_at


def _descendants(root: int) -> list[int]:
    """Every process below ``root`` (children, theirs, ...), read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _start(nodes: int, cpus: float, temp_dir: str) -> tuple[Any, list[Any]]:
    import ray
    from ray.cluster_utils import Cluster

    # Cluster.add_node writes the head's address to Ray's default temp dir (/tmp/ray),
    # whatever temp_dir says, and fails on a machine where nothing has made that dir yet
    address_file = Path(ray._private.utils.get_ray_address_file(None))
    address_file.parent.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(initialize_head=False)
    try:
        cluster.add_node(temp_dir=temp_dir, **_HEAD_ARGS)
        workers = [_add_worker(cluster, cpus, temp_dir) for _ in range(nodes)]
        cluster.wait_for_nodes(timeout=60)
        cluster.connect()
    except BaseException:
        with contextlib.suppress(Exception):
            ray.shutdown()
            cluster.shutdown()
        raise
    return cluster, workers


def _add_worker(cluster: Any, cpus: float, temp_dir: str) -> Any:
    return cluster.add_node(num_cpus=cpus, temp_dir=temp_dir, **_NODE_ARGS)


def _stop(cluster: Any, temp_dir: str) -> None:
    import ray

    ray.shutdown()
    cluster.shutdown()
    _kill_leftovers(temp_dir)
    shutil.rmtree(temp_dir, ignore_errors=True)


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def _raylet_errors(temp_dir: str, lines: int = 3) -> str:
    """The last lines of every raylet's and the GCS's stderr: the cause Ray's own exception
    leaves out (an agent's port file that never came, a port already taken)."""
    out = []
    for path in sorted(Path(temp_dir).glob("session_*/logs/*.err")):
        if path.name.startswith(("raylet", "gcs_server")):
            tail = [line.strip() for line in path.read_text(errors="replace").splitlines()
                    if line.strip()][-lines:]
            if tail:
                out.append(f"{path.name}: {' | '.join(tail)}")
    return f" [{'; '.join(out)}]" if out else ""


def _kill_leftovers(temp_dir: str) -> None:
    """SIGKILL every process whose command line names this attempt's private temp dir (the
    GCS, raylets and agents of a node that failed half-way, which Ray does not stop)."""
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if temp_dir.encode() in cmd and pid != os.getpid():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
