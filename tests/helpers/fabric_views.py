"""Hand-built FabricViews of the test fabrics (what the controller would have learnt), with the
DPID/port/address conventions of topologies/leafspine.py, and an independent BFS oracle."""
from __future__ import annotations

from collections import deque

from controller.topology import FabricView

LEAF, SPINE, AGG = 0x1000, 0x2000, 0x3000


def ip(n: int) -> str:
    return f"10.0.{n >> 8}.{n & 0xFF}"


def mac(n: int) -> str:
    return f"00:00:00:00:{n >> 8:02x}:{n & 0xFF:02x}"


def add_switch(view: FabricView, dpid: int, name: str, nports: int) -> None:
    view.add_switch(dpid, name, {p: (f"{name}-eth{p}", True) for p in range(1, nports + 1)})


def leaf_spine(spines: int, leaves: int, hosts: int) -> FabricView:
    """Leaf l: ports 1..hosts to hosts, hosts+s to spine s; spine s: port l to leaf l."""
    view = FabricView()
    for s in range(1, spines + 1):
        add_switch(view, SPINE + s, f"spine{s}", leaves)
    for leaf in range(1, leaves + 1):
        add_switch(view, LEAF + leaf, f"leaf{leaf}", hosts + spines)
        for port in range(1, hosts + 1):
            n = (leaf - 1) * hosts + port
            assert view.learn_host(ip(n), mac(n), LEAF + leaf, port)
        for s in range(1, spines + 1):
            assert view.add_link((LEAF + leaf, hosts + s), (SPINE + s, leaf))
    return view


def fat_tree(k: int = 4) -> FabricView:
    """k-ary fat-tree: edge ports 1..k/2 hosts, k/2+a agg a; agg ports 1..k/2 edges,
    k/2+1+c cores; core port pod+1 faces pod; agg a of a pod links cores (a-1)*k/2+1..a*k/2."""
    half = k // 2
    view = FabricView()
    for c in range(1, half * half + 1):
        add_switch(view, SPINE + c, f"core{c}", k)
    n = 0
    for pod in range(k):
        aggs = [AGG + pod * half + a for a in range(1, half + 1)]
        for a, agg in enumerate(aggs, start=1):
            add_switch(view, agg, f"agg{pod * half + a}", k)
            for c in range(half):
                assert view.add_link((agg, half + 1 + c), (SPINE + (a - 1) * half + c + 1, pod + 1))
        for e in range(1, half + 1):
            edge = LEAF + pod * half + e
            add_switch(view, edge, f"edge{pod * half + e}", k)
            for port in range(1, half + 1):
                n += 1
                assert view.learn_host(ip(n), mac(n), edge, port)
            for a, agg in enumerate(aggs, start=1):
                assert view.add_link((edge, half + a), (agg, e))
    return view


def hop_counts(view: FabricView, dst: int) -> dict[int, int]:
    """BFS over view.links only (not the module's own distances_to)."""
    adjacency: dict[int, set[int]] = {}
    for (a, _), (b, _) in view.links.items():
        adjacency.setdefault(a, set()).add(b)
    dist, queue = {dst: 0}, deque([dst])
    while queue:
        here = queue.popleft()
        for peer in adjacency.get(here, ()):
            if peer not in dist:
                dist[peer] = dist[here] + 1
                queue.append(peer)
    return dist
