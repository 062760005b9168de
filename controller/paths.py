"""Paths per job, after Crux's path selection (Cao et al., SIGCOMM'24, section 4.1): under a sharing
policy that chooses paths (`intensity-paths`, controller/sharing.py), the jobs are taken in their
intensity ranking, the most intense first, and each job's traffic between two of its hosts on
different switches is put on the least loaded of the shortest paths, given the load the jobs before
it were put on. The switches then carry a pin per host pair where they have a choice (a higher
priority than the destination routes: controller/pipeline.py), so the rest of the traffic keeps to
`controller.lb`.

The choice is greedy, one host pair at a time:
- the pairs in order: jobs by intensity, the highest first (ties by id); a job's pairs by their load,
  the heaviest first (ties by addresses);
- a pair's load is its bytes of one iteration over the job's iteration period (controller/sharing.py
  `JobTiming.period_ms`, measured or modelled), so a job that sends the same bytes twice as often
  loads its links twice as much; the bytes are the job document's `traffic`, or, without it, each
  host's model bytes (the layer table's) spread evenly over the job's other hosts;
- a path's cost is the load already on its most loaded link direction, then the sum over its link
  directions (the shorter detour), then its ports in order (the same answer every time); every link
  is taken to be of one rate (the controller does not know the fabric's rates);
- the chosen path's link directions take the pair's load.

A job's traffic is what goes between two of its hosts: the runner never gives a host to two jobs,
and this holds whatever the transport (TCP connections, mlt's datagrams from any port) and whatever
DSCP the job's classes give it. Plain data in (the FabricView, the registered jobs), plain data out
(each pinned pair's hops, and per switch its pins): no OpenFlow here.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Collection, Sequence

from controller.routing import Output, distances_to, next_hop_ports
from controller.scheduling import RegisteredJob, sharing_of
from controller.sharing import SHARING_POLICIES, job_timing
from controller.topology import FabricView

# Shortest paths weighed per pair; a 4-spine leaf-spine has 4, a k=8 fat-tree 16 between pods.
MAX_CANDIDATES = 256
# Host pairs pinned in all, in the ranking's order (the rest keep to the routes): bounds the rules on
# a switch and the time a job's registration holds the controller (16 jobs of 128 hosts: 35 ms here).
MAX_PINNED_PAIRS = 1024

Hop = tuple[int, int]  # (dpid, the port the traffic leaves it by)


@dataclass(frozen=True)
class Demand:
    """A job's traffic from host `src` to host `dst`: `load` bytes per millisecond."""
    job: str
    src: str
    dst: str
    load: float


@dataclass(frozen=True)
class PinnedPath:
    """The path a job's traffic from `src` to `dst` is pinned to: the switches it leaves, each with
    its port, from the source's switch to the one before the destination's."""
    job: str
    src: str
    dst: str
    hops: tuple[Hop, ...]


def chooses_paths(jobs: Sequence[RegisteredJob]) -> bool:
    """Whether the jobs' sharing policy (every job names the same) chooses their paths."""
    return bool(jobs) and SHARING_POLICIES[jobs[0].sharing].chooses_paths


def host_pairs_traffic(job: RegisteredJob, known: Collection[str] | None = None
                       ) -> tuple[tuple[str, str, float], ...]:
    """The job's bytes of one iteration from host to host: its document's `traffic`, or each host's
    model bytes spread evenly over the job's other hosts; only between `known` hosts when given (a
    pair with a host not learnt yet has no path to choose)."""
    def known_host(host: str) -> bool:
        return known is None or host in known

    if job.traffic:
        return tuple(entry for entry in job.traffic if known_host(entry[0]) and known_host(entry[1]))
    peers = len(job.hosts) - 1
    model = sum(layer.bytes for layer in job.layers)
    hosts = [host for host in job.hosts if known_host(host)]
    return tuple((src, dst, model / peers) for src in hosts for dst in hosts if src != dst) if peers else ()


