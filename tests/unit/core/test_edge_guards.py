"""The edge's pure guards: connections per address, Host names, origins, probes."""

from __future__ import annotations

import asyncio

import pytest

from parityserve.config import parse_config
from parityserve.core.edge_guards import (
    AddressTally,
    HostAllowlist,
    TallyStatistics,
    check_host_entry,
    host_name,
    is_probe,
    same_origin,
)


def test_an_address_past_its_cap_is_refused_and_not_counted() -> None:
    tally = AddressTally(max_per_address=2)
    assert tally.admit("10.0.0.1") and tally.admit("10.0.0.1")
    assert not tally.admit("10.0.0.1")
    assert tally.admit("10.0.0.2")  # another address has its own allowance
    assert tally.statistics() == TallyStatistics(open=3, addresses=2, busiest=2)
    tally.release("10.0.0.1")
    assert tally.admit("10.0.0.1")  # a closed connection frees its place


def test_released_addresses_leave_the_table() -> None:
    tally = AddressTally(max_per_address=1)
    for i in range(100):  # many addresses come and go: the table does not keep them
        assert tally.admit(f"10.0.0.{i}")
        tally.release(f"10.0.0.{i}")
    assert tally.statistics() == TallyStatistics(open=0, addresses=0, busiest=0)
    with pytest.raises(ValueError, match="no admitted connection"):
        tally.release("10.0.0.1")


@pytest.mark.parametrize("value,name", [
    ("127.0.0.1:8000", "127.0.0.1"), ("LocalHost", "localhost"), ("localhost.:80", "localhost"),
    ("[::1]:8000", "::1"), ("[::1]", "::1"), ("evil.example", "evil.example"),
    ("a:b:c", None), ("[::1", None), ("[::1]x", None), ("host:port", None), ("", None),
    (":80", None),
])
def test_host_name(value: str, name: str | None) -> None:
    assert host_name(value) == name


LOOPBACK = HostAllowlist(["127.0.0.1"])


@pytest.mark.parametrize("host", ["127.0.0.1:8000", "127.0.0.1", "localhost:8000",
                                  "LOCALHOST.", "[::1]:8000", None])
def test_a_loopback_listener_answers_its_own_names(host: str | None) -> None:
    assert LOOPBACK.allows(host)


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "127.0.0.1.evil.example",
                                  "localhost.evil.example", "10.0.0.5", "", "127.0.0.1:x"])
def test_a_loopback_listener_refuses_other_names(host: str) -> None:
    assert not LOOPBACK.allows(host)


def test_a_listener_on_every_interface_answers_addresses_and_the_machine_name() -> None:
    hosts = HostAllowlist(["0.0.0.0"], machine_names=["Box"])
    for host in ("10.1.2.3:8000", "[fe80::1]:8000", "box:8000", "localhost"):
        assert hosts.allows(host), host
    assert not hosts.allows("evil.example:8000")  # a rebinding attack sends a name


def test_allowed_hosts_add_names_domains_or_everything() -> None:
    hosts = HostAllowlist(["127.0.0.1"], ["api.example.com", ".svc.cluster.local"])
    for host in ("api.example.com", "API.example.com:443", "svc.cluster.local",
                 "parityserve.default.svc.cluster.local:8000"):
        assert hosts.allows(host), host
    for host in ("example.com", "evilsvc.cluster.local", "api.example.com.evil"):
        assert not hosts.allows(host), host
    assert HostAllowlist(["127.0.0.1"], ["*"]).allows("anything.at.all")


@pytest.mark.parametrize("entry", ["", "has space", "a/b", "http://x", ".", "*.example.com"])
def test_a_malformed_allowed_hosts_entry_is_refused_at_load(entry: str) -> None:
    with pytest.raises(ValueError, match="allowed_hosts entry"):
        check_host_entry(entry)
    with pytest.raises(Exception, match="allowed_hosts entry"):
        parse_config({"server": {"allowed_hosts": [entry]}})


def test_allowed_hosts_entries_load() -> None:
    config = parse_config({"server": {"allowed_hosts": ["*", ".svc", "[::1]", "10.0.0.5"]}})
    assert config.server.allowed_hosts == ("*", ".svc", "[::1]", "10.0.0.5")


@pytest.mark.parametrize("origin,host,scheme,same", [
    ("http://127.0.0.1:8000", "127.0.0.1:8000", "http", True),
    ("http://LOCALHOST:8000", "localhost:8000", "http", True),
    ("http://example.com", "example.com:80", "http", True),  # the default port, either way
    ("https://example.com", "example.com", "https", True),
    ("http://[::1]:8000", "[::1]:8000", "http", True),
    ("http://evil.example", "127.0.0.1:8000", "http", False),
    ("http://127.0.0.1:9000", "127.0.0.1:8000", "http", False),  # another port, another site
    ("https://127.0.0.1:8000", "127.0.0.1:8000", "http", False),  # another scheme
    ("null", "127.0.0.1:8000", "http", False),  # a sandboxed page or a file
    ("http://127.0.0.1:8000", None, "http", False),
    ("http://127.0.0.1:99999", "127.0.0.1:99999", "http", False),  # not a port
    ("http://127.0.0.1:8000/path", "127.0.0.1:8000", "http", False),
])
def test_same_origin(origin: str, host: str | None, scheme: str, same: bool) -> None:
    assert same_origin(origin, host, scheme) is same


@pytest.mark.parametrize("method,path,probe", [
    ("GET", "/v2/health/live", True), ("HEAD", "/v2/health/ready", True),
    ("GET", "/v2/models/m/ready", True), ("GET", "/v2/models/m/versions/2/ready", True),
    ("POST", "/v2/health/live", False), ("GET", "/v2", False), ("GET", "/metrics", False),
    ("GET", "/v2/models//ready", False), ("GET", "/v2/models/m/infer", False),
    ("GET", "/v2/models/m/x/2/ready", False), ("GET", "/admin/state", False),
])
def test_is_probe(method: str, path: str, probe: bool) -> None:
    assert is_probe(method, path) is probe


def test_the_h11_fallback_checks_host_as_an_asgi_wrapper() -> None:
    from parityserve.runtime.frontend.connection import host_guard

    served, refused, sent = [], [], []

    async def app(scope, receive, send) -> None:
        served.append(scope["headers"])

    async def send(message) -> None:
        sent.append(message)

    guarded = host_guard(app, LOOPBACK, refused.append)
    for host in (b"127.0.0.1:8000", b"evil.example"):
        scope = {"type": "http", "headers": [(b"host", host)]}
        asyncio.run(guarded(scope, None, send))
    assert served == [[(b"host", b"127.0.0.1:8000")]] and refused == ["host_not_allowed"]
    assert sent[0]["status"] == 421 and b"host_not_allowed" in sent[1]["body"]
