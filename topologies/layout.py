"""The fabric's layout, the one place that says how a fabric is named and wired: node names, DPIDs,
port numbers, addresses, and which port faces what. Plain data, no Mininet: the Topos
(topologies/leafspine.py) build from it, and spec validation, metrics and tests read it.

Conventions (deterministic, so runs and logs compare across builds):
  * names spine1.., leaf1.. (fat-tree: core1.., agg1.., edge1..), hosts h1..hN leaf by leaf;
  * DPIDs 0x1000+i for leaves/edges, 0x2000+i for spines/cores, 0x3000+i for aggregation;
  * a leaf's ports 1..hosts face its hosts and the next ones its spines; spine port j faces leaf j;
    an edge's ports 1..k/2 face its hosts, the next ones its pod's aggregation switches; an
    aggregation switch's ports 1..k/2 face its pod's edges, the next ones its cores; core port p
    faces pod p;
  * host n has IP 10.0.0.0 + n (/8) and MAC 00:00:00:00:hh:ll (n in its last two bytes).

A fabric file (topologies/files.py) keeps these conventions for the tiers it declares; its links may
run slower or faster than their tier's rate (`Link.speed`).
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass

LEAF_DPID, SPINE_DPID, AGG_DPID = 0x1000, 0x2000, 0x3000
MAX_PER_TIER = 0xFFF  # switches of one tier, so the DPID ranges never meet
MAX_HOSTS = (1 << 24) - 2  # host addresses in 10.0.0.0/8
HOST_ROLE = "host"
LEAF_ROLES = ("leaf", "edge")  # switches whose hosts hang off them


@dataclass(frozen=True)
class Node:
    name: str
    role: str  # host, leaf, spine, edge, agg, core
    number: int  # n of hn, i of leafi ...

    @property
    def is_switch(self) -> bool:
        return self.role != HOST_ROLE

    @property
    def dpid(self) -> int:
        base = {"leaf": LEAF_DPID, "edge": LEAF_DPID, "spine": SPINE_DPID, "core": SPINE_DPID,
                "agg": AGG_DPID}[self.role]
        return base + self.number

    @property
    def ip(self) -> str:
        return str(ipaddress.IPv4Address(0x0A000000 + self.number))

    @property
    def mac(self) -> str:
        return ":".join(f"{byte:02x}" for byte in self.number.to_bytes(6, "big"))


@dataclass(frozen=True)
class Link:
    """A link between a's port_a and b's port_b (a host's port is 0); tier host or fabric. Its rate is
    its tier's (host_bw, fabric_bw) times `speed`."""
    a: Node
    port_a: int
    b: Node
    port_b: int
    speed: float = 1.0

    @property
    def tier(self) -> str:
        return HOST_ROLE if HOST_ROLE in (self.a.role, self.b.role) else "fabric"

    @property
    def names(self) -> frozenset[str]:
        return frozenset({self.a.name, self.b.name})


@dataclass(frozen=True)
class Layout:
    nodes: tuple[Node, ...]
    links: tuple[Link, ...]

    @property
    def hosts(self) -> list[Node]:
        return [node for node in self.nodes if not node.is_switch]

    @property
    def switches(self) -> list[Node]:
        return [node for node in self.nodes if node.is_switch]

    def node(self, name: str) -> Node:
        return next(node for node in self.nodes if node.name == name)

    def ports(self, name: str) -> dict[int, Node]:
        """A node's ports and what each faces."""
        ports = {}
        for link in self.links:
            if link.a.name == name:
                ports[link.port_a] = link.b
            if link.b.name == name:
                ports[link.port_b] = link.a
        return ports

    def interface(self, name: str, port: int) -> str:
        """Mininet's name of a node's interface at a port."""
        return f"{name}-eth{port}"


def _node(role: str, number: int) -> Node:
    return Node(f"h{number}" if role == HOST_ROLE else f"{role}{number}", role, number)


def leaf_spine(spines: int, leaves: int, hosts: int) -> Layout:
    """`spines` x `leaves` with `hosts` per leaf (sizes checked by the caller)."""
    spine_nodes = [_node("spine", s) for s in range(1, spines + 1)]
    nodes, links = list(spine_nodes), []
    for leaf_number in range(1, leaves + 1):
        leaf = _node("leaf", leaf_number)
        nodes.append(leaf)
        for port in range(1, hosts + 1):
            host = _node(HOST_ROLE, (leaf_number - 1) * hosts + port)
            nodes.append(host)
            links.append(Link(leaf, port, host, 0))
        for s, spine in enumerate(spine_nodes, start=1):
            links.append(Link(leaf, hosts + s, spine, leaf_number))
    return Layout(tuple(nodes), tuple(links))


def fat_tree(k: int) -> Layout:
    """A k-ary fat-tree (Al-Fares et al.): k pods of k/2 edge and k/2 aggregation switches, (k/2)^2
    cores, k/2 hosts per edge; aggregation switch a of every pod links cores (a-1)k/2+1 .. a*k/2."""
    half = k // 2
    cores = [_node("core", c) for c in range(1, half * half + 1)]
    nodes, links, host_number = list(cores), [], 0
    for pod in range(k):
        aggs = [_node("agg", pod * half + a) for a in range(1, half + 1)]
        nodes += aggs
        for e in range(1, half + 1):
            edge = _node("edge", pod * half + e)
            nodes.append(edge)
            for port in range(1, half + 1):
                host_number += 1
                host = _node(HOST_ROLE, host_number)
                nodes.append(host)
                links.append(Link(edge, port, host, 0))
            for a, agg in enumerate(aggs, start=1):
                links.append(Link(edge, half + a, agg, e))
        for a, agg in enumerate(aggs, start=1):
            for c in range(half):
                links.append(Link(agg, half + 1 + c, cores[(a - 1) * half + c], pod + 1))
    return Layout(tuple(nodes), tuple(links))
