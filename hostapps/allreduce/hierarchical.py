"""Hierarchical all-reduce: a reduce-scatter within each leaf, an all-reduce across the leaves of each
chunk among the ranks that hold it (one a leaf), an all-gather within each leaf (NCCL's and Horovod's
two-level all-reduce with leaves for nodes, every rank of a leaf in the cross-leaf phase as each of
NCCL's channels puts one)."""
from __future__ import annotations

import math
from typing import Sequence

from hostapps.allreduce.ring import ring_rounds
from hostapps.allreduce.schedule import AllReduce, Round, Rounds, Transfer, register_allreduce


def _moved(done: Round, offset: int, step_of) -> Round:
    """`done` with its element ranges shifted by `offset` and each message's step mapped by step_of."""
    def move(t: Transfer) -> Transfer:
        return t._replace(step=step_of(t.step), lo=t.lo + offset, hi=t.hi + offset)
    return Round(tuple(map(move, done.sends)), tuple(map(move, done.recvs)),
                 tuple((lo + offset, hi + offset) for lo, hi in done.scale))


@register_allreduce("hierarchical")
class Hierarchical(AllReduce):
    """Reduce-scatter within each leaf, all-reduce each chunk across the leaves, all-gather within each
    leaf; pipelined over segments of --partition-bytes.

    `leaves` gives each rank's leaf switch (the runner passes the layout's: --leaves).  The h ranks of a leaf
    run a ring's reduce-scatter over the leaf's h chunks of the segment, so each holds its leaf's sum of one
    chunk; the ranks holding the same elements on the L leaves (one a leaf) run a ring all-reduce of them
    across the spines; and each leaf runs a ring's all-gather of the finished chunks.  With h ranks on every
    leaf (n = hL) a rank sends and receives 2(h-1)/h of the segment within its leaf and 2(L-1)/(hL) across:
    2(n-1)/n in all, the flat ring's bytes, in 2(h-1) + 2(L-1) rounds where the ring takes 2(n-1).  Across
    the spines go h flows out of and h into each leaf, each carrying 2(L-1)/(hL) of the model: 2(L-1)/L of it
    a leaf, where the flat ring's one edge out of a leaf carries 2(n-1)/n.  (Reducing to one leader per leaf
    and running the leaders' ring would cross with the same bytes, but the leader's link would carry the
    leaf's sum in and the mean out besides: 2 models each way for 2 leaves, 1.2 times the ring's 5/3 for 6
    ranks.)

    Leaves of different sizes: the segment is cut into Q = lcm(leaf sizes) columns, a leaf of h ranks
    takes Q/h of them a chunk, and the cross-leaf rings run per piece (columns whose holder is the same on
    every leaf), so a rank alone on its leaf takes part in every piece's ring.  The smaller leaves' reduce-
    scatter ends, and their all-gather starts, with the largest one's.  A piece's messages are stepped
    apart (step: round x pieces + piece) so that two rings between the same two ranks never share a key.

    Loss: the reduce-scatters within and across the leaves tolerate it (zero-fill, as the ring's); the
    all-gathers are exact.  Each element's mean is finished by one rank of one cross-leaf ring and copied
    from there, so every rank ends bit-identical.
    """
    pipelined = True
    follows_leaves = True

    def __init__(self, world: int, leaves: Sequence[int] = ()):
        super().__init__(world, leaves)
        if len(self.leaves) != world:
            raise ValueError(f"the hierarchical all-reduce needs the leaf of each of its {world} ranks, "
                             f"got {len(self.leaves)}")
        groups: dict[int, list[int]] = {}
        for rank, leaf in enumerate(self.leaves):
            groups.setdefault(leaf, []).append(rank)
        self.groups = sorted(groups.values())              # by lowest rank: the cross-leaf rings' order
        self.group_of = {rank: index for index, group in enumerate(self.groups) for rank in group}
        sizes = [len(group) for group in self.groups]
        self.columns = math.lcm(*sizes)
        cuts = sorted({i * self.columns // h for h in sizes for i in range(h + 1)})
        self.pieces = list(zip(cuts, cuts[1:]))              # in columns
        self.within = max(sizes) - 1                          # rounds of the largest leaf's reduce-scatter
        across = len(self.groups) - 1
        rounds = 2 * (self.within + across)
        self.steps = rounds * len(self.pieces)
        self.reduce_steps = (self.within + across) * len(self.pieces)
        self.parts = len(self.groups) * (self.columns if self.columns <= world else max(sizes))

    def _holder(self, group: int, column: int) -> int:
        """The rank of leaf `group` that holds the leaf's sum of `column` after the reduce-scatter (member i of
        a ring finishes chunk i + 1)."""
        members = self.groups[group]
        chunk = column * len(members) // self.columns
        return members[(chunk - 1) % len(members)]

    def _element(self, size: int, column: int) -> int:
        """Where `column` starts in a segment of `size` elements (near-equal columns, as chunk_bounds)."""
        base, extra = divmod(size, self.columns)
        return column * base + min(column, extra)

    def _rings(self, rank: int) -> list[tuple[int, list[int]]]:
        """The pieces whose cross-leaf ring `rank` is in, each with its ring (a rank per leaf, in leaf order)."""
        if len(self.groups) == 1:
            return []
        rings = [(p, [self._holder(g, first) for g in range(len(self.groups))])
                 for p, (first, _) in enumerate(self.pieces)]
        return [(p, ring) for p, ring in rings if rank in ring]

    def peers(self, rank: int) -> set[int]:
        members = self.groups[self.group_of[rank]]
        place = members.index(rank)
        linked = {members[(place - 1) % len(members)], members[(place + 1) % len(members)]}
        for _, ring in self._rings(rank):
            index = ring.index(rank)
            linked |= {ring[(index - 1) % len(ring)], ring[(index + 1) % len(ring)]}
        return linked - {rank}

    def schedule(self, rank: int, size: int) -> list[Round]:
        group = self.group_of[rank]
        members, count = self.groups[group], len(self.groups)
        h, within, pieces = len(members), self.within, len(self.pieces)
        rounds = Rounds(2 * (within + count - 1))
        if h > 1:
            per_chunk = self.columns // h
            bounds = [(self._element(size, i * per_chunk), self._element(size, (i + 1) * per_chunk)) for i in range(h)]
            for at, done in enumerate(ring_rounds(members.index(rank), h, size, members.__getitem__, 0, bounds),
                                      start=within - (h - 1)):
                if at >= within:  # the leaf's all-gather starts as the cross-leaf rings end
                    at += 2 * (count - 1)
                if count > 1:
                    done = done._replace(scale=())  # the cross-leaf ring finishes the chunk
                rounds.add(at, _moved(done, 0, lambda step, at=at: at * pieces))
        for piece, ring in self._rings(rank):
            lo = self._element(size, self.pieces[piece][0])
            hi = self._element(size, self.pieces[piece][1])
            for at, done in enumerate(ring_rounds(group, count, hi - lo, ring.__getitem__), start=within):
                rounds.add(at, _moved(done, lo, lambda step, at=at, piece=piece: at * pieces + piece))
        return rounds.done()
