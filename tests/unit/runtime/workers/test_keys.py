"""CURVE key files and the hand-over of local workers' keys."""

from __future__ import annotations

import logging
import stat
from pathlib import Path

import pytest

from parityserve.cli import main
from parityserve.errors import ConfigError
from parityserve.runtime.workers.keys import ClientKeys, ServerKeys, generate


def test_generate_writes_a_public_file_and_a_private_secret_file(tmp_path: Path) -> None:
    public, secret = generate(tmp_path, "w1")
    assert (public.name, secret.name) == ("w1.key", "w1.key_secret")
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600


def test_a_keys_dir_admits_its_worker_keys_but_not_the_server_key(tmp_path: Path) -> None:
    generate(tmp_path, "server")
    generate(tmp_path, "w1")
    generate(tmp_path, "w2")
    keys = ServerKeys.from_dir(tmp_path)
    w1 = ClientKeys.from_files(tmp_path / "server.key", tmp_path / "w1.key_secret")
    assert w1.public in keys.allowed and w1.server_public == keys.public
    assert len(keys.allowed) == 2 and keys.public not in keys.allowed


def test_missing_or_public_only_key_files_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="parityserve keys generate"):
        ServerKeys.from_dir(tmp_path)
    generate(tmp_path, "w1")
    with pytest.raises(ConfigError, match="no secret key"):
        ClientKeys.from_files(tmp_path / "w1.key", tmp_path / "w1.key")


def test_per_replica_keys_are_admitted_then_revoked() -> None:
    server = ServerKeys.in_memory()
    client = server.client()
    assert client.public in server.allowed
    assert ClientKeys.from_env(client.to_env()) == client
    server.revoke(client.public)
    assert client.public not in server.allowed


def test_garbage_in_the_environment_variable_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        ClientKeys.from_env("{not json")


def test_the_keys_command_writes_files_and_will_not_overwrite(tmp_path: Path, capsys) -> None:
    assert main(["keys", "generate", "--dir", str(tmp_path)]) == 0
    assert (tmp_path / "server.key_secret").exists()
    assert "secret" in capsys.readouterr().out
    assert main(["keys", "generate", "--dir", str(tmp_path)]) != 0
    assert "--force" in capsys.readouterr().err


def test_a_secret_key_file_open_to_others_is_warned_of(tmp_path: Path, caplog) -> None:
    generate(tmp_path, "server")
    _public, secret = generate(tmp_path, "w1")
    with caplog.at_level(logging.WARNING, logger="parityserve.runtime.workers.secret_files"):
        ServerKeys.from_dir(tmp_path)
        ClientKeys.from_files(tmp_path / "server.key", secret)
    assert caplog.text == ""  # generated 0600
    (tmp_path / "server.key_secret").chmod(0o644)
    secret.chmod(0o640)
    with caplog.at_level(logging.WARNING, logger="parityserve.runtime.workers.secret_files"):
        ServerKeys.from_dir(tmp_path)  # the frontend's, and a worker's --client-key
        ClientKeys.from_files(tmp_path / "server.key", secret)
    assert f"{tmp_path / 'server.key_secret'} has mode 0644: its group and every user" \
        in caplog.text
    assert f"{secret} has mode 0640: its group may" in caplog.text
