"""NCCL's double binary tree all-reduce (Sanders, Speck and Träff, "Two-tree algorithms for full
bandwidth broadcast, reduction and scan", Parallel Computing 2009; NCCL 2.4's trees)."""
from __future__ import annotations

import itertools
from typing import Sequence

from hostapps.allreduce.schedule import AllReduce, Round, Rounds, Transfer, chunk_bounds, register_allreduce


def btree_parent(rank: int, world: int) -> int | None:
    """The parent of `rank` in NCCL's binary tree rooted at 0 (ncclGetBtree): in-order on the rank numbers,
    a rank's lowest set bit is its level; its parent clears that bit and sets the next one, or, out of range,
    only clears it.  Every rank that is a leaf here (the odd ones) is an inner node of the mirrored tree."""
    if rank == 0:
        return None
    bit = rank & -rank
    up = (rank ^ bit) | (bit << 1)
    return up if up < world else rank ^ bit


def rerooted(parents: list[int | None]) -> list[int | None]:
    """The tree with a root of one child turned into that child's last child: the child is the root.

    NCCL's binary tree hangs the in-order tree under rank 0 (ncclGetBtree), a root with one child, so a
    segment climbs one level more than the tree's in-order height and comes back down one more: two rounds
    of latency a segment, and two more ticks of pipeline fill and drain, for a rank that only divides.  The
    child takes the old root as a third child: it then takes three halves of a segment in and sends three
    out in that tree, and is a leaf of the other tree (the child is an odd position there), so it carries
    two segments each way, as every rank with two children does."""
    root = parents.index(None)
    children = [rank for rank, up in enumerate(parents) if up == root]
    if len(children) != 1:
        return parents
    turned = list(parents)
    turned[children[0]], turned[root] = None, children[0]
    return turned


def double_tree(world: int) -> tuple[list[int | None], list[int | None]]:
    """The parent of every rank in two trees after NCCL's (ncclGetDtree): the binary tree, and the same tree
    mirrored (rank r as world-1-r) for an even world or shifted by one rank for an odd one, so that a rank has
    two or more children in at most one tree; each rerooted at its root's only child."""
    first = [btree_parent(r, world) for r in range(world)]
    if world % 2:
        shifted = [btree_parent((r - 1) % world, world) for r in range(world)]
        second = [None if up is None else (up + 1) % world for up in shifted]
    else:
        mirrored = [btree_parent(world - 1 - r, world) for r in range(world)]
        second = [None if up is None else world - 1 - up for up in mirrored]
    return rerooted(first), rerooted(second)


def leaf_placement(shapes: Sequence[list[int | None]], leaves: Sequence[int]) -> list[int]:
    """The rank to put at each position of the trees (their parents by position), so that few tree edges join
    ranks of different leaves: every crossing edge is a flow each way over the spines, where per-flow ECMP
    may stack it on an uplink with others.  Which rank holds which position changes no rank's load, only
    which links the edges take.

    A local search: from NCCL's order (rank r at position r) and from each leaf's ranks side by side, swap
    two ranks of different leaves while that cuts the crossing edges; the better of the two.  Deterministic,
    so every rank places the trees alike."""
    world = len(leaves)
    edges = [(position, up) for parents in shapes for position, up in enumerate(parents) if up is not None]
    adjacent: list[list[int]] = [[] for _ in range(world)]
    for a, b in edges:
        adjacent[a].append(b)
        adjacent[b].append(a)

    def crossing_at(position: int, order: list[int]) -> int:
        return sum(leaves[order[position]] != leaves[order[other]] for other in adjacent[position])

    def search(order: list[int]) -> list[int]:
        improved = True
        while improved:
            improved = False
            for a, b in itertools.combinations(range(world), 2):
                if leaves[order[a]] == leaves[order[b]]:
                    continue
                before = crossing_at(a, order) + crossing_at(b, order)
                order[a], order[b] = order[b], order[a]
                if crossing_at(a, order) + crossing_at(b, order) < before:
                    improved = True
                else:
                    order[a], order[b] = order[b], order[a]
        return order

    starts = [list(range(world)), sorted(range(world), key=lambda rank: (leaves[rank], rank))]
    return min((search(start) for start in starts),
               key=lambda order: sum(leaves[order[a]] != leaves[order[b]] for a, b in edges))


