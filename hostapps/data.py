"""The training data: the UCI optical handwritten digits (8x8, 1797 images), bundled.

digits.csv.gz is scikit-learn's copy (sklearn/datasets/data, BSD-3-Clause; the data are Alpaydin and
Kaynak's, UCI ML repository, CC BY 4.0): one row per image, 64 pixel values 0..16 then the label.
It is read with numpy alone: importing scikit-learn for it would cost every worker seconds of CPU at
start-up, and a run starts five or more at once on two cores.

Each global batch is drawn from a seeded stream of per-epoch permutations of
the training split; worker `rank` of `world` takes every world-th sample of it
(by stride), so the W shards of a batch are disjoint and together they are
exactly the batch a single worker would use: W-worker and 1-worker training
see the same data.
"""
import gzip
from pathlib import Path
from typing import NamedTuple

import numpy as np

IMAGE_SIDE = 8
CLASSES = 10
DIGITS_CSV = Path(__file__).with_name("digits.csv.gz")
PIXEL_MAX = 16


class Split(NamedTuple):
    x_train: np.ndarray  # float32 (n, 64), pixel values scaled to [0, 1]
    y_train: np.ndarray  # int64 (n,)
    x_test: np.ndarray
    y_test: np.ndarray


def load_split(seed: int, test_fraction: float = 0.25) -> Split:
    """Stratified train/test split of the 1797 digit images: each class gives round(test_fraction
    of its images), drawn by a generator seeded with `seed`, to the test set."""
    with gzip.open(DIGITS_CSV, "rt") as file:
        table = np.loadtxt(file, delimiter=",", dtype=np.int64)
    x, y = (table[:, :-1] / PIXEL_MAX).astype(np.float32), table[:, -1]
    rng = np.random.default_rng(seed)
    test = np.concatenate([rng.permutation(members)[:round(len(members) * test_fraction)]
                           for members in (np.flatnonzero(y == label) for label in range(CLASSES))])
    train = rng.permutation(np.setdiff1d(np.arange(len(y)), test))
    test = rng.permutation(test)
    return Split(x[train], y[train], x[test], y[test])


class ShardedBatches:
    """This worker's shard of every global batch."""

    def __init__(self, split: Split, global_batch: int, rank: int, world: int, seed: int):
        if global_batch % world:
            raise ValueError(f"global batch {global_batch} does not split evenly over {world} workers")
        if global_batch < world:
            raise ValueError(f"global batch {global_batch} leaves workers with no data ({world} workers)")
        self.x, self.y = split.x_train, split.y_train
        self.global_batch, self.rank, self.world, self.seed = global_batch, rank, world, seed
        self._permutations: dict[int, np.ndarray] = {}

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch not in self._permutations:
            self._permutations[epoch] = np.random.default_rng([self.seed, epoch]).permutation(len(self.y))
        return self._permutations[epoch]

    def batch(self, iteration: int) -> tuple[np.ndarray, np.ndarray]:
        n = len(self.y)
        positions = iteration * self.global_batch + np.arange(self.rank, self.global_batch, self.world)
        index = np.empty(len(positions), dtype=np.int64)
        for epoch in np.unique(positions // n):
            here = positions // n == epoch
            index[here] = self._permutation(int(epoch))[positions[here] % n]
        return self.x[index], self.y[index]
