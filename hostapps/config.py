"""What a training job is (`Training`, the knobs an experiment spec's `job` and the host apps' command
line share) and what one process of it is (`ProcessConfig`: its role, rank, peers, transport
details). Each knob is declared once here, on the schema engine (common/schema.py): the host apps'
argparse is generated from it, the runner writes a command line with `to_arguments`, and the spec's
`job` section extends `Training`; defaults are the same everywhere.
"""
import argparse
import math
import re
from dataclasses import dataclass
from typing import Any, Callable

from common.frames import DEFAULT_MTU
from hostapps.allreduce import ALLREDUCES, allreduce_names
from hostapps.caramel import BATCHINGS, PIPELININGS, SCHEDULES, computation_schedule, job_of
from hostapps.collectives import FUSION_PRESETS, MAX_PS_SLICES, split_bytes
from hostapps.mlt.wire import payload_for_mtu
from hostapps.model import FlatModel, Network
from hostapps.profiles import PROFILES, ProfileModel
from common.schema import SchemaError, add_arguments, from_arguments, knob, section, to_arguments
from hostapps.send_orders import SEND_ORDERS, resolve, send_order_names
from hostapps.traces import TraceError, trace_profile
from hostapps.transport import Address

MODES = ("allreduce", "ps")
TASKS = ("train", "inference")
# When a parameter-server shard steps and returns a tensor: as soon as every worker pushed it, or, as
# TensorFlow's PS does, once the whole iteration's gradients are in (every parameter at once).
PS_UPDATES = ("tensor", "iteration")
# The computation schedule a profile's ops run in (hostapps/caramel.py): the DAG's listing order
# forward and its reverse backward, as frameworks run a module list; an arbitrary valid order of the
# DAG drawn from the seed, as TensorFlow's dataflow executor runs it; or Caramel's, which widens the
# transfer windows.
BACKWARD_ORDERS = SCHEDULES
TRANSPORTS = ("tcp", "mlt")
# How mlt draws a datagram's source port on a spraying fabric: away from the paths its receiver saw
# queue (hostapps.mlt.paths), or blind, at random over every port.
SPRAY_MODES = ("adaptive", "blind")
ROLES = ("worker", "server")
U32 = 2**32 - 1        # the frame header's tag field; the largest seed
MAX_TIMEOUT_S = 86400  # a day, far beyond any run (waits overflow past threading.TIMEOUT_MAX, ~292 years)
MAX_LINK_MBPS = 1e6    # mlt advises rates in kbit/s in a 32-bit field
# Messages of a job: a fusion bucket, partition or PS slice below 1 KiB (256 floats) costs Python
# more per message than its bytes.
MIN_PIECE_BYTES, MAX_PIECE_BYTES = 1024, 1 << 30
PIECE_BYTES = (f"{MIN_PIECE_BYTES}..{MAX_PIECE_BYTES}, smaller pieces cost a message per "
               f"{MIN_PIECE_BYTES // 4} floats or fewer")


class ConfigError(SchemaError):
    """Bad input, reported as 'error: --ARG: message' (or 'error: message' when it names no one argument)."""

    def __init__(self, argument: str, message: str):
        super().__init__(argument, message)
        if not argument:
            self.args = (message,)


def model_names() -> list[str]:
    return ["mlp", *PROFILES, "trace"]


def _fusion(value: str) -> bool:
    return value in FUSION_PRESETS or (re.fullmatch(r"[1-9][0-9]{0,9}", value) is not None
                                       and MIN_PIECE_BYTES <= int(value) <= MAX_PIECE_BYTES)


def _piece(n: int) -> bool:
    return MIN_PIECE_BYTES <= n <= MAX_PIECE_BYTES


