"""The fabric a spec describes: its node names and links from the fabric's layout
(topologies/layout.py), and its size checked against the DPID plan, OpenFlow port numbers, Linux
interface names and this machine before anything counts or names its nodes.

Hosts are h1..hN leaf by leaf; leaf-spine switches leaf1.., spine1..; fat-tree switches edge1..,
agg1.., core1.. pod by pod; a fabric file's (topologies/files.py) by the tiers it declares. A link is
written `a-b` in either order.
"""
from __future__ import annotations

import dataclasses
from collections import defaultdict
from functools import cache
from typing import TYPE_CHECKING

from common.schema import show
from experiments.spec.errors import SpecError, not_allowed
from topologies.files import FabricFileError, read_fabric
from topologies.layout import MAX_PER_TIER, Layout, fat_tree, leaf_spine

if TYPE_CHECKING:
    from experiments.spec.schema import Topology

# Fabric sizes. Limits of the fabric's conventions: a tier of switches has MAX_PER_TIER DPIDs
# (topologies/layout.py); a switch's port numbers stay well inside OpenFlow's 0xff00 (this
# one is not a constant of topologies/); Mininet names port n of a switch `<switch>-eth<n>`, and
# Linux interface names have at most IFNAMSIZ - 1 characters.
MAX_SWITCH_PORTS = 1024
IFNAME_CHARS = 15
# Limits of this machine (2 cores, 24 GB): every host may run a host app, ~21 MB of private memory at
# start (numpy and the digits; measured) plus its model's and transport's buffers; one ovs-vswitchd thread
# forwards every packet of every switch, and a 4x8x4 leaf-spine (12 switches) already takes
# ~7 s to build and start (docs/platform.md).
MACHINE_HOSTS = 128
MACHINE_SWITCHES = 64


# The knobs that shape a built-in kind: a fabric file gives its own shape.
SHAPE_KNOBS = ("spines", "leaves", "hosts_per_leaf", "k")


def layout_of(topology: Topology) -> Layout:
    """The fabric's nodes and links (topologies/layout.py), once check_topology passed."""
    if topology.kind == "file":
        return read_fabric(topology.file)
    if topology.kind == "fattree":
        return fat_tree(topology.k)
    return leaf_spine(topology.spines, topology.leaves, topology.hosts_per_leaf)


def host_names(topology: Topology) -> list[str]:
    return [node.name for node in layout_of(topology).hosts]


def _host_count(topology: Topology) -> int:
    """Counted, not listed: check_topology caps sizes before anything is built."""
    if topology.kind == "file":
        return len(layout_of(topology).hosts)  # the file's reader caps its sizes
    if topology.kind == "fattree":
        return topology.k ** 3 // 4
    return topology.leaves * topology.hosts_per_leaf


@cache
def shortest_paths_from(layout: Layout, source: str) -> tuple[dict[str, int], dict[str, int]]:
    """Hops from source to every node and how many shortest paths reach it (hosts forward nothing)."""
    graph: dict[str, list[str]] = defaultdict(list)
    for link in layout.links:
        graph[link.a.name].append(link.b.name)
        graph[link.b.name].append(link.a.name)
    hosts = {node.name for node in layout.hosts}
    hops, paths, frontier = {source: 0}, {source: 1}, [source]
    while frontier:
        following = []
        for node in frontier:
            if node in hosts and node != source:
                continue
            for peer in graph[node]:
                if peer not in hops:
                    hops[peer], paths[peer] = hops[node] + 1, 0
                    following.append(peer)
                if hops[peer] == hops[node] + 1:
                    paths[peer] += paths[node]
        frontier = following
    return hops, paths


def topology_links(topology: Topology) -> set[frozenset[str]]:
    """Every link of the fabric as the unordered pair of its end nodes' names."""
    return {link.names for link in layout_of(topology).links}


