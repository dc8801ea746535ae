"""The admin token and the safe defaults, through the ``parityserve`` command line."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from parityserve.client import Client

pytestmark = pytest.mark.e2e

PARITYSERVE = str(Path(sys.executable).with_name("parityserve"))


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PARITYSERVE_ADMIN_TOKEN"}
    return {**env, "PARITYSERVE_HOME": str(home), **extra}


def _cli(*args: str, home: Path, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PARITYSERVE, *args], capture_output=True, text=True,
                          timeout=timeout_s, env=_env(home), stdin=subprocess.DEVNULL)


def _config(path: Path, server: dict) -> Path:
    path.write_text(yaml.safe_dump({"server": server}))
    return path


def test_start_refuses_an_open_admin_api_off_loopback(tmp_path):
    config = _config(tmp_path / "open.yaml", {"host": "0.0.0.0", "require_admin_token": False})
    done = _cli("start", "-c", str(config), home=tmp_path)
    assert done.returncode != 0
    assert "require_admin_token: false is allowed only when every listener is on loopback" \
        in done.stderr
    assert "serving on" not in done.stdout


def test_token_before_any_server_says_where_start_will_put_it(tmp_path):
    done = _cli("token", home=tmp_path)
    assert done.returncode == 1 and str(tmp_path / "admin-token") in done.stderr


def test_help_texts_teach_the_token():
    done = _cli("token", "--help", home=Path("/nonexistent"))
    assert done.returncode == 0
    for phrase in ("Authorization: Bearer", "PARITYSERVE_ADMIN_TOKEN", "--show", "--rotate",
                   "restart"):
        assert phrase in done.stdout, phrase
    assert "parityserve token" in _cli("--help", home=Path("/nonexistent")).stdout


def _wait_url(out: Path, proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        match = re.search(r"serving on (https?://\S+)", out.read_text())
        if match:
            return match.group(1)
        time.sleep(0.05)
    raise AssertionError(f"no URL: {out.read_text()}")


def test_start_generates_the_token_says_where_and_never_prints_it(tmp_path):
    home, logs = tmp_path / "home", tmp_path / "logs"
    config = _config(tmp_path / "serving.yaml", {"http_port": 0, "log_level": "info"})
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with out.open("wb") as o, err.open("wb") as e:
        proc = subprocess.Popen([PARITYSERVE, "-v", "start", "-c", str(config),
                                 "--log-dir", str(logs)], stdout=o, stderr=e,
                                env=_env(home), stdin=subprocess.DEVNULL)
    try:
        url = _wait_url(out, proc)
        token = (home / "admin-token").read_text().strip()
        assert f"admin token: generated and stored in {home / 'admin-token'}" in out.read_text()
        assert "parityserve token --show" in out.read_text()
        with Client(url, token=token) as client:
            assert "models" in client.state()
        shown = _cli("token", "--show", home=home)
        assert shown.stdout.strip() == token
        assert str(home / "admin-token") in _cli("token", home=home).stdout
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert proc.returncode == 0
    logged = [out.read_text(), err.read_text(),
              *(p.read_text() for p in logs.rglob("*") if p.is_file())]
    assert "Started server process" in err.read_text()  # logs were written, and checked
    assert all(token not in text for text in logged)


def test_start_with_a_config_token_says_so(tmp_path):
    token = "config-token-e2e-0123456789abcdef"
    config = _config(tmp_path / "serving.yaml", {"http_port": 0, "admin_token": token})
    out = tmp_path / "stdout"
    with out.open("wb") as o:
        proc = subprocess.Popen([PARITYSERVE, "start", "-c", str(config)], stdout=o,
                                stderr=subprocess.STDOUT, env=_env(tmp_path / "home"),
                                stdin=subprocess.DEVNULL)
    try:
        url = _wait_url(out, proc)
        with Client(url, token=token) as client:
            assert "models" in client.state()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    text = out.read_text()
    assert "admin token: from the config (server.admin_token)" in text and token not in text
    assert not (tmp_path / "home" / "admin-token").exists()


def test_rotate_writes_a_new_token(tmp_path):
    (tmp_path / "admin-token").write_text("old-token\n")
    done = _cli("token", "--rotate", home=tmp_path)
    assert done.returncode == 0 and "restarted" in done.stdout
    new = (tmp_path / "admin-token").read_text().strip()
    assert new != "old-token" and new not in done.stdout


@pytest.mark.parametrize("where", ["config", "env", "file"])
def test_start_refuses_a_token_shorter_than_32_characters(tmp_path, where):
    short = "fifteen-chars-x"  # 15
    server: dict = {"http_port": 0}
    env = _env(tmp_path)
    if where == "config":
        server["admin_token"] = short
    elif where == "env":
        env["PARITYSERVE_ADMIN_TOKEN"] = short
    else:
        (tmp_path / "admin-token").write_text(short + "\n")
        (tmp_path / "admin-token").chmod(0o600)
    config = _config(tmp_path / "serving.yaml", server)
    done = subprocess.run([PARITYSERVE, "start", "-c", str(config)], capture_output=True,
                          text=True, timeout=60, env=env, stdin=subprocess.DEVNULL)
    assert done.returncode == 2, done.stderr
    assert "the token has 15 characters" in done.stderr and "shorter than 32" in done.stderr
    assert short not in done.stderr + done.stdout and "serving on" not in done.stdout


def test_start_warns_of_a_token_file_and_a_curve_key_others_can_read(tmp_path):
    (tmp_path / "admin-token").write_text("t" * 43 + "\n")
    (tmp_path / "admin-token").chmod(0o644)
    assert _cli("keys", "generate", "--dir", str(tmp_path / "keys"), home=tmp_path
                ).returncode == 0
    secret = tmp_path / "keys" / "server.key_secret"
    secret.chmod(0o640)
    config = _config(tmp_path / "serving.yaml", {"http_port": 0, "grpc_port": 0,
                                                 "worker_keys_dir": "keys"})
    out = tmp_path / "stdout"
    with out.open("wb") as o:
        proc = subprocess.Popen([PARITYSERVE, "start", "-c", str(config)], stdout=o,
                                stderr=subprocess.STDOUT, env=_env(tmp_path),
                                stdin=subprocess.DEVNULL)
    try:
        _wait_url(out, proc)  # a warning, not a refusal: auth.py says why
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    text = out.read_text()
    assert f"the admin token file {tmp_path / 'admin-token'} has mode 0644: its group and " \
           "every user may read or change it" in text
    assert f"the CURVE secret key file {secret} has mode 0640: its group may" in text
    assert "chmod 600" in text
