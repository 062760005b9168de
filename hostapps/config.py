"""Run configuration: one dataclass for the CLI, the tests and the runner, and its validation."""
import argparse
import math
import re
from dataclasses import dataclass, field

from hostapps.collectives import FUSION_PRESETS, MAX_PS_SLICES, split_bytes
from hostapps.model import FlatModel, Network
from hostapps.policies import POLICIES
from hostapps.profiles import PROFILES, ProfileModel
from hostapps.transport import Address

MODES = ("allreduce", "ps")
MODELS = ("mlp",)
TRANSPORTS = ("tcp", "mlt")
ROLES = ("worker", "server")
U32 = 2**32 - 1        # the frame header's job field; numpy's and scikit-learn's largest seed
MAX_TIMEOUT_S = 86400  # a day, far beyond any run (waits overflow past threading.TIMEOUT_MAX, ~292 years)
MAX_LINK_MBPS = 1e6    # mlt advises rates in kbit/s in a 32-bit field


class ConfigError(ValueError):
    """Bad input, reported as 'error: --ARG: message' (or 'error: message' when it names no one argument)."""

    def __init__(self, argument: str, message: str):
        super().__init__(f"{argument}: {message}" if argument else message)


def decimal(text: str) -> bool:
    """ASCII digits only: str.isdigit() also takes '²', which int() refuses, and '٣', which it reads as 3."""
    return text.isascii() and text.isdigit()


def require(argument: str, value: float, ok: bool, allowed: str) -> None:
    """Refuse `value` unless ok, as '--ARG: VALUE is not allowed (ALLOWED)'; NaN fails every comparison."""
    if not ok:
        raise ConfigError(argument, f"{value} is not allowed ({allowed})")


