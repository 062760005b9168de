"""The spec's schema: the dataclasses below, on the schema engine the whole testbed shares
(common/schema.py): each field's type annotation says what YAML value it takes and `knob` adds the
default and what is allowed. The job's knobs are the host apps' own (`Training`, hostapps/config.py),
and choices are read from the registries that define them (load balancing modes, the controller's
class policies, send orders, model profiles).
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Literal

from common.frames import DEFAULT_MTU, MAX_MTU, MIN_MTU
from common.schema import knob, section
from controller.options import ControllerOptions
from controller.routing import LB_MODES
from controller.scheduling import CLASS_POLICIES
from controller.sharing import MAX_JOBS, SHARING_POLICIES
from experiments.spec.topology import host_names
from hostapps.config import Training
from topologies.cluster import LOCAL, PLACERS
from topologies.tcp import DEFAULT_TCP_CC, available_tcp_cc

LABEL_PATTERN = re.compile(r"[A-Za-z0-9_.+-]+")
SERVER_PATTERN = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,252})")  # a DNS name or an IPv4 address
# Runs: repetitions x matrix points, each validated (experiments/spec/matrix.py sizes the matrix).
MAX_REPETITIONS = 100
# Link rates: topologies/shaping.py gives each of the 8 priority classes a floor of 1% of the
# link, and tc's smallest rate is 8 kbit/s; tc reads `{rate:g}mbit`, plain decimals up to 999999.
MIN_RATE_MBIT = 0.8
MAX_RATE_MBIT = 100_000
LINK_RATE = (f"a rate in Mbit/s {MIN_RATE_MBIT:g}..{MAX_RATE_MBIT}, so that each class's floor, 1% of it, "
             "reaches tc's 8 kbit/s")
# Times after the job starts: finite, and at most iperf3's longest test (a run stops at 600 s).
MAX_SECONDS = 86_400
AT_SECONDS = f"seconds after the job starts, 0..{MAX_SECONDS}"
DURATION_SECONDS = f"seconds, > 0 and at most {MAX_SECONDS}"
# Background flows: flow i's iperf3 servers listen on 5201 + FLOW_PORTS*i + source index
# (experiments/disturbances.py), below the job's ports 7000 and 7100 (experiments/runner.py).
FLOW_PORTS = 10
MAX_FLOWS = 100
# A job of several starts within this of the run's start: a process waiting for its start keeps its
# peers silent, and they give up after experiments/runplan.py's PEER_TIMEOUT_S (30 s); the runner's
# start-up (4 s) and a sharing offset (under a period) come on top.
MAX_START_S = 15.0
JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,31}")  # a part of the controller's job id


def _unique_names(value: Any) -> bool:
    return isinstance(value, list) and len(value) > 0 and len(set(value)) == len(value)


def _count_or_hosts(value: Any) -> bool:
    return value >= 1 if isinstance(value, int) else _unique_names(value)


@dataclass(frozen=True)
class Topology:
    kind: Literal["leafspine", "fattree", "file"] = knob("leafspine")
    spines: int = knob(2, "an integer >= 1", lambda n: n >= 1)
    leaves: int = knob(2, "an integer >= 1", lambda n: n >= 1)
    hosts_per_leaf: int = knob(2, "an integer >= 1", lambda n: n >= 1)
    k: int = knob(4, "an even integer >= 2 (fattree only)", lambda n: n >= 2 and n % 2 == 0)
    host_bw: float = knob(100.0, LINK_RATE, lambda x: MIN_RATE_MBIT <= x <= MAX_RATE_MBIT)
    fabric_bw: float = knob(100.0, LINK_RATE, lambda x: MIN_RATE_MBIT <= x <= MAX_RATE_MBIT)
    mtu: int = knob(DEFAULT_MTU, f"an integer {MIN_MTU}..{MAX_MTU} (bytes, every interface of the fabric)",
                          lambda n: MIN_MTU <= n <= MAX_MTU)
    tcp_cc: str = knob(DEFAULT_TCP_CC, "a TCP congestion control this kernel offers ("
                             + ", ".join(available_tcp_cc()) + "), set in every host",
                             lambda name: name in available_tcp_cc())
    file: str | None = knob(None, "a fabric file (topologies/files.py: switches by tier, hosts per leaf, links "
                            "and their speeds), a path from the repository root or absolute; kind file")

    def __post_init__(self) -> None:
        if self.file is not None and self.kind == "leafspine":  # kind left out: the file is the fabric
            object.__setattr__(self, "kind", "file")


@dataclass(frozen=True)
class Controller:
    lb: str = knob(ControllerOptions.lb, choices=lambda: LB_MODES)
    sched: str = knob("fifo", choices=lambda: list(CLASS_POLICIES))
    sharing: str = knob("fair", choices=lambda: list(SHARING_POLICIES))
    stats_interval_s: float = knob(
        ControllerOptions.stats_interval,
        "a period in seconds, 0.1..60: a run waits up to two periods for its last port statistics",
        lambda x: 0.1 <= x <= 60)


@dataclass(frozen=True)
class Cluster:
    """The machines the fabric runs on (topologies/cluster.py, docs/cluster.md); none listed: this one."""
    servers: list[str] = knob(
        [], f"[] for this machine alone, or distinct server names, the first {LOCAL} (it runs the controller "
        "and keeps the results)",
        lambda v: v == [] or (_unique_names(v) and v[0] == LOCAL
                              and all(isinstance(name, str) and SERVER_PATTERN.fullmatch(name) for name in v)))
    placement: str = knob("switchbin", choices=lambda: list(PLACERS))


@dataclass(frozen=True, kw_only=True)
class Job(Training):
    """The training job: the host apps' knobs, where it runs, and the accuracy it aims for."""
    workers: Literal["all"] | int | list[str] = knob(
        "all", "'all' hosts but the servers, a count >= 1 or a list of distinct host names",
        lambda v: v == "all" or _count_or_hosts(v))
    servers: int | list[str] = knob(1, "a count >= 1 or a list of distinct host names (ps only)", _count_or_hosts)
    target_accuracy: float = knob(0.9, "a fraction in (0, 1]", lambda x: 0 < x <= 1)


