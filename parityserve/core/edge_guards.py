"""Who may use the HTTP edge: connections per client address, Host names, origins (pure).

Three guards, each against one client taking what belongs to others:

* ``AddressTally`` counts one listener's open connections per client address. An address
  past its cap is refused at once, so one address cannot hold the listener's connections;
  the listener's own cap counts only the connections admitted here.
* ``HostAllowlist``: the names a request's ``Host`` may carry. A web page can make a browser
  send requests to a server on loopback; with DNS rebinding its own name resolves there and
  the browser lets the page read the answers. The name it sends is then the page's, never
  one of this server's, so a server that answers only its own names is out of its reach.
* ``same_origin``: a browser says which page sent a request in ``Origin``; a request from
  another site's page (a cross-site form post) must not drive the admin API.

``is_probe`` names the health routes that are answered even past the connection cap.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

__all__ = ["AddressTally", "HostAllowlist", "TallyStatistics", "check_host_entry", "host_name",
           "is_probe", "same_origin"]

# Every listener answers these names: a client on this machine may use any of them.
LOCAL_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
_ANY_ADDRESS = frozenset({"0.0.0.0", "::", ""})
_ENTRY = re.compile(r"^\.?[a-z0-9_\-]+(\.[a-z0-9_\-]+)*$|^[0-9a-f:.]+$")
_PROBES = frozenset({"/v2/health/live", "/v2/health/ready"})
_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


@dataclass(frozen=True, slots=True)
class TallyStatistics:
    open: int  # connections admitted and not yet closed
    addresses: int  # distinct client addresses among them
    busiest: int  # the most any one address holds


class AddressTally:
    """One listener's open connections, counted per client address (``None``: unknown)."""

    def __init__(self, max_per_address: int) -> None:
        self.max_per_address = max_per_address
        self.total = 0
        self._open: dict[str | None, int] = {}

    def admit(self, address: str | None) -> bool:
        """Count a new connection from ``address``; False (and not counted) past its cap."""
        held = self._open.get(address, 0)
        if held >= self.max_per_address:
            return False
        self._open[address] = held + 1
        self.total += 1
        return True

    def release(self, address: str | None) -> None:
        """An admitted connection from ``address`` closed."""
        held = self._open.get(address, 0) - 1
        if held < 0:
            raise ValueError(f"no admitted connection from {address!r} to release")
        if held:
            self._open[address] = held
        else:
            del self._open[address]  # the table holds only addresses with connections
        self.total -= 1

    def statistics(self) -> TallyStatistics:
        return TallyStatistics(self.total, len(self._open), max(self._open.values(), default=0))


def host_name(value: str) -> str | None:
    """The name in a Host header (or an origin's netloc), lower case, without the port or a
    trailing dot; None when it is not ``name[:port]`` or ``[v6]``/``[v6]:port``."""
    value = value.strip().lower()
    if value.startswith("["):
        name, bracket, rest = value[1:].partition("]")
        if not bracket or (rest and not _is_port(rest)):
            return None
    else:
        name, colon, port = value.rpartition(":")
        if not colon:
            name = value
        elif not port.isdigit() or ":" in name:
            return None
    name = name.removesuffix(".")
    return name or None


def _is_port(rest: str) -> bool:
    return rest.startswith(":") and rest[1:].isdigit()


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def check_host_entry(entry: str) -> str:
    """An ``allowed_hosts`` entry in the form ``HostAllowlist`` compares, or ValueError."""
    normal = entry.strip().lower().removesuffix(".")
    if normal == "*":
        return normal
    if normal.startswith("[") and normal.endswith("]"):
        normal = normal[1:-1]
    if not _ENTRY.match(normal) or normal == ".":
        raise ValueError(f"allowed_hosts entry {entry!r} is not a host name, an IP address, "
                         "'.domain' (it and its subdomains) or '*'")
    return normal


class HostAllowlist:
    """The Host header names a server answers (see the module docstring).

    ``bound``: the addresses its listeners are bound to; each is allowed, and so are the
    localhost names. A listener on every interface (0.0.0.0) is reached by the machine's
    addresses, which cannot be listed reliably, so it allows any IP address and
    ``machine_names`` (the host name): a rebinding attack sends a name, never an IP address.
    ``extra``: the operator's ``allowed_hosts``.
    """

    def __init__(self, bound: Iterable[str], extra: Iterable[str] = (),
                 machine_names: Iterable[str] = ()) -> None:
        entries = [check_host_entry(e) for e in extra]
        bound = [b.strip().lower() for b in bound]
        self.any_ip = any(b in _ANY_ADDRESS for b in bound)
        self.any = "*" in entries
        names = set(LOCAL_NAMES) | {b for b in bound if b not in _ANY_ADDRESS}
        if self.any_ip:
            names |= {n.lower() for n in machine_names if n}
        self.names = frozenset(names | {e for e in entries if not e.startswith(".")})
        self.domains = tuple(e for e in entries if e.startswith("."))

    def allows(self, host: str | None) -> bool:
        """Whether a request with this Host header is answered. No Host at all (HTTP/1.0) is:
        every browser sends one."""
        if host is None or self.any:
            return True
        name = host_name(host)
        if name is None:
            return False
        return (name in self.names or any(name.endswith(d) or name == d[1:] for d in self.domains)
                or (self.any_ip and _is_ip(name)))


def same_origin(origin: str, host: str | None, scheme: str) -> bool:
    """Whether a browser's ``Origin`` is the page this request is addressed to: the same
    scheme, name and port as the request's ``Host`` (a sandboxed page's ``null`` never is)."""
    if host is None:
        return False
    try:
        parts = urlsplit(origin.strip())
        port = parts.port
    except ValueError:
        return False
    if parts.scheme.lower() != scheme.lower() or parts.path or not parts.hostname:
        return False
    default = _DEFAULT_PORTS.get(scheme.lower())
    theirs = (host_name(parts.netloc), port or default)
    ours = (host_name(host), _host_port(host) or default)
    return theirs[0] is not None and theirs == ours


def _host_port(host: str) -> int | None:
    tail = host.strip().rpartition("]")[2] if host.strip().startswith("[") else host
    _, colon, port = tail.rpartition(":")
    return int(port) if colon and port.isdigit() else None


def is_probe(method: str, path: str) -> bool:
    """A health probe: GET or HEAD of /v2/health/live, /v2/health/ready or a model's
    ``/v2/models/{m}[/versions/{v}]/ready``. Cheap to answer, and what an orchestrator asks
    before it restarts a server it cannot reach."""
    if method not in ("GET", "HEAD"):
        return False
    if path in _PROBES:
        return True
    parts = path.split("/")
    return (parts[:3] == ["", "v2", "models"] and parts[-1] == "ready" and all(parts[3:-1])
            and (len(parts) == 5 or (len(parts) == 7 and parts[4] == "versions")))
