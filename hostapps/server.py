"""A parameter-server shard: averages the workers' gradients of its tensors, steps SGD, returns parameters.

Synchronous: iteration t of a tensor completes when every worker has pushed
its gradient.  Gradients are taken in arrival order (wait_any), and each
tensor is queued for return to every worker as soon as it is updated; one
send thread per worker picks the order with the --send-order.  With
--ps-slice-bytes the unit is a slice of a tensor instead (P3's parameter
slicing): it is averaged, stepped and returned on its own, so the return of
early slices overlaps the push of later ones on the full-duplex link.

With --ps-update iteration the shard keeps TensorFlow's semantics instead: it steps every tensor once
the iteration's last gradient is in, so all of them become ready at once and the send order alone
decides which the next forward pass gets first (TicTac's setting).  With --task inference there are
no gradients: each worker asks for an iteration's parameters (ps_request_key) when it starts it, and
gets every parameter of the shard back in the send order; workers run free, one iteration apart at
most (the shard serves iteration t+1's requests once every worker asked for t).

Under a loss bound pushes tolerate loss and pulls are exact (collectives.ring_allreduce says why).
Every push is one worker's contribution, so a short one is cheap to account for exactly: each
element is averaged over the contributions that arrived (a per-element count, kept only for a
slice some push of which came short), not over every worker with zeros for the lost ones.
"""
import time

import numpy as np

from hostapps import timing
from hostapps.assembly import connect_transport, largest_message_bytes
from hostapps.collectives import (PS_PULL, PS_PUSH, assign_shards, float_parts, ps_key, ps_phase,
                                  ps_request_key)
from hostapps.config import ProcessConfig, build_model
from hostapps.model import FlatModel, Sgd, blas_threads
from hostapps.send_orders import Unit, make_send_order, time_oracle
from hostapps.sendloop import SendLoop
from hostapps.records import Recorder
from hostapps.transport import MessageKey, Peer, Transport, TransportError