def placed(parents: list[int | None], order: Sequence[int]) -> list[int | None]:
    """A tree given by position (parents[position]) as the parent of every rank, order[position] its rank."""
    by_rank: list[int | None] = [None] * len(parents)
    for position, up in enumerate(parents):
        by_rank[order[position]] = None if up is None else order[up]
    return by_rank


class Tree:
    """One tree's shape: each rank's parent, children (by rank), height above its deepest leaf and depth."""

    def __init__(self, parents: list[int | None]):
        self.parents = parents
        self.children: list[list[int]] = [[] for _ in parents]
        for rank, up in enumerate(parents):
            if up is not None:
                self.children[up].append(rank)
        self.root = parents.index(None)
        self.depth = [0] * len(parents)
        self.height = [0] * len(parents)
        order = [self.root]
        for rank in order:  # breadth first: parents before children
            for child in self.children[rank]:
                self.depth[child] = self.depth[rank] + 1
                order.append(child)
        for rank in reversed(order):
            if self.children[rank]:
                self.height[rank] = 1 + max(self.height[c] for c in self.children[rank])


@register_allreduce("tree")
class DoubleBinaryTree(AllReduce):
    """Two binary trees, each reducing half of every segment up to its root and broadcasting the mean back
    down, pipelined over segments of --partition-bytes as NCCL pipelines its chunks.

    A rank has children in at most one tree and is a leaf of the other, so it sends and receives about
    twice the segment in all (the ring: 2(n-1)/n of it) over 2(ceil(log2 n) - 1) rounds of latency
    (the ring: 2(n-1)).  One tree would cost its inner ranks three segments each way, half again the
    double tree's bandwidth for the same latency: hence two.  The reduction is a message per tree edge and
    round: a rank sends up in the round of its height (after its children's partial sums, received in the
    rounds of theirs), the root divides, and in the broadcast a rank sends down in the round of its depth.

    Given each rank's leaf switch (`leaves`: the runner passes the layout's, --leaves), the ranks take the
    trees' positions so that few edges cross leaves (leaf_placement): 6 ranks on 2 leaves cross with 4 of
    the 10 edges where NCCL's order crosses with 6, so per-flow ECMP has fewer flows to stack on an uplink.

    Loss: the partial sums going up tolerate it (zero-fill, as the ring's reduce-scatter); the broadcast is
    exact.  Each half's mean is finished by its tree's root alone and copied from there, so every rank
    ends bit-identical.
    """
    pipelined = True
    follows_leaves = True

    def __init__(self, world: int, leaves: Sequence[int] = ()):
        super().__init__(world, leaves)
        if self.leaves and len(self.leaves) != world:
            raise ValueError(f"the tree needs the leaf of each of its {world} ranks or none, got {len(self.leaves)}")
        shapes = list(double_tree(world)) if world > 1 else []
        if len(set(self.leaves)) > 1:
            order = leaf_placement(shapes, self.leaves)
            shapes = [placed(parents, order) for parents in shapes]
        self.trees = [Tree(parents) for parents in shapes]
        self.levels = max((tree.height[tree.root] for tree in self.trees), default=0)
        self.steps, self.reduce_steps, self.parts = 4 * self.levels, 2 * self.levels, 2

    def peers(self, rank: int) -> set[int]:
        linked = set()
        for tree in self.trees:
            linked.update(tree.children[rank])
            if tree.parents[rank] is not None:
                linked.add(tree.parents[rank])
        return linked

    def schedule(self, rank: int, size: int) -> list[Round]:
        levels = self.levels
        rounds = Rounds(2 * levels)
        for index, (tree, (lo, hi)) in enumerate(zip(self.trees, chunk_bounds(size, 2))):
            up, down = index * levels, 2 * levels + index * levels  # the tree's first reduce and broadcast steps
            parent = tree.parents[rank]
            for child in tree.children[rank]:
                rounds.recv(tree.height[child], Transfer(child, up + tree.height[child], lo, hi, True))
                rounds.send(levels + tree.depth[rank], Transfer(child, down + tree.depth[rank], lo, hi, False))
            if parent is None:
                rounds.finish(levels - 1, lo, hi)
            else:
                rounds.send(tree.height[rank], Transfer(parent, up + tree.height[rank], lo, hi, True))
                rounds.recv(levels + tree.depth[parent], Transfer(parent, down + tree.depth[parent], lo, hi, False))
        return rounds.done()
