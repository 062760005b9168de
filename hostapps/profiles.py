"""Layer profiles of real DNNs, replayed with real tensors and emulated compute.

Parameter counts are computed exactly from each architecture (ResNet-50:
25,557,032; VGG-16: 138,357,544; BERT-base with pooler: 109,482,240;
Inception-v3: 23,817,352 trainable, keras.applications.InceptionV3's count;
BERT-base with pooler and a 2-label classifier: 109,483,778).  One profile
layer is one tensor the training job all-reduces or pushes.  In `resnet50`,
`vgg16` and `bert_base` a layer is a parametrized module (conv, batch-norm,
dense, layer-norm, embedding) whose weight and bias travel as one tensor.
`inception_v3` and `bert_base_tf` have TensorFlow's granularity, one tensor per
trainable variable (a conv's weights and its batch-norm's beta; a dense
kernel and its bias; a layer-norm's gamma and beta): many small tensors, as
TensorFlow's all-reduce sees them.

Per-layer times are a FLOP-proportional split of published whole-model times:

* ResNet-50 and VGG-16: Justin Johnson, "cnn-benchmarks"
  (github.com/jcjohnson/cnn-benchmarks, README, commit 0367b1f), Torch with
  cuDNN 5005 on a GeForce GTX 1080, batch 16 of 224x224 images:
  ResNet-50 forward 50.67 ms, total 153.90 ms; VGG-16 forward 66.56 ms,
  total 232.55 ms.  That README's backward column repeats the forward one,
  so backward is taken as total - forward.
* BERT-base (both granularities): Devlin et al., "BERT", NAACL 2019,
  appendix A.2: pre-training ran 1,000,000 steps of 256 sequences in 4 days
  on 16 TPU chips, i.e. 345.6 ms per step for a per-chip batch of 16
  sequences.  We split it 1/3 forward, 2/3 backward (backward costs about
  twice the forward FLOPs) and count FLOPs at sequence length 128, used for
  90% of those steps.  bert_base_tf's variables are those of
  google-research/bert (modeling.py, with run_classifier.py's output layer).
* Inception-v3: TensorFlow's benchmarks (tensorflow/docs,
  site/en/r1/guide/performance/benchmarks.md, "Details for NVIDIA DGX-1",
  other results, May 2017): one Tesla P100, synthetic data, batch 32:
  128 images/s, i.e. 250 ms a step, split 1/3 forward, 2/3 backward as
  BERT's.  The architecture is Szegedy et al., "Rethinking the Inception
  Architecture for Computer Vision", CVPR 2016, as TF-slim's
  inception_v3_base lays it out (names, 299x299 input, batch-norm without
  scale), with keras.applications.InceptionV3's 1000-class top (no auxiliary
  head).

Within forward (and within backward) a layer gets time in proportion to its
forward FLOPs (2 per multiply-add; normalisation and embedding lookups counted
as a few FLOPs per element, a bias one per output element; parameter-free
attention matmuls are charged to attention.output.dense, the layer that
consumes them; pools and concatenations to nothing).

Scaling: `scale` multiplies every tensor's size.  To keep the real model's
compute/communication ratio at an emulated link rate, times are multiplied by
scale * REFERENCE_LINK_GBPS / link rate: the published compute paired with a
10 Gbit/s host link, the interconnect these profiles would have run on.
Compute is emulated by sleeping to a running deadline, which leaves the CPU to
the communication threads as a GPU would.

A profile may carry its forward DAG (`Profile.graph`: ResNet-50's shortcut
branches, Inception-v3's four-branch modules, BERT's parallel query, key and
value): ops, the ops whose outputs each reads and the parameter tensors
(profile layers) each reads, every tensor read by exactly one op.  Without a
graph a profile is the chain of its layers.  An op's compute is the time of
the layers it reads; a parameter-free op (an add, a pool, a concatenation)
takes none, since the published time is split over the parametrized layers.
The model runs its ops in a `Schedule`: the forward pass in a topological
order of the DAG, backprop in one of the reversed DAG (each op after every op
that reads its output), the listing order and its reverse by default.
TicTac's send orders rank transfers on the DAG (hostapps/send_orders.py);
hostapps/caramel.py computes the schedules of the job knob `backward`.
"""
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
class Schedule:
    """The order a model runs its ops in: `forward` lists every op after the ops it reads, `backward`
    every op after every op that reads its output (its backprop needs theirs)."""
    forward: tuple[int, ...]
    backward: tuple[int, ...]


