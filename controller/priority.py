"""Priority classes: which DSCP a flow carries through the fabric.

The fabric's egress ports queue by the DSCP class selector (CS7 first, CS0/unmarked last; see
topologies/shaping.py). Hosts may mark their own packets (kept end to end); the controller can
also mark a flow at its ingress switch. Later policies (gradient-aware scheduling) produce
FlowClass rules; this module only validates and places them.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from controller.topology import FabricView

PROTOCOLS = {"tcp": 6, "udp": 17}


@dataclass(frozen=True)
class FlowClass:
    """Mark packets from `src` to `dst` (optionally one protocol and L4 ports) with `dscp`."""
    src: str
    dst: str
    dscp: int
    proto: str | None = None
    sport: int | None = None
    dport: int | None = None

    @classmethod
    def from_dict(cls, data: dict) -> "FlowClass":
        """Build from REST/JSON input; every error names the field and what is allowed."""
        if not isinstance(data, dict):
            raise ValueError("flow: expected an object with src, dst, dscp[, proto, sport, dport]")
        unknown = set(data) - {"src", "dst", "dscp", "proto", "sport", "dport"}
        if unknown:
            raise ValueError(f"{sorted(unknown)[0]}: unknown field (allowed: src, dst, dscp, "
                             "proto, sport, dport)")
        for name in ("src", "dst"):
            try:
                if not isinstance(data.get(name), str):
                    raise ValueError
                ipaddress.IPv4Address(data[name])
            except ValueError:
                raise ValueError(f"{name}: {data.get(name)!r} is not allowed "
                                 "(an IPv4 address such as \"10.0.0.1\")") from None
        dscp = data.get("dscp")
        if isinstance(dscp, bool) or not isinstance(dscp, int) or not 0 <= dscp <= 63:
            raise ValueError(f"dscp: {dscp!r} is not allowed (an integer 0..63)")
        proto = data.get("proto")
        if proto is not None and (not isinstance(proto, str) or proto not in PROTOCOLS):
            raise ValueError(f"proto: {proto!r} is not allowed (tcp or udp)")
        for name in ("sport", "dport"):
            port = data.get(name)
            if port is None:
                continue
            if proto is None:
                raise ValueError(f"{name}: needs proto (tcp or udp)")
            if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
                raise ValueError(f"{name}: {port!r} is not allowed (an integer 1..65535)")
        return cls(data["src"], data["dst"], dscp, proto, data.get("sport"), data.get("dport"))

    def match_key(self) -> tuple:
        """What the switch matches on; two classes with one key are one flow."""
        return (self.src, self.dst, self.proto, self.sport, self.dport)

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v is not None}


def class_selector(dscp: int) -> int:
    """The egress class (0..7) a DSCP value lands in."""
    return dscp >> 3


def ingress_switch(view: FabricView, flow: FlowClass) -> int | None:
    """Where to mark the flow: the switch its source host attaches to (None: not learnt yet)."""
    host = view.hosts.get(flow.src)
    return host.dpid if host else None
