"""The training data: scikit-learn's bundled handwritten digits, loaded offline.

Each global batch is drawn from a seeded stream of per-epoch permutations of
the training split; worker `rank` of `world` takes every world-th sample of it
(by stride), so the W shards of a batch are disjoint and together they are
exactly the batch a single worker would use: W-worker and 1-worker training
see the same data.
"""
from typing import NamedTuple

import numpy as np

IMAGE_SIDE = 8
CLASSES = 10


class Split(NamedTuple):
    x_train: np.ndarray  # float32 (n, 64), pixel values scaled to [0, 1]
    y_train: np.ndarray  # int64 (n,)
    x_test: np.ndarray
    y_test: np.ndarray


def load_split(seed: int, test_fraction: float = 0.25) -> Split:
    """Stratified train/test split of the 1797 digit images."""
    # scikit-learn takes a second to import: only the workers that train on the digits need it.
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(
        x, digits.target, test_size=test_fraction, random_state=seed, stratify=digits.target)
    return Split(x_train, y_train, x_test, y_test)


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
