"""Numpy models with explicit forward and backward, float32, and the SGD step.

All parameters of a model live in one flat float32 buffer (and the gradients
in another) laid out layer after layer, so a layer's tensor or a fused bucket
of adjacent layers is a contiguous slice that goes on the wire without a copy.
`backward()` is a generator that yields each layer's index as soon as its
gradient is in the buffer, last layer first: that is what lets communication
start while backprop continues (wait-free backprop).
"""
import os
from typing import Callable, Iterator

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

from hostapps.data import CLASSES, IMAGE_SIDE


def limit_blas_threads() -> None:
    """One BLAS thread in this process.  A host app is one process of several on a few cores: more threads
    only oversubscribe them, and OpenBLAS's spin while they wait for work, taking the CPU the other
    processes' communication threads need."""
    for variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[variable] = "1"  # BLAS libraries loaded later read these
    threadpool_limits(1)  # ... those loaded already (numpy's) are told


def blas_threads() -> int:
    """The most threads any BLAS library loaded here (numpy's) may use for one call (recorded in
    summary.json)."""
    return max((pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"), default=1)


# Called with a layer index just before that layer's forward: where a worker
# waits for the layer's parameters from the previous iteration.
BeforeLayer = Callable[[int], None]
# Float32 FLOPs per second assumed of numpy on one core (BLAS matmuls, order of magnitude): turns
# the layers' FLOPs into the compute times the controller's tictac classes are timed by, where only
# their ratios matter.
NUMPY_FLOPS_PER_S = 1e10


class Dense:
    """y = x @ W + b, optionally followed by ReLU."""

    def __init__(self, name: str, n_in: int, n_out: int, relu: bool):
        self.name, self.n_in, self.n_out, self.relu = name, n_in, n_out, relu
        self.size = n_in * n_out + n_out

    def forward_flops(self, rows: int) -> float:
        return 2.0 * self.n_in * self.n_out * rows  # 2 per multiply-add

    def bind(self, params: np.ndarray, grads: np.ndarray) -> None:
        cut = self.n_in * self.n_out
        self.weight, self.bias = params[:cut].reshape(self.n_in, self.n_out), params[cut:]
        self.grad_weight, self.grad_bias = grads[:cut].reshape(self.n_in, self.n_out), grads[cut:]

    def init(self, rng: np.random.Generator) -> None:
        self.weight[...] = rng.normal(0.0, np.sqrt(2.0 / self.n_in), self.weight.shape)
        self.bias[...] = 0.0

    def forward(self, x: np.ndarray) -> np.ndarray:
        self.x = x
        y = x @ self.weight
        y += self.bias
        if self.relu:
            np.maximum(y, 0.0, out=y)
        self.y = y
        return y

    def backward(self, dy: np.ndarray, need_input_grad: bool) -> np.ndarray | None:
        if self.relu:
            dy = dy * (self.y > 0.0)
        np.matmul(self.x.T, dy, out=self.grad_weight)
        np.sum(dy, axis=0, out=self.grad_bias)
        return dy @ self.weight.T if need_input_grad else None


class Conv3x3:
    """3x3 convolution (stride 1, zero padding 1) + ReLU on single-channel 8x8 images.

    It must be the first layer: it never computes a gradient for its input.
    Output is flattened as (pixel, channel), ready for a Dense layer.
    """

    def __init__(self, name: str, channels: int):
        self.name, self.channels = name, channels
        self.size = 9 * channels + channels

    def forward_flops(self, images: int) -> float:
        return 2.0 * 9 * self.channels * IMAGE_SIDE * IMAGE_SIDE * images

    def bind(self, params: np.ndarray, grads: np.ndarray) -> None:
        self.weight, self.bias = params[:9 * self.channels].reshape(9, self.channels), params[9 * self.channels:]
        self.grad_weight = grads[:9 * self.channels].reshape(9, self.channels)
        self.grad_bias = grads[9 * self.channels:]

    def init(self, rng: np.random.Generator) -> None:
        self.weight[...] = rng.normal(0.0, np.sqrt(2.0 / 9), self.weight.shape)
        self.bias[...] = 0.0

    def forward(self, x: np.ndarray) -> np.ndarray:
        images = np.pad(x.reshape(-1, IMAGE_SIDE, IMAGE_SIDE), ((0, 0), (1, 1), (1, 1)))
        patches = np.lib.stride_tricks.sliding_window_view(images, (3, 3), axis=(1, 2))
        self.cols = patches.reshape(-1, 9)  # (n * 64, 9), one row per output pixel
        y = self.cols @ self.weight
        y += self.bias
        np.maximum(y, 0.0, out=y)
        self.y = y
        return y.reshape(len(x), -1)

    def backward(self, dy: np.ndarray, need_input_grad: bool) -> None:
        dy = dy.reshape(self.y.shape) * (self.y > 0.0)
        np.matmul(self.cols.T, dy, out=self.grad_weight)
        np.sum(dy, axis=0, out=self.grad_bias)


def softmax_cross_entropy(logits: np.ndarray, labels: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean loss over the batch and its gradient with respect to the logits."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    probs = np.exp(shifted)
    probs /= probs.sum(axis=1, keepdims=True)
    rows = np.arange(len(labels))
    loss = float(-np.log(probs[rows, labels] + 1e-12).mean())
    probs[rows, labels] -= 1.0
    probs /= len(labels)
    return loss, probs


class FlatModel:
    """Layers whose parameters and gradients are slices of two flat float32 buffers."""

    def __init__(self, layers: list):
        self.layers = layers
        self.offsets = np.cumsum([0] + [layer.size for layer in layers])
        self.params = np.zeros(int(self.offsets[-1]), dtype=np.float32)
        self.grads = np.zeros_like(self.params)

    def layer_tensor_names(self) -> dict[int, tuple[str, str]]:
        """Tensor id -> (name, layer) when every layer is its own tensor."""
        return {i: (layer.name, str(i)) for i, layer in enumerate(self.layers)}

    def layer_slice(self, layers: tuple[int, ...]) -> slice:
        """The flat-buffer slice of adjacent layers (a layer or a fusion bucket)."""
        return slice(int(self.offsets[min(layers)]), int(self.offsets[max(layers) + 1]))

    def layer_params(self, i: int) -> np.ndarray:
        return self.params[self.layer_slice((i,))]

    def layer_grads(self, i: int) -> np.ndarray:
        return self.grads[self.layer_slice((i,))]


class Network(FlatModel):
    """A classifier for the digits: optional conv layer, then dense layers with ReLU, then softmax."""

    def __init__(self, width: int, depth: int, conv_channels: int, seed: int):
        layers: list = []
        n_in = IMAGE_SIDE * IMAGE_SIDE
        if conv_channels:
            layers.append(Conv3x3("conv", conv_channels))
            n_in *= conv_channels
        for i in range(depth):
            layers.append(Dense(f"fc{i + 1}", n_in, width, relu=True))
            n_in = width
        layers.append(Dense("out", n_in, CLASSES, relu=False))
        super().__init__(layers)
        rng = np.random.default_rng(seed)
        for i, layer in enumerate(layers):
            layer.bind(self.layer_params(i), self.layer_grads(i))
            layer.init(rng)

    def forward(self, batch: tuple[np.ndarray, np.ndarray], before_layer: BeforeLayer) -> float:
        x, labels = batch
        for i, layer in enumerate(self.layers):
            before_layer(i)
            x = layer.forward(x)
        loss, self._dlogits = softmax_cross_entropy(x, labels)
        return loss

    def estimated_times_s(self, rows: int) -> tuple[list[float], list[float]]:
        """Per-layer forward and backward seconds on a batch of `rows`, from the layers' FLOPs at
        NUMPY_FLOPS_PER_S. Backward computes the weight gradient and, but for the first layer, the
        input gradient: each a matmul as large as the forward one."""
        forward_s = [layer.forward_flops(rows) / NUMPY_FLOPS_PER_S for layer in self.layers]
        return forward_s, [seconds * (1 if i == 0 else 2) for i, seconds in enumerate(forward_s)]

    def backward(self) -> Iterator[int]:
        dy = self._dlogits
        for i in reversed(range(len(self.layers))):
            dy = self.layers[i].backward(dy, need_input_grad=i > 0)
            yield i

    def accuracy(self, x: np.ndarray, labels: np.ndarray) -> float:
        for layer in self.layers:
            x = layer.forward(x)
        return float((x.argmax(axis=1) == labels).mean())


class Sgd:
    """SGD with optional momentum, in place on flat slices."""

    def __init__(self, lr: float, momentum: float, size: int):
        self.lr, self.momentum = np.float32(lr), np.float32(momentum)
        self.velocity = np.zeros(size, dtype=np.float32) if momentum else None

    def step(self, where: slice, params: np.ndarray, grads: np.ndarray) -> None:
        """params[where] -= lr * (momentum-smoothed) grads[where]; grads[where] is consumed."""
        grad = grads[where]
        if self.velocity is not None:
            velocity = self.velocity[where]
            velocity *= self.momentum
            velocity += grad
            grad[...] = velocity
        grad *= -self.lr
        params[where] += grad
