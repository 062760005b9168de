"""Ring all-reduce: reduce-scatter, then all-gather, around the ranks in rank order."""
from __future__ import annotations

from functools import cache
from typing import Callable, Sequence

import numpy as np

from hostapps.allreduce.schedule import (AllReduce, Round, Rounds, Segment, Transfer, chunk_bounds,
                                         register_allreduce, run_allreduce)
from hostapps.transport import Peer, Transport


def ring_neighbours(rank: int, world: int) -> tuple[Peer, Peer]:
    """(left, right) workers of `rank` on the ring."""
    return Peer("worker", (rank - 1) % world), Peer("worker", (rank + 1) % world)


def ring_rounds(index: int, count: int, size: int, rank_of: Callable[[int], int] = int,
                first_step: int = 0, bounds: Sequence[tuple[int, int]] = ()) -> list[Round]:
    """The rounds of member `index` of a ring of `count` members (member i is rank rank_of(i)), its
    messages' steps from first_step: count - 1 rounds of reduce-scatter, then count - 1 of all-gather.
    Each round sends one of `count` chunks (`bounds`, by default near-equal ones of range(size)) to the
    right neighbour and receives one from the left; member i finishes chunk i + 1."""
    bounds = bounds or chunk_bounds(size, count)
    left, right = rank_of((index - 1) % count), rank_of((index + 1) % count)
    rounds = Rounds(2 * (count - 1))
    for step in range(count - 1):
        rounds.send(step, Transfer(right, first_step + step, *bounds[(index - step) % count], True))
        rounds.recv(step, Transfer(left, first_step + step, *bounds[(index - step - 1) % count], True))
        gather = count - 1 + step
        rounds.send(gather, Transfer(right, first_step + gather, *bounds[(index + 1 - step) % count], False))
        rounds.recv(gather, Transfer(left, first_step + gather, *bounds[(index - step) % count], False))
    rounds.finish(count - 2, *bounds[(index + 1) % count])
    return rounds.done()


@register_allreduce("ring")
class Ring(AllReduce):
    """Each of the 2(n-1) rounds sends one of n chunks to the right neighbour and receives one from the
    left, so every rank sends and receives 2(n-1)/n of the segment: bandwidth-optimal, with 2(n-1)
    latencies.  Rank order is leaf order on our fabrics, so only one ring edge per leaf crosses the spines.

    Loss: the reduce-scatter's partial sums tolerate it, the all-gather is exact.  A partial sum may arrive
    short (at least 1 - loss_bound of it), its missing elements zero.  The rule is zero-fill: such an
    element of the sum lacks the contributions that partial sum carried (up to n-1 of them) and is still
    divided by n, so the step shrinks there, as if those workers skipped it (MLT, NSDI'24, zero-fills lost
    gradient bytes too).  Averaging over the contributions that arrived would need each element's count to
    travel with the partial sum (a partial sum does not say how many contributions it holds): a second
    message per hop or a quarter more bytes, so not here (the parameter server, whose every push is one
    contribution, does average over arrivals).  OptiReduce (NSDI'25) lets both rounds of its Transpose
    AllReduce go over a bounded-loss transport and spreads lost entries with a Hadamard transform; we bound
    loss in the reduce phase only and have no Hadamard transform.
    """

    def __init__(self, world: int, leaves=()):
        super().__init__(world, leaves)
        self.steps, self.reduce_steps, self.parts = 2 * (world - 1), world - 1, world

    def peers(self, rank: int) -> set[int]:
        return {(rank - 1) % self.world, (rank + 1) % self.world} - {rank}

    def schedule(self, rank: int, size: int) -> list[Round]:
        return ring_rounds(rank, self.world, size)


def ring_allreduce(transport: Transport, left: Peer, right: Peer, rank: int, world: int, iteration: int, tensor: int,
                   flat: np.ndarray, scratch: np.ndarray | None = None) -> None:
    """Replace `flat` in place by its mean over the ring (messages keyed (iteration, tensor, step)).  `left` and
    `right` are ring_neighbours(rank, world): the ring's schedule names them itself."""
    assert (left, right) == ring_neighbours(rank, world), "the ring's neighbours are fixed by rank order"
    run_allreduce(transport, ring_of(world), rank, iteration, [Segment(tensor, 0, flat)], scratch)


@cache
def ring_of(world: int) -> Ring:
    """The ring of `world` ranks, its schedules written once."""
    return Ring(world)


def ring_phase(world: int, step: int) -> str:
    """REDUCE or GATHER: the half of a ring all-reduce (of any segment of a pipeline) a message step is in."""
    return ring_of(world).phase(step)
