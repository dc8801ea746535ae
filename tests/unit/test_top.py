"""parityserve/top.py's pure helpers: frontend URLs and the one line an unread frontend gets."""

from __future__ import annotations

import orjson
import pytest

from parityserve.errors import ServiceError, Unauthorized, Unavailable
from parityserve.top import _split_url, describe_error


def test_a_url_may_name_a_separate_admin_listener_and_a_bare_host_means_http():
    assert _split_url("10.0.0.5:8000") == ("http://10.0.0.5:8000", None)
    assert _split_url("https://h:8000,h:9000") == ("https://h:8000", "http://h:9000")


def test_each_failure_is_one_line_that_says_what_kind_it_is():
    assert describe_error(Unavailable("cannot connect\nto x")) == "unreachable: cannot connect to x"
    assert describe_error(Unauthorized("wants the token")).startswith("admin token refused: ")
    with pytest.raises(ValueError) as caught:  # a 200 that is a web page, not state JSON
        orjson.loads(b"<html>")
    assert describe_error(caught.value).startswith("not a parityserve frontend? ")
    assert describe_error(ServiceError("boom")) == "ServiceError: boom"


def test_the_replicas_cell_shows_parity_apart_and_red_when_any_is_down():
    from parityserve.top import _replicas
    from parityserve.top_view import ModelRow

    def row(up: int, parity_up: int, parity: int) -> ModelRow:
        return ModelRow("m", None, None, None, 0.05, up, 2, None, None, "c=1", parity_up,
                        parity)

    assert _replicas(row(2, 0, 0)).plain == "2/2" and not _replicas(row(2, 0, 0)).style
    assert _replicas(row(2, 1, 1)).plain == "2/2 +1/1p" and not _replicas(row(2, 1, 1)).style
    assert _replicas(row(2, 0, 1)).style == "bold red"  # the parity replica is down
    assert _replicas(row(1, 1, 1)).style == "bold red"
