"""Routing decisions: for every switch, where each host's traffic goes.

Paths are the shortest ones over the live links; where several next hops tie, the load-balancing
mode decides: `ecmp` and `spray` put them in an OpenFlow select group hashed by OVS `dp_hash` on the
IP 5-tuple, UDP ports included (OVS's default hash leaves UDP ports out, so every UDP datagram
between two hosts would take one path), `single` picks one of them deterministically.  `ecmp` and
`spray` install the same groups: the hosts' entropy makes the difference.  A TCP flow keeps its
5-tuple, so it stays on one path either way; mlt sends each peer's datagrams from one source port
under `ecmp` (one flow, placed as TCP's are) and draws a port per datagram under `spray`, which the
hash sprays per packet (the runner tells the hosts which: experiments.runner.process_config).
"""
from __future__ import annotations

import ipaddress
import zlib
from collections import deque
from dataclasses import dataclass, field

from controller.topology import FabricView

LB_MODES = ("ecmp", "spray", "single")
# The OVS selection method of every select group (OpenFlow 1.5 Netronome extension): the datapath's
# 5-tuple hash, which covers UDP ports where OVS's default hash does not (checked on OVS 3.1).
SELECTION_METHOD = "dp_hash"
MAX_GROUP_ID = 0xFFFFFF00  # OFPG_MAX


@dataclass(frozen=True)
class Group:
    group_id: int
    ports: tuple[int, ...]
    selection_method: str


@dataclass(frozen=True)
class Output:
    """Send to `port`, or through select group `group_id` when not None."""
    port: int | None = None
    group_id: int | None = None


@dataclass
class SwitchPlan:
    groups: dict[int, Group] = field(default_factory=dict)
    routes: dict[str, Output] = field(default_factory=dict)  # host IP -> output
    # (src IP, dst IP) -> output: a job's traffic pinned to its chosen path (controller/paths.py)
    pins: dict[tuple[str, str], Output] = field(default_factory=dict)


def group_id_of(ports: tuple[int, ...]) -> int:
    """A deterministic group id per bucket set: the port bitmap when ports fit in 31 bits,
    else a CRC of the port list (with the top bit set so the two ranges never meet)."""
    if max(ports) < 31:
        return sum(1 << p for p in ports)
    return (zlib.crc32(repr(sorted(ports)).encode()) % (MAX_GROUP_ID - (1 << 31))) + (1 << 31)


def distances_to(view: FabricView, dst: int) -> dict[int, int]:
    """Hop counts from every switch to `dst` over live links (BFS)."""
    dist = {dst: 0}
    queue = deque([dst])
    while queue:
        here = queue.popleft()
        for _, peer in view.neighbours(here):
            if peer not in dist:
                dist[peer] = dist[here] + 1
                queue.append(peer)
    return dist


def next_hop_ports(view: FabricView, src: int, dst: int,
                   dist: dict[int, int] | None = None) -> tuple[int, ...]:
    """Ports of `src` on a shortest path to switch `dst` (empty when unreachable)."""
    dist = distances_to(view, dst) if dist is None else dist
    if src not in dist or src == dst:
        return ()
    return tuple(port for port, peer in view.neighbours(src)
                 if dist.get(peer) == dist[src] - 1)


def choose_single(ports: tuple[int, ...], ip: str) -> int:
    """The no-multipath baseline: one of the tied ports, chosen by the destination address, so
    destinations are spread over the paths but each always takes the same one."""
    return sorted(ports)[int(ipaddress.ip_address(ip)) % len(ports)]


def plan_fabric(view: FabricView, lb: str) -> dict[int, SwitchPlan]:
    """The groups and host routes of every switch."""
    if lb not in LB_MODES:
        raise ValueError(f"lb: {lb!r} is not allowed (one of {', '.join(LB_MODES)})")
    plans = {dpid: SwitchPlan() for dpid in view.switches}
    dists = {dpid: distances_to(view, dpid)
             for dpid in {h.dpid for h in view.hosts.values()}}
    for ip, host in sorted(view.hosts.items()):
        for dpid, plan in plans.items():
            if dpid == host.dpid:
                plan.routes[ip] = Output(port=host.port)
                continue
            ports = next_hop_ports(view, dpid, host.dpid, dists[host.dpid])
            if not ports:
                continue
            if len(ports) == 1 or lb == "single":
                plan.routes[ip] = Output(port=choose_single(ports, ip))
                continue
            group = Group(group_id_of(ports), ports, SELECTION_METHOD)
            plan.groups[group.group_id] = group
            plan.routes[ip] = Output(group_id=group.group_id)
    return plans
