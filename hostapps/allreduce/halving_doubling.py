"""Recursive halving-doubling all-reduce (Rabenseifner; Thakur, Rabenseifner and Gropp, "Optimization of
Collective Communication Operations in MPICH", IJHPCA 2005)."""
from __future__ import annotations

from hostapps.allreduce.schedule import AllReduce, Round, Rounds, Transfer, chunk_bounds, register_allreduce


@register_allreduce("halving_doubling")
class HalvingDoubling(AllReduce):
    """Reduce-scatter by recursive halving, then all-gather by recursive doubling, among p = 2^k ranks.

    Halving round i pairs each rank with the one whose number differs in bit i: the two hold the same
    range of the segment, each sends the half the other keeps and adds in the half it keeps; after k rounds
    each holds one of p chunks whole.  Doubling retraces the rounds in reverse, each pair swapping their
    halves.  Bit 0 first: the largest exchanges (half the segment) are between ranks 2j and 2j+1, neighbours
    on one leaf on our fabrics; only the last rounds, the smallest, cross the spines.  Every rank sends and
    receives 2(p-1)/p of the segment in 2 log2(p) rounds: the ring's bytes with logarithmic latency.

    Other world sizes, as MPICH does: with n = p + r (p the largest power of two <= n), each of the first r
    even ranks first sends its whole segment to the odd rank after it (a REDUCE message) and sits out; the
    p ranks left run the above; the odd ranks send the mean back to their even partners at the end (GATHER).
    Two rounds and two segments' bytes more on those ranks.

    Pipelined over segments of --partition-bytes, as the tree is: unpipelined, the fold round loads only the
    folded ranks' uplinks and the unfold only their downlinks, so the rounds' busiest links add up to 3.5
    models for 6 ranks where the busiest link carries 2.5; with segments in flight one segment's fold shares
    the links with older segments' halving, doubling and unfold, and once the pipeline is full every round
    loads both directions of the busiest links.

    Loss: the fold and the halving messages are contributions to sums and tolerate it (zero-fill, as the
    ring's reduce-scatter); the doubling and the unfold are exact.  Each chunk's mean is finished by one
    rank and copied from there, so every rank ends bit-identical.
    """

    pipelined = True

    def __init__(self, world: int, leaves=()):
        super().__init__(world, leaves)
        self.bits = max(0, world.bit_length() - 1)
        self.p = 1 << self.bits             # ranks in the recursive part
        self.extra = world - self.p         # even ranks folded into their odd neighbour
        fold = 1 if self.extra else 0
        self.steps = 2 * (fold + self.bits)
        self.reduce_steps = fold + self.bits
        self.parts = self.p

    def folded(self, rank: int) -> bool:
        """Whether the rank sits out the recursive part (its segment folded into rank + 1)."""
        return rank < 2 * self.extra and rank % 2 == 0

    def virtual(self, rank: int) -> int:
        """The rank's number among the p ranks of the recursive part (not for a folded rank)."""
        return rank // 2 if rank < 2 * self.extra else rank - self.extra

    def real(self, virtual: int) -> int:
        return 2 * virtual + 1 if virtual < self.extra else virtual + self.extra

    def peers(self, rank: int) -> set[int]:
        if rank < 2 * self.extra:
            partner = {rank ^ 1}
            if self.folded(rank):
                return partner
        else:
            partner = set()
        v = self.virtual(rank)
        return partner | {self.real(v ^ (1 << i)) for i in range(self.bits)}

    def schedule(self, rank: int, size: int) -> list[Round]:
        fold = 1 if self.extra else 0
        rounds = Rounds(self.steps)
        whole = (0, size)
        if rank < 2 * self.extra:
            if self.folded(rank):
                rounds.send(0, Transfer(rank + 1, 0, *whole, True))
                rounds.recv(self.steps - 1, Transfer(rank + 1, self.steps - 1, *whole, False))
                return rounds.done()
            rounds.recv(0, Transfer(rank - 1, 0, *whole, True))
            rounds.send(self.steps - 1, Transfer(rank - 1, self.steps - 1, *whole, False))
        chunks = chunk_bounds(size, self.p)
        v = self.virtual(rank)
        first, last = 0, self.p  # the chunks this rank holds: [first, last)
        held = []
        for i in range(self.bits):
            partner = self.real(v ^ (1 << i))
            middle = (first + last) // 2
            keep, give = ((first, middle), (middle, last)) if not v & (1 << i) else ((middle, last), (first, middle))
            halving = fold + i
            rounds.send(halving, Transfer(partner, halving, chunks[give[0]][0], chunks[give[1] - 1][1], True))
            rounds.recv(halving, Transfer(partner, halving, chunks[keep[0]][0], chunks[keep[1] - 1][1], True))
            held.append((keep, give))
            first, last = keep
        rounds.finish(fold + self.bits - 1, chunks[first][0], chunks[first][1])
        for i in reversed(range(self.bits)):
            keep, give = held[i]
            partner, doubling = self.real(v ^ (1 << i)), self.steps - 1 - fold - i
            rounds.send(doubling, Transfer(partner, doubling, chunks[keep[0]][0], chunks[keep[1] - 1][1], False))
            rounds.recv(doubling, Transfer(partner, doubling, chunks[give[0]][0], chunks[give[1] - 1][1], False))
        return rounds.done()
