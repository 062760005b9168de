"""A training worker: compute thread runs forward/backward, a comm thread moves gradients.

Wait-free backprop: backward hands each layer's gradient to the comm thread
the moment it is computed, and the next iteration's forward of a layer waits
only for that layer's new parameters (all-reduced and stepped locally, or
pulled from its parameter-server shard).
"""
import os
import threading
import time
from typing import Callable

import numpy as np

from hostapps.collectives import (PS_PULL, PS_PUSH, assign_shards, make_buckets, ring_allreduce,
                                  ring_neighbours)
from hostapps.config import RunConfig, build_model
from hostapps.data import ShardedBatches, load_split
from hostapps.model import FlatModel, Network, Sgd
from hostapps.policies import SendLoop, Unit, make_policy
from hostapps.records import Recorder
from hostapps.transport import MessageKey, Peer, TcpTransport, Transport


class GradientSync:
    """What the compute thread asks of communication; one subclass per mode."""

    def __init__(self, cfg: RunConfig, transport: Transport, model: FlatModel, recorder: Recorder):
        self.cfg, self.transport, self.model, self.recorder = cfg, transport, model, recorder
        self.wait_s = 0.0  # time the compute thread spent blocked on communication
        self.loop = SendLoop("comm", make_policy(cfg.policy), self.communicate, transport.abort)

    def check(self) -> None:
        if self.loop.error is not None:
            raise self.loop.error

    def communicate(self, unit: Unit) -> None:
        raise NotImplementedError

    def gradient_ready(self, iteration: int, layer: int) -> None:
        raise NotImplementedError

    def wait_params(self, iteration: int, layer: int) -> None:
        """Block until `layer` holds the parameters that iteration `iteration` must use."""
        raise NotImplementedError

    def wait_all(self, iteration: int) -> None:
        """Block until every layer holds the parameters produced by `iteration`."""
        for layer in range(len(self.model.layers)):
            self.wait_params(iteration + 1, layer)

    def tensor_names(self) -> dict[int, tuple[str, str]]:
        raise NotImplementedError

    def close(self) -> None:
        self.loop.stop()
        self.check()