@dataclass(frozen=True)
class Model:
    """What is trained: the MLP on the digits, or the layers of a real DNN's profile."""
    name: str = knob("mlp", choices=model_names, flag="--model")
    width: int = knob(64, "an integer 1..1024 (mlp only: hidden units per layer)", lambda n: 1 <= n <= 1024)
    depth: int = knob(2, "an integer 1..8 (mlp only: hidden layers)", lambda n: 1 <= n <= 8)
    conv: int = knob(0, "an integer 0..64 (mlp only: channels of a leading 3x3 conv layer; 0: none)",
                     lambda n: 0 <= n <= 64)
    scale: float = knob(0.01, "a fraction of the profile's tensor sizes in (0, 1]", lambda x: 0 < x <= 1)
    trace: str | None = knob(None, "a PyTorch profiler trace (Kineto's Chrome-trace JSON, .json or .json.gz, recorded "
                             "with record_shapes) whose training step gives the profile (hostapps/traces.py); a path "
                             "from the repository root or absolute", flag="--model-trace")

    def __post_init__(self) -> None:
        if self.trace is not None and self.name == "mlp":  # name left out: the trace is the model
            object.__setattr__(self, "name", "trace")

    @property
    def profile(self) -> str | None:
        return None if self.name == "mlp" else self.name


@dataclass(frozen=True, kw_only=True)
class Training:
    """The knobs of a training job, the same in every process."""
    mode: str = knob("allreduce", choices=lambda: MODES)
    task: str = knob("train", choices=lambda: TASKS)
    collective: str = knob("ring", choices=allreduce_names)
    model: Model = section(Model)
    iterations: int = knob(60, "an integer 1..10000", lambda n: 1 <= n <= 10_000)
    batch: int = knob(48, "an integer 1..4096 (global batch, split evenly over the workers)", lambda n: 1 <= n <= 4096)
    lr: float = knob(0.3, "a finite learning rate > 0", lambda x: 0 < x < math.inf)
    momentum: float = knob(0.0, "a fraction in [0, 1)", lambda x: 0 <= x < 1)
    seed: int = knob(0, f"an integer 0..{U32}", lambda n: 0 <= n <= U32)
    transport: str = knob("tcp", choices=lambda: TRANSPORTS)
    loss_bound: float = knob(0.0, "a fraction in [0, 1) (transport mlt)", lambda x: 0 <= x < 1)
    drop_marking: bool = knob(False, "true or false (transport mlt with loss_bound > 0)")
    spray: str = knob("adaptive", choices=lambda: SPRAY_MODES)
    send_order: str = knob("ready", choices=send_order_names)
    fusion: str = knob("none", f"none, horovod, ddp or a bucket size in bytes as a string, {PIECE_BYTES} "
                       "(allreduce)", _fusion)
    partition_bytes: int = knob(65536, f"a byte count {PIECE_BYTES} (allreduce: caramel's first bucket and "
                                "pipeline segment, bytescheduler's partition)", _piece)
    credit_bytes: int = knob(262144, f"a byte count 0..{MAX_PIECE_BYTES} (bytescheduler: partition bytes in "
                             "flight at once)", lambda n: 0 <= n <= MAX_PIECE_BYTES)
    ps_slice_bytes: int = knob(0, f"0 or a multiple of 4 in {PIECE_BYTES} (ps: each layer pushed and pulled in "
                               "slices of at most this size, as P3; 0: whole layers; allreduce ignores it)",
                               lambda n: n == 0 or (_piece(n) and n % 4 == 0))
    ps_update: str = knob("tensor", choices=lambda: PS_UPDATES)
    backward: str = knob("reverse", choices=lambda: BACKWARD_ORDERS)
    caramel_batching: str = knob("adaptive", choices=lambda: BATCHINGS)
    caramel_pipelining: str = knob("segments", choices=lambda: PIPELININGS)
    caramel_step_ms: float = knob(1.0, "milliseconds > 0, at most 1000 (Caramel's cost model: what one message step of "
                                  "a ring all-reduce costs beyond its bytes; caramel's batching and schedule plan "
                                  "with it)", lambda x: 0 < x <= 1000)
    eval_every: int = knob(10, "an integer >= 0 (iterations; 0: only at the end)", lambda n: n >= 0)

    @property
    def fusion_bytes(self) -> int:
        return FUSION_PRESETS[self.fusion] if self.fusion in FUSION_PRESETS else int(self.fusion)

    @property
    def order(self) -> str:
        """The send order in effect (`best` resolved for the mode)."""
        return resolve(self.send_order, self.mode)