def listing_schedule(graph: Sequence[Op]) -> Schedule:
    """The DAG's listing order forward and its reverse backward: on a chain, the only schedule; on a
    branched DAG, the layer order frameworks run a module list in."""
    return Schedule(tuple(range(len(graph))), tuple(reversed(range(len(graph)))))


def readers(graph: Sequence[Op]) -> list[list[int]]:
    """Op -> the ops that read its output."""
    read_by: list[list[int]] = [[] for _ in graph]
    for i, op in enumerate(graph):
        for j in sorted(set(op.inputs)):
            read_by[j].append(i)
    return read_by


def schedule_error(graph: Sequence[Op], schedule: Schedule) -> str | None:
    """What makes `schedule` not one of `graph` (None: it is one): an order that is not a permutation of
    the ops, or an op before one it depends on."""
    for name, order in (("forward", schedule.forward), ("backward", schedule.backward)):
        if sorted(order) != list(range(len(graph))):
            return f"the {name} order is not a permutation of the {len(graph)} ops"
    place = {op: k for k, op in enumerate(schedule.forward)}
    for i, op in enumerate(graph):
        for j in op.inputs:
            if place[j] > place[i]:
                return f"forward runs {graph[i].name} before {graph[j].name}, which it reads"
    place = {op: k for k, op in enumerate(schedule.backward)}
    for i, op in enumerate(graph):
        for j in op.inputs:
            if place[j] < place[i]:
                return f"backward runs {graph[j].name} before {graph[i].name}, which reads it"
    return None


def gradient_order(graph: Sequence[Op], schedule: Schedule) -> list[int]:
    """The layers in the order backprop under `schedule` readies their gradients: an op's tensors once
    it has run, the last-listed first."""
    return [param for op in schedule.backward for param in sorted(graph[op].params, reverse=True)]


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

    def tensors(self, name: str, inputs: tuple[int, ...], *layers: ProfileLayer) -> int:
        """Append the layers and the one op that reads them all (after `inputs`); return the op."""
        first = len(self.layers)
        self.layers.extend(layers)
        return self.op(name, inputs, tuple(range(first, len(self.layers))))

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