class AllReduceSync(GradientSync):
    """Ring all-reduce of each bucket once all its layers' gradients exist, then a local SGD step."""

    def __init__(self, cfg: RunConfig, transport: Transport, model: FlatModel, recorder: Recorder):
        super().__init__(cfg, transport, model, recorder)
        sizes = [int(model.layer_grads(i).nbytes) for i in range(len(model.layers))]
        self.buckets = make_buckets(sizes, cfg.fusion_bytes)
        self.bucket_of = {layer: b for b, layers in enumerate(self.buckets) for layer in layers}
        self.pending = {b: len(layers) for b, layers in enumerate(self.buckets)}
        self.left, self.right = ring_neighbours(cfg.rank, cfg.world)
        largest = max(model.layer_slice(layers).stop - model.layer_slice(layers).start for layers in self.buckets)
        self.scratch = np.empty(largest // cfg.world + 1, dtype=np.float32)  # one ring chunk
        self.sgd = Sgd(cfg.lr, cfg.momentum, model.params.size)
        self.updated = [-1] * len(model.layers)  # last iteration whose update each layer holds
        self.cond = threading.Condition()

    def gradient_ready(self, iteration: int, layer: int) -> None:
        self.check()
        b = self.bucket_of[layer]
        self.pending[b] -= 1
        if self.pending[b] == 0:
            self.pending[b] = len(self.buckets[b])
            where = self.model.layer_slice(self.buckets[b])
            self.loop.queue.put(Unit(iteration, b, self.buckets[b], (where.stop - where.start) * 4))

    def communicate(self, unit: Unit) -> None:
        where = self.model.layer_slice(unit.layers)
        with self.recorder.span("allreduce %s" % self.tensor_names()[unit.tensor][0], "comm"):
            ring_allreduce(self.transport, self.left, self.right, self.cfg.rank, self.cfg.world,
                           unit.iteration, unit.tensor, self.model.grads[where], self.scratch)
        self.sgd.step(where, self.model.params, self.model.grads)
        with self.cond:
            for layer in unit.layers:
                self.updated[layer] = unit.iteration
            self.cond.notify_all()

    def wait_params(self, iteration: int, layer: int) -> None:
        if self.updated[layer] >= iteration - 1:
            return
        start = time.time()
        with self.recorder.span("wait %s" % self.model.layers[layer].name, "wait"), self.cond:
            while self.updated[layer] < iteration - 1:
                self.check()
                self.cond.wait(0.1)
        self.wait_s += time.time() - start

    def tensor_names(self) -> dict[int, tuple[str, str]]:
        return {b: (self.model.layers[layers[0]].name if len(layers) == 1 else "bucket%d" % b,
                    "+".join(map(str, layers))) for b, layers in enumerate(self.buckets)}


class PushPullSync(GradientSync):
    """Push each gradient to its parameter-server shard; pull each layer's parameters before its forward."""

    def __init__(self, cfg: RunConfig, transport: Transport, model: FlatModel, recorder: Recorder):
        super().__init__(cfg, transport, model, recorder)
        sizes = [layer.size for layer in model.layers]
        self.server_of = [Peer("server", s) for s in assign_shards(sizes, len(cfg.servers))]
        self.pulled = [-1] * len(model.layers)  # last iteration whose parameters each layer holds

    def gradient_ready(self, iteration: int, layer: int) -> None:
        self.check()
        self.loop.queue.put(Unit(iteration, layer, (layer,), int(self.model.layer_grads(layer).nbytes)))

    def communicate(self, unit: Unit) -> None:
        layer = unit.tensor
        self.transport.send(self.server_of[layer], MessageKey(unit.iteration, layer, PS_PUSH),
                            self.model.layer_grads(layer))

    def wait_params(self, iteration: int, layer: int) -> None:
        if iteration == 0 or self.pulled[layer] >= iteration - 1:
            return
        self.check()
        start = time.time()
        with self.recorder.span("wait %s" % self.model.layers[layer].name, "wait"):
            self.transport.recv(self.server_of[layer], MessageKey(iteration - 1, layer, PS_PULL),
                                out=self.model.layer_params(layer))
        self.pulled[layer] = iteration - 1
        self.wait_s += time.time() - start

    def tensor_names(self) -> dict[int, tuple[str, str]]:
        return self.model.layer_tensor_names()


def connect_transport(cfg: RunConfig, recorder: Recorder) -> TcpTransport:
    """Open this process's connections: ring neighbours in allreduce; every worker-server pair in ps."""
    me = Peer(cfg.role, cfg.rank)
    listen = (cfg.workers if cfg.role == "worker" else cfg.servers)[cfg.rank]
    transport = TcpTransport(me, listen, cfg.job, cfg.timeout, recorder.log_message)
    dial, accept = {}, {}
    if cfg.role == "server":
        accept = {Peer("worker", r): address for r, address in enumerate(cfg.workers)}
    elif cfg.mode == "ps":
        dial = {Peer("server", s): address for s, address in enumerate(cfg.servers)}
    else:
        for peer in set(ring_neighbours(cfg.rank, cfg.world)) - {me}:
            (dial if peer.rank > cfg.rank else accept)[peer] = cfg.workers[peer.rank]
    try:
        transport.connect(dial, accept)
    except BaseException:
        transport.abort()
        raise
    return transport


def write_model(path: str, model: FlatModel) -> None:
    """Final parameters, one flat float32 array per layer, keyed by layer name."""
    np.savez(path, **{layer.name: model.layer_params(i) for i, layer in enumerate(model.layers)})


def run_worker(cfg: RunConfig, on_iteration: Callable[[int], None] | None = None) -> dict:
    """Train for cfg.iterations; write the --out files; return the summary (and the model under 'model').
    on_iteration(done) is called after each iteration (the CLI reports progress with it)."""
    wall_start = time.time()
    model = build_model(cfg)
    split = load_split(cfg.seed) if isinstance(model, Network) else None
    batches = ShardedBatches(split, cfg.batch, cfg.rank, cfg.world, cfg.seed) if split else None
    recorder = Recorder(cfg.job, "worker", cfg.rank)
    transport = connect_transport(cfg, recorder)
    sync = (AllReduceSync if cfg.mode == "allreduce" else PushPullSync)(cfg, transport, model, recorder)
    accuracy = None
    try:
        for it in range(cfg.iterations):
            start = time.time()
            sync.wait_s = 0.0
            with recorder.span("forward %d" % it, "compute"):
                loss = model.forward(batches.batch(it) if batches else None,
                                     lambda layer: sync.wait_params(it, layer))
            with recorder.span("backward %d" % it, "compute"):
                for layer in model.backward():
                    sync.gradient_ready(it, layer)
            last = it == cfg.iterations - 1
            if last:
                sync.wait_all(it)  # the last iteration ends when its parameters are in
            end, wait_s = time.time(), sync.wait_s
            accuracy = None
            if split is not None and (last or (cfg.eval_every and (it + 1) % cfg.eval_every == 0)):
                sync.wait_all(it)
                accuracy = model.accuracy(split.x_test, split.y_test)
            recorder.add_iteration(it, start, end, wait_s, loss, accuracy)
            if on_iteration is not None:
                on_iteration(it + 1)
        sync.close()
    except BaseException as e:
        transport.abort()
        # A comm-thread failure is the root cause of whatever the compute thread then saw.
        raise sync.loop.error or e
    transport.close()
    summary = dict(role="worker", rank=cfg.rank, mode=cfg.mode, model=cfg.profile or cfg.model,
                   final_accuracy=accuracy, iterations=cfg.iterations, param_count=int(model.params.size),
                   bytes_per_iteration=int(model.params.nbytes), wall_time_s=time.time() - wall_start)
    if cfg.out:
        recorder.write(cfg.out, sync.tensor_names(), summary)
        write_model(os.path.join(cfg.out, "model.npz"), model)
    return {**summary, "model": model, "recorder": recorder}

