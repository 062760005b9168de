"""`python -m experiments plan SPEC`: where a spec's fabrics land and what crosses between servers.

For each fabric the runs share: which server each node lands on (topologies/cluster.py, the
placement the run will use), the links that cross servers (each a gretap tunnel over the machines'
own network), and for each run the bytes one iteration sends over those links, with the rate they
need when an iteration runs at its analytical bound: what the servers' network must carry.

The traffic is the job's own, from its model and mode: ring all-reduce sends 2(n-1)/n of the model
from each worker to the next; a parameter-server worker pushes each shard its layers and pulls them
back. A host pair's bytes split evenly over the fabric's shortest paths (what spraying does per
packet and ECMP does on average over flows; `single` puts each pair on one of them), framing at the
MTU included. Background flows and retransmissions are not counted.
"""
from __future__ import annotations

import itertools
from collections import defaultdict
from functools import cache

from experiments.metrics import wire_bytes_per_payload_byte
from experiments.runner import _fabric_key, layer_table, lower_bound_s
from experiments.spec import Run, Spec, layout_of
from hostapps.collectives import assign_shards
from topologies.cluster import LOCAL, crossing_links, placement
from topologies.layout import Layout

LinkKey = frozenset  # a link as the pair of its end nodes' names


def host_traffic(run: Run) -> dict[tuple[str, str], float]:
    """Bytes on the wire from host to host in one iteration of the run's job."""
    config = run.config
    sizes = [layer["bytes"] for layer in layer_table(run)]
    wire = wire_bytes_per_payload_byte(config.topology.mtu, run.job.transport)
    workers, servers = config.worker_hosts, config.server_hosts
    traffic: dict[tuple[str, str], float] = defaultdict(float)
    if run.job.mode == "allreduce":
        n = len(workers)
        for rank, host in enumerate(workers):
            if n > 1:
                traffic[host, workers[(rank + 1) % n]] += 2 * (n - 1) / n * sum(sizes) * wire
    else:
        owners = assign_shards(sizes, len(servers))
        for shard, server in enumerate(servers):
            shard_bytes = sum(size for size, owner in zip(sizes, owners) if owner == shard) * wire
            for worker in workers:
                traffic[worker, server] += shard_bytes
                traffic[server, worker] += shard_bytes
    return dict(traffic)


@cache
def _paths_from(layout: Layout, source: str) -> tuple[dict[str, int], dict[str, int]]:
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


def path_shares(layout: Layout, src: str, dst: str) -> dict[LinkKey, float]:
    """The share of src -> dst traffic each link carries, split evenly over the shortest paths."""
    (hops_src, paths_src), (hops_dst, paths_dst) = _paths_from(layout, src), _paths_from(layout, dst)
    total, distance = paths_src[dst], hops_src[dst]
    shares: dict[LinkKey, float] = {}
    for link in layout.links:
        for near, far in ((link.a.name, link.b.name), (link.b.name, link.a.name)):
            if near in hops_src and far in hops_dst and hops_src[near] + 1 + hops_dst[far] == distance:
                shares[link.names] = shares.get(link.names, 0.0) + paths_src[near] * paths_dst[far] / total
    return shares


def link_traffic(run: Run) -> dict[LinkKey, float]:
    """Bytes each link of the fabric carries in one iteration (both directions)."""
    layout = layout_of(run.topology)
    carried: dict[LinkKey, float] = defaultdict(float)
    for (src, dst), sent in host_traffic(run).items():
        for link, share in path_shares(layout, src, dst).items():
            carried[link] += sent * share
    return dict(carried)


def plan_text(spec: Spec) -> str:
    """What `plan` prints: per fabric its placement and crossing links, per run its crossing traffic."""
    fabrics = [list(runs) for _, runs in itertools.groupby(spec.runs, _fabric_key)]
    lines = [f"{spec.name}: {len(spec.runs)} runs on {len(fabrics)} fabric(s)"]
    for number, runs in enumerate(fabrics, start=1):
        config = runs[0].config
        layout = layout_of(config.topology)
        servers = config.cluster.servers or [LOCAL]
        where = placement(layout, servers, config.cluster.placement)
        crossing = crossing_links(layout, where)
        topology = config.topology
        shape = (f"k={topology.k} fat-tree" if topology.kind == "fattree"
                 else f"{topology.spines}x{topology.leaves}x{topology.hosts_per_leaf} leaf-spine")
        lines += ["", f"fabric {number}: {shape}, {len(layout.hosts)} hosts, {len(layout.switches)} switches; "
                  f"placement {config.cluster.placement} on {len(servers)} server(s)"]
        width = max(map(len, servers))
        for server in servers:
            names = [name for name in where if where[name] == server]
            switches = [name for name in names if layout.node(name).is_switch]
            lines.append(f"  {server:<{width}}  {len(switches)} switches, {len(names) - len(switches)} hosts: "
                         f"{' '.join(names)}")
        shown = ", ".join(f"{link.a.name}-{link.b.name}" for link in crossing[:12])
        more = f" and {len(crossing) - 12} more" if len(crossing) > 12 else ""
        lines.append(f"  links crossing servers: {len(crossing)} of {len(layout.links)}"
                     + (f" ({shown}{more})" if crossing else ""))
        crossing_keys = {link.names for link in crossing}
        lines.append("  run: bytes per iteration over crossing links (busiest link) -> Mbit/s at the bound")
        run_width = max(len(run.run_id) for run in runs)
        for run in runs:
            carried = link_traffic(run)
            across = {link: sent for link, sent in carried.items() if link in crossing_keys}
            total, busiest = sum(across.values()), max(across.values(), default=0.0)
            bound = lower_bound_s(run)
            lines.append(f"  {run.run_id:<{run_width}}  {total / 1e6:8.2f} MB ({busiest / 1e6:.2f} MB)"
                         f" -> {total * 8 / bound / 1e6:8.1f} Mbit/s ({busiest * 8 / bound / 1e6:.1f})"
                         f" in {bound * 1e3:.1f} ms")
    return "\n".join(lines)
