"""Priority classes: which DSCP a flow carries through the fabric.

The fabric's egress ports queue by the DSCP class selector (CS7 first, CS0/unmarked last; see
topologies/shaping.py). Hosts may mark their own packets (kept end to end); the controller can
also mark a flow at its ingress switch. Later policies (gradient-aware scheduling) produce
FlowClass rules; this module only validates and places them.
"""
from __future__ import annotations

import functools
import ipaddress
import reprlib
from dataclasses import dataclass

from common.classes import MAX_DSCP
from common.schema import SchemaError, dotted, knob
from controller.topology import FabricView

PROTOCOLS = {"tcp": 6, "udp": 17}
PORT_BITS = 16
MAX_PORT = (1 << PORT_BITS) - 1
PORT = f"a port 1..{MAX_PORT}"
IPV4 = 'an IPv4 address such as "10.0.0.1"'
# Flows in one request (POST/DELETE /fabric/classes, a job's flows): thousands of connections
# is far beyond a testbed job, and parsing the most allowed takes tens of milliseconds.
MAX_FLOWS = 4096
# Marks the controller keeps in all (REST marks plus every job's rewrites, a port range counting
# one per aligned block): each is a flow entry on a switch, re-planned on every fabric change.
MAX_MARKS = 16384

_shown = reprlib.Repr()  # input quoted in an error stays one short line, however big or deep
_shown.maxstring = _shown.maxother = _shown.maxlong = 40
_shown.maxlevel, _shown.maxlist, _shown.maxdict = 2, 4, 4


class CapacityError(Exception):
    """A well-formed request that would take the controller past one of its limits (409)."""


def shown(value: object) -> str:
    """`value` as an error message quotes it: its repr, cut short."""
    return _shown.repr(value)


def is_ipv4(text: str) -> bool:
    """Whether the string is an IPv4 address in dotted form. What cannot be one (longer than
    "255.255.255.255") is refused before the cache, which so holds at most 4096 short strings."""
    return len(text) <= len("255.255.255.255") and _is_dotted_ipv4(text)


@functools.lru_cache(maxsize=4096)  # a job's flows name its hosts again and again
def _is_dotted_ipv4(text: str) -> bool:
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return True


def is_port(port: int | None) -> bool:
    """Whether port is a port (None: not given, also fine)."""
    return port is None or 1 <= port <= MAX_PORT


def parse_ipv4(name: str, value: object) -> str:
    """An IPv4 address given as a dotted string; the error names the field."""
    if not (isinstance(value, str) and is_ipv4(value)):
        raise ValueError(f"{name}: {shown(value)} is not allowed ({IPV4})")
    return value


def parse_int(name: str, value: object, lo: int, hi: int) -> int:
    """An integer (not a bool, not a float) in lo..hi; the error names the field."""
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"{name}: {shown(value)} is not allowed (an integer {lo}..{hi})")
    return value


def too_many(path: str, items: list, most: int) -> None:
    """Refuses a list of more than `most` items (checked after the schema engine built it)."""
    if len(items) > most:
        raise SchemaError(path, f"{len(items)} items is more than the {most} allowed")


def port_range_blocks(lo: int, hi: int) -> list[tuple[int, int]]:
    """The ports lo..hi as the fewest power-of-two aligned blocks, each a (value, mask) pair
    for a masked L4 port match: port p is in a block iff p & mask == value."""
    if not 0 <= lo <= hi < 1 << PORT_BITS:
        raise ValueError(f"port range: [{lo}, {hi}] is not allowed (0 <= lo <= hi <= 65535)")
    blocks = []
    while lo <= hi:
        size = lo & -lo if lo else 1 << PORT_BITS  # the largest block aligned at lo ...
        while lo + size - 1 > hi:                   # ... that ends inside the range
            size >>= 1
        blocks.append((lo, ((1 << PORT_BITS) - 1) & ~(size - 1)))
        lo += size
    return blocks


@dataclass(frozen=True)
class FlowClass:
    """Mark packets from `src` to `dst` (any destination when None; optionally one protocol, L4
    ports, a destination port block `dport`/`dport_mask`, and only packets arriving with DSCP
    `in_dscp`) with `dscp`."""
    src: str
    dst: str | None
    dscp: int
    proto: str | None = None
    sport: int | None = None
    dport: int | None = None
    dport_mask: int | None = None
    in_dscp: int | None = None

    def match_key(self) -> tuple:
        """What the switch matches on; two classes with one key are one flow."""
        return (self.src, self.dst, self.proto, self.sport, self.dport, self.dport_mask,
                self.in_dscp)

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass(frozen=True, kw_only=True)
class ClassEntry:
    """A flow of a /fabric/classes request, declared on the schema engine (common/schema.py):
    mark packets from src to dst with dscp; optionally one protocol and, with it, L4 ports."""
    src: str = knob(allowed=IPV4, check=is_ipv4)
    dst: str = knob(allowed=IPV4, check=is_ipv4)
    dscp: int = knob(allowed=f"an integer 0..{MAX_DSCP}", check=lambda dscp: 0 <= dscp <= MAX_DSCP)
    proto: str | None = knob(None, "tcp or udp", lambda proto: proto is None or proto in PROTOCOLS)
    sport: int | None = knob(None, PORT, is_port)
    dport: int | None = knob(None, PORT, is_port)

    def flow_class(self, at: str = "") -> FlowClass:
        """The FlowClass it asks for; ports need a protocol (the error names the port at `at`)."""
        for name in ("sport", "dport"):
            if getattr(self, name) is not None and self.proto is None:
                raise SchemaError(dotted(at, name), "needs proto (tcp or udp)")
        return FlowClass(self.src, self.dst, self.dscp, self.proto, self.sport, self.dport)


def flow_classes(entries: list[ClassEntry], at: str = "flows") -> list[FlowClass]:
    """The FlowClasses of a request's flows (at path `at`), at most MAX_FLOWS."""
    too_many(at, entries, MAX_FLOWS)
    return [entry.flow_class(dotted(at, str(index))) for index, entry in enumerate(entries)]


def ingress_switch(view: FabricView, flow: FlowClass) -> int | None:
    """Where to mark the flow: the switch its source host attaches to (None: not learnt yet)."""
    host = view.hosts.get(flow.src)
    return host.dpid if host else None
