"""Hierarchical all-reduce: within each leaf, across the leaves among one rank per leaf, back within each
leaf (Horovod's and NCCL's two-level all-reduce, with leaves for nodes)."""
from __future__ import annotations

from hostapps.allreduce.ring import ring_rounds
from hostapps.allreduce.schedule import AllReduce, Round, Rounds, Transfer, register_allreduce


@register_allreduce("hierarchical")
class Hierarchical(AllReduce):
    """Reduce within each leaf to its leader (its lowest rank), ring all-reduce among the leaders, and
    broadcast back within each leaf, pipelined over segments of --partition-bytes.

    `leaves` gives each rank's leaf switch (the runner passes the layout's: --leaves).  Within a leaf the
    ranks form a chain, highest rank first: each adds its segment to the partial sum from the rank above and
    passes it down to the leader, and the mean goes back up the chain; with segments in flight every chain
    link carries a segment per round each way, so a leaf reduces at its host links' rate whatever its size.
    Only the leaders' ring crosses the spines: one flow out of and one into each leaf carrying 2(L-1)/L of
    the model for L leaves, where the flat ring's edge out of a leaf carries 2(n-1)/n of it for n ranks.
    Rounds: (h-1) up the largest leaf's chain, 2(L-1) around the leaders' ring, (h-1) back.

    Loss: the chain's partial sums and the leaders' reduce-scatter tolerate it (zero-fill, as the ring's);
    the leaders' all-gather and the broadcast are exact.  Each chunk's mean is finished by one leader and
    copied from there, so every rank ends bit-identical.
    """
    pipelined = True

    def __init__(self, world: int, leaves=()):
        super().__init__(world, leaves)
        if len(self.leaves) != world:
            raise ValueError(f"the hierarchical all-reduce needs the leaf of each of its {world} ranks, "
                             f"got {len(self.leaves)}")
        groups: dict[int, list[int]] = {}
        for rank, leaf in enumerate(self.leaves):
            groups.setdefault(leaf, []).append(rank)
        self.chains = sorted(groups.values())               # by leader
        self.chain_of = {rank: chain for chain in self.chains for rank in chain}
        self.leaders = [chain[0] for chain in self.chains]
        self.climb = max(len(chain) for chain in self.chains) - 1  # rounds up the longest chain
        across = len(self.leaders) - 1
        self.steps = 2 * (self.climb + across)
        self.reduce_steps = self.climb + across
        self.parts = len(self.leaders)

    def peers(self, rank: int) -> set[int]:
        chain = self.chain_of[rank]
        place = chain.index(rank)
        linked = set(chain[max(0, place - 1):place + 2]) - {rank}
        if place == 0 and len(self.leaders) > 1:
            index, count = self.leaders.index(rank), len(self.leaders)
            linked |= {self.leaders[(index - 1) % count], self.leaders[(index + 1) % count]}
        return linked - {rank}

    def schedule(self, rank: int, size: int) -> list[Round]:
        chain, climb, count = self.chain_of[rank], self.climb, len(self.leaders)
        place, top = chain.index(rank), len(chain) - 1
        back = climb + 2 * (count - 1)  # the first broadcast round
        rounds = Rounds(self.steps)
        whole = (0, size)
        if place < top:  # the rank above sends its partial sum down in the round of its distance from the top
            rounds.recv(top - place - 1, Transfer(chain[place + 1], top - place - 1, *whole, True))
            rounds.send(back + place, Transfer(chain[place + 1], back + place, *whole, False))
        if place > 0:
            rounds.send(top - place, Transfer(chain[place - 1], top - place, *whole, True))
            rounds.recv(back + place - 1, Transfer(chain[place - 1], back + place - 1, *whole, False))
            return rounds.done()
        if count == 1:
            rounds.finish(climb - 1, *whole)
            return rounds.done()
        for at, ring in enumerate(ring_rounds(self.leaders.index(rank), count, size, self.leaders.__getitem__, climb),
                                  start=climb):
            rounds.add(at, ring)
        return rounds.done()
