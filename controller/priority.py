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
FLOW_CLASS_FIELDS = ("src", "dst", "dscp", "proto", "sport", "dport")

_shown = reprlib.Repr()  # input quoted in an error stays one short line, however big or deep
_shown.maxstring = _shown.maxother = _shown.maxlong = 40
_shown.maxlevel, _shown.maxlist, _shown.maxdict = 2, 4, 4


class CapacityError(Exception):
    """A well-formed request that would take the controller past one of its limits (409)."""


def shown(value: object) -> str:
    """`value` as an error message quotes it: its repr, cut short."""
    return _shown.repr(value)


def field(at: str, name: str) -> str:
    """The path of field `name` of the object at path `at` ("" for the document itself)."""
    return f"{at}.{name}" if at else name


@functools.lru_cache(maxsize=4096)  # a job's flows name its hosts again and again
def is_ipv4(text: str) -> bool:
    """Whether the string is an IPv4 address in dotted form."""
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return True


def is_port(port: int) -> bool:
    return 1 <= port <= MAX_PORT


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


def parse_bool(name: str, value: object) -> bool:
    """A JSON boolean: "false", 0 and null are refused, not taken for false or true."""
    if not isinstance(value, bool):
        raise ValueError(f"{name}: {shown(value)} is not allowed (true or false)")
    return value


def parse_proto(name: str, value: object) -> str:
    if not isinstance(value, str) or value not in PROTOCOLS:
        raise ValueError(f"{name}: {shown(value)} is not allowed (tcp or udp)")
    return value


def parse_port(name: str, value: object) -> int:
    return parse_int(name, value, 1, MAX_PORT)


def parse_list(name: str, value: object, most: int, may_be_empty: bool = False) -> list:
    """A JSON array of at most `most` items (non-empty unless `may_be_empty`)."""
    if not isinstance(value, list) or not (value or may_be_empty):
        raise ValueError(f"{name}: {shown(value)} is not allowed "
                         f"(a {'' if may_be_empty else 'non-empty '}list)")
    if len(value) > most:
        raise ValueError(f"{name}: {len(value)} items is more than the {most} allowed")
    return value


def check_fields(data: object, at: str, allowed: tuple[str, ...], what: str = "body") -> dict:
    """`data`, the object at path `at` ("" for a whole document, named `what` in errors), must
    be an object whose keys are among `allowed`."""
    if not isinstance(data, dict):
        raise ValueError(f"{at or what}: expected an object with {', '.join(allowed)}, "
                         f"not {shown(data)}")
    unknown = set(data) - set(allowed)
    if unknown:
        raise ValueError(f"{field(at, sorted(unknown)[0])}: unknown field "
                         f"(allowed: {', '.join(allowed)})")
    return data


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

    @classmethod
    def from_dict(cls, data: object, at: str = "") -> "FlowClass":
        """Build from REST/JSON input, the object at path `at` (e.g. "flows[2]"); every error
        names the field and what is allowed."""
        check_fields(data, at, FLOW_CLASS_FIELDS, "flow")
        src = parse_ipv4(field(at, "src"), data.get("src"))
        dst = parse_ipv4(field(at, "dst"), data.get("dst"))
        dscp = parse_int(field(at, "dscp"), data.get("dscp"), 0, 63)
        proto = data.get("proto")
        if proto is not None:
            parse_proto(field(at, "proto"), proto)
        for name in ("sport", "dport"):
            if data.get(name) is None:
                continue
            if proto is None:
                raise ValueError(f"{field(at, name)}: needs proto (tcp or udp)")
            parse_port(field(at, name), data[name])
        return cls(src, dst, dscp, proto, data.get("sport"), data.get("dport"))

    def match_key(self) -> tuple:
        """What the switch matches on; two classes with one key are one flow."""
        return (self.src, self.dst, self.proto, self.sport, self.dport, self.dport_mask,
                self.in_dscp)

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v is not None}


def parse_flow_classes(name: str, value: object) -> list[FlowClass]:
    """The flows of a /fabric/classes request: a list of at most MAX_FLOWS flow objects."""
    return [FlowClass.from_dict(flow, f"{name}[{i}]")
            for i, flow in enumerate(parse_list(name, value, MAX_FLOWS, may_be_empty=True))]


def class_selector(dscp: int) -> int:
    """The egress class (0..7) a DSCP value lands in."""
    return dscp >> 3


def ingress_switch(view: FabricView, flow: FlowClass) -> int | None:
    """Where to mark the flow: the switch its source host attaches to (None: not learnt yet)."""
    host = view.hosts.get(flow.src)
    return host.dpid if host else None