def check_training(job: Training, label: Callable[[str], str], error: type[SchemaError] = SchemaError,
                   runs: bool = True) -> None:
    """The rules that span a job's knobs; `label` names a knob for the message (a spec's dotted path,
    a command line's flag), `error` is the caller's error class. runs=False: a spec's base that
    a matrix completes (its mode, say), where a knob may be set for the runs it matters in."""
    if job.loss_bound > 0 and job.transport != "mlt":
        raise error(label("loss_bound"), f"{job.loss_bound:g} is not allowed (0 with transport tcp (a loss bound "
                    f"needs the loss-tolerant transport: {label('transport')} mlt))")
    if job.spray != "adaptive" and job.transport != "mlt":
        raise error(label("spray"), f"{job.spray!r} is not allowed (adaptive unless {label('transport')} mlt: "
                    "only mlt draws a source port per datagram)")
    if job.drop_marking and job.loss_bound == 0:
        raise error(label("drop_marking"), f"true is not allowed (false unless {label('loss_bound')} > 0 with "
                    "transport mlt)")
    if (job.model.name == "trace") != (job.model.trace is not None):
        raise error(label("model.trace"), f"{job.model.trace!r} is not allowed (none with model {job.model.name}: "
                    "a trace is the model, whose name is then trace or left out)" if job.model.trace is not None
                    else "missing (model trace is the profile of a trace: its path)")
    if job.backward != "reverse" and job.model.profile is None:
        raise error(label("backward"), f"{job.backward!r} is not allowed (reverse unless {label('model')} is a "
                    "profile: the numpy network is a chain, its backprop has no order to choose)")
    for name, value, default in (("task", job.task, "train"), ("ps_update", job.ps_update, "tensor")):
        if value != default and job.mode != "ps":
            raise error(label(name), f"{value!r} is not allowed ({default} unless {label('mode')} ps: an "
                        "all-reduce job has no parameter server)")
    order = job.send_order
    if order in SEND_ORDERS and job.mode not in SEND_ORDERS[order].modes:
        right = [name for name, cls in SEND_ORDERS.items() if job.mode in cls.modes and name != "ready"]
        raise error(label("send_order"), f"{order!r} is not allowed (ready, best or {', '.join(right)} in "
                    f"{job.mode} mode)")
    if job.mode == "allreduce" and job.order == "caramel" and job.collective != "ring":
        raise error(label("collective"), f"{job.collective!r} is not allowed (ring with send order caramel: "
                    "its batches are planned on a ring all-reduce's time model)")
    for name, why in inert_knobs(job) if runs else []:
        value = getattr(job, name)
        raise error(label(name), f"{value!r} is not allowed ({Training.__dataclass_fields__[name].default!r}"
                    f" here: {why}, so it would change nothing)")