def inception_v3(batch: int = 32) -> tuple[list[ProfileLayer], tuple[Op, ...]]:
    """Inception-v3 (TF-slim's inception_v3_base, keras' 1000-class top), 299x299 input, a tensor per
    trainable variable, and its forward DAG: every mixed module's branches read the module's input and
    meet in its concatenation."""
    graph = _GraphBuilder()

    def conv(scope: str, x: int | None, c_in: int, c_out: int, kernel: tuple[int, int], side: int) -> int:
        """A conv (no bias) and its batch-norm (beta only: TF-slim's scale=False): one op, two tensors."""
        kh, kw = kernel
        outputs = c_out * side * side * batch
        return graph.tensors(scope, () if x is None else (x,),
                             ProfileLayer(scope + "/weights", kh * kw * c_in * c_out, 2.0 * kh * kw * c_in * outputs),
                             ProfileLayer(scope + "/BatchNorm/beta", c_out, 4.0 * outputs))

    one, three, five = (1, 1), (3, 3), (5, 5)
    x = conv("Conv2d_1a_3x3", None, 3, 32, three, 149)
    x = conv("Conv2d_2a_3x3", x, 32, 32, three, 147)
    x = conv("Conv2d_2b_3x3", x, 32, 64, three, 147)
    x = graph.op("MaxPool_3a_3x3", (x,))
    x = conv("Conv2d_3b_1x1", x, 64, 80, one, 73)
    x = conv("Conv2d_4a_3x3", x, 80, 192, three, 71)
    x = graph.op("MaxPool_5a_3x3", (x,))
    c_in = 192
    for module, pool_out, b1 in (("Mixed_5b", 32, ("Conv2d_0a_1x1", "Conv2d_0b_5x5")),
                                 ("Mixed_5c", 64, ("Conv2d_0b_1x1", "Conv_1_0c_5x5")),
                                 ("Mixed_5d", 64, ("Conv2d_0b_1x1", "Conv_1_0c_5x5"))):
        m = module + "/Branch_"
        b0 = conv(m + "0/Conv2d_0a_1x1", x, c_in, 64, one, 35)
        b1x = conv(m + "1/" + b1[0], x, c_in, 48, one, 35)
        b1x = conv(m + "1/" + b1[1], b1x, 48, 64, five, 35)
        b2 = conv(m + "2/Conv2d_0a_1x1", x, c_in, 64, one, 35)
        b2 = conv(m + "2/Conv2d_0b_3x3", b2, 64, 96, three, 35)
        b2 = conv(m + "2/Conv2d_0c_3x3", b2, 96, 96, three, 35)
        b3 = conv(m + "3/Conv2d_0b_1x1", graph.op(m + "3/AvgPool_0a_3x3", (x,)), c_in, pool_out, one, 35)
        x, c_in = graph.op(module + "/concat", (b0, b1x, b2, b3)), 64 + 64 + 96 + pool_out
    m = "Mixed_6a/Branch_"
    b0 = conv(m + "0/Conv2d_1a_1x1", x, c_in, 384, three, 17)
    b1x = conv(m + "1/Conv2d_0a_1x1", x, c_in, 64, one, 35)
    b1x = conv(m + "1/Conv2d_0b_3x3", b1x, 64, 96, three, 35)
    b1x = conv(m + "1/Conv2d_1a_1x1", b1x, 96, 96, three, 17)
    x, c_in = graph.op("Mixed_6a/concat", (b0, b1x, graph.op(m + "2/MaxPool_1a_3x3", (x,)))), 384 + 96 + c_in
    seven, seven_t = (1, 7), (7, 1)
    for module, c7 in (("Mixed_6b", 128), ("Mixed_6c", 160), ("Mixed_6d", 160), ("Mixed_6e", 192)):
        m = module + "/Branch_"
        b0 = conv(m + "0/Conv2d_0a_1x1", x, c_in, 192, one, 17)
        b1x = conv(m + "1/Conv2d_0a_1x1", x, c_in, c7, one, 17)
        b1x = conv(m + "1/Conv2d_0b_1x7", b1x, c7, c7, seven, 17)
        b1x = conv(m + "1/Conv2d_0c_7x1", b1x, c7, 192, seven_t, 17)
        b2 = conv(m + "2/Conv2d_0a_1x1", x, c_in, c7, one, 17)
        for name, kernel, c_out in (("0b_7x1", seven_t, c7), ("0c_1x7", seven, c7), ("0d_7x1", seven_t, c7),
                                    ("0e_1x7", seven, 192)):
            b2 = conv(m + "2/Conv2d_" + name, b2, c7, c_out, kernel, 17)
        b3 = conv(m + "3/Conv2d_0b_1x1", graph.op(m + "3/AvgPool_0a_3x3", (x,)), c_in, 192, one, 17)
        x = graph.op(module + "/concat", (b0, b1x, b2, b3))
    m = "Mixed_7a/Branch_"
    b0 = conv(m + "0/Conv2d_0a_1x1", x, c_in, 192, one, 17)
    b0 = conv(m + "0/Conv2d_1a_3x3", b0, 192, 320, three, 8)
    b1x = conv(m + "1/Conv2d_0a_1x1", x, c_in, 192, one, 17)
    b1x = conv(m + "1/Conv2d_0b_1x7", b1x, 192, 192, seven, 17)
    b1x = conv(m + "1/Conv2d_0c_7x1", b1x, 192, 192, seven_t, 17)
    b1x = conv(m + "1/Conv2d_1a_3x3", b1x, 192, 192, three, 8)
    x, c_in = graph.op("Mixed_7a/concat", (b0, b1x, graph.op(m + "2/MaxPool_1a_3x3", (x,)))), 320 + 192 + c_in
    for module, split in (("Mixed_7b", "0b_3x1"), ("Mixed_7c", "0c_3x1")):
        m = module + "/Branch_"
        b0 = conv(m + "0/Conv2d_0a_1x1", x, c_in, 320, one, 8)
        b1x = conv(m + "1/Conv2d_0a_1x1", x, c_in, 384, one, 8)
        b1a = conv(m + "1/Conv2d_0b_1x3", b1x, 384, 384, (1, 3), 8)
        b1b = conv(m + "1/Conv2d_" + split, b1x, 384, 384, (3, 1), 8)
        b2 = conv(m + "2/Conv2d_0a_1x1", x, c_in, 448, one, 8)
        b2 = conv(m + "2/Conv2d_0b_3x3", b2, 448, 384, three, 8)
        b2a = conv(m + "2/Conv2d_0c_1x3", b2, 384, 384, (1, 3), 8)
        b2b = conv(m + "2/Conv2d_0d_3x1", b2, 384, 384, (3, 1), 8)
        b3 = conv(m + "3/Conv2d_0b_1x1", graph.op(m + "3/AvgPool_0a_3x3", (x,)), c_in, 192, one, 8)
        x, c_in = graph.op(module + "/concat", (b0, b1a, b1b, b2a, b2b, b3)), 2048
    x = graph.op("Logits/AvgPool_1a_8x8", (x,))
    graph.tensors("Logits", (x,), ProfileLayer("Logits/kernel", 2048 * 1000, 2.0 * 2048 * 1000 * batch),
                  ProfileLayer("Logits/bias", 1000, 1.0 * 1000 * batch))
    return graph.layers, tuple(graph.ops)