@dataclass(frozen=True, kw_only=True)
class JobEntry(Job):
    """One job of several sharing the fabric (`jobs:`): a job with a name and its start."""
    name: str = knob("", "a name of 1..32 letters, digits, _ and -, the first a letter or digit (default "
                     "job<index>)", lambda v: v == "" or JOB_NAME.fullmatch(v) is not None)
    start_s: float = knob(0.0, f"seconds 0..{MAX_START_S:g} after the run's jobs start, when this job's first "
                          "iteration starts", lambda x: 0 <= x <= MAX_START_S)


@dataclass(frozen=True)
class Flow:
    """An iperf3 background flow; several sources make an incast into dst."""
    src: str | list[str] = knob(
        allowed=f"a host name or a list of at most {FLOW_PORTS} distinct host names (incast)",
        check=lambda v: isinstance(v, str) or (_unique_names(v) and len(v) <= FLOW_PORTS))
    dst: str = knob(allowed="a host name")
    proto: Literal["tcp", "udp"] = knob("tcp")
    rate_mbps: float = knob(
        0.0, f"0: as fast as it goes, or a rate in Mbit/s 0.001..{MAX_RATE_MBIT}; iperf3 counts whole bits per second",
        lambda x: x == 0 or 0.001 <= x <= MAX_RATE_MBIT)
    start_s: float = knob(0.0, AT_SECONDS, lambda x: 0 <= x <= MAX_SECONDS)
    duration_s: float = knob(10.0, DURATION_SECONDS, lambda x: 0 < x <= MAX_SECONDS)


@dataclass(frozen=True)
class Fault:
    """A link fault: down, random loss (nftables) or a rate cut, for duration_s from at_s."""
    kind: Literal["link_down", "loss", "rate"] = knob()
    link: str = knob(allowed="a link of the topology written a-b, e.g. h1-leaf1")
    at_s: float = knob(allowed=AT_SECONDS, check=lambda x: 0 <= x <= MAX_SECONDS)
    duration_s: float = knob(allowed=DURATION_SECONDS, check=lambda x: 0 < x <= MAX_SECONDS)
    loss_percent: float | None = knob(
        None, "a percentage 0.01..100, nftables drops in 1/10000ths; only with kind loss",
        lambda x: x is None or 0.01 <= x <= 100)
    rate_mbps: float | None = knob(None, f"only with kind rate: {LINK_RATE}",
                                         lambda x: x is None or MIN_RATE_MBIT <= x <= MAX_RATE_MBIT)


