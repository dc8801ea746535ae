"""ReadClock, the pure part of the connection limits: phases, deadlines, head size, answers."""

from __future__ import annotations

import orjson

from parityserve.config import Limits
from parityserve.runtime.frontend.connection import Phase, ReadClock, Refusal, render_refusal

LIMITS = Limits(header_timeout_s=2.0, body_timeout_s=5.0, max_header_bytes=1024)


def test_a_new_connection_must_start_its_head_within_the_header_timeout() -> None:
    clock = ReadClock(LIMITS)
    assert clock.phase is Phase.HEAD and clock.settle(now=100.0) == 102.0
    refusal = clock.expired()
    assert (refusal.reason, refusal.answer) == ("idle_timeout", False)  # nothing was asked


def test_the_first_request_keeps_the_connections_head_deadline() -> None:
    clock = ReadClock(LIMITS)
    clock.settle(now=100.0)
    clock.message_begin()
    assert clock.settle(now=101.5) == 102.0  # trickling bytes do not buy more time
    refusal = clock.expired()
    assert (refusal.status, refusal.code, refusal.reason) == (408, "request_timeout",
                                                              "header_timeout")
    assert "header_timeout_s=2s" in refusal.message


def test_the_body_deadline_runs_from_the_end_of_the_head_and_ends_with_the_message() -> None:
    clock = ReadClock(LIMITS)
    clock.settle(now=0.0)
    clock.message_begin()
    assert clock.headers_complete() is None
    assert clock.phase is Phase.BODY and clock.settle(now=1.0) == 6.0
    assert clock.settle(now=3.0) == 6.0
    assert clock.expired().reason == "body_timeout"
    clock.message_complete()
    assert clock.phase is Phase.REST and clock.settle(now=4.0) is None  # the app's time


def test_a_keep_alive_request_gets_its_own_head_deadline() -> None:
    clock = ReadClock(LIMITS)
    clock.settle(now=0.0)
    clock.message_begin()
    clock.headers_complete()
    clock.message_complete()
    clock.message_begin()
    assert clock.phase is Phase.HEAD and clock.settle(now=50.0) == 52.0


def test_a_request_that_arrives_in_one_read_never_needs_a_deadline() -> None:
    clock = ReadClock(LIMITS)
    clock.settle(now=0.0)
    for _ in range(3):
        clock.message_begin()
        clock.headers_complete()
        clock.message_complete()
        assert clock.fed(100) is None
        assert (clock.phase, clock.deadline) == (Phase.REST, None)


def test_postponing_restarts_the_current_phase() -> None:
    clock = ReadClock(LIMITS)
    clock.message_begin()
    clock.headers_complete()
    assert clock.settle(now=0.0) == 5.0
    assert clock.postpone(now=4.0) == 9.0


def test_an_incomplete_head_is_refused_once_its_bytes_pass_the_limit() -> None:
    clock = ReadClock(LIMITS)
    clock.message_begin()
    assert clock.fed(1000) is None
    refusal = clock.fed(100)
    assert refusal is not None
    assert (refusal.status, refusal.code, refusal.reason) == (431, "header_too_large",
                                                              "header_too_large")
    assert "max_header_bytes=1024" in refusal.message


def test_a_chunk_a_head_began_in_the_middle_of_is_not_counted_as_head() -> None:
    # Pipelined: the chunk's start was the end of the previous request's body.
    clock = ReadClock(LIMITS)
    clock.message_begin()
    clock.headers_complete()
    clock.message_complete()
    clock.message_begin()
    assert clock.fed(64 * 1024) is None
    assert clock.fed(1000) is None  # from here on every byte is head
    assert clock.fed(100) is not None


def test_bytes_after_a_completed_head_are_not_head() -> None:
    clock = ReadClock(LIMITS)
    clock.message_begin()
    clock.headers_complete(chunk_bytes=1 << 20, measure=lambda: 500)
    assert clock.fed(1 << 20) is None  # a big body in the same read


def test_a_completed_head_is_measured_when_it_may_be_over_the_limit() -> None:
    def unmeasurable() -> int:
        raise AssertionError("a head that fits in 1024 bytes is not measured")

    clock = ReadClock(LIMITS)
    clock.message_begin()
    assert clock.headers_complete(chunk_bytes=1024, measure=unmeasurable) is None
    clock.message_complete()
    clock.message_begin()
    refusal = clock.headers_complete(chunk_bytes=4096, measure=lambda: 1025)
    assert refusal is not None and refusal.status == 431
    assert clock.phase is Phase.HEAD  # refused: the body phase never starts


def test_a_refusal_renders_as_a_closing_json_response() -> None:
    refusal = Refusal(408, "request_timeout", "too slow", "header_timeout")
    raw = render_refusal(refusal, [(b"server", b"uvicorn")])
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"HTTP/1.1 408 Request Timeout"
    assert b"server: uvicorn" in lines and b"connection: close" in lines
    assert b"content-type: application/json" in lines
    assert b"content-length: %d" % len(body) in lines
    assert orjson.loads(body) == {"error": "too slow", "code": "request_timeout"}
