"""Layer profiles of real DNNs, replayed with real tensors and emulated compute.

Parameter counts are computed exactly from each architecture (ResNet-50:
25,557,032; VGG-16: 138,357,544; BERT-base with pooler: 109,482,240).  One
profile layer is one parametrized module (conv, batch-norm, dense, layer-norm,
embedding); its weight and bias travel as one tensor.

Per-layer times are a FLOP-proportional split of published whole-model times:

* ResNet-50 and VGG-16: Justin Johnson, "cnn-benchmarks"
  (github.com/jcjohnson/cnn-benchmarks, README, commit 0367b1f), Torch with
  cuDNN 5005 on a GeForce GTX 1080, batch 16 of 224x224 images:
  ResNet-50 forward 50.67 ms, total 153.90 ms; VGG-16 forward 66.56 ms,
  total 232.55 ms.  That README's backward column repeats the forward one,
  so backward is taken as total - forward.
* BERT-base: Devlin et al., "BERT", NAACL 2019, appendix A.2: pre-training
  ran 1,000,000 steps of 256 sequences in 4 days on 16 TPU chips, i.e.
  345.6 ms per step for a per-chip batch of 16 sequences.  We split it 1/3
  forward, 2/3 backward (backward costs about twice the forward FLOPs) and
  count FLOPs at sequence length 128, used for 90% of those steps.

Within forward (and within backward) a layer gets time in proportion to its
forward FLOPs (2 per multiply-add; normalisation and embedding lookups counted
as a few FLOPs per element; parameter-free attention matmuls are charged to
attention.output.dense, the layer that consumes them).

Scaling: `scale` multiplies every tensor's size.  To keep the real model's
compute/communication ratio at an emulated link rate, times are multiplied by
scale * REFERENCE_LINK_GBPS / link rate: the published compute paired with a
10 Gbit/s host link, the interconnect these profiles would have run on.
Compute is emulated by sleeping to a running deadline, which leaves the CPU to
the communication threads as a GPU would.

A profile may carry its forward DAG (`Profile.graph`, ResNet-50's has the
shortcut branches): ops, the ops whose outputs each reads and the parameter
tensors (profile layers) each reads, which TicTac's send orders rank
transfers by (hostapps/send_orders.py), and Caramel's computation reordering
runs backprop by (`caramel_backward_order`, job knob `backward`).  An op's compute is its layers'
forward time; parameter-free ops (a residual add) take none, since the
published time is split over the parametrized layers.  Without a graph a
profile is the chain of its layers.
"""
import math
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

from hostapps.model import BeforeLayer, FlatModel
from hostapps.timing import sleep_for

REFERENCE_LINK_GBPS = 10.0
# Value every emulated gradient element carries; any finite constant exercises the pipeline.
EMULATED_GRADIENT = 1e-3


@dataclass(frozen=True)
class ProfileLayer:
    name: str
    params: int
    flops: float  # forward FLOPs per batch of the published profile (a trace's: its measured forward seconds)
    backward_flops: float | None = None  # weight of its backward where measured apart (a trace's seconds); None: flops


@dataclass(frozen=True)
class Op:
    """One op of a forward DAG, listed after the ops it reads (a graph is a topological order)."""
    name: str
    inputs: tuple[int, ...]  # the ops whose outputs it reads, by position in the graph
    params: tuple[int, ...]  # the parameter tensors (profile layers) it reads


def chain_graph(layers: int) -> tuple[Op, ...]:
    """The forward DAG of a chain model: op k reads layer k and op k - 1's output."""
    return tuple(Op(f"layer{k}", (k - 1,) if k else (), (k,)) for k in range(layers))


@dataclass(frozen=True)
class Profile:
    name: str
    layers: list[ProfileLayer]
    forward_s: float   # published forward time of one batch
    backward_s: float  # published backward time of one batch
    source: str
    graph: tuple[Op, ...] = ()  # the forward DAG; empty: the chain of the layers

    @property
    def params(self) -> int:
        return sum(layer.params for layer in self.layers)


def _conv(name: str, k: int, c_in: int, c_out: int, out_side: int, batch: int, bias: bool) -> ProfileLayer:
    return ProfileLayer(name, k * k * c_in * c_out + (c_out if bias else 0),
                        2.0 * k * k * c_in * c_out * out_side * out_side * batch)


def _norm(name: str, channels: int, elements: int, batch: int) -> ProfileLayer:
    """Batch- or layer-norm: a scale and a shift per channel, a few FLOPs per element."""
    return ProfileLayer(name, 2 * channels, 4.0 * elements * batch)


def _dense(name: str, n_in: int, n_out: int, rows: int) -> ProfileLayer:
    return ProfileLayer(name, n_in * n_out + n_out, 2.0 * n_in * n_out * rows)