def demands(jobs: Sequence[RegisteredJob], intensity: dict[str, float],
            known: Collection[str] | None = None, limit: int | None = None) -> list[Demand]:
    """Every job's host pairs in the order they choose: the most intense job first, its heaviest pair
    first (between `known` hosts when given; the jobs' after the first `limit` pairs are left out)."""
    ordered: list[Demand] = []
    for job in sorted(jobs, key=lambda job: (-intensity[job.job], job.job)):
        if limit is not None and len(ordered) >= limit:
            break
        period = job_timing(job).period_ms
        pairs = [Demand(job.job, src, dst, sent / period if period > 0 else float(sent))
                 for src, dst, sent in host_pairs_traffic(job, known) if sent > 0]
        ordered += sorted(pairs, key=lambda demand: (-demand.load, demand.src, demand.dst))
    return ordered


def shortest_paths(view: FabricView, src: int, dst: int, dist: dict[int, int] | None = None,
                   limit: int = MAX_CANDIDATES) -> list[tuple[Hop, ...]]:
    """The shortest paths over live links from switch `src` to switch `dst`, each as its hops, in
    port order (at most `limit`; none when unreachable or `src` is `dst`)."""
    dist = distances_to(view, dst) if dist is None else dist
    found: list[tuple[Hop, ...]] = []

    def extend(here: int, hops: tuple[Hop, ...]) -> None:
        if here == dst:
            found.append(hops)
            return
        for port in sorted(next_hop_ports(view, here, dst, dist)):
            if len(found) >= limit:
                return
            extend(view.links[(here, port)][0], hops + ((here, port),))

    if src in dist and src != dst:
        extend(src, ())
    return found


def choose_paths(view: FabricView, jobs: Sequence[RegisteredJob]) -> list[PinnedPath]:
    """Each job's host pairs on their paths, when the jobs' sharing policy chooses paths (none
    otherwise). A pair whose hosts are not known yet, or share a switch, has no path."""
    if not chooses_paths(jobs):
        return []
    shared = sharing_of(jobs)
    load: dict[Hop, float] = defaultdict(float)
    dists: dict[int, dict[int, int]] = {}
    paths: dict[tuple[int, int], list[tuple[Hop, ...]]] = {}  # (src switch, dst switch) -> candidates
    chosen = []
    for demand in demands(jobs, shared.intensity, view.hosts.keys(), MAX_PINNED_PAIRS):
        src, dst = view.hosts[demand.src].dpid, view.hosts[demand.dst].dpid
        if src == dst:
            continue
        if len(chosen) >= MAX_PINNED_PAIRS:
            break
        if dst not in dists:
            dists[dst] = distances_to(view, dst)
        if (src, dst) not in paths:
            paths[src, dst] = shortest_paths(view, src, dst, dists[dst])
        candidates = paths[src, dst]
        if not candidates:
            continue
        hops = min(candidates, key=lambda path: (max(load[hop] for hop in path), sum(load[hop] for hop in path),
                                                 path))
        for hop in hops:
            load[hop] += demand.load
        chosen.append(PinnedPath(demand.job, demand.src, demand.dst, hops))
    return chosen


def pins_by_switch(view: FabricView, paths: Sequence[PinnedPath]) -> dict[int, dict[tuple[str, str], Output]]:
    """Switch -> (src, dst) -> the port the pair's traffic leaves by, on the switches of its path that
    have more than one shortest next hop towards the destination (elsewhere its route is the path)."""
    pins: dict[int, dict[tuple[str, str], Output]] = defaultdict(dict)
    dists: dict[int, dict[int, int]] = {}
    choice: dict[tuple[int, int], bool] = {}  # (switch, dst switch) -> more than one next hop
    for path in paths:
        dst = view.hosts[path.dst].dpid
        if dst not in dists:
            dists[dst] = distances_to(view, dst)
        for dpid, port in path.hops:
            if (dpid, dst) not in choice:
                choice[dpid, dst] = len(next_hop_ports(view, dpid, dst, dists[dst])) > 1
            if choice[dpid, dst]:
                pins[dpid][(path.src, path.dst)] = Output(port=port)
    return dict(pins)
