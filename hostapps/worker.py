"""A training worker: compute thread runs forward/backward, a comm thread moves gradients.

Wait-free backprop: backward hands each layer's gradient to the comm thread
the moment it is computed, and the next iteration's forward of a layer waits
only for that layer's new parameters (all-reduced and stepped locally, or
pulled from its parameter-server shard).  An inference job (PS mode) runs the forward pass only, each
layer waiting for the parameters the iteration pulls.
"""
import os
import threading
import time
from typing import Callable

import numpy as np

from hostapps import timing
from hostapps.allreduce import GATHER, PeerSenders, Segment, ring_neighbours, run_allreduce
from hostapps.collectives import (PS_PULL, PS_PUSH, assign_shards, float_parts, ps_key, ps_phase, ps_request_key,
                                  ring_min)
from hostapps.assembly import agrees, allreduce_of, connect_transport, largest_message_bytes, plan_pieces
from hostapps.caramel import pipelines
from hostapps.config import ProcessConfig, build_model
from hostapps.data import ShardedBatches, load_split
from common.files import atomic_open
from hostapps.model import FlatModel, Network, Sgd, blas_threads
from hostapps.send_orders import Unit, make_send_order, time_oracle
from hostapps.sendloop import Agree, SendLoop
from hostapps.records import Recorder
from hostapps.transport import MessageKey, Peer, Transport


class GradientSync:
    """What the compute thread asks of communication; one subclass per mode."""

    def __init__(self, cfg: ProcessConfig, transport: Transport, model: FlatModel, recorder: Recorder):
        self.cfg, self.transport, self.model, self.recorder = cfg, transport, model, recorder
        self.wait_s = 0.0  # time the compute thread spent blocked on communication
        self.order = make_send_order(cfg.order, time_oracle(model, cfg.link_mbps))
        self.loop = SendLoop("comm", self.order, self.communicate, transport.abort, *self.batching())

    def check(self) -> None:
        if self.loop.error is not None:
            raise self.loop.error

    def batching(self) -> tuple[Agree | None, int]:
        """The SendLoop's agreement collective and credit bytes: none by default, one unit at a time."""
        return None, 0

    def communicate(self, units: list[Unit]) -> None:
        raise NotImplementedError

    def start_iteration(self, iteration: int) -> None:
        """Called before each iteration's forward pass; nothing by default."""

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

    def phase_of(self, tensor: int, step: int) -> str:
        """The phase (collectives.PHASES) of message (tensor, step), for the records."""
        raise NotImplementedError

    def close(self) -> None:
        self.loop.stop()
        self.check()