class _GraphBuilder:
    """A profile's layers and its forward DAG, built together: each layer is read by one op."""

    def __init__(self) -> None:
        self.layers: list[ProfileLayer] = []
        self.ops: list[Op] = []

    def layer(self, layer: ProfileLayer, *inputs: int) -> int:
        """Append the layer and the op that reads it (after `inputs`); return the op."""
        self.layers.append(layer)
        return self.op(layer.name, inputs, (len(self.layers) - 1,))

    def op(self, name: str, inputs: tuple[int, ...], params: tuple[int, ...] = ()) -> int:
        self.ops.append(Op(name, inputs, params))
        return len(self.ops) - 1


def resnet50(batch: int = 16) -> tuple[list[ProfileLayer], tuple[Op, ...]]:
    """ResNet-50 with the stride on the 3x3 conv (fb.resnet.torch, torchvision), 224x224 input,
    and its forward DAG: in each block the main path (three convs, each with its batch-norm) and
    the shortcut, through a downsample conv in a stage's first block, meet in an add."""
    graph = _GraphBuilder()
    x = graph.layer(_conv("conv1", 7, 3, 64, 112, batch, False))
    x = graph.layer(_norm("bn1", 64, 64 * 112 * 112, batch), x)
    side, c_in = 56, 64
    for stage, (blocks, mid, stride) in enumerate([(3, 64, 1), (4, 128, 2), (6, 256, 2), (3, 512, 2)], 1):
        c_out = 4 * mid
        for block in range(blocks):
            s = stride if block == 0 else 1
            out_side = side // s
            p = f"layer{stage}.{block}."
            main = graph.layer(_conv(p + "conv1", 1, c_in, mid, side, batch, False), x)
            main = graph.layer(_norm(p + "bn1", mid, mid * side * side, batch), main)
            main = graph.layer(_conv(p + "conv2", 3, mid, mid, out_side, batch, False), main)
            main = graph.layer(_norm(p + "bn2", mid, mid * out_side * out_side, batch), main)
            main = graph.layer(_conv(p + "conv3", 1, mid, c_out, out_side, batch, False), main)
            main = graph.layer(_norm(p + "bn3", c_out, c_out * out_side * out_side, batch), main)
            shortcut = x
            if block == 0:
                shortcut = graph.layer(_conv(p + "downsample.0", 1, c_in, c_out, out_side, batch, False), x)
                shortcut = graph.layer(_norm(p + "downsample.1", c_out, c_out * out_side * out_side, batch),
                                       shortcut)
            x = graph.op(p + "add", (main, shortcut))
            side, c_in = out_side, c_out
    graph.layer(_dense("fc", 2048, 1000, batch), x)
    return graph.layers, tuple(graph.ops)


def vgg16(batch: int = 16) -> list[ProfileLayer]:
    """VGG-16 (configuration D), 224x224 input."""
    layers, c_in, side = [], 3, 224
    for block, (convs, c_out) in enumerate([(2, 64), (2, 128), (3, 256), (3, 512), (3, 512)], 1):
        for i in range(convs):
            layers.append(_conv(f"conv{block}_{i + 1}", 3, c_in, c_out, side, batch, True))
            c_in = c_out
        side //= 2
    return layers + [_dense("fc6", 512 * 7 * 7, 4096, batch), _dense("fc7", 4096, 4096, batch),
                     _dense("fc8", 4096, 1000, batch)]


def bert_base(batch: int = 16, seq: int = 128) -> list[ProfileLayer]:
    """BERT-base (uncased vocabulary, with pooler), sequence length `seq`."""
    hidden, ffn, tokens = 768, 3072, batch * seq
    layers = [ProfileLayer("embeddings.word_embeddings", 30522 * hidden, 1.0 * tokens * hidden),
              ProfileLayer("embeddings.position_embeddings", 512 * hidden, 1.0 * tokens * hidden),
              ProfileLayer("embeddings.token_type_embeddings", 2 * hidden, 1.0 * tokens * hidden),
              _norm("embeddings.LayerNorm", hidden, tokens * hidden, 1)]
    attention_matmuls = 2 * 2.0 * seq * seq * hidden * batch  # Q.K^T and softmax(.).V
    for i in range(12):
        p = f"encoder.layer.{i}."
        out = _dense(p + "attention.output.dense", hidden, hidden, tokens)
        layers += [_dense(p + "attention.self.query", hidden, hidden, tokens),
                   _dense(p + "attention.self.key", hidden, hidden, tokens),
                   _dense(p + "attention.self.value", hidden, hidden, tokens),
                   ProfileLayer(out.name, out.params, out.flops + attention_matmuls),
                   _norm(p + "attention.output.LayerNorm", hidden, tokens * hidden, 1),
                   _dense(p + "intermediate.dense", hidden, ffn, tokens),
                   _dense(p + "output.dense", ffn, hidden, tokens),
                   _norm(p + "output.LayerNorm", hidden, tokens * hidden, 1)]
    return layers + [_dense("pooler.dense", hidden, hidden, batch)]


