"""What a run's job sends where in one iteration, and the bounds that traffic puts on an iteration.

The traffic is the job's own, from its layer sizes and mode: an all-reduce sends what its algorithm's
schedule sends (hostapps/allreduce: the ring sends 2(n-1)/n of the model from each worker to the next),
the whole model as one unit, tick by tick as the workers run it (allreduce_ticks); a parameter-server
worker pushes each shard its layers (as hostapps/collectives.assign_shards places them) and pulls them
back (inference: pulls only). A host pair's bytes split evenly over the fabric's shortest paths (what
spraying does per packet and ECMP does on average over flows; `single` puts each pair on one of them,
which only loads links more), framing at the MTU included. Background flows, faults and
retransmissions are not counted.

The bounds:
- comm_bound_s, the run's lower bound on an iteration's communication (runs.csv's lower_bound_s):
  for an all-reduce the alpha-beta cost of its algorithm, tick by tick: each tick costs the busiest
  link direction's bytes at its rate (bandwidth: host links at host_bw, uplinks at fabric_bw, so an
  algorithm that crosses the spines pays for an oversubscribed fabric) plus the latency of its
  slowest message (alpha: its last frame, at most an MTU, stored and forwarded by every switch on its
  path); for a parameter server comm_lower_bound_s, the fluid bound (host links only, equal shards);
- link_bound_s: the busiest link direction of the whole fabric over the iteration, host links at
  host_bw and switch links at fabric_bw, shards by their real bytes;
- tail_comm_s: what must still cross after the last gradient is computed: the front layer (ready
  last in backprop, needed first in the next forward pass) pushed by every worker into its shard,
  and pulled back by every worker once all are in (PS; when sliced, only the last slice's pull
  waits; inference pulls only), or all-reduced (the busiest worker's bytes of it).
metrics.run_metrics combines them with the measured compute: max(link bound, compute + tail).
"""
from __future__ import annotations

from collections import defaultdict
from functools import cache
from typing import Sequence

from common.frames import ETHERNET_HEADER_BYTES
from experiments.spec import Run, Topology, layout_of
from experiments.spec.topology import shortest_paths_from
from experiments.spec.checks import worker_leaves
from hostapps.allreduce import ALLREDUCES, AllReduce, make_allreduce
from hostapps.codec import DATAGRAM_HEADER_BYTES
from hostapps.collectives import assign_shards
from hostapps.mlt import IP_UDP_HEADER_BYTES, payload_for_mtu
from topologies.layout import Layout

LinkKey = frozenset  # a link as the pair of its end nodes' names
Direction = tuple[str, str]  # a link's direction: (from node, to node)
Message = tuple[str, str, int]  # a message of the job: from host, to host, payload bytes
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


def allreduce_of(run: Run) -> AllReduce:
    """The run's all-reduce algorithm over its workers, as the host apps build it."""
    job = run.job
    return make_allreduce(job.collective, len(run.config.worker_hosts),
                          worker_leaves(run.config) if ALLREDUCES[job.collective].follows_leaves else [])


def allreduce_ticks(run: Run, unit_bytes: int) -> list[list[Message]]:
    """The messages of one all-reduce of a unit of `unit_bytes` (the whole model: an upper bound on any
    unit, which costs every piece of it one latency at most), tick by tick as the workers run it: cut into
    segments as the worker cuts a unit (hostapps.worker.AllReduceSync.communicate), segment k one tick
    behind segment k-1 (hostapps.allreduce.run_allreduce)."""
    job, workers = run.job, run.config.worker_hosts
    algorithm = allreduce_of(run)
    bounds = algorithm.segments(unit_bytes // 4, job.partition_bytes // 4, payload_for_mtu(run.topology.mtu) // 4,
                                pipeline=job.order == "caramel")
    schedules = {hi - lo: [algorithm.rounds(rank, hi - lo) for rank in range(len(workers))] for lo, hi in bounds}
    depth = len(next(iter(schedules.values()))[0])
    ticks = []
    for tick in range(len(bounds) + depth - 1 if depth else 0):
        messages = []
        for k in range(max(0, tick - depth + 1), min(tick, len(bounds) - 1) + 1):
            for rank, rounds in enumerate(schedules[bounds[k][1] - bounds[k][0]]):
                messages += [(workers[rank], workers[t.peer], 4 * (t.hi - t.lo)) for t in rounds[tick - k].sends]
        ticks.append(messages)
    return ticks


def _link_mbps(topology: Topology, hosts: set[str], direction: Direction, speeds: dict[frozenset, float]) -> float:
    """A link direction's rate: host_bw at a host, fabric_bw times the link's speed between switches
    (a fabric file may run a link slower than its tier; speeds: link names -> speed)."""
    if direction[0] in hosts or direction[1] in hosts:
        return topology.host_bw
    return topology.fabric_bw * speeds[frozenset(direction)]


