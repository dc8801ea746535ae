"""The command line and real clients, the way a user meets them.

Every test runs the installed ``parityserve`` console script in a subprocess and talks to it
over HTTP with ``parityserve.client.Client`` or ``tritonclient``; nothing runs in-process.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import joblib
import numpy as np
import pytest
import tritonclient.http as triton
import yaml
from prometheus_client.parser import text_string_to_metric_families

from parityserve.bench.ports import free_port
from parityserve.bench.serverproc import ServerProcess
from parityserve.client import Client
from parityserve.models.datasets import load_digits_split
from parityserve.models.digits import train_digits_classifier

pytestmark = pytest.mark.e2e

# The console script pip installed next to this interpreter, not ``python -m``.
PARITYSERVE = str(Path(sys.executable).with_name("parityserve"))
SHUTDOWN_LINE = "parityserve stopped; all workers shut down."


def run_cli(*args: str, timeout_s: float = 60.0, cwd: Path | None = None
            ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PARITYSERVE, *args], capture_output=True, text=True,
                          timeout=timeout_s, cwd=cwd, stdin=subprocess.DEVNULL)


def write_yaml(path: Path, mapping: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(mapping, sort_keys=False))
    return path


def wait_for(condition: Callable[[], Any], timeout_s: float = 30.0, what: str = "condition"
             ) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what} not met within {timeout_s:g}s")


def is_running(pid: int) -> bool:
    """True while ``pid`` is a live process (a zombie awaiting its reaper counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def still_running(pids: list[int], timeout_s: float = 5.0) -> list[int]:
    """The pids still alive after waiting up to ``timeout_s`` for all of them to go."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(is_running(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if is_running(p)]


def replica_pids(client: Client, model: str | None = None) -> list[int]:
    return [r["pid"] for m in client.state()["models"] if model in (None, m["name"])
            for r in m["replicas"] if r["pid"] is not None]


def _find(pattern: str, text: str) -> str:
    match = re.search(pattern, text)
    assert match is not None, f"{pattern!r} not in:\n{text}"
    return match.group(1)


class Frontend:
    """``parityserve start -c FILE --port 0`` in its own process group, like a terminal job."""

    def __init__(self, config: Path, workdir: Path, *extra: str) -> None:
        self.config = config
        self.workdir = workdir
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.rpc = ""
        self._out = workdir / f"{config.stem}.stdout"
        self._err = workdir / f"{config.stem}.stderr"

    @property
    def stdout(self) -> str:
        return self._out.read_text()

    @property
    def stderr(self) -> str:
        return self._err.read_text()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def launch(self) -> Frontend:
        cmd = [PARITYSERVE, "start", "-c", str(self.config), "--port", "0", *self.extra]
        with self._out.open("wb") as out, self._err.open("wb") as err:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                         cwd=self.workdir, start_new_session=True,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
        return self

    def start(self, timeout_s: float = 60.0) -> Frontend:
        self.launch()
        banner = wait_for(self._banner, timeout_s, "the 'serving on' banner")
        self.url = _find(r"serving on (http://\S+)", banner)
        self.rpc = _find(r"workers connect to +(tcp://\S+)", banner)
        return self

    def _banner(self) -> str | None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"parityserve start exited with {self.proc.returncode}:\n"
                                 f"{self.stdout}\n{self.stderr}")
        text = self.stdout
        return text if "serving on" in text and "admin state" in text else None

    def send(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def ctrl_c(self) -> None:
        """What a terminal does on Ctrl-C: SIGINT to every process of the foreground group."""
        os.killpg(self.pid, signal.SIGINT)

    def wait(self, timeout_s: float = 30.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout_s)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def frontends(tmp_path: Path) -> Iterator[Callable[..., Frontend]]:
    """Make Frontends; whatever a test leaves running is killed afterwards."""
    made: list[Frontend] = []

    def make(config: Path, *extra: str, start: bool = True) -> Frontend:
        frontend = Frontend(config, tmp_path, *extra)
        made.append(frontend)
        return frontend.start() if start else frontend.launch()

    yield make
    for frontend in made:
        frontend.close()


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Other processes a test starts (e.g. ``parityserve worker``); killed afterwards."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)


ECHO_ONLY = {
    "server": {"http_port": 8000},
    "models": [{"name": "echo", "source": "zoo:echo", "replicas": 2}],
    "applications": [{"name": "echo", "models": ["echo"], "slo_ms": 5000}],
}


@pytest.fixture(scope="module")
def digits_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_digits_classifier(tmp_path_factory.mktemp("digits"))


@pytest.fixture
def deploy_dir(tmp_path: Path) -> Path:
    """Configs live in a folder of their own; the frontend runs from its parent."""
    folder = tmp_path / "deploy"
    folder.mkdir()
    return folder


def _serving_yaml(deploy_dir: Path, digits_file: Path) -> Path:
    """The issue's YAML shape; the model path is relative to the YAML file."""
    shutil.copy(digits_file, deploy_dir / "digits.joblib")
    return write_yaml(deploy_dir / "serving.yaml", {
        "server": {"host": "127.0.0.1", "http_port": 8000},
        "models": [
            {"name": "digits", "source": "sklearn:digits.joblib", "replicas": 2,
             "batching": {"max_batch_size": 16}},
            {"name": "echo", "source": "zoo:echo", "replicas": 1},
        ],
        "applications": [
            {"name": "digits", "models": ["digits"], "slo_ms": 5000, "default_output": -1},
            {"name": "echo", "models": ["echo"], "slo_ms": 5000},
        ],
    })


def _assert_clean_exit(frontend, code: int, pids: list[int]) -> None:
    assert code == 0, frontend.stderr
    assert SHUTDOWN_LINE in frontend.stdout
    assert "Traceback" not in frontend.stderr, frontend.stderr
    assert still_running(pids, timeout_s=5) == []


# ---- 1. start, serve, SIGTERM ---------------------------------------------------------------

def test_start_prints_urls_serves_real_clients_and_sigterm_leaves_no_worker(
        frontends, deploy_dir, digits_file) -> None:
    frontend = frontends(_serving_yaml(deploy_dir, digits_file))
    url, banner = frontend.url, frontend.stdout
    assert url.startswith("http://127.0.0.1:") and not url.endswith(":8000")  # --port 0
    for line in (f"{url}/metrics", f"{url}/admin/state", f"{url}/v2/health/ready",
                 f"POST {url}/digits/predict", f"POST {url}/echo/predict",
                 f"POST {url}/v2/models/digits/infer"):
        assert line in banner, banner
    x = load_digits_split(seed=0)[2][:4].astype(np.float32)
    expected = joblib.load(digits_file).predict(x)

    with Client(url) as client:
        assert client.live() and client.ready()
        answer = client.predict("digits", x[0])
        assert answer["default"] is False and answer["output"] == expected[0]
        assert [a["output"] for a in client.predict_batch("digits", list(x))] == list(expected)
        assert client.predict("echo", [1.5, 2.5])["output"] == [1.5, 2.5]
        assert client.state()["rpc_address"] == frontend.rpc
        pids = replica_pids(client)
    assert len(pids) == 3 and all(is_running(p) for p in pids)

    tc = triton.InferenceServerClient(url.removeprefix("http://"))
    try:
        assert tc.is_server_live() and tc.is_server_ready() and tc.is_model_ready("digits")
        meta = tc.get_model_metadata("digits")
        inp = triton.InferInput(meta["inputs"][0]["name"], list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        result = tc.infer("digits", [inp])
        out = result.as_numpy(meta["outputs"][0]["name"])
        np.testing.assert_array_equal(out.ravel(), expected)
    finally:
        tc.close()
    metrics = text_string_to_metric_families(httpx.get(f"{url}/metrics").text)
    answered = sum(s.value for family in metrics for s in family.samples
                   if s.name == "parityserve_requests_total"
                   and s.labels.get("target") == "digits" and s.labels.get("outcome") == "ok")
    assert answered >= 1  # the inference above, counted (a name alone is on a fresh server)

    frontend.send(signal.SIGTERM)
    _assert_clean_exit(frontend, frontend.wait(30), pids)


def test_server_process_helper_stops_cleanly(deploy_dir) -> None:
    """``bench.serverproc.ServerProcess`` (demo, benchmarks) sees the same clean exit."""
    with ServerProcess(write_yaml(deploy_dir / "echo.yaml", ECHO_ONLY)) as server:
        with Client(server.url) as client:
            assert client.predict("echo", [1.0])["output"] == [1.0]
            pids = replica_pids(client)
        assert server.stop() == 0
    assert server.stop() == 0  # idempotent, and __exit__ stopped it once more
    assert SHUTDOWN_LINE in "".join(server.output)
    assert still_running(pids, timeout_s=5) == []


# ---- 2. Ctrl-C ------------------------------------------------------------------------------

def test_ctrl_c_reaches_only_the_frontend_which_stops_its_workers(
        frontends, deploy_dir) -> None:
    frontend = frontends(write_yaml(deploy_dir / "echo.yaml", ECHO_ONLY))
    with Client(frontend.url) as client:
        pids = replica_pids(client)
    assert len(pids) == 2
    for pid in pids:  # workers live in sessions of their own, away from the terminal's group
        assert os.getsid(pid) == pid and os.getpgid(pid) != os.getpgid(frontend.pid)

    frontend.ctrl_c()  # SIGINT to the frontend's whole process group, as a terminal sends it
    _assert_clean_exit(frontend, frontend.wait(30), pids)
    assert "KeyboardInterrupt" not in frontend.stderr


_SLOW_SETUP = """\
import time


class Slow:
    def setup(self):
        time.sleep(60)

    def predict(self, batch):
        return batch
"""


def test_ctrl_c_while_a_model_is_still_loading_stops_at_once(frontends, deploy_dir) -> None:
    (deploy_dir / "slowsetup.py").write_text(_SLOW_SETUP)
    frontend = frontends(write_yaml(deploy_dir / "slow.yaml", {
        "models": [{"name": "slow", "source": "python:slowsetup:Slow"}]}), start=False)
    pids = wait_for(lambda: _workers_of(frontend.pid), timeout_s=20, what="a worker starting")
    time.sleep(0.5)  # let it get into setup()
    started = time.monotonic()
    frontend.ctrl_c()
    _assert_clean_exit(frontend, frontend.wait(30), pids)
    assert time.monotonic() - started < 10 and "serving on" not in frontend.stdout


# ---- 3. SIGKILL -----------------------------------------------------------------------------

def test_workers_die_with_a_killed_frontend(frontends, deploy_dir) -> None:
    frontend = frontends(write_yaml(deploy_dir / "echo.yaml", ECHO_ONLY))
    with Client(frontend.url) as client:
        pids = replica_pids(client)
    assert len(pids) == 2
    frontend.send(signal.SIGKILL)
    assert frontend.wait(10) == -signal.SIGKILL
    assert still_running(pids, timeout_s=5) == []


# ---- 4. validate ----------------------------------------------------------------------------

def test_validate_summarises_a_good_file(deploy_dir, digits_file) -> None:
    result = run_cli("validate", "-c", str(_serving_yaml(deploy_dir, digits_file)))
    assert result.returncode == 0, result.stderr
    assert "ok — 2 models, 2 applications" in result.stdout
    assert "model digits v1: sklearn:digits.joblib x2" in result.stdout
    assert "app echo: ['echo'], SLO 5000 ms" in result.stdout


_GOOD_MODEL = {"name": "m", "source": "zoo:echo"}


@pytest.mark.parametrize(("text", "problem"), [
    ("server: {http_prot: 8000}\n", "server.http_prot: unknown key"),
    ({"models": [{**_GOOD_MODEL, "replicas": -1}]}, "models.0.replicas: Input should be greater"),
    ({"models": [_GOOD_MODEL], "applications": [{"name": "a", "models": ["nope"]}]},
     "application 'a' links unknown models ['nope']"),
    ("models: [\n  - name: m\n", "invalid YAML: expected the node content"),
    ("- just\n- a list\n", "expected a mapping at the top level"),
    (None, "cannot read config"),
], ids=["unknown-key", "bad-value", "unknown-model", "invalid-yaml", "not-a-mapping", "missing"])
def test_validate_rejects_a_bad_file_in_one_line(deploy_dir, text, problem) -> None:
    path = deploy_dir / "bad.yaml"
    if isinstance(text, dict):
        write_yaml(path, text)
    elif text is not None:
        path.write_text(text)
    result = run_cli("validate", "-c", str(path))
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("parityserve: error: "), result.stderr
    assert problem in lines[0] and "bad.yaml" in lines[0]


def test_start_rejects_a_bad_file_before_starting_anything(deploy_dir) -> None:
    path = write_yaml(deploy_dir / "bad.yaml", {"server": {"http_prot": 1}})
    result = run_cli("start", "-c", str(path), "--port", "0", timeout_s=30)
    assert result.returncode == 2 and "serving on" not in result.stdout
    assert result.stderr.strip() == (f"parityserve: error: {path}: server.http_prot: "
                                     "unknown key (check its spelling)")


# ---- 5. help --------------------------------------------------------------------------------

@pytest.mark.parametrize(("args", "teaches"), [
    ((), ["examples:", "parityserve start -c serving.yaml", "parityserve worker --connect",
          "validate", "bench"]),
    (("start",), ["--config", "--port", "--log-dir", "SIGTERM"]),
    (("validate",), ["--config"]),
    (("worker",), ["--connect", "tcp://HOST:PORT", "--model", "--source", "zoo:NAME"]),
    (("bench",), ["overhead"]),
], ids=["top", "start", "validate", "worker", "bench"])
def test_help_exits_zero_and_teaches(args, teaches) -> None:
    result = run_cli(*args, "--help")
    assert result.returncode == 0, result.stderr
    for words in teaches:
        assert words in result.stdout, (words, result.stdout)


def test_no_command_is_a_usage_error() -> None:
    result = run_cli()
    assert result.returncode == 2 and "usage: parityserve" in result.stderr


# ---- 6. parityserve worker ------------------------------------------------------------------

@pytest.fixture
def worker_keys(tmp_path: Path) -> Path:
    """A keys folder made the way the README says: the frontend's pair and one worker's."""
    keys = tmp_path / "keys"
    for name in ("server", "w1"):
        result = run_cli("keys", "generate", "--dir", str(keys), "--name", name)
        assert result.returncode == 0, result.stderr
    return keys


def _key_args(keys: Path) -> list[str]:
    return ["--server-key", str(keys / "server.key"), "--client-key", str(keys / "w1.key_secret")]


def test_external_worker_joins_serves_and_leaves(frontends, deploy_dir, tmp_path,
                                                 children, worker_keys) -> None:
    config = write_yaml(deploy_dir / "ext.yaml", {
        # A long heartbeat timeout: the frontend must forget a leaving worker by its goodbye.
        "server": {"heartbeat_timeout_ms": 30000, "worker_keys_dir": str(worker_keys)},
        "models": [{"name": "ext", "source": "zoo:echo", "replicas": 0}],
        "applications": [{"name": "ext", "models": ["ext"], "slo_ms": 200,
                          "default_output": "no replica"}],
    })
    frontend = frontends(config)
    client = Client(frontend.url)
    assert client.state()["rpc_address"] == frontend.rpc
    _assert_default(client.predict("ext", [1.0, 2.0]))

    log = (tmp_path / "worker.log").open("wb")
    worker = subprocess.Popen([PARITYSERVE, "worker", "--connect", frontend.rpc, "--model", "ext",
                               "--source", "zoo:echo", *_key_args(worker_keys)],
                              stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    log.close()
    children.append(worker)
    wait_for(lambda: [r for r in _model(client, "ext")["replicas"] if r["state"] == "ready"],
             timeout_s=30, what="the external worker joining")
    assert replica_pids(client, "ext") == [worker.pid]
    answer = client.predict("ext", [1.0, 2.0])
    assert answer["default"] is False and answer["output"] == [1.0, 2.0]

    worker.send_signal(signal.SIGTERM)
    assert worker.wait(10) == 0
    started = time.monotonic()
    wait_for(lambda: _model(client, "ext")["replicas"] == [], timeout_s=5,
             what="the frontend forgetting the worker")
    assert time.monotonic() - started < 5  # by goodbye, not the 30 s heartbeat timeout
    _assert_default(client.predict("ext", [3.0]))
    client.close()
    assert "Traceback" not in (tmp_path / "worker.log").read_text()


def _assert_default(answer: dict) -> None:
    assert answer["default"] is True and answer["output"] == "no replica"
    assert "no running replica" in answer["default_explanation"]


def _model(client: Client, name: str) -> dict:
    return next(m for m in client.state()["models"] if m["name"] == name)


def test_worker_for_an_unknown_model_is_refused_clearly(frontends, deploy_dir,
                                                        worker_keys) -> None:
    config = {**ECHO_ONLY, "server": {**ECHO_ONLY["server"],
                                      "worker_keys_dir": str(worker_keys)}}
    frontend = frontends(write_yaml(deploy_dir / "echo.yaml", config))
    result = run_cli("worker", "--connect", frontend.rpc, "--model", "nope", "--source",
                     "zoo:echo", *_key_args(worker_keys), timeout_s=30)
    assert result.returncode == 2
    assert "parityserve: error: the frontend at" in result.stderr
    # It says what was asked for, never what is served: a stranger learns nothing.
    assert "no model 'nope' version 1 here" in result.stderr
    assert "echo" not in result.stderr.split("no model")[1]


def test_worker_without_keys_is_told_what_to_pass(frontends, deploy_dir) -> None:
    frontend = frontends(write_yaml(deploy_dir / "echo.yaml", ECHO_ONLY))
    result = run_cli("worker", "--connect", frontend.rpc, "--model", "echo", "--source",
                     "zoo:echo", timeout_s=30)
    assert result.returncode == 2, result.stderr
    assert "accepts only CURVE-authenticated workers: pass --server-key" in result.stderr
    assert "Traceback" not in result.stderr


def test_worker_with_a_key_the_frontend_does_not_admit_is_refused(frontends, deploy_dir,
                                                                  worker_keys) -> None:
    config = {**ECHO_ONLY, "server": {**ECHO_ONLY["server"],
                                      "worker_keys_dir": str(worker_keys)}}
    frontend = frontends(write_yaml(deploy_dir / "echo.yaml", config))
    stranger = run_cli("keys", "generate", "--dir", str(worker_keys.parent / "other"),
                       "--name", "w1")
    assert stranger.returncode == 0, stranger.stderr
    result = run_cli("worker", "--connect", frontend.rpc, "--model", "echo", "--source",
                     "zoo:echo", "--server-key", str(worker_keys / "server.key"),
                     "--client-key", str(worker_keys.parent / "other" / "w1.key_secret"),
                     timeout_s=30)
    assert result.returncode == 2, result.stderr
    assert "does not admit this worker's key" in result.stderr


def test_worker_with_no_frontend_gives_up_after_the_join_timeout() -> None:
    port = free_port()  # nothing listens on it
    result = run_cli("worker", "--connect", f"tcp://127.0.0.1:{port}", "--model", "echo",
                     "--source", "zoo:echo", "--join-timeout", "1", timeout_s=30)
    assert result.returncode == 2, result.stderr
    assert f"no frontend answered at tcp://127.0.0.1:{port} within 1 s" in result.stderr


def test_worker_whose_model_cannot_load_fails_fast(tmp_path) -> None:
    result = run_cli("worker", "--connect", "tcp://127.0.0.1:9", "--model", "m",
                     "--source", "sklearn:/nonexistent.joblib", timeout_s=30)
    assert result.returncode == 2
    assert "parityserve: error: model 'm' (sklearn:/nonexistent.joblib) failed to load" \
        in result.stderr
    assert "Traceback" not in result.stderr


# ---- 7. a model that cannot load ------------------------------------------------------------

def _with_broken(replicas: int) -> dict:
    return {
        "models": [{"name": "echo", "source": "zoo:echo", "replicas": 1},
                   {"name": "broken", "source": "sklearn:/nonexistent.joblib",
                    "replicas": replicas}],
        "applications": [{"name": "broken", "models": ["broken"], "slo_ms": 200,
                          "default_output": -1},
                         {"name": "echo", "models": ["echo"], "slo_ms": 5000}],
    }


def test_start_fails_fast_when_a_model_cannot_load(frontends, deploy_dir) -> None:
    started = time.monotonic()
    frontend = frontends(write_yaml(deploy_dir / "broken.yaml", _with_broken(1)), start=False)
    code = frontend.wait(30)
    assert code == 2 and time.monotonic() - started < 20
    assert "serving on" not in frontend.stdout
    last = frontend.stderr.strip().splitlines()[-1]
    assert last == ("parityserve: error: model 'broken' (sklearn:/nonexistent.joblib) failed "
                    "to load: sklearn model file /nonexistent.joblib does not exist; check the "
                    "path in the config")
    assert "Traceback" not in frontend.stderr
    assert _workers_of(frontend.pid) == []


def _workers_of(frontend_pid: int) -> list[int]:
    """Worker processes a frontend launched (they carry its pid on their command line)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        worker = b"parityserve.runtime.workers.worker" in cmdline
        if worker and str(frontend_pid).encode() in cmdline:
            found.append(int(proc.name))
    return [pid for pid in found if is_running(pid)]


def test_a_model_failing_to_load_later_backs_off_and_the_rest_keeps_serving(
        frontends, deploy_dir) -> None:
    frontend = frontends(write_yaml(deploy_dir / "later.yaml", _with_broken(0)))
    with Client(frontend.url) as client:
        client.set_replicas("broken", 1)
        error = wait_for(lambda: _model(client, "broken")["load_error"], timeout_s=20,
                         what="the load error in the admin state")
        # Paths are scrubbed from errors the API shows (models/sources.scrub_paths).
        assert "sklearn model file <path>/nonexistent.joblib does not exist" in error
        wait_for(lambda: "(3 failures in a row)" in frontend.stderr, timeout_s=20,
                 what="restarts backing off")
        assert "(2 failures in a row)" in frontend.stderr
        answer = client.predict("broken", [0.0] * 64)
        assert answer["default"] is True and answer["output"] == -1
        assert client.predict("echo", [7.0])["output"] == [7.0]
        pids = replica_pids(client, "echo")
    frontend.send(signal.SIGTERM)
    _assert_clean_exit(frontend, frontend.wait(30), pids)
    assert _workers_of(frontend.pid) == []


# ---- 5. benchmarks ----------------------------------------------------------------------------

def _descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (from /proc, no psutil needed)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier}
        found |= frontier
    return found


def _alive(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            if (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] \
                    != "Z":
                alive.add(pid)
    return alive


def test_sigterm_to_a_benchmark_stops_every_process_it_started(tmp_path) -> None:
    bench = subprocess.Popen(
        [PARITYSERVE, "bench", "overhead", "--quick", "--models", "noop",
         "--results-dir", str(tmp_path / "bench-results")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    seen: set[int] = set()
    try:  # wait until the bare baseline app and the benchmark's server have both been up
        def both_seen() -> bool:
            seen.update(_descendants(bench.pid))
            cmdlines = []
            for pid in seen:
                with contextlib.suppress(OSError):
                    cmdlines.append((Path("/proc") / str(pid) / "cmdline").read_bytes())
            return any(b"baseline_app" in c for c in cmdlines) and any(
                b"runtime.workers.worker" in c for c in cmdlines)

        wait_for(both_seen, timeout_s=120, what="the benchmark's processes")
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(30) != 0
        wait_for(lambda: not _alive(seen), timeout_s=30,
                 what="every process the benchmark started to stop")
    finally:
        if bench.poll() is None:
            bench.kill()
        for pid in _alive(seen):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


MOVED_BENCHES = ("tail", "accuracy", "selection", "simulate")


@pytest.mark.parametrize("name", MOVED_BENCHES)
def test_a_moved_benchmark_names_its_new_command(name: str) -> None:
    result = run_cli("bench", name, "--quick", "--help")
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.count("\n") == 1, result.stderr  # one line
    assert f"`python -m benchmarks.{name} --quick --help`" in result.stderr
    assert f"`make bench-{name}`" in result.stderr


@pytest.mark.parametrize("name", MOVED_BENCHES)
def test_a_benchmark_module_teaches_with_help(name: str) -> None:
    result = subprocess.run([sys.executable, "-m", f"benchmarks.{name}", "--help"],
                            capture_output=True, text=True, timeout=60,
                            cwd=Path(__file__).parents[2], stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr
    for words in (f"usage: python -m benchmarks.{name}", "--quick", "--results-dir",
                  f"python -m benchmarks.{name} --", f"make bench-{name}", "[bench]"):
        assert words in result.stdout, (words, result.stdout)