@dataclass
class RunConfig:
    role: str
    rank: int
    workers: list[Address]
    servers: list[Address] = field(default_factory=list)
    mode: str = "allreduce"
    model: str = "mlp"
    width: int = 128
    depth: int = 2
    conv: int = 0           # channels of a leading 3x3 conv layer; 0 for none
    profile: str | None = None
    scale: float = 0.01     # profile tensor sizes are scaled by this
    link_mbps: float = 100.0
    iterations: int = 300
    batch: int = 64         # global batch, split evenly over the workers
    lr: float = 0.1
    momentum: float = 0.0
    seed: int = 0
    transport: str = "tcp"
    timeout: float = 30.0
    eval_every: int = 50
    out: str | None = None
    fusion: str = "none"    # a FUSION_PRESETS name or a byte count
    policy: str = "ready"
    # Bytescheduler partitions, caramel's first bucket and pipeline segments.  Smaller pieces cost more
    # per-message latency than their overlap gains on a 2-core emulator (16 KB: caramel 0.47x of
    # ready order, 64 KB: 1.15x; experiments/headline.yaml's fabric).
    partition_bytes: int = 65536
    credit_bytes: int = 262144    # bytescheduler: partition bytes in flight at once
    ps_slice_bytes: int = 0       # ps: push/pull each layer in slices of at most this many bytes; 0: whole layers
    job: int = 0
    # --transport mlt (hostapps.mlt): loss bound, source-port pool, datagram payload, quiet period
    loss_bound: float = 0.0
    sport_range: int = 128
    mtu_payload: int = 1400
    quiet_ms: float = 5.0
    drop_marking: bool = False
    layer_dscp: dict[int, int] = field(default_factory=dict)  # mlt: DSCP per tensor id

    @property
    def world(self) -> int:
        return len(self.workers)

    @property
    def fusion_bytes(self) -> int:
        return FUSION_PRESETS[self.fusion] if self.fusion in FUSION_PRESETS else int(self.fusion)

    def validate(self) -> None:
        def allowed(argument: str, what: str, value: str, choices) -> None:
            if value not in choices:
                raise ConfigError(argument, "unknown %s '%s' (allowed: %s)" % (what, value, ", ".join(sorted(choices))))

        allowed("role", "role", self.role, ROLES)
        allowed("--mode", "mode", self.mode, MODES)
        allowed("--model", "model", self.model, MODELS)
        if self.profile is not None:
            allowed("--profile", "profile", self.profile, PROFILES)
        allowed("--transport", "transport", self.transport, TRANSPORTS)
        allowed("--policy", "policy", self.policy, POLICIES)
        if self.mode not in POLICIES[self.policy].modes:
            raise ConfigError("--policy", "'%s' is for %s mode, not %s" % (
                self.policy, " or ".join(POLICIES[self.policy].modes), self.mode))
        if self.partition_bytes < 4 or self.credit_bytes < 0:
            raise ConfigError("--partition-bytes" if self.partition_bytes < 4 else "--credit-bytes",
                              "must be at least 4 (partition) or 0 (credit)")
        if self.ps_slice_bytes < 0 or self.ps_slice_bytes % 4:
            raise ConfigError("--ps-slice-bytes", "must be 0 (whole layers) or a positive multiple of 4 "
                              "(whole floats), got %d" % self.ps_slice_bytes)
        if self.ps_slice_bytes and self.mode != "ps":
            raise ConfigError("--ps-slice-bytes", "slices parameter-server messages: ps mode only, not %s"
                              % self.mode)
        if self.fusion not in FUSION_PRESETS and not decimal(self.fusion):
            raise ConfigError("--fusion", "'%s' is neither a byte count nor a preset (%s)" % (
                self.fusion, ", ".join(FUSION_PRESETS)))
        if not self.workers:
            raise ConfigError("--workers", "no worker addresses")
        if self.mode == "ps" and not self.servers:
            raise ConfigError("--servers", "mode ps needs at least one server address")
        if self.mode == "allreduce" and self.servers:
            raise ConfigError("--servers", "allreduce mode has no servers, but %d were given" % len(self.servers))
        peers = self.workers if self.role == "worker" else self.servers
        if not 0 <= self.rank < len(peers):
            raise ConfigError("--rank", "%d is out of range for %d %ss" % (self.rank, len(peers), self.role))
        if len(set(self.workers + self.servers)) != len(self.workers) + len(self.servers):
            raise ConfigError("--workers", "the same address appears twice in --workers/--servers")
        for name in ("width", "depth", "iterations", "batch"):
            if getattr(self, name) < 1:
                raise ConfigError("--" + name, "must be at least 1, got %d" % getattr(self, name))
        if self.conv < 0:
            raise ConfigError("--conv", "must be 0 (no conv layer) or a channel count, got %d" % self.conv)
        if self.batch < self.world:
            raise ConfigError("--batch", "global batch %d leaves workers with no data (%d workers)" % (
                self.batch, self.world))
        if self.batch % self.world:
            raise ConfigError("--batch", "global batch %d does not split evenly over %d workers" % (
                self.batch, self.world))
        if self.eval_every < 0:
            raise ConfigError("--eval-every", "must be 0 (at the end only) or more, got %d" % self.eval_every)
        require("--timeout", self.timeout, self.timeout > 0 and math.isfinite(self.timeout), "seconds > 0, finite")
        require("--timeout", self.timeout, self.timeout <= MAX_TIMEOUT_S, f"seconds, at most {MAX_TIMEOUT_S}")
        require("--lr", self.lr, self.lr > 0 and math.isfinite(self.lr), "> 0, finite")
        require("--scale", self.scale, 0 < self.scale <= 1, "a fraction of the profile's tensor sizes in (0, 1]")
        require("--link-mbps", self.link_mbps, 0 < self.link_mbps <= MAX_LINK_MBPS,
                f"Mbit/s > 0, at most {MAX_LINK_MBPS:.0f}")
        require("--momentum", self.momentum, 0 <= self.momentum < 1, "a fraction in [0, 1)")
        require("--loss-bound", self.loss_bound, 0 <= self.loss_bound < 1, "a fraction in [0, 1)")
        require("--job", self.job, 0 <= self.job <= U32, f"an integer 0..{U32}, the frame header's job field")
        require("--seed", self.seed, 0 <= self.seed <= U32, f"an integer 0..{U32}")
        if not 1 <= self.sport_range <= 1024:
            raise ConfigError("--sport-range", "must be 1..1024 source ports, got %d" % self.sport_range)
        if not (64 <= self.mtu_payload <= 65000 and self.mtu_payload % 4 == 0):
            raise ConfigError("--mtu-payload", "must be a multiple of 4 in 64..65000, got %d" % self.mtu_payload)
        # A quiet period beyond the timeout outlasts the sender's patience: it gives up before we decide.
        require("--quiet-ms", self.quiet_ms, 0 < self.quiet_ms <= 1000 * self.timeout,
                "milliseconds > 0, at most --timeout")