def _tiers(topology: Topology) -> list[tuple[str, int, int, str, str]]:
    """Each tier of switches: (name prefix, switches, ports of each, the field sizing the tier,
    the ports' count in fields, the first of which is blamed for too many); a fabric file's tiers by
    the roles it declares, sized by the file, each with its switches' most ports."""
    if topology.kind == "file":
        layout = layout_of(topology)
        tiers: dict[str, list[int]] = {}
        for node in layout.switches:
            tiers.setdefault(node.role, []).append(len(layout.ports(node.name)))
        return [(role, len(ports), max(ports), "file", "file") for role, ports in tiers.items()]
    if topology.kind == "fattree":
        k, half = topology.k, topology.k // 2
        return [("edge", k * half, k, "k", "k"), ("agg", k * half, k, "k", "k"), ("core", half * half, k, "k", "k")]
    return [("leaf", topology.leaves, topology.hosts_per_leaf + topology.spines, "leaves", "hosts_per_leaf + spines"),
            ("spine", topology.spines, topology.leaves, "spines", "leaves")]


def check_topology(topology: Topology) -> None:
    """The fabric's size within its DPID plan, OpenFlow port numbers, Linux interface names and
    this machine; checked before anything counts or names its nodes."""
    def refuse(name: str, allowed: str) -> SpecError:
        return not_allowed(f"topology.{name}", getattr(topology, name), allowed)

    if topology.kind == "file" or topology.file is not None:
        _check_file(topology)
    tiers = _tiers(topology)
    for prefix, count, _, sized_by, _ in tiers:
        if count > MAX_PER_TIER:
            makes = "" if count == getattr(topology, sized_by) else f"; this makes {count}"
            raise refuse(sized_by, f"at most {MAX_PER_TIER} {prefix} switches, the DPIDs of one tier{makes}")
    for prefix, _, ports, _, ports_by in tiers:
        if ports > MAX_SWITCH_PORTS:
            raise refuse(ports_by.split(" ")[0], f"at most {MAX_SWITCH_PORTS} ports per switch, well inside "
                         f"OpenFlow's 0xff00; each {prefix} would have {ports}: {ports_by}")
    for prefix, count, ports, sized_by, _ in tiers:
        longest = f"{prefix}{count}-eth{ports}"
        if len(longest) > IFNAME_CHARS:
            raise refuse(sized_by, f"Linux interface names have at most {IFNAME_CHARS} characters; {longest} "
                         f"has {len(longest)}")
    hosts, switches = _host_count(topology), sum(tier[1] for tier in tiers)
    if hosts > MACHINE_HOSTS or switches > MACHINE_SWITCHES:
        if topology.kind in ("fattree", "file"):
            blamed = "k" if topology.kind == "fattree" else "file"
        elif hosts > MACHINE_HOSTS:
            blamed = "hosts_per_leaf" if topology.hosts_per_leaf >= topology.leaves else "leaves"
        else:
            blamed = "spines" if topology.spines >= topology.leaves else "leaves"
        raise refuse(blamed, f"one machine runs at most {MACHINE_HOSTS} hosts and {MACHINE_SWITCHES} switches; "
                     f"this makes {hosts} hosts and {switches} switches")



def _check_file(topology: Topology) -> None:
    """A fabric file given with kind file, without the built-in kinds' shape knobs, and readable."""
    if topology.file is None:
        raise SpecError("topology.file", "missing (kind file: the fabric file's path)")
    if topology.kind != "file":
        raise not_allowed("topology.kind", topology.kind, "file, or left out, with topology.file")
    defaults = {field.name: field.default for field in dataclasses.fields(topology)}
    for name in SHAPE_KNOBS:
        if getattr(topology, name) != defaults[name]:
            raise not_allowed(f"topology.{name}", getattr(topology, name),
                              "left out with topology.file: the file gives the fabric's shape")
    try:
        read_fabric(topology.file)
    except FabricFileError as error:
        raise SpecError("topology.file", f"{show(topology.file)}: {error}") from None
