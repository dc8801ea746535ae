"""`parityserve start` serves KServe V2 over gRPC beside HTTP; --grpc-port moves or stops it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as tg
import yaml

from parityserve.bench.ports import free_port

PARITYSERVE = str(Path(sys.executable).with_name("parityserve"))
CONFIG = {"server": {"http_port": 0},
          "models": [{"name": "echo", "source": "zoo:echo", "replicas": 1}]}


def _start(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen[str], str]:
    config = tmp_path / "serving.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    proc = subprocess.Popen([PARITYSERVE, "start", "-c", str(config), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout is not None
    lines = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if "model echo" in line:  # the last line of the banner
            return proc, "".join(lines)
    proc.kill()
    proc.communicate()
    pytest.fail("server did not start:\n" + "".join(lines))


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)  # drains and closes the pipe
    assert proc.returncode == 0


def test_start_serves_grpc_on_the_port_asked_and_says_where(tmp_path) -> None:
    port = free_port()
    proc, banner = _start(tmp_path, "--grpc-port", str(port))
    try:
        assert re.search(rf"V2 gRPC\s+127\.0\.0\.1:{port}", banner), banner
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        inp = tg.InferInput("input", [2, 3], "FP32")
        inp.set_data_from_numpy(x)
        with tg.InferenceServerClient(f"127.0.0.1:{port}") as client:
            np.testing.assert_array_equal(client.infer("echo", [inp]).as_numpy("output"), x)
    finally:
        _stop(proc)


def test_grpc_port_zero_turns_it_off_and_a_bad_port_is_a_clear_error(tmp_path) -> None:
    proc, banner = _start(tmp_path, "--grpc-port", "0")
    _stop(proc)
    assert "gRPC" not in banner
    done = subprocess.run([PARITYSERVE, "start", "-c", str(tmp_path / "serving.yaml"),
                           "--grpc-port", "70000"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "command line: server.grpc_port: Input should be less than or equal to 65535" \
        in done.stderr