def inert_knobs(job: Training) -> list[tuple[str, str]]:
    """The knobs set away from their default that change nothing in this job, each with why: a
    comparison that sets one would measure nothing under its name."""
    order = job.order
    inert = []
    if job.fusion != "none" and (job.mode != "allreduce" or order in ("caramel", "bytescheduler")):
        inert.append(("fusion", "fusion buckets are the all-reduce units of the ready, random and tictac "
                      f"orders; {job.mode} mode with send order {order} " + (
                          "has none" if job.mode != "allreduce" else "cuts its own")))
    if job.partition_bytes != Training.partition_bytes and not (job.mode == "allreduce" and (
            order in ("caramel", "bytescheduler") or ALLREDUCES[job.collective].pipelined)):
        names = [name for name, cls in ALLREDUCES.items() if cls.pipelined]
        pipelined = " and ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)
        inert.append(("partition_bytes", f"only caramel's and bytescheduler's all-reduce units and the {pipelined} "
                      f"all-reduces' pipeline segments use it, not send order {order} with collective "
                      f"{job.collective} in {job.mode} mode"))
    caramel = job.mode == "allreduce" and order == "caramel"
    if caramel and job.partition_bytes != Training.partition_bytes and not (
            job.caramel_pipelining == "segments" or job.caramel_batching == "doubling"
            or ALLREDUCES[job.collective].pipelined):
        inert.append(("partition_bytes", "caramel cuts no segments with caramel_pipelining none, and its "
                      f"caramel_batching {job.caramel_batching} does not start from it"))
    for name in ("caramel_batching", "caramel_pipelining"):
        if getattr(job, name) != getattr(Training, name) and not caramel:
            inert.append((name, f"only send order caramel's all-reduce uses it, not send order {order} in "
                          f"{job.mode} mode"))
    if job.caramel_step_ms != Training.caramel_step_ms and not (
            job.backward == "caramel" or (caramel and job.caramel_batching == "adaptive")):
        inert.append(("caramel_step_ms", "only Caramel's plans use it (backward caramel, or send order caramel "
                      "with caramel_batching adaptive in allreduce mode)"))
    if job.credit_bytes != Training.credit_bytes and not (job.mode == "allreduce" and order == "bytescheduler"):
        inert.append(("credit_bytes", f"only bytescheduler's all-reduce uses it, not send order {order} in "
                      f"{job.mode} mode"))
    if job.collective != Training.collective and job.mode != "allreduce":
        inert.append(("collective", f"only an all-reduce job has one; {job.mode} mode pushes to and pulls from "
                      "its servers"))
    if job.ps_slice_bytes and job.mode != "ps":
        inert.append(("ps_slice_bytes", "only a parameter server slices layers; an all-reduce job has none"))
    return inert


def parse_addresses(text: str) -> list[Address]:
    addresses = []
    for item in filter(None, text.split(",")):
        host, _, port = item.rpartition(":")
        if not host or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
            raise ValueError(f"bad address '{item}' (expected host:port, port 1..65535)")
        addresses.append((host, int(port)))
    return addresses


def parse_layer_dscp(text: str) -> dict[int, int]:
    """`0:48,1:40` -> {0: 48, 1: 40}; an empty string -> {}."""
    mapping = {}
    for item in filter(None, text.split(",")):
        tensor, _, dscp = item.partition(":")
        if not (re.fullmatch(r"[0-9]+", tensor) and int(tensor) <= U32 and re.fullmatch(r"[0-9]+", dscp)
                and int(dscp) < 64):
            raise ValueError(f"{item!r} is not TENSOR:DSCP with TENSOR 0..{U32} and DSCP 0..63")
        mapping[int(tensor)] = int(dscp)
    return mapping


def parse_leaves(text: str) -> list[int]:
    """`1,1,2,2` -> [1, 1, 2, 2]; an empty string -> []."""
    leaves = []
    for item in filter(None, text.split(",")):
        if not re.fullmatch(r"[0-9]{1,9}", item):
            raise ValueError(f"{item!r} is not a leaf number 0..999999999")
        leaves.append(int(item))
    return leaves


def _addresses_text(addresses: list[Address]) -> str:
    return ",".join(f"{host}:{port}" for host, port in addresses)