def _speeds(layout: Layout) -> dict[frozenset, float]:
    return {link.names: link.speed for link in layout.links}


def tick_seconds(run: Run, ticks: list[list[Message]]) -> list[tuple[float, float]]:
    """Each tick's cost in the alpha-beta model, (latency, transfer): the latency of its slowest message
    (its last frame, at most an MTU, through every link after the first: each switch stores and forwards
    it) and the transfer of its busiest link direction (all the tick's bytes over it, at its rate)."""
    topology = run.topology
    layout, wire = layout_of(topology), wire_bytes_per_payload_byte(topology.mtu, run.job.transport)
    hosts, speeds = {node.name for node in layout.hosts}, _speeds(layout)
    frame_bits = (topology.mtu + ETHERNET_HEADER_BYTES) * 8
    costs = []
    for messages in ticks:
        carried: dict[Direction, float] = defaultdict(float)
        latency = 0.0
        for src, dst, nbytes in messages:
            for direction, share in path_shares(layout, src, dst).items():
                carried[direction] += nbytes * wire * share
            hops = shortest_paths_from(layout, src)[0][dst]
            last_frame = min(nbytes * wire * 8, frame_bits) if nbytes else 0
            latency = max(latency, last_frame * ((hops - 2) / topology.fabric_bw + 1 / topology.host_bw) / 1e6)
        busiest = max((sent * 8 / (_link_mbps(topology, hosts, direction, speeds) * 1e6)
                       for direction, sent in carried.items()), default=0.0)
        costs.append((latency, busiest))
    return costs


def comm_bound_s(run: Run, sizes: Sequence[int]) -> float:
    """The analytical bound on one iteration's communication. An all-reduce's: no faster than its busiest
    link direction carries all its algorithm's bytes (link_bound_s), nor than one unit's rounds follow each
    other, each at least the latency of its slowest message's last frame (tick_seconds). The two do not
    add up: while one unit's round waits for its last frame, another unit's bytes may use the links, as
    the send loop overlaps the layers' all-reduces. alpha_beta_s is the cost of one all-reduce alone. A
    parameter server's: the fluid bound (comm_lower_bound_s)."""
    config = run.config
    if run.job.mode != "allreduce":
        return comm_lower_bound_s(run.job.mode, sum(sizes), config.topology.host_bw, len(config.worker_hosts),
                                  max(1, len(config.server_hosts)), config.topology.mtu, run.job.transport)
    latency = sum(latency for latency, _ in tick_seconds(run, allreduce_ticks(run, sum(sizes))))
    return max(link_bound_s(run, sizes), latency)


def alpha_beta_s(run: Run, unit_bytes: int) -> float:
    """The alpha-beta cost of one all-reduce of `unit_bytes` alone: round by round, the latency of its
    slowest message's last frame and the transfer of its busiest link direction."""
    return sum(latency + busiest for latency, busiest in tick_seconds(run, allreduce_ticks(run, unit_bytes)))


def host_traffic(run: Run, sizes: Sequence[int]) -> dict[Direction, float]:
    """Bytes on the wire from host to host in one iteration of the run's job (sizes: layer bytes)."""
    config = run.config
    wire = wire_bytes_per_payload_byte(config.topology.mtu, run.job.transport)
    workers, servers = config.worker_hosts, config.server_hosts
    traffic: dict[Direction, float] = defaultdict(float)
    if run.job.mode == "allreduce":
        for messages in allreduce_ticks(run, sum(sizes)):
            for src, dst, nbytes in messages:
                traffic[src, dst] += nbytes * wire
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
def path_shares(layout: Layout, src: str, dst: str) -> dict[Direction, float]:
    """The share of src -> dst traffic each link direction carries, split evenly over the shortest paths."""
    (hops_src, paths_src), (hops_dst, paths_dst) = shortest_paths_from(layout, src), shortest_paths_from(layout, dst)
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
    seconds = [sent * 8 / (_link_mbps(topology, hosts, direction, _speeds(layout)) * 1e6)
               for direction, sent in directed_traffic(run, sizes).items()]
    return max(seconds, default=0.0)


def tail_comm_s(run: Run, sizes: Sequence[int]) -> float:
    """Seconds of communication that cannot overlap the iteration's compute, at host_bw: the front
    layer's n pushes into its shard's link and n pulls out of it (only its last slice's pulls when
    sliced), or its all-reduce (the bytes the busiest worker sends or receives)."""
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
    carried: dict[tuple[str, str], int] = defaultdict(int)
    for messages in allreduce_ticks(run, front):
        for src, dst, nbytes in messages:
            carried[src, "out"] += nbytes
            carried[dst, "in"] += nbytes
    return max(carried.values(), default=0) * seconds_per_byte
