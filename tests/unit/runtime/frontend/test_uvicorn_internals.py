"""The private uvicorn API that ``runtime/frontend/connection.py`` (``GuardedHttpTools``, a subclass
of uvicorn's ``HttpToolsProtocol``) and ``runtime/frontend/hot_cycle.py`` (``HotCycle``, a stand-in
for its ``RequestResponseCycle``) ride on, named, so that a uvicorn release that renames one fails
here with the name instead of in production with an ``AttributeError`` per connection.

uvicorn makes no promise about these names; ``pyproject.toml`` pins uvicorn to the minor
release they were checked against. To move the pin: install the new release, run this file,
``tests/unit/runtime/frontend/test_hot_cycle.py`` and
``tests/integration/test_connection_limits.py``, read uvicorn's changes to
``protocols/http/httptools_impl.py``, then widen the pin.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import tomllib
from importlib import metadata
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement

from parityserve.config import Limits
from parityserve.runtime.frontend import connection
from parityserve.runtime.frontend.hot_cycle import HotCycle

PYPROJECT = Path(__file__).resolve().parents[4] / "pyproject.toml"

# Methods GuardedHttpTools overrides, calls on the base class, or calls on itself.
PROTOCOL_METHODS = (
    "connection_made", "connection_lost", "data_received", "send_400_response",
    "on_message_begin", "on_headers_complete", "on_message_complete", "on_response_complete",
    "_start_asgi_task", "_unset_keepalive_if_required", "_should_upgrade",
    "handle_websocket_upgrade", "_unsupported_upgrade_warning",
)
# State the protocol keeps that GuardedHttpTools reads or replaces, once a connection is made
# and a request has begun.
PROTOCOL_STATE = (
    "app", "loop", "parser", "pipeline", "root_path", "limit_concurrency", "server_state",
    "transport", "flow", "client", "cycle", "url", "headers", "scope", "expect_100_continue",
)
FLOW_CONTROL = ("read_paused", "pause_reading", "resume_reading")  # uvicorn's FlowControl
SERVER_STATE = ("default_headers",)


def missing(obj: Any, names: tuple[str, ...]) -> list[str]:
    return [name for name in names if not hasattr(obj, name)]


def explain(what: str, names: list[str]) -> str:
    return (f"uvicorn {metadata.version('uvicorn')} has no {', '.join(names)} on {what}, which "
            "parityserve/runtime/frontend/connection.py and hot_cycle.py rely on: adapt them to "
            "this release (see this file's docstring) before widening the uvicorn pin")


def test_missing_names_are_named() -> None:
    class Protocol:
        parser = None

    gone = missing(Protocol, ("parser", "pipeline"))
    assert gone == ["pipeline"]
    assert "no pipeline on HttpToolsProtocol" in explain("HttpToolsProtocol", gone)


def test_the_httptools_protocol_is_there_to_subclass() -> None:
    assert connection._httptools_protocol() is not None, (
        "uvicorn.protocols.http.httptools_impl.HttpToolsProtocol (or httptools) cannot be "
        "imported: every listener falls back to h11, without read timeouts")


def test_the_protocol_has_the_methods_guarded_http_tools_uses() -> None:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    gone = missing(HttpToolsProtocol, PROTOCOL_METHODS)
    assert not gone, explain("HttpToolsProtocol", gone)


def test_a_connection_has_the_state_guarded_http_tools_reads() -> None:
    gaps = asyncio.run(_state_gaps())
    assert not gaps, "\n".join(gaps)


def test_hot_cycle_has_what_the_protocol_uses_of_a_cycle() -> None:
    """Every ``cycle.X`` uvicorn's protocol touches, read from its source, is on HotCycle."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    used = sorted(_cycle_attributes(ast.parse(inspect.getsource(HttpToolsProtocol))))
    assert used, "found no cycle.X in HttpToolsProtocol's source: the walker is out of date"
    provided = set(HotCycle.__slots__) | {n for n in dir(HotCycle) if not n.startswith("__")}
    gone = [name for name in used if name not in provided]
    assert not gone, (f"uvicorn {metadata.version('uvicorn')}'s protocol uses {gone} of its "
                      "cycle, which HotCycle (parityserve/runtime/frontend/hot_cycle.py) lacks")


def test_uvicorn_is_pinned_to_the_release_checked_here() -> None:
    pins = [Requirement(dep) for dep in tomllib.loads(PYPROJECT.read_text())["project"]
            ["dependencies"] if Requirement(dep).name == "uvicorn"]
    assert len(pins) == 1, "pyproject.toml should name uvicorn once among the dependencies"
    (pin,) = pins
    assert any(spec.operator == "<" for spec in pin.specifier), (
        f"{pin}: uvicorn needs an upper bound, since GuardedHttpTools subclasses its private "
        "HttpToolsProtocol")
    installed = metadata.version("uvicorn")
    assert pin.specifier.contains(installed), (
        f"uvicorn {installed} is installed but pyproject.toml pins {pin}: run this file "
        "against the new release, then move the pin with it")


async def _state_gaps() -> list[str]:
    """What a GuardedHttpTools connection, made as uvicorn makes it, lacks once a request's
    first line is read (uvicorn sets a request's url, headers and scope when it begins)."""
    import uvicorn
    from uvicorn.server import ServerState

    async def app(scope: Any, receive: Any, send: Any) -> None:
        pass  # never called: the request never completes its head

    config = uvicorn.Config(app, **connection.uvicorn_settings(Limits()))
    config.load()
    protocol = config.http_protocol_class(config=config, server_state=ServerState(),
                                          app_state={}, _loop=asyncio.get_running_loop())
    protocol.connection_made(_Transport())
    try:
        protocol.data_received(b"GET / HTTP/1.1\r\n")
        checks = [("an HttpToolsProtocol connection", protocol, PROTOCOL_STATE),
                  ("FlowControl", getattr(protocol, "flow", None), FLOW_CONTROL),
                  ("ServerState", protocol.server_state, SERVER_STATE)]
        return [explain(what, gone) for what, obj, names in checks
                if (gone := missing(obj, names))]
    finally:
        protocol.connection_lost(None)


class _Transport(asyncio.Transport):
    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 40000)}.get(
            name, default)

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass


def _cycle_attributes(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            owner = node.value
            if (isinstance(owner, ast.Name) and owner.id == "cycle") or (
                    isinstance(owner, ast.Attribute) and owner.attr == "cycle"):
                names.add(node.attr)
    return names