@dataclass(frozen=True, kw_only=True)
class ProcessConfig(Training):
    """One process of a job: a worker or a parameter-server shard, its peers and its transport."""
    role: str = knob(choices=lambda: ROLES, cli=False)
    rank: int = knob(allowed="this process's index in --workers or --servers", check=lambda n: n >= 0)
    workers: Any = knob(allowed="comma-separated host:port of every worker, by rank", parse=parse_addresses)
    servers: Any = knob([], "comma-separated host:port of every parameter-server shard (ps)", parse=parse_addresses)
    out: str | None = knob(None, "a directory for iterations.csv, tensors.csv, trace.json, summary.json")
    timeout: float = knob(30.0, f"seconds > 0, at most {MAX_TIMEOUT_S}: a peer silent this long is an error",
                          lambda x: 0 < x <= MAX_TIMEOUT_S)
    tag: int = knob(0, f"an integer 0..{U32}: the job's number, in every frame it sends, so that jobs sharing "
                    "hosts never take each other's messages", lambda n: 0 <= n <= U32)
    start_at: float = knob(0.0, "0, or a time in Unix seconds before which a worker starts no iteration (connected, "
                           "it waits: the jobs sharing a fabric start at their offsets)", lambda x: 0 <= x < math.inf)
    pace: float = knob(0.0, "0, or seconds: with --start-at, iteration i starts no earlier than start-at + i x pace "
                       "(the time-shift policy's circle: a job that drifts ahead waits, so the phases of jobs "
                       "sharing links stay apart)", lambda x: 0 <= x < 3600)
    link_mbps: float = knob(100.0, f"Mbit/s > 0, at most {MAX_LINK_MBPS:.0f}: the host's link (mlt pacing, "
                            "profile timing)", lambda x: 0 < x <= MAX_LINK_MBPS)
    source_port: int = knob(0, "0 or a port 1024..65535 (tcp: the j-th peer this process dials is dialed from "
                            "this port + j; mlt with --sport-range 1: every datagram leaves from this port; so "
                            "per-flow ECMP places the flows alike in every run given the same ports; 0: ephemeral "
                            "ports)", lambda n: n == 0 or 1024 <= n <= 65535)
    # mlt (hostapps/mlt): datagram payload, source-port pool, quiet period, DSCP per tensor
    # by default as much as a datagram carries at the fabric's default MTU (the runner gives its fabric's)
    mtu_payload: int = knob(payload_for_mtu(DEFAULT_MTU), "a multiple of 4 in 64..65000 (mlt: payload bytes per "
                            "datagram, the same in every process)", lambda n: 64 <= n <= 65000 and n % 4 == 0)
    sport_range: int = knob(1024, "an integer 1..1024 (mlt: UDP source ports a sender sprays over; 1 on a "
                            "per-flow fabric)",
                            lambda n: 1 <= n <= 1024)
    quiet_ms: float = knob(5.0, "milliseconds > 0, at most --timeout (mlt: silence after which a message "
                           "within the loss bound is complete)", lambda x: 0 < x <= 1000 * MAX_TIMEOUT_S)
    layer_dscp: Any = knob({}, "TENSOR:DSCP,... (mlt: the controller's class per tensor)", parse=parse_layer_dscp)
    leaves: Any = knob([], "comma-separated leaf number of every worker, by rank (collectives hierarchical and "
                       "tree: the leaf switch each worker's host hangs off)", parse=parse_leaves)

    @property
    def world(self) -> int:
        return len(self.workers)

    def validate(self) -> None:
        """The rules that span fields; ConfigError names the flag."""
        check_training(self, lambda name: "--" + name.replace("_", "-").replace(".", "-"), ConfigError)
        if not self.workers:
            raise ConfigError("--workers", "no worker addresses")
        if self.mode == "ps" and not self.servers:
            raise ConfigError("--servers", "mode ps needs at least one server address")
        if self.mode == "allreduce" and self.servers:
            raise ConfigError("--servers", f"allreduce mode has no servers, but {len(self.servers)} were given")
        peers = self.workers if self.role == "worker" else self.servers
        if not 0 <= self.rank < len(peers):
            raise ConfigError("--rank", f"{self.rank} is out of range for {len(peers)} {self.role}s")
        if len(set(self.workers + self.servers)) != len(self.workers) + len(self.servers):
            raise ConfigError("--workers", "the same address appears twice in --workers/--servers")
        if self.collective == "hierarchical" and len(self.leaves) != self.world:
            raise ConfigError("--leaves", f"{len(self.leaves)} leaves for {self.world} workers (collective "
                              "hierarchical needs the leaf of every worker)")
        if self.leaves and len(self.leaves) != self.world:
            raise ConfigError("--leaves", f"{len(self.leaves)} leaves for {self.world} workers (the leaf of every "
                              "worker, or none)")
        if self.leaves and not ALLREDUCES[self.collective].follows_leaves:
            readers = " and ".join(name for name, algorithm in ALLREDUCES.items() if algorithm.follows_leaves)
            raise ConfigError("--leaves", f"not allowed with collective {self.collective} (only {readers} read it)")
        if self.batch % self.world:
            raise ConfigError("--batch", f"global batch {self.batch} does not split evenly over {self.world} workers")
        if self.quiet_ms > 1000 * self.timeout:
            # A quiet period beyond the timeout outlasts the sender's patience: it gives up before we decide.
            raise ConfigError("--quiet-ms", f"{self.quiet_ms:g} is not allowed (milliseconds > 0, at most --timeout)")


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are ConfigErrors: one 'error: --ARG: ...' line and exit status 2 from main()."""

    def error(self, message: str) -> None:
        named = re.fullmatch(r"argument (\S+): (.*)", message, re.DOTALL)
        raise ConfigError(named[1].split("/")[0], named[2]) if named else ConfigError("", message)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m hostapps",
                           description="Data-parallel training host app (worker or parameter server).")
    parser.add_argument("role", help="worker or server")
    add_arguments(parser, ProcessConfig)
    return parser


def config_from_args(argv: list[str]) -> ProcessConfig:
    """Parse and validate a command line; raise ConfigError naming the bad argument."""
    args = build_parser().parse_args(argv)
    try:
        cfg = from_arguments(ProcessConfig, args, extra={"role": args.role})
    except SchemaError as error:
        raise ConfigError(error.path, error.problem) from None
    cfg.validate()
    return cfg


def process_arguments(cfg: ProcessConfig) -> list[str]:
    """The command line (after the role) that gives back `cfg`."""
    argv = to_arguments(cfg, ProcessConfig)
    for flag, text in (("--workers", _addresses_text(cfg.workers)), ("--servers", _addresses_text(cfg.servers)),
                       ("--layer-dscp", ",".join(f"{t}:{d}" for t, d in sorted(cfg.layer_dscp.items()))),
                       ("--leaves", ",".join(map(str, cfg.leaves)))):
        index = argv.index(flag)
        argv[index + 1] = text
    return argv


def build_model(cfg: ProcessConfig) -> FlatModel:
    """The model a run names, initialised from the seed: identical in every process of the job."""
    if cfg.model.profile is not None:
        try:
            source = trace_profile(cfg.model.trace) if cfg.model.trace else PROFILES[cfg.model.profile]()
        except TraceError as error:
            raise ConfigError("--model-trace", f"{cfg.model.trace!r} {error}") from None
        profile = ProfileModel(source, cfg.model.scale, cfg.link_mbps)
        profile.run_in(computation_schedule(job_of(profile, cfg.batch // cfg.world), cfg))
        if cfg.mode == "allreduce" and cfg.order == "caramel":
            # Caramel's units are runs of gradients in the order backprop readies them: each one slice.
            profile.lay_out(list(reversed(profile.gradient_order())))
        model: FlatModel = profile
    else:
        model = Network(cfg.model.width, cfg.model.depth, cfg.model.conv, cfg.seed)
    if cfg.mode == "ps" and len(cfg.servers) > len(model.layers):
        raise ConfigError("--servers", f"{len(cfg.servers)} shards but the model has only {len(model.layers)} "
                          f"tensors, so shard {len(model.layers)} would hold no data")
    if cfg.mode == "ps" and cfg.ps_slice_bytes:
        largest = max(model.layers, key=lambda layer: layer.size)
        slices = split_bytes(largest.size * 4, cfg.ps_slice_bytes)
        if slices > MAX_PS_SLICES:
            raise ConfigError("--ps-slice-bytes", f"{cfg.ps_slice_bytes} bytes cut layer {largest.name} "
                              f"({largest.size * 4} bytes) into {slices} slices, more than the {MAX_PS_SLICES} "
                              "the message step field can number")
    return model


def layer_times_s(model: FlatModel, rows: int) -> tuple[list[float], list[float]]:
    """Per-layer forward and backward seconds of a worker's iteration on `rows` samples: what a
    profile emulates, or the numpy network's estimate from its FLOPs."""
    if isinstance(model, ProfileModel):
        return model.forward_s, model.backward_s
    return model.estimated_times_s(rows)