@dataclass(frozen=True)
class RunConfig:
    """Everything one run needs: the fabric, the controller, the job and the disturbances."""
    topology: Topology = section(Topology)
    controller: Controller = section(Controller)
    cluster: Cluster = section(Cluster)
    job: Job = section(Job)
    jobs: list[JobEntry] = knob(
        [], f"[] for the one job of `job`, or a list of 2..{MAX_JOBS} jobs (the controller holds {MAX_JOBS}), each "
        "on hosts of its own", lambda jobs: jobs == [] or len(jobs) >= 2)
    background: list[Flow] = knob(
        [], f"a list of at most {MAX_FLOWS} flows: their iperf3 ports stay below the job's",
        lambda flows: len(flows) <= MAX_FLOWS)
    faults: list[Fault] = knob([], "a list of faults")

    def __post_init__(self) -> None:
        if self.jobs:  # `job` is the first of them: what is said of the run's job is said of it
            named = [dataclasses.replace(entry, name=entry.name or f"job{index}")
                     for index, entry in enumerate(self.jobs)]
            object.__setattr__(self, "jobs", named)
            object.__setattr__(self, "job", named[0])

    @property
    def job_configs(self) -> list[RunConfig]:
        """Each job's run as if it were alone: the config with that job as `job` (and no `jobs`);
        [self] for a run of one job."""
        if not self.jobs:
            return [self]
        return [dataclasses.replace(self, job=entry, jobs=[]) for entry in self.jobs]

    @property
    def job_names(self) -> list[str]:
        return [entry.name for entry in self.jobs] or [""]

    @property
    def hosts(self) -> list[str]:
        return host_names(self.topology)

    @property
    def server_hosts(self) -> list[str]:
        """Parameter-server shards' hosts (none in allreduce): a count takes the last hosts."""
        servers = self.job.servers
        if self.job.mode != "ps":
            return []
        return list(servers) if isinstance(servers, list) else self.hosts[-servers:]

    @property
    def worker_hosts(self) -> list[str]:
        """Workers' hosts in rank order: a count takes the first hosts that are not servers."""
        workers = self.job.workers
        if isinstance(workers, list):
            return list(workers)
        free = [host for host in self.hosts if host not in self.server_hosts]
        return free if workers == "all" else free[:workers]


@dataclass(frozen=True)
class Header:
    """The top-level fields that are about the experiment rather than each run."""
    name: str = knob("experiment", "a name of letters, digits and _.+-",
                           lambda v: LABEL_PATTERN.fullmatch(v) is not None)
    description: str = knob("", "text")
    repetitions: int = knob(1, f"an integer 1..{MAX_REPETITIONS}", lambda n: 1 <= n <= MAX_REPETITIONS)
    matrix: dict = knob({}, "a mapping of axis names to axes")
    include: list = knob([], "a list of {where: {AXIS: LABEL or [LABELS], ...}, set: {dotted field: value, ...}}: "
                         "overrides for the matrix points that match")
    exclude: list = knob([], "a list of {AXIS: LABEL or [LABELS], ...}: matrix points not to run")
    confidence: float = knob(0.95, "a level between 0 and 1 for every interval of the summary, e.g. 0.95",
                             lambda x: 0 < x < 1)
    stolen_retries: int = knob(1, "an integer 0..3: how many more times a run runs after the fidelity guard failed it "
                               "while the hypervisor stole 2% or more of the CPUs",
                               lambda n: 0 <= n <= 3)
    live: int | None = knob(None, "a port 1024..65535 of 127.0.0.1 for the live view of the running experiment "
                            "(experiments/live.py), or null", lambda port: port is None or 1024 <= port <= 65535)


HEADER_KEYS = tuple(f.name for f in dataclasses.fields(Header))
CONFIG_KEYS = tuple(f.name for f in dataclasses.fields(RunConfig))
