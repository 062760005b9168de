"""Source ports drawn from a run's seed: per-flow ECMP places a run's flows alike in every run
with that seed, so schemes are compared on the same placement.

Per-flow ECMP hashes each flow's 5-tuple onto one spine, and the flows that collide on an
uplink share it: in the headline's all-reduce, runs of one configuration ranged 0.33-0.90 s an
iteration, mostly by placement, so "scheme X vs the baseline" over three repetitions was decided by
which runs drew the collisions. Addresses and listening ports are the same in every run; with the
dialing ports drawn from the seed too, repetition r of every scheme (seeds grow by one per
repetition) puts each flow on the same spine as repetition r of the baseline, and the repetitions
still sample different placements. mlt on a per-flow fabric sends every datagram from its block's
first port (a flow per peer; hostapps.mlt.transport): its flows are other 5-tuples than TCP's (UDP, and
to its peers' datagram ports), so they take their own placement, the same for every mlt scheme of a
repetition. What placement leaves is TCP against the bulk flows on a shared
uplink: on one placement, runs of one configuration still differed by up to 30%. Spraying schemes
hash every packet anew, so they gain nothing from it and lose nothing.

Each process (servers first, then workers, by rank) and each background flow's client gets a block
of BLOCK_PORTS ports (a process dials its j-th TCP peer from the block's start + j), below Linux's
default ephemeral range (32768-60999) and clear of the job's (7000, 7100) and iperf3's (5201 up)
listening ports.
"""
import random

from experiments.spec import RunConfig

FIRST_PORT = 20000
BLOCK_PORTS = 64
BLOCKS = (32768 - FIRST_PORT) // BLOCK_PORTS


def source_port_blocks(seed: int, count: int) -> list[int]:
    """The first port of each of `count` distinct blocks, the same for the same seed; past BLOCKS of
    them, 0 (ephemeral ports: those flows are placed by chance)."""
    drawn = random.Random(seed).sample(range(BLOCKS), min(count, BLOCKS))
    return [FIRST_PORT + BLOCK_PORTS * block for block in drawn] + [0] * max(0, count - BLOCKS)


def run_source_ports(config: RunConfig) -> tuple[list[int], list[int]]:
    """A run's source-port blocks, from its job's seed: one per process (servers, then workers, by rank)
    and one per background flow client (flows in order, each flow's sources in order)."""
    processes = len(config.server_hosts) + len(config.worker_hosts)
    clients = sum(1 if isinstance(flow.src, str) else len(flow.src) for flow in config.background)
    blocks = source_port_blocks(config.job.seed, processes + clients)
    return blocks[:processes], blocks[processes:]