class AllReduceSync(GradientSync):
    """All-reduce of each piece (by the job's --collective) once all its layers' gradients exist, then a local
    SGD step."""

    def __init__(self, cfg: ProcessConfig, transport: Transport, model: FlatModel, recorder: Recorder):
        self.pieces = plan_pieces(model, cfg)
        self.agreement_tensor = len(self.pieces)  # tensor id of bytescheduler's ready-count agreement
        self.agreement_iteration, self.agreements = -1, 0
        self.pieces_of_layer: list[list[int]] = [[] for _ in model.layers]
        for p, piece in enumerate(self.pieces):
            for layer in piece.layers:
                self.pieces_of_layer[layer].append(p)
        self.layers_missing = [len(piece.layers) for piece in self.pieces]  # per piece, this iteration
        self.pieces_missing = [len(pieces) for pieces in self.pieces_of_layer]  # per layer, this iteration
        self.left, self.right = ring_neighbours(cfg.rank, cfg.world)  # the agreement's ring
        self.algorithm = allreduce_of(cfg)
        largest = max(piece.where.stop - piece.where.start for piece in self.pieces)
        self.scratch = np.empty(self.algorithm.scratch_elements(cfg.rank, largest), dtype=np.float32)
        self.senders = PeerSenders(transport)  # its threads start with the first message to each peer
        self.sgd = Sgd(cfg.lr, cfg.momentum, model.params.size)
        self.updated = [-1] * len(model.layers)  # last iteration whose update each layer holds
        self.cond = threading.Condition()
        super().__init__(cfg, transport, model, recorder)

    def batching(self) -> tuple[Agree | None, int]:
        return (self.agree, self.cfg.credit_bytes) if agrees(self.cfg) else (None, 0)

    def agree(self, first: Unit, arrivals: int) -> int:
        """How many units have arrived on every rank (backprop puts them in the same order everywhere)."""
        if first.iteration != self.agreement_iteration:
            self.agreement_iteration, self.agreements = first.iteration, 0
        key = MessageKey(first.iteration, self.agreement_tensor, self.agreements * (self.cfg.world - 1))
        self.agreements += 1
        return ring_min(self.transport, self.left, self.right, self.cfg.world, key, arrivals)

    def gradient_ready(self, iteration: int, layer: int) -> None:
        self.check()
        for p in self.pieces_of_layer[layer]:
            self.layers_missing[p] -= 1
            if self.layers_missing[p] == 0:
                piece = self.pieces[p]
                self.layers_missing[p] = len(piece.layers)
                self.loop.queue.put(Unit(iteration, p, piece.layers, (piece.where.stop - piece.where.start) * 4))

    def communicate(self, units: list[Unit]) -> None:
        """All-reduce a batch of units (all of one iteration) as one pipeline; caramel's pipelining, or a
        pipelined algorithm, cuts each into --partition-bytes segments."""
        cfg, algorithm, segments = self.cfg, self.algorithm, []
        for unit in units:
            flat = self.model.grads[self.pieces[unit.tensor].where]
            bounds = algorithm.segments(flat.size, cfg.partition_bytes // 4, cfg.mtu_payload // 4,
                                        pipeline=pipelines(cfg))
            segments += [Segment(unit.tensor, k * algorithm.steps, flat[lo:hi]) for k, (lo, hi) in enumerate(bounds)]
        names = self.tensor_names()
        with self.recorder.span(f"allreduce {' '.join(names[u.tensor][0] for u in units)}", "comm"):
            run_allreduce(self.transport, algorithm, cfg.rank, units[0].iteration, segments, self.scratch,
                          self.senders)
        for unit in units:
            self.sgd.step(self.pieces[unit.tensor].where, self.model.params, self.model.grads)
        with self.cond:
            for unit in units:
                for layer in unit.layers:
                    self.pieces_missing[layer] -= 1
                    if self.pieces_missing[layer] == 0:
                        self.pieces_missing[layer] = len(self.pieces_of_layer[layer])
                        self.updated[layer] = unit.iteration
            self.cond.notify_all()

    def wait_params(self, iteration: int, layer: int) -> None:
        if self.updated[layer] >= iteration - 1:
            return
        start = time.time()
        with self.recorder.span(f"wait {self.model.layers[layer].name}", "wait"), self.cond:
            while self.updated[layer] < iteration - 1:
                self.check()
                self.cond.wait(0.1)
        self.wait_s += time.time() - start

    def tensor_names(self) -> dict[int, tuple[str, str]]:
        names = {p: (self.model.layers[piece.layers[0]].name if len(piece.layers) == 1 else f"bucket{p}",
                     "+".join(map(str, piece.layers))) for p, piece in enumerate(self.pieces)}
        return {**names, self.agreement_tensor: ("agreement", "")}

    def phase_of(self, tensor: int, step: int) -> str:
        return GATHER if tensor == self.agreement_tensor else self.algorithm.phase(step)

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.senders.close(join=False)  # idle by now: every all-reduce waited for its sends


class PushPullSync(GradientSync):
    """Push each gradient to its parameter-server shard; pull each layer's parameters before its forward.

    With --ps-slice-bytes each layer goes as slices (flat-buffer ranges cut identically by the server):
    the server returns a slice as soon as every worker pushed it, so pulls overlap later pushes."""

    def __init__(self, cfg: ProcessConfig, transport: Transport, model: FlatModel, recorder: Recorder):
        super().__init__(cfg, transport, model, recorder)
        sizes = [layer.size for layer in model.layers]
        self.server_of = [Peer("server", s) for s in assign_shards(sizes, len(cfg.servers))]
        self.slices = [float_parts(model.layer_slice((layer,)), cfg.ps_slice_bytes) for layer in range(len(sizes))]
        self.pulled = [-1] * len(model.layers)  # last iteration whose parameters each layer holds

    def gradient_ready(self, iteration: int, layer: int) -> None:
        self.check()
        parts = self.slices[layer]
        for part, where in enumerate(parts):
            self.loop.queue.put(Unit(iteration, layer, (layer,), (where.stop - where.start) * 4, part, len(parts)))

    def communicate(self, units: list[Unit]) -> None:
        for unit in units:
            self.transport.send(self.server_of[unit.tensor], ps_key(unit.iteration, unit.tensor, unit.part, PS_PUSH),
                                self.model.grads[self.slices[unit.tensor][unit.part]], tolerate_loss=True)

    def wait_params(self, iteration: int, layer: int) -> None:
        if iteration == 0 or self.pulled[layer] >= iteration - 1:
            return
        self.check()
        start = time.time()
        with self.recorder.span(f"wait {self.model.layers[layer].name}", "wait"):
            for part, where in enumerate(self.slices[layer]):
                self.transport.recv(self.server_of[layer], ps_key(iteration - 1, layer, part, PS_PULL),
                                    out=self.model.params[where])
        self.pulled[layer] = iteration - 1
        self.wait_s += time.time() - start

    def tensor_names(self) -> dict[int, tuple[str, str]]:
        return self.model.layer_tensor_names()

    def phase_of(self, tensor: int, step: int) -> str:
        return ps_phase(step)


