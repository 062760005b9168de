"""What a run's job sends where in one iteration, and the bounds that traffic puts on an iteration.

The traffic is the job's own, from its layer sizes and mode: ring all-reduce sends 2(n-1)/n of the
model from each worker to the next; a parameter-server worker pushes each shard its layers (as
hostapps/collectives.assign_shards places them) and pulls them back (inference: pulls only). A host
pair's bytes split evenly over the fabric's shortest paths (what spraying does per packet and ECMP
does on average over flows; `single` puts each pair on one of them, which only loads links more),
framing at the MTU included. Background flows, faults and retransmissions are not counted.

Three bounds: comm_lower_bound_s, the fluid one (host links only, equal shards), and two more:
- link_bound_s: the busiest link direction of the whole fabric, host links at host_bw and switch
  links at fabric_bw, shards by their real bytes;
- tail_comm_s: what must still cross after the last gradient is computed: the front layer (ready
  last in backprop, needed first in the next forward pass) pushed by every worker into its shard,
  and pulled back by every worker once all are in (PS; when sliced, only the last slice's pull
  waits; inference pulls only), or reduced around the ring (all-reduce).
metrics.run_metrics combines them with the measured compute: max(link bound, compute + tail).
"""
from __future__ import annotations

from collections import defaultdict
from functools import cache
from typing import Sequence

from common.frames import ETHERNET_HEADER_BYTES
from experiments.spec import Run, layout_of
from hostapps.codec import DATAGRAM_HEADER_BYTES
from hostapps.collectives import assign_shards
from hostapps.mlt import IP_UDP_HEADER_BYTES, payload_for_mtu
from topologies.layout import Layout

LinkKey = frozenset  # a link as the pair of its end nodes' names
Direction = tuple[str, str]  # a link's direction: (from node, to node)
TCP_IP_HEADER_BYTES = 52  # IPv4 20 + TCP 20 + the timestamp option 12


def wire_bytes_per_payload_byte(mtu: int, transport: str) -> float:
    """What a link carries (Ethernet frames, as the shapers count them) per byte of tensor payload,
    with full-size packets: TCP segments of mtu - 52 bytes, mlt datagrams of payload_for_mtu."""
    if transport == "tcp":
        return (mtu + ETHERNET_HEADER_BYTES) / (mtu - TCP_IP_HEADER_BYTES)
    if transport == "mlt":
        payload = payload_for_mtu(mtu)
        return (payload + DATAGRAM_HEADER_BYTES + IP_UDP_HEADER_BYTES + ETHERNET_HEADER_BYTES) / payload
    raise ValueError(f"transport: {transport!r} is not allowed (tcp or mlt)")


def comm_lower_bound_s(mode: str, model_bytes: float, host_bw_mbps: float,
                       workers: int, servers: int, mtu: int, transport: str) -> float:
    """Analytical lower bound on one iteration's communication time, framing at the MTU included.

    Ring all-reduce: every worker sends and receives 2(n-1)/n of the model over its link.
    Parameter server with k shards: every worker pushes the whole model (S/B) and the shards
    together receive n models over k links (n*S/(k*B)).
    """
    rate_bytes_per_s = host_bw_mbps * 1e6 / 8
    seconds_per_model = model_bytes * wire_bytes_per_payload_byte(mtu, transport) / rate_bytes_per_s
    if mode == "allreduce":
        return 2 * (workers - 1) / workers * seconds_per_model
    if mode == "ps":
        return max(seconds_per_model, workers * seconds_per_model / servers)
    raise ValueError(f"mode: {mode!r} is not allowed (allreduce or ps)")


def host_traffic(run: Run, sizes: Sequence[int]) -> dict[Direction, float]:
    """Bytes on the wire from host to host in one iteration of the run's job (sizes: layer bytes)."""
    config = run.config
    wire = wire_bytes_per_payload_byte(config.topology.mtu, run.job.transport)
    workers, servers = config.worker_hosts, config.server_hosts
    traffic: dict[Direction, float] = defaultdict(float)
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
                if run.job.task == "train":  # inference pulls only
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


def path_shares(layout: Layout, src: str, dst: str) -> dict[Direction, float]:
    """The share of src -> dst traffic each link direction carries, split evenly over the shortest paths."""
    (hops_src, paths_src), (hops_dst, paths_dst) = _paths_from(layout, src), _paths_from(layout, dst)
    total, distance = paths_src[dst], hops_src[dst]
    shares: dict[Direction, float] = {}
    for link in layout.links:
        for near, far in ((link.a.name, link.b.name), (link.b.name, link.a.name)):
            if near in hops_src and far in hops_dst and hops_src[near] + 1 + hops_dst[far] == distance:
                shares[near, far] = shares.get((near, far), 0.0) + paths_src[near] * paths_dst[far] / total
    return shares


def directed_traffic(run: Run, sizes: Sequence[int]) -> dict[Direction, float]:
    """Bytes each link direction of the fabric carries in one iteration."""
    layout = layout_of(run.topology)
    carried: dict[Direction, float] = defaultdict(float)
    for (src, dst), sent in host_traffic(run, sizes).items():
        for direction, share in path_shares(layout, src, dst).items():
            carried[direction] += sent * share
    return dict(carried)


def link_traffic(run: Run, sizes: Sequence[int]) -> dict[LinkKey, float]:
    """Bytes each link of the fabric carries in one iteration (both directions)."""
    carried: dict[LinkKey, float] = defaultdict(float)
    for direction, sent in directed_traffic(run, sizes).items():
        carried[frozenset(direction)] += sent
    return dict(carried)


def link_bound_s(run: Run, sizes: Sequence[int]) -> float:
    """Seconds the busiest link direction needs for one iteration's traffic at its rate."""
    topology = run.config.topology
    layout = layout_of(topology)
    hosts = {node.name for node in layout.hosts}
    speed = {link.names: link.speed for link in layout.links}
    seconds = [sent * 8 / ((topology.host_bw if hosts & set(direction) else topology.fabric_bw)
                           * speed[frozenset(direction)] * 1e6)
               for direction, sent in directed_traffic(run, sizes).items()]
    return max(seconds, default=0.0)


def tail_comm_s(run: Run, sizes: Sequence[int]) -> float:
    """Seconds of communication that cannot overlap the iteration's compute, at host_bw: the front
    layer's n pushes into its shard's link and n pulls out of it (only its last slice's pulls when
    sliced), or its ring reduction."""
    config, job = run.config, run.job
    if not sizes:
        return 0.0
    seconds_per_byte = wire_bytes_per_payload_byte(config.topology.mtu, job.transport) * 8 / (
        config.topology.host_bw * 1e6)
    front, n = sizes[0], len(config.worker_hosts)
    if job.mode == "ps":
        pulled = min(front, job.ps_slice_bytes) if job.ps_slice_bytes else front
        pushed = front if job.task == "train" else 0
        return n * (pushed + pulled) * seconds_per_byte
    return 2 * (n - 1) / n * front * seconds_per_byte
