"""Where each message from a worker goes: parsed into a typed record, then to the model path
(results) or the supervisor (hello, goodbye, load failure). Anything else is dropped and
counted, never raised: a worker is another process, maybe a hostile one.
"""

from __future__ import annotations

from typing import Any

from parityserve.errors import ProtocolError
from parityserve.runtime.fleet.supervisor import Supervisor
from parityserve.runtime.modelpath.dispatch import ModelPath, Replica
from parityserve.runtime.workers import messages, wire
from parityserve.runtime.workers.rpc import RejectHandler

__all__ = ["Inbox"]


class Inbox:
    """The worker link's message handler."""

    def __init__(self, supervisor: Supervisor, reject: RejectHandler) -> None:
        self.supervisor = supervisor
        self.reject = reject

    def __call__(self, rid: str, header: dict[str, Any], buffers: list[Any]) -> None:
        found = self.supervisor.find(rid)
        try:
            message = messages.parse(header, buffers)
        except ProtocolError as exc:
            if found is not None and header.get("t") == wire.RESULT:
                found[0].refuse_batch(found[1], f"malformed result: {exc}")
            self.reject(rid, "malformed", str(exc))
            return
        if found is None:
            self._from_stranger(rid, message)
            return
        found[1].last_seen = self.supervisor.clock()
        self._from_replica(rid, message, *found)

    def _from_stranger(self, rid: str, message: messages.Message) -> None:
        if not isinstance(message, messages.Hello):
            self.reject(rid, "unknown_replica", f"{type(message).__name__} from no replica")
        elif not self.supervisor.join(rid, message):
            self.reject(rid, "unknown_model",
                        f"hello for model {message.model!r} v{message.version}")

    def _from_replica(self, rid: str, message: messages.Message, path: ModelPath,
                      replica: Replica) -> None:
        if isinstance(message, messages.Result):
            refused = path.accept_result(replica, message)
            if refused is not None:
                self.reject(rid, *refused)
        elif isinstance(message, messages.Heartbeat):
            self.supervisor.heartbeat(replica, message)
        elif isinstance(message, messages.Hello):
            self.supervisor.ready(path, replica, message)
        elif isinstance(message, messages.Bye):
            self.supervisor.forget(path, replica)
        elif (isinstance(message, messages.Failed)
              and not self.supervisor.load_failed(path, replica, message.error)):
            self.reject(rid, "unexpected_failed", f"FAILED while {replica.state}")
