"""The admin token: resolution order, the token file, and the frontend's Bearer check."""

from __future__ import annotations

import hmac
import logging
import os
import stat
import warnings
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr
from starlette.exceptions import StarletteDeprecationWarning

from parityserve.config import Server
from parityserve.errors import ConfigError
from parityserve.runtime.frontend import auth
from parityserve.runtime.frontend.auth import (
    AuthPolicy,
    ResolvedToken,
    authorized,
    resolve_token,
    vetted,
)
from parityserve.runtime.frontend.http import create_admin_app, create_app
from parityserve.runtime.modelpath.metrics import Metrics
from parityserve.runtime.workers.secret_files import exposed

with warnings.catch_warnings():
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from starlette.testclient import TestClient

TOKEN = "s3cret-token"


def test_public_names_are_pinned():
    assert sorted(auth.__all__) == sorted([
        "ENV_HOME", "ENV_TOKEN", "MIN_TOKEN_CHARS", "AuthPolicy", "ResolvedToken", "authorized",
        "default_token_file", "read_token", "resolve_token", "token_file", "vetted",
        "write_new_token"])


# ---------------------------------------------------------------- resolution order


def test_config_token_wins_over_env_and_file(tmp_path):
    (tmp_path / "admin-token").write_text("from-file\n")
    env = {auth.ENV_HOME: str(tmp_path), auth.ENV_TOKEN: "from-env"}
    found = resolve_token(Server(admin_token=SecretStr("from-config")), env=env)
    assert (found.token, found.source) == ("from-config", "config")


def test_env_wins_over_file(tmp_path):
    (tmp_path / "admin-token").write_text("from-file\n")
    env = {auth.ENV_HOME: str(tmp_path), auth.ENV_TOKEN: "from-env"}
    found = resolve_token(Server(), env=env)
    assert (found.token, found.source) == ("from-env", "env")


def test_file_is_read_when_nothing_else_is_set(tmp_path):
    (tmp_path / "admin-token").write_text("from-file\n")
    found = resolve_token(Server(), env={auth.ENV_HOME: str(tmp_path)})
    assert (found.token, found.source, found.path) == ("from-file", "file",
                                                       tmp_path / "admin-token")


def test_relative_token_file_resolves_against_the_config_folder(tmp_path):
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "tok").write_text("relative\n")
    found = resolve_token(Server(admin_token_file="keys/tok"), tmp_path, env={})
    assert (found.token, found.path) == ("relative", tmp_path / "keys" / "tok")


def test_home_defaults_to_dot_parityserve():
    assert auth.default_token_file({}) == Path("~/.parityserve/admin-token").expanduser()


def test_a_token_is_generated_with_private_modes(tmp_path):
    home = tmp_path / "home"
    found = resolve_token(Server(), env={auth.ENV_HOME: str(home)})
    path = home / "admin-token"
    assert found.source == "generated" and found.path == path
    assert len(found.token) >= 40 and path.read_text().strip() == found.token
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    again = resolve_token(Server(), env={auth.ENV_HOME: str(home)})
    assert (again.token, again.source) == (found.token, "file")


def test_create_false_generates_nothing(tmp_path):
    assert resolve_token(Server(), create=False, env={auth.ENV_HOME: str(tmp_path)}) is None
    assert not (tmp_path / "admin-token").exists()


def test_race_another_process_created_the_file_first(tmp_path, monkeypatch):
    path = tmp_path / "admin-token"
    real_open = os.open

    def someone_else_first(p: Any, flags: int, mode: int = 0o777) -> int:
        if Path(p) == path and flags & os.O_EXCL and not path.exists():
            path.write_text("theirs\n")  # the other process wins the race here
        return real_open(p, flags, mode)

    monkeypatch.setattr(auth.os, "open", someone_else_first)
    assert auth.write_new_token(path) == "theirs"
    assert path.read_text() == "theirs\n"


def test_rotate_replaces_the_file(tmp_path):
    path = tmp_path / "admin-token"
    first = auth.write_new_token(path)
    second = auth.write_new_token(path, replace=True)
    assert first != second and auth.read_token(path) == second
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["admin-token"]


def test_repr_and_str_never_show_the_token(tmp_path):
    found = resolve_token(Server(admin_token=SecretStr(TOKEN)), env={})
    generated = resolve_token(Server(), env={auth.ENV_HOME: str(tmp_path)})
    for record in (found, generated, AuthPolicy(token=TOKEN)):
        assert TOKEN not in repr(record) and TOKEN not in str(record)
    assert generated.token not in repr(generated) + str(generated) + generated.where()
    assert str(tmp_path) in generated.where()


# ---------------------------------------------------------------- token hygiene


@pytest.mark.parametrize("source", ["config", "env", "file"])
def test_a_token_shorter_than_32_characters_is_refused(tmp_path, source):
    short = "x" * 31
    path = tmp_path / "admin-token" if source == "file" else None
    with pytest.raises(ConfigError, match="the token has 31 characters") as caught:
        vetted(ResolvedToken(short, source, path))
    assert short not in str(caught.value) and "secrets.token_urlsafe(32)" in str(caught.value)
    assert vetted(ResolvedToken("x" * 32, "env")).token == "x" * 32


@pytest.mark.parametrize(("mode", "who"), [
    (0o644, "its group and every user"), (0o640, "its group"), (0o604, "every user"),
    (0o620, "its group"), (0o602, "every user"), (0o600, None), (0o400, None)])