def bert_base_tf(batch: int = 16, seq: int = 128, labels: int = 2) -> tuple[list[ProfileLayer], tuple[Op, ...]]:
    """BERT-base as google-research/bert's TensorFlow code lays out its trainable variables (each kernel,
    bias, gamma and beta its own tensor; pooler; a `labels`-way classifier), and its forward DAG: in
    every layer the query, key and value projections read the layer's input side by side."""
    hidden, ffn, tokens = 768, 3072, batch * seq
    graph = _GraphBuilder()

    def dense(scope: str, x: int, n_in: int, n_out: int, rows: int, extra_flops: float = 0.0) -> int:
        return graph.tensors(scope, (x,), ProfileLayer(scope + "/kernel", n_in * n_out,
                                                       2.0 * n_in * n_out * rows + extra_flops),
                             ProfileLayer(scope + "/bias", n_out, 1.0 * n_out * rows))

    def layer_norm(scope: str, inputs: tuple[int, ...]) -> int:
        return graph.tensors(scope, inputs, ProfileLayer(scope + "/gamma", hidden, 2.0 * hidden * tokens),
                             ProfileLayer(scope + "/beta", hidden, 2.0 * hidden * tokens))

    lookup = 1.0 * tokens * hidden
    x = graph.tensors("bert/embeddings", (), ProfileLayer("bert/embeddings/word_embeddings", 30522 * hidden, lookup),
                      ProfileLayer("bert/embeddings/token_type_embeddings", 2 * hidden, lookup),
                      ProfileLayer("bert/embeddings/position_embeddings", 512 * hidden, lookup))
    x = layer_norm("bert/embeddings/LayerNorm", (x,))
    attention_matmuls = 2 * 2.0 * seq * seq * hidden * batch  # Q.K^T and softmax(.).V
    for i in range(12):
        p = f"bert/encoder/layer_{i}/"
        qkv = tuple(dense(p + "attention/self/" + name, x, hidden, hidden, tokens)
                    for name in ("query", "key", "value"))
        out = dense(p + "attention/output/dense", graph.op(p + "attention/self", qkv), hidden, hidden, tokens,
                    attention_matmuls)
        x = layer_norm(p + "attention/output/LayerNorm", (out, x))  # the residual add, then the norm
        out = dense(p + "output/dense", dense(p + "intermediate/dense", x, hidden, ffn, tokens), ffn, hidden, tokens)
        x = layer_norm(p + "output/LayerNorm", (out, x))
    x = dense("bert/pooler/dense", x, hidden, hidden, batch)
    graph.tensors("output", (x,), ProfileLayer("output_weights", labels * hidden, 2.0 * labels * hidden * batch),
                  ProfileLayer("output_bias", labels, 1.0 * labels * batch))
    return graph.layers, tuple(graph.ops)


def _resnet50_profile() -> Profile:
    layers, graph = resnet50()
    return Profile("resnet50", layers, 0.05067, 0.15390 - 0.05067,
                   "jcjohnson/cnn-benchmarks, GTX 1080, cuDNN 5005, batch 16", graph)


def _inception_v3_profile() -> Profile:
    layers, graph = inception_v3()
    return Profile("inception_v3", layers, 0.250 / 3, 0.250 * 2 / 3,
                   "TensorFlow benchmarks (May 2017), Tesla P100, synthetic data, batch 32: 128 images/s", graph)


def _bert_base_tf_profile() -> Profile:
    layers, graph = bert_base_tf()
    return Profile("bert_base_tf", layers, 0.3456 / 3, 0.3456 * 2 / 3,
                   "Devlin et al. 2019 A.2, TPU chip, batch 16, seq 128", graph)


PROFILES: dict[str, Callable[[], Profile]] = {
    "resnet50": _resnet50_profile,
    "vgg16": lambda: Profile("vgg16", vgg16(), 0.06656, 0.23255 - 0.06656,
                             "jcjohnson/cnn-benchmarks, GTX 1080, cuDNN 5005, batch 16"),
    "bert_base": lambda: Profile("bert_base", bert_base(), 0.3456 / 3, 0.3456 * 2 / 3,
                                 "Devlin et al. 2019 A.2, TPU chip, batch 16, seq 128"),
    "inception_v3": _inception_v3_profile,
    "bert_base_tf": _bert_base_tf_profile,
}