def parse_addresses(argument: str, text: str) -> list[Address]:
    addresses = []
    for item in filter(None, text.split(",")):
        host, _, port = item.rpartition(":")
        if not host or not decimal(port) or not 0 < int(port) < 65536:
            raise ConfigError(argument, "bad address '%s' (expected host:port, port 1..65535)" % item)
        addresses.append((host, int(port)))
    return addresses


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are ConfigErrors: one 'error: --ARG: ...' line and exit status 2 from main()."""

    def error(self, message: str) -> None:
        named = re.fullmatch(r"argument (\S+): (.*)", message, re.DOTALL)
        raise ConfigError(named[1], named[2]) if named else ConfigError("", message)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m hostapps",
                           description="Data-parallel training host app (worker or parameter server).")
    parser.add_argument("role", help="worker or server")
    parser.add_argument("--rank", type=int, required=True, help="index of this process in --workers or --servers")
    parser.add_argument("--workers", required=True, help="comma-separated host:port of every worker, by rank")
    parser.add_argument("--servers", default="", help="comma-separated host:port of every PS shard (ps mode)")
    parser.add_argument("--world-size", type=int, help="number of workers; checked against --workers")
    parser.add_argument("--shards", type=int, help="number of PS shards; checked against --servers")
    parser.add_argument("--mode", default="allreduce", help="allreduce or ps")
    parser.add_argument("--model", default="mlp", help="mlp (trained on the digits)")
    parser.add_argument("--width", type=int, default=128, help="hidden units per dense layer")
    parser.add_argument("--depth", type=int, default=2, help="hidden dense layers")
    parser.add_argument("--conv", type=int, default=0, help="channels of a leading 3x3 conv layer (0: none)")
    parser.add_argument("--profile", help="replay a real DNN instead: resnet50, vgg16 or bert_base")
    parser.add_argument("--scale", type=float, default=0.01, help="profile tensor size factor")
    parser.add_argument("--link-mbps", type=float, default=100.0, help="emulated host link rate (profile timing)")
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--batch", type=int, default=64, help="global batch, split over the workers")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--momentum", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--transport", default="tcp", help="tcp, or mlt (loss-tolerant UDP, sprayable)")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds before a silent peer is an error")
    parser.add_argument("--eval-every", type=int, default=50, help="test accuracy every N iterations (0: at the end)")
    parser.add_argument("--out", help="directory for iterations.csv, tensors.csv, trace.json, summary.json")
    parser.add_argument("--fusion", default="none", help="allreduce bucket bytes or preset: none, horovod, ddp")
    parser.add_argument("--policy", default="ready", help="gradient/parameter send order: %s" % ", ".join(POLICIES))
    parser.add_argument("--partition-bytes", type=int, default=65536,
                        help="bytescheduler partition size; caramel first bucket and pipeline segment size")
    parser.add_argument("--credit-bytes", type=int, default=262144, help="bytescheduler: partition bytes in flight")
    parser.add_argument("--ps-slice-bytes", type=int, default=0,
                        help="ps: push and pull each layer in slices of at most this many bytes, so pulls of "
                             "early slices overlap pushes of later ones (P3); 0: whole layers")
    parser.add_argument("--job", type=int, default=0, help="job id carried in every frame")
    parser.add_argument("--loss-bound", type=float, default=0.0,
                        help="mlt: fraction of a message's bytes that may be lost (0: fully reliable)")
    parser.add_argument("--sport-range", type=int, default=128, help="mlt: UDP source ports a sender sprays over")
    parser.add_argument("--mtu-payload", type=int, default=1400, help="mlt: payload bytes per datagram")
    parser.add_argument("--quiet-ms", type=float, default=5.0,
                        help="mlt: silence after which a message within the loss bound is complete")
    parser.add_argument("--drop-marking", action="store_true",
                        help="mlt: send the least important gradient datagrams with DSCP 1 (LE)")
    parser.add_argument("--layer-dscp", default="",
                        help="mlt: DSCP per tensor id as TENSOR:DSCP,... (the controller's classes)")
    return parser


def parse_layer_dscp(text: str) -> dict[int, int]:
    """`0:48,1:40` -> {0: 48, 1: 40}; an empty string -> {}."""
    mapping = {}
    for item in filter(None, text.split(",")):
        tensor, _, dscp = item.partition(":")
        if not (decimal(tensor) and int(tensor) <= U32 and decimal(dscp) and int(dscp) < 64):
            raise ConfigError("--layer-dscp", "%r is not TENSOR:DSCP with TENSOR 0..%d and DSCP 0..63" % (item, U32))
        mapping[int(tensor)] = int(dscp)
    return mapping


def config_from_args(argv: list[str]) -> RunConfig:
    """Parse and validate a command line; raise ConfigError naming the bad argument."""
    args = build_parser().parse_args(argv)
    cfg = RunConfig(role=args.role, rank=args.rank, workers=parse_addresses("--workers", args.workers),
                    servers=parse_addresses("--servers", args.servers), mode=args.mode, model=args.model,
                    width=args.width, depth=args.depth, conv=args.conv, profile=args.profile, scale=args.scale,
                    link_mbps=args.link_mbps, iterations=args.iterations, batch=args.batch, lr=args.lr,
                    momentum=args.momentum, seed=args.seed, transport=args.transport, timeout=args.timeout,
                    eval_every=args.eval_every, out=args.out, fusion=args.fusion, policy=args.policy, job=args.job,
                    partition_bytes=args.partition_bytes, credit_bytes=args.credit_bytes,
                    ps_slice_bytes=args.ps_slice_bytes,
                    loss_bound=args.loss_bound, sport_range=args.sport_range, mtu_payload=args.mtu_payload,
                    quiet_ms=args.quiet_ms, drop_marking=args.drop_marking,
                    layer_dscp=parse_layer_dscp(args.layer_dscp))
    if args.world_size is not None and args.world_size != cfg.world:
        raise ConfigError("--world-size", "%d does not match the %d addresses in --workers" % (
            args.world_size, cfg.world))
    if args.shards is not None and args.shards != len(cfg.servers):
        raise ConfigError("--shards", "%d does not match the %d addresses in --servers" % (
            args.shards, len(cfg.servers)))
    cfg.validate()
    return cfg


def build_model(cfg: RunConfig) -> FlatModel:
    """The model a run names, initialised from the seed: identical in every process of the job."""
    if cfg.profile is not None:
        model: FlatModel = ProfileModel(PROFILES[cfg.profile](), cfg.scale, cfg.link_mbps)
    else:
        model = Network(cfg.width, cfg.depth, cfg.conv, cfg.seed)
    if cfg.mode == "ps" and len(cfg.servers) > len(model.layers):
        raise ConfigError("--servers", "%d shards but the model has only %d tensors, so shard %d would hold no data"
                          % (len(cfg.servers), len(model.layers), len(model.layers)))
    if cfg.mode == "ps" and cfg.ps_slice_bytes:
        largest = max(model.layers, key=lambda layer: layer.size)
        slices = split_bytes(largest.size * 4, cfg.ps_slice_bytes)
        if slices > MAX_PS_SLICES:
            raise ConfigError("--ps-slice-bytes", "%d bytes cut layer %s (%d bytes) into %d slices, more than the "
                              "%d the message step field can number" % (cfg.ps_slice_bytes, largest.name,
                                                                         largest.size * 4, slices, MAX_PS_SLICES))
    return model
