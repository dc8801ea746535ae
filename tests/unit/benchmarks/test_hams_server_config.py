"""The HAMS benchmarks' servers take their load generator as many clients: one address's
share of a graph must not queue the generator's own concurrency at the door."""

from __future__ import annotations

from benchmarks.hams import LOADGEN_SHARE, _as_many_clients
from benchmarks.hams_stocks import stocks_config
from parityserve.config import parse_config


def test_the_stocks_config_lifts_the_per_address_share_and_still_parses() -> None:
    config = parse_config(_as_many_clients(stocks_config("hams")))
    assert config.server.limits.max_graph_requests_per_address == LOADGEN_SHARE
    assert config.server.require_admin_token is False  # the rest of server is kept


def test_a_share_the_config_sets_itself_is_kept() -> None:
    mine = {**stocks_config("bare"), "server": {"limits": {"max_graph_requests_per_address": 3}}}
    assert parse_config(_as_many_clients(mine)).server.limits \
        .max_graph_requests_per_address == 3
