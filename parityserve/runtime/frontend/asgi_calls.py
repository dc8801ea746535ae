"""Small ASGI helpers shared by the layers that wrap the frontend's app
(runtime/cluster/shard_mesh.py, runtime/cluster/peers.py): buffer a request, run the app on it and
keep its answer, or make an admin call in-process through the same routes, validation and token
check as a client's."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

__all__ = ["ASGIApp", "Message", "Receive", "Scope", "Send", "call", "capture",
           "is_admin_change", "read_all", "send_plain", "status_of", "target_of"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_CHANGES = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def is_admin_change(scope: Scope) -> bool:
    """An HTTP request that may change the server: a write under ``/admin/``."""
    return (scope["type"] == "http" and scope["method"] in _CHANGES
            and scope["path"].startswith("/admin/"))


def target_of(scope: Scope) -> str:
    """The request's path with its query string, as a peer must replay it."""
    query = scope.get("query_string") or b""
    return scope["path"] + (f"?{query.decode()}" if query else "")


def status_of(messages: Sequence[Message]) -> int:
    """The status of a captured answer (its first message starts the response)."""
    return int(messages[0]["status"])


async def read_all(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


async def capture(app: ASGIApp, scope: Scope, body: bytes) -> list[Message]:
    """Run ``app`` on a buffered body; its response messages, the start message first."""
    messages: list[Message] = []
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if sent:
            await asyncio.Event().wait()  # a disconnect never comes: the body is complete
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def keep(message: Message) -> None:
        messages.append(message)

    await app(scope, receive, keep)
    return messages


async def call(app: ASGIApp, method: str, target: str, body: bytes,
               token: str | None) -> tuple[int, bytes]:
    """``method target`` on ``app`` in this process, as a client with the admin token would
    send it: (status, body). The route checks the token and the body as for anyone."""
    path, _, query = target.partition("?")
    headers = [(b"content-type", b"application/json"), (b"host", b"127.0.0.1")]
    if token:
        headers.append((b"authorization", f"Bearer {token}".encode()))
    scope: Scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                    "method": method, "scheme": "http", "path": path,
                    "raw_path": path.encode(), "query_string": query.encode(),
                    "root_path": "", "headers": headers, "client": ("127.0.0.1", 0),
                    "server": ("127.0.0.1", 0)}
    messages = await capture(app, scope, body)
    return status_of(messages), b"".join(m.get("body", b"") for m in messages[1:])


async def send_plain(send: Send, status: int, body: bytes,
                     headers: Sequence[tuple[bytes, bytes]]) -> None:
    kept = [(k, v) for k, v in headers if k.lower() != b"content-length"]
    await send({"type": "http.response.start", "status": status,
                "headers": [*kept, (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