def _resnet50_profile() -> Profile:
    layers, graph = resnet50()
    return Profile("resnet50", layers, 0.05067, 0.15390 - 0.05067,
                   "jcjohnson/cnn-benchmarks, GTX 1080, cuDNN 5005, batch 16", graph)


PROFILES: dict[str, Callable[[], Profile]] = {
    "resnet50": _resnet50_profile,
    "vgg16": lambda: Profile("vgg16", vgg16(), 0.06656, 0.23255 - 0.06656,
                             "jcjohnson/cnn-benchmarks, GTX 1080, cuDNN 5005, batch 16"),
    "bert_base": lambda: Profile("bert_base", bert_base(), 0.3456 / 3, 0.3456 * 2 / 3,
                                 "Devlin et al. 2019 A.2, TPU chip, batch 16, seq 128"),
}


def caramel_backward_order(graph: Sequence[Op], backward_s: Sequence[float], sizes: Sequence[int]) -> list[int]:
    """Caramel's computation reordering (Hashemi et al., arXiv 2004.14020, 2020; cited in full at
    send_orders.Caramel): backprop may run any op once every op reading its output has run; among those,
    the one readying the most gradient bytes per second of its compute goes first, so gradients reach the
    network sooner.  Returns the layers in the order their gradients
    become ready.  Parameter-free ops (a residual add) only pass the gradient on and go at once; ties keep
    the reversed layer order, so a chain, which leaves no choice, is unchanged."""
    readers = [0] * len(graph)
    for op in graph:
        for i in op.inputs:
            readers[i] += 1
    ready = [i for i, count in enumerate(readers) if count == 0]
    order: list[int] = []

    def bytes_per_second(i: int) -> float:
        params = graph[i].params
        seconds = sum(backward_s[p] for p in params)
        return math.inf if not params or seconds == 0 else sum(sizes[p] for p in params) / seconds

    while ready:
        op = max(ready, key=lambda i: (bytes_per_second(i), i))
        ready.remove(op)
        order += sorted(graph[op].params, reverse=True)
        for i in graph[op].inputs:
            readers[i] -= 1
            if readers[i] == 0:
                ready.append(i)
    return order


def compute_scale(scale: float, link_mbps: float) -> float:
    """Factor on published times that keeps compute/communication at the emulated link rate."""
    return scale * REFERENCE_LINK_GBPS * 1000.0 / link_mbps


class _Tensor:
    def __init__(self, name: str, size: int):
        self.name, self.size = name, size


class ProfileModel(FlatModel):
    """A profile's layers as real float32 tensors, with compute replaced by timed sleeps."""

    def __init__(self, profile: Profile, scale: float, link_mbps: float):
        super().__init__([_Tensor(layer.name, max(1, round(layer.params * scale))) for layer in profile.layers])
        self.profile = profile
        total_flops = sum(layer.flops for layer in profile.layers)
        factor = compute_scale(scale, link_mbps)
        self.forward_s = [profile.forward_s * factor * layer.flops / total_flops for layer in profile.layers]
        backward = [layer.flops if layer.backward_flops is None else layer.backward_flops for layer in profile.layers]
        total_backward = sum(backward)
        self.backward_s = [profile.backward_s * factor * weight / total_backward for weight in backward]
        self.backward_order = list(reversed(range(len(self.layers))))  # the order frameworks run backprop
        self._clock = 0.0

    def reorder_backward(self) -> None:
        """Run backprop in Caramel's order on the profile's DAG (a chain keeps the reversed order)."""
        graph = self.profile.graph or chain_graph(len(self.layers))
        self.backward_order = caramel_backward_order(graph, self.backward_s, [layer.size for layer in self.layers])

    def _compute(self, seconds: float) -> None:
        # Sleep to a running deadline so that many short layers do not accumulate oversleep.
        now = time.monotonic()
        self._clock = max(self._clock, now) + seconds
        if self._clock > now:
            sleep_for(self._clock - now)

    def forward(self, batch: object, before_layer: BeforeLayer) -> None:
        self._clock = time.monotonic()
        for i, seconds in enumerate(self.forward_s):
            before_layer(i)
            self._compute(seconds)

    def backward(self) -> Iterator[int]:
        for i in self.backward_order:
            self._compute(self.backward_s[i])
            self.layer_grads(i).fill(EMULATED_GRADIENT)
            yield i
