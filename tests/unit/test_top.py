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
