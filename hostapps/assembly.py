"""What every process of a job is built from, worker and server alike: the all-reduce algorithm and
the pieces the model is cut into, the largest message of the job, and the transport with this
process's connections (the algorithm's peers in allreduce; every worker-server pair in ps)."""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

from common.schema import defaults
from hostapps.allreduce import AllReduce, make_allreduce, ring_neighbours
from hostapps.caramel import Prediction, Ring, caramel_pieces, job_of, pipelines, predict
from hostapps.collectives import float_parts, make_buckets
from hostapps.config import ProcessConfig, build_model
from hostapps.mlt import MltOptions, MltTransport
from hostapps.model import FlatModel
from hostapps.profiles import ProfileModel, listing_schedule
from hostapps.records import Recorder
from hostapps.transport import DEFAULT_MAX_MESSAGE_BYTES, Address, Peer, TcpTransport


class Piece(NamedTuple):
    """What one all-reduce unit covers: its layers and its slice of the flat buffers."""
    layers: tuple[int, ...]
    where: slice


def plan_pieces(model: FlatModel, cfg: ProcessConfig) -> list[Piece]:
    """The all-reduce units, in backward order: partitions of each layer (bytescheduler), Caramel's units
    (caramel.caramel_pieces), or --fusion buckets."""
    if cfg.order == "bytescheduler":
        return [Piece((layer,), part) for layer in reversed(range(len(model.layers)))
                for part in float_parts(model.layer_slice((layer,)), cfg.partition_bytes)]
    sizes = [int(model.layer_grads(i).nbytes) for i in range(len(model.layers))]
    buckets = caramel_pieces(model, cfg) if cfg.order == "caramel" else make_buckets(sizes, cfg.fusion_bytes)
    return [Piece(layers, model.layer_slice(layers)) for layers in buckets]


def allreduce_of(cfg: ProcessConfig) -> AllReduce:
    """The job's all-reduce algorithm (--collective) over its workers (and their --leaves)."""
    return make_allreduce(cfg.collective, cfg.world, cfg.leaves)


def agrees(cfg: ProcessConfig) -> bool:
    """Whether the all-reduce's send order picks among units only once every rank has them (collectives.ring_min
    around the ring): an order that reorders must, or the ranks would reduce different units and deadlock;
    ready and caramel take units in backprop's order, the same on every rank."""
    return cfg.order not in ("ready", "caramel")


def largest_message_bytes(cfg: ProcessConfig, model: FlatModel) -> int:
    """The largest message any process of the job sends: a piece in allreduce (no algorithm sends more than a
    segment of it; bytescheduler's agreement is one int64), a layer in ps (its slices are no larger)."""
    if cfg.mode == "allreduce":
        return max(8, *(4 * (piece.where.stop - piece.where.start) for piece in plan_pieces(model, cfg)))
    return 4 * max(layer.size for layer in model.layers)


def peers_to_connect(cfg: ProcessConfig) -> tuple[dict[Peer, Address], dict[Peer, Address]]:
    """The peers this process dials and those it accepts, each in rank order: a TCP transport dials its
    j-th peer from --source-port + j, so the order must be the same in every run."""
    if cfg.role == "server":
        return {}, {Peer("worker", r): address for r, address in enumerate(cfg.workers)}
    if cfg.mode == "ps":
        return {Peer("server", s): address for s, address in enumerate(cfg.servers)}, {}
    ranks = allreduce_of(cfg).peers(cfg.rank)
    if agrees(cfg):
        ranks |= {peer.rank for peer in ring_neighbours(cfg.rank, cfg.world)} - {cfg.rank}
    dial, accept = {}, {}
    for rank in sorted(ranks):
        (dial if rank > cfg.rank else accept)[Peer("worker", rank)] = cfg.workers[rank]
    return dial, accept


def mlt_options(cfg: ProcessConfig | None = None, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                **changes: Any) -> MltOptions:
    """mlt's options: the knobs of the same names of `cfg` (or their defaults, without one), `changes` made,
    and the job's largest message."""
    knobs = defaults(ProcessConfig) if cfg is None else {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    options = MltOptions(max_message_bytes=max_message_bytes,
                         **{f.name: knobs[f.name] for f in dataclasses.fields(MltOptions) if f.name in knobs})
    return dataclasses.replace(options, **changes)


def connect_transport(cfg: ProcessConfig, recorder: Recorder, max_message_bytes: int) -> TcpTransport | MltTransport:
    """Open this process's connections: the all-reduce's peers in allreduce; every worker-server pair in ps.
    max_message_bytes: the largest message of the job (largest_message_bytes): a transport refuses to send
    more, and a peer announcing more is refused, not allocated."""
    me = Peer(cfg.role, cfg.rank)
    listen = (cfg.workers if cfg.role == "worker" else cfg.servers)[cfg.rank]
    if cfg.transport == "mlt":
        options = mlt_options(cfg, max_message_bytes, allreduce_precedence=cfg.mode == "allreduce")
        transport: TcpTransport | MltTransport = MltTransport(me, listen, cfg.tag, cfg.timeout, options=options,
                                                              log=recorder.log_message)
    else:
        transport = TcpTransport(me, listen, cfg.tag, cfg.timeout, recorder.log_message, cfg.source_port,
                                 max_message_bytes)
    dial, accept = peers_to_connect(cfg)
    try:
        transport.connect(dial, accept)
    except BaseException:
        transport.abort()
        raise
    return transport


def predicted_iteration_s(cfg: ProcessConfig, step_s: float) -> Prediction:
    """What the time model predicts for an all-reduce job's steady iteration when a message step costs
    `step_s` (the job plans with its own caramel_step_ms): its units as the worker cuts them (per tensor,
    fusion buckets, or caramel's), its schedule, pipelined as it pipelines."""
    model = build_model(cfg)
    job = job_of(model, cfg.batch // cfg.world)
    schedule = model.schedule if isinstance(model, ProfileModel) else listing_schedule(job.graph)
    units = [piece.layers for piece in plan_pieces(model, cfg)]
    ring = Ring(cfg.world, cfg.link_mbps * 1e6 / 8, step_s, cfg.partition_bytes if pipelines(cfg) else 0,
                cfg.mtu_payload // 4)
    return predict(job, schedule, units, ring)