class ParameterShard:
    """The tensors one server owns, and the per-iteration aggregation over a transport."""

    def __init__(self, cfg: ProcessConfig, transport: Transport, model: FlatModel, recorder: Recorder):
        self.cfg, self.transport, self.model, self.recorder = cfg, transport, model, recorder
        owners = assign_shards([layer.size for layer in model.layers], len(cfg.servers))
        self.tensors = [t for t, owner in enumerate(owners) if owner == cfg.rank]
        self.workers = [Peer("worker", r) for r in range(cfg.world)]
        # Flat-buffer slices of each owned tensor, cut as the workers cut them (one when unsliced).
        self.slices = {t: float_parts(model.layer_slice((t,)), cfg.ps_slice_bytes) for t in self.tensors}
        self.request_tensor = len(model.layers)
        self.sgd = Sgd(cfg.lr, cfg.momentum, model.params.size)
        largest = max(where.stop - where.start for parts in self.slices.values() for where in parts)
        self.scratch = np.empty(largest, dtype=np.float32)
        self.arrived = np.empty(largest, dtype=bool)  # which elements of the last push arrived
        oracle = time_oracle(model, cfg.link_mbps)
        # One queue per worker: when many tensors are updated at once, the send order orders each worker's returns.
        self.senders = [SendLoop(f"send-{worker}", make_send_order(cfg.order, oracle), self._sender(worker),
                                 transport.abort) for worker in self.workers]

    def _sender(self, worker: Peer):
        def send(units: list[Unit]) -> None:
            for unit in units:
                self.transport.send(worker, ps_key(unit.iteration, unit.tensor, unit.part, PS_PULL),  # exact
                                    self.model.params[self.slices[unit.tensor][unit.part]])
        return send

    def _check(self) -> None:
        for sender in self.senders:
            if sender.error is not None:
                raise sender.error

    def _unit(self, iteration: int, tensor: int, part: int) -> Unit:
        where = self.slices[tensor][part]
        return Unit(iteration, tensor, (tensor,), (where.stop - where.start) * 4, part, len(self.slices[tensor]))

    def serve_iteration(self, iteration: int) -> float:
        """Aggregate, step and return every owned slice of one iteration (inference: return them on
        request); return the compute seconds."""
        if self.cfg.task == "inference":
            self._serve_requests(iteration)
            return 0.0
        stepped: list[Unit] = []  # with --ps-update iteration, returned once all are
        slice_of = {ps_key(iteration, t, part, PS_PUSH): (t, part)
                    for t in self.tensors for part in range(len(self.slices[t]))}
        pending = {(worker, key) for worker in self.workers for key in slice_of}
        arrived = dict.fromkeys(slice_of, 0)
        # Of the slices with a short push: per element, how many pushes it arrived in.
        contributions: dict[MessageKey, np.ndarray] = {}
        compute_s = 0.0
        while pending:
            self._check()
            peer, key = self.transport.wait_any(pending)
            pending.remove((peer, key))
            start = time.time()
            t, part = slice_of[key]
            where = self.slices[t][part]
            grad = self.model.grads[where]
            incoming = grad if arrived[key] == 0 else self.scratch[:grad.size]
            arrived_elements = self.arrived[:grad.size]
            delivered = self.transport.recv(peer, key, out=incoming, arrived=arrived_elements)
            if incoming is not grad:
                grad += incoming
            if delivered < 1 or key in contributions:
                count = contributions.setdefault(key, np.full(grad.size, arrived[key], dtype=np.int32))
                count += arrived_elements
            arrived[key] += 1
            if arrived[key] == len(self.workers):
                if key in contributions:  # an element no push delivered gets a zero gradient
                    grad /= np.maximum(contributions.pop(key), 1).astype(np.float32)
                else:
                    grad *= np.float32(1.0 / len(self.workers))
                self.sgd.step(where, self.model.params, self.model.grads)
                unit = self._unit(iteration, t, part)
                if self.cfg.ps_update == "tensor":
                    for sender in self.senders:
                        sender.queue.put(unit)
                else:
                    stepped.append(unit)
            compute_s += time.time() - start
        for sender in self.senders:
            sender.queue.put(*stepped)
        for worker, sender in zip(self.workers, self.senders):
            if not sender.queue.join(self.cfg.timeout):
                self._check()
                raise TransportError(f"could not return the parameters of iteration {iteration} to {worker} "
                                     f"within {self.cfg.timeout:.1f} s")
        self._check()
        return compute_s

    def _serve_requests(self, iteration: int) -> None:
        """Queue every owned slice of `iteration` for each worker as its request arrives, back layers
        first (the order training's backprop would have made them ready: `ready` is not front first)."""
        units = [self._unit(iteration, t, part) for t in reversed(self.tensors) for part in range(len(self.slices[t]))]
        key = ps_request_key(iteration, self.request_tensor)
        pending = {(worker, key) for worker in self.workers}
        while pending:
            self._check()
            worker, _ = self.transport.wait_any(pending)
            pending.remove((worker, key))
            self.transport.recv(worker, key, out=self.scratch[:1])
            self.senders[worker.rank].queue.put(*units)

    def tensor_names(self) -> dict[int, tuple[str, str]]:
        return {**self.model.layer_tensor_names(), self.request_tensor: ("request", "")}

    def close(self) -> None:
        for sender in self.senders:
            sender.stop()
        self._check()


def run_server(cfg: ProcessConfig) -> dict:
    """Serve cfg.iterations synchronous iterations; write the --out files; return the summary."""
    wall_start = time.time()
    model = build_model(cfg)
    recorder = Recorder(cfg.tag, "server", cfg.rank)
    transport = connect_transport(cfg, recorder, largest_message_bytes(cfg, model))
    try:
        shard = ParameterShard(cfg, transport, model, recorder)
        for it in range(cfg.iterations):
            start = time.time()
            with recorder.span(f"iteration {it}", "server"):
                compute_s = shard.serve_iteration(it)
            end = time.time()
            recorder.add_iteration(it, start, end, end - start - compute_s, None, None)
        shard.close()
    except BaseException:
        transport.abort()
        raise
    transport.close()
    summary = dict(job=cfg.tag, role="server", rank=cfg.rank, mode=cfg.mode, model=cfg.model.name,
                   final_accuracy=None, iterations=cfg.iterations, param_count=int(model.params.size),
                   bytes_per_iteration=int(model.params.nbytes), shard_tensors=shard.tensors,
                   transport=transport.counters(), timing=timing.summary(), blas_threads=blas_threads(),
                   wall_time_s=time.time() - wall_start)
    if cfg.out:
        recorder.write(cfg.out, shard.tensor_names(), summary, lambda tensor, step: ps_phase(step))
    return {**summary, "model": model, "recorder": recorder}