def compute_scale(scale: float, link_mbps: float) -> float:
    """Factor on published times that keeps compute/communication at the emulated link rate."""
    return scale * REFERENCE_LINK_GBPS * 1000.0 / link_mbps


class _Tensor:
    def __init__(self, name: str, size: int):
        self.name, self.size = name, size


class ProfileModel(FlatModel):
    """A profile's layers as real float32 tensors, with compute replaced by timed sleeps, run op by op
    in a Schedule of its DAG (`run_in`; the listing order by default)."""

    def __init__(self, profile: Profile, scale: float, link_mbps: float):
        super().__init__([_Tensor(layer.name, max(1, round(layer.params * scale))) for layer in profile.layers])
        self.profile = profile
        self.graph = profile.graph or chain_graph(len(self.layers))
        total_flops = sum(layer.flops for layer in profile.layers)
        factor = compute_scale(scale, link_mbps)
        self.forward_s = [profile.forward_s * factor * layer.flops / total_flops for layer in profile.layers]
        backward = [layer.flops if layer.backward_flops is None else layer.backward_flops for layer in profile.layers]
        total_backward = sum(backward)
        self.backward_s = [profile.backward_s * factor * weight / total_backward for weight in backward]
        self.schedule = listing_schedule(self.graph)
        self._bounds = [(int(self.offsets[i]), int(self.offsets[i + 1])) for i in range(len(self.layers))]
        self._clock = 0.0

    def op_times_s(self) -> tuple[list[float], list[float]]:
        """Each op's forward and backward seconds: those of the layers it reads."""
        return ([sum(self.forward_s[p] for p in op.params) for op in self.graph],
                [sum(self.backward_s[p] for p in op.params) for op in self.graph])

    def run_in(self, schedule: Schedule) -> None:
        error = schedule_error(self.graph, schedule)
        if error:
            raise ValueError(f"not a schedule of {self.profile.name}: {error}")
        self.schedule = schedule

    def gradient_order(self) -> list[int]:
        """The layers in the order backward() yields them."""
        return gradient_order(self.graph, self.schedule)

    def lay_out(self, order: Sequence[int]) -> None:
        """Place the layers in the flat buffers in `order` (a permutation of them), so that layers adjacent
        in it are one contiguous slice: a run of gradients in the order backprop readies them goes on the
        wire as one message.  Parameters move with their layers."""
        if sorted(order) != list(range(len(self.layers))):
            raise ValueError("a layout is a permutation of the layers")
        params = [self.layer_params(i).copy() for i in range(len(self.layers))]
        start, bounds = 0, [(0, 0)] * len(self.layers)
        for layer in order:
            bounds[layer] = (start, start + self.layers[layer].size)
            start += self.layers[layer].size
        self._bounds = bounds
        for i, values in enumerate(params):
            self.layer_params(i)[...] = values

    def layer_slice(self, layers: tuple[int, ...]) -> slice:
        """The flat-buffer slice of layers that are adjacent in the layout (a layer or a bucket of them)."""
        lo, hi = min(self._bounds[i][0] for i in layers), max(self._bounds[i][1] for i in layers)
        if hi - lo != sum(self.layers[i].size for i in set(layers)):
            raise ValueError(f"layers {sorted(layers)} are not adjacent in the flat buffer")
        return slice(lo, hi)

    def _compute(self, seconds: float) -> None:
        # Sleep to a running deadline so that many short layers do not accumulate oversleep.
        now = time.monotonic()
        self._clock = max(self._clock, now) + seconds
        if self._clock > now:
            sleep_for(self._clock - now)

    def forward(self, batch: object, before_layer: BeforeLayer) -> None:
        self._clock = time.monotonic()
        for op in self.schedule.forward:
            params = self.graph[op].params
            for layer in params:
                before_layer(layer)
            self._compute(sum(self.forward_s[layer] for layer in params))

    def backward(self) -> Iterator[int]:
        for op in self.schedule.backward:
            params = sorted(self.graph[op].params, reverse=True)
            self._compute(sum(self.backward_s[layer] for layer in params))
            for layer in params:
                # A value per layer, so that a layer summed into another's place would show in the result.
                self.layer_grads(layer).fill(EMULATED_GRADIENT * (1 + layer % 8))
                yield layer
