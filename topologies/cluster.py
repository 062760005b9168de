"""Where the nodes of a fabric run when it spans several servers: which server each switch and
host lands on (`placement`) and which links therefore cross between servers. Plain Python on the
layout, so planning and validation need no Mininet; emulation/cluster.py builds the network so.

Two placements: `switchbin` cuts the switches into contiguous, even bins, one per server, each
tier spread over the bins, and puts every host with its switch (so only switch-to-switch links
cross); `roundrobin` deals the switches, then the hosts, to the servers in turn.
"""
from __future__ import annotations

from topologies.layout import Layout, Link

PLACERS = ("switchbin", "roundrobin")
LOCAL = "localhost"


class ClusterError(RuntimeError):
    """A cluster that cannot be used; the message names the field (cluster.servers, cluster.placement)."""


def _placer_order(layout: Layout) -> list[str]:
    """The switches in the order they are placed: each tier spread evenly over the list (leaf i
    next to the spines of the same fraction of their tier), so that switchbin's contiguous bins
    each get a share of every tier and a leaf's hosts stay with it."""
    tiers: dict[str, list[str]] = {}
    for node in layout.switches:
        tiers.setdefault(node.role, []).append(node.name)
    position = {name: (index / len(names), role)
                for role, names in tiers.items() for index, name in enumerate(names)}
    return sorted(position, key=lambda name: (position[name], name))


def _bins(nodes: list[str], servers: list[str]) -> dict[str, str]:
    """The nodes cut into contiguous bins of even size, one per server in order (the first
    servers take one more when they do not divide evenly)."""
    quotient, remainder = divmod(len(nodes), len(servers))
    tickets = [server for index, server in enumerate(servers)
               for _ in range(quotient + (index < remainder))]
    return dict(zip(nodes, tickets))


def placement(layout: Layout, servers: list[str], method: str) -> dict[str, str]:
    """Which server each node of the fabric lands on."""
    if method not in PLACERS:
        raise ClusterError(f"cluster.placement: {method!r} is not allowed (one of {', '.join(PLACERS)})")
    switches = _placer_order(layout)
    hosts = [node.name for node in layout.hosts]
    if method == "roundrobin":
        return {name: servers[index % len(servers)] for index, name in enumerate(switches + hosts)}
    if len(servers) > len(switches):
        raise ClusterError(f"cluster.placement: switchbin gives every server a switch; {len(servers)} servers "
                           f"but {len(switches)} switches (list fewer servers or use roundrobin)")
    where = _bins(switches, servers)
    for link in layout.links:  # a host goes with the (last) switch it is linked to
        for host, switch in ((link.a, link.b), (link.b, link.a)):
            if host.role == "host" and switch.name in where:
                where[host.name] = where[switch.name]
    return {name: where[name] for name in switches + hosts}


def crossing_links(layout: Layout, where: dict[str, str]) -> list[Link]:
    """The links whose ends land on different servers (each one a tunnel)."""
    return [link for link in layout.links if where[link.a.name] != where[link.b.name]]