def test_a_token_file_open_to_others_is_warned_of(tmp_path, caplog, mode, who):
    path = tmp_path / "admin-token"
    path.write_text("t" * 43 + "\n")
    path.chmod(mode)
    with caplog.at_level(logging.WARNING, logger="parityserve.runtime.workers.secret_files"):
        vetted(ResolvedToken("t" * 43, "file", path))
    if who is None:
        assert caplog.text == "" and exposed(path) is None
    else:
        assert f"the admin token file {path} has mode {mode:04o}: {who} may" in caplog.text
        assert f"chmod 600 {path}" in caplog.text and "t" * 43 not in caplog.text


# ---------------------------------------------------------------- the header check


@pytest.mark.parametrize("header,ok", [
    (f"Bearer {TOKEN}", True), (f"bearer {TOKEN}", True), (f"Bearer  {TOKEN} ", True),
    (None, False), ("", False), ("Bearer", False), ("Bearer ", False), (TOKEN, False),
    (f"Basic {TOKEN}", False), (f"Bearer {TOKEN}x", False), (f"Bearer {TOKEN[:-1]}", False),
    ("Bearer wrong", False), ("Bearer ü", False),
])
def test_authorized(header, ok):
    assert authorized(header, TOKEN) is ok


def test_comparison_is_constant_time(monkeypatch):
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    assert not authorized("Bearer nope", TOKEN)
    assert calls == [(b"nope", TOKEN.encode())]


# ---------------------------------------------------------------- the frontend


class FakeSystem:
    def __init__(self) -> None:
        self.replica_calls: list[tuple[str, int]] = []

    def is_ready(self) -> bool:
        return True

    def state(self) -> dict[str, Any]:
        return {"models": []}

    async def set_replicas(self, model: str, n: int) -> None:
        self.replica_calls.append((model, n))


def _client(policy: AuthPolicy, metrics: Metrics | None = None,
            system: FakeSystem | None = None) -> TestClient:
    app = create_app(system or FakeSystem(), metrics=metrics or Metrics(), auth=policy)
    return TestClient(app)


def _bearer(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.mark.parametrize("headers", [{}, _bearer("wrong"), {"Authorization": TOKEN}])
def test_admin_without_the_token_is_401_and_changes_nothing(headers):
    system, metrics = FakeSystem(), Metrics()
    client = _client(AuthPolicy(token=TOKEN), metrics, system)
    response = client.post("/admin/models/m/replicas", json={"replicas": 3}, headers=headers)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    body = response.json()
    assert body["code"] == "unauthorized" and "Authorization: Bearer" in body["error"]
    assert system.replica_calls == []
    assert b'parityserve_bad_requests_total{code="unauthorized"} 1.0' in metrics.render()[0]


def test_admin_with_the_token_works():
    system = FakeSystem()
    client = _client(AuthPolicy(token=TOKEN), system=system)
    assert client.get("/admin/state", headers=_bearer()).json() == {"models": []}
    assert client.post("/admin/models/m/replicas", json={"replicas": 3},
                       headers=_bearer()).status_code == 200
    assert system.replica_calls == [("m", 3)]


def test_open_policy_serves_admin_without_a_token():
    assert _client(AuthPolicy.open()).get("/admin/state").status_code == 200


def test_health_and_metrics_are_open_by_default():
    client = _client(AuthPolicy(token=TOKEN))
    for path in ("/v2/health/live", "/v2/health/ready", "/metrics"):
        assert client.get(path).status_code == 200, path


def test_protect_metrics_and_inference():
    client = _client(AuthPolicy(token=TOKEN, protect_metrics=True, protect_inference=True))
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers=_bearer()).status_code == 200
    for path in ("/calc/predict", "/calc/update", "/v2/models/m/infer",
                 "/v2/models/m/versions/1/infer"):
        assert client.post(path, content=b"{}").status_code == 401, path
    for path in ("/v2/models/m", "/v2/models/m/config"):
        assert client.get(path).status_code == 401, path
    for path in ("/v2/health/live", "/v2/health/ready"):
        assert client.get(path).status_code == 200, path


def test_unprotected_hot_paths_are_the_bare_handlers():
    """Protection off: predict and infer pay nothing (no wrapper between guard and handler)."""
    open_app = create_app(FakeSystem(), metrics=Metrics(), auth=AuthPolicy(token=TOKEN))
    shut_app = create_app(FakeSystem(), metrics=Metrics(),
                          auth=AuthPolicy(token=TOKEN, protect_inference=True))
    front_open = open_app.endpoints["predict"].__closure__
    front_shut = shut_app.endpoints["predict"].__closure__
    handler = next(c.cell_contents for c in front_open
                   if getattr(c.cell_contents, "__name__", "") == "predict")
    assert handler.__func__.__qualname__ == "_Frontend.predict"
    assert all(getattr(c.cell_contents, "__name__", "") != "predict" for c in front_shut)


def test_admin_split_off_is_404_on_the_main_app_and_served_by_the_admin_app():
    policy = AuthPolicy(token=TOKEN, serve_admin=False)
    main = _client(policy)
    assert main.get("/admin/state", headers=_bearer()).status_code == 404
    admin = TestClient(create_admin_app(FakeSystem(), metrics=Metrics(), auth=policy))
    assert admin.get("/admin/state").status_code == 401
    assert admin.get("/admin/state", headers=_bearer()).status_code == 200
    assert admin.get("/v2/health/ready").status_code == 404


def test_create_app_has_no_default_policy():
    with pytest.raises(TypeError, match="auth"):
        create_app(FakeSystem(), metrics=Metrics())  # type: ignore[call-arg]