class InferencePull(PushPullSync):
    """Inference at a parameter server: no gradients; each iteration asks every shard for its parameters as
    it starts (a TensorFlow worker's receive ops), and each layer's forward waits for that iteration's pull."""

    def __init__(self, cfg: ProcessConfig, transport: Transport, model: FlatModel, recorder: Recorder):
        super().__init__(cfg, transport, model, recorder)
        self.request_tensor = len(model.layers)
        self.shards = [Peer("server", s) for s in range(len(cfg.servers))]

    def start_iteration(self, iteration: int) -> None:
        self.check()
        for shard in self.shards:
            self.transport.send(shard, ps_request_key(iteration, self.request_tensor), np.zeros(1, np.float32))

    def wait_params(self, iteration: int, layer: int) -> None:
        # Iteration t reads the parameters pulled for t itself (training reads those stepped in t - 1).
        super().wait_params(iteration + 1, layer)

    def wait_all(self, iteration: int) -> None:
        """Every parameter an iteration pulls is in when its forward pass ends."""

    def tensor_names(self) -> dict[int, tuple[str, str]]:
        return {**super().tensor_names(), self.request_tensor: ("request", "")}


def write_model(path: str, model: FlatModel) -> None:
    """Final parameters, one flat float32 array per layer, keyed by layer name."""
    with atomic_open(path, "wb") as file:
        np.savez(file, **{layer.name: model.layer_params(i) for i, layer in enumerate(model.layers)})


def run_worker(cfg: ProcessConfig, on_iteration: Callable[[int], None] | None = None) -> dict:
    """Train for cfg.iterations; write the --out files; return the summary (and the model under 'model').
    on_iteration(done) is called after each iteration (the CLI reports progress with it)."""
    wall_start = time.time()
    model = build_model(cfg)
    split = load_split(cfg.seed) if isinstance(model, Network) else None
    batches = ShardedBatches(split, cfg.batch, cfg.rank, cfg.world, cfg.seed) if split else None
    recorder = Recorder(cfg.tag, "worker", cfg.rank)
    transport = connect_transport(cfg, recorder, largest_message_bytes(cfg, model))
    inference = cfg.task == "inference"
    sync = (AllReduceSync if cfg.mode == "allreduce" else InferencePull if inference else PushPullSync)(
        cfg, transport, model, recorder)
    accuracy = None
    if cfg.start_at:  # connected to its peers, the job starts at its offset (its peers wait alike)
        time.sleep(max(0.0, cfg.start_at - time.time()))
    try:
        for it in range(cfg.iterations):
            if cfg.start_at and cfg.pace and it:  # kept to its place on the circle, not only started there
                time.sleep(max(0.0, cfg.start_at + it * cfg.pace - time.time()))
            start = time.time()
            sync.wait_s = 0.0
            sync.start_iteration(it)
            with recorder.span(f"forward {it}", "compute"):
                loss = model.forward(batches.batch(it) if batches else None,
                                     lambda layer: sync.wait_params(it, layer))
            if not inference:
                with recorder.span(f"backward {it}", "compute"):
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
    summary = dict(job=cfg.tag, role="worker", rank=cfg.rank, mode=cfg.mode, model=cfg.model.name,
                   final_accuracy=accuracy, iterations=cfg.iterations, param_count=int(model.params.size),
                   bytes_per_iteration=int(model.params.nbytes), transport=transport.counters(),
                   timing=timing.summary(), blas_threads=blas_threads(),
                   wall_time_s=time.time() - wall_start)
    if cfg.out:
        recorder.write(cfg.out, sync.tensor_names(), summary, sync.phase_of)
        write_model(os.path.join(cfg.out, "model.npz"), model)
    return {**summary, "model": model, "recorder": recorder}

