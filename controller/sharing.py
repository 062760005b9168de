"""Inter-job scheduling: how training jobs that share the fabric share its classes and its time.

Plain data in (the registered jobs: each one's layer table, and the time its traffic of one
iteration needs on its busiest link, `comm_ms`, which the runner works out from the fabric), plain
data out: each job's band of the gradient classes CS6..CS2 (common/classes.py), inside which its
own class policy (controller/scheduling.py) ranks its layers, and each job's iteration start
offset.

- `fair`: every job the whole band, each job's policy filling it on its own (the baseline: no
  arbitration between jobs);
- `intensity` (after Crux, SIGCOMM'24): jobs ranked by intensity, the compute of an iteration over
  its communication time on its busiest link, the more intense first; the ranking is compressed
  into the five classes, each job a band of its own while there are bands enough;
- `intensity-paths`: `intensity`'s bands, and each job's traffic pinned to paths chosen in the same
  ranking, the most intense job first on the least loaded ones (controller/paths.py decides them);
- `timeshift` (after CASSINI, NSDI'24): every job the whole band, a pace per job (its iteration
  period stretched to a harmonic of one common period, the circle) and start offsets that interleave
  the jobs' communication phases on that circle; the jobs keep to it by starting iteration i no
  earlier than their start + i x pace, so a job that drifts ahead waits and the phases stay apart.

Every registered job names the policy (`sharing` of its job document); one policy holds for all of
them, so a job naming another is refused while others are registered. Adding a policy: subclass
`SharingPolicy`, set `name`, write `levels` (and `offsets_ms`), decorate with `@register`.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import ClassVar, Sequence

import numpy as np

from common.classes import GRADIENT_DSCPS

MAX_JOBS = 16  # jobs the controller holds at once
# The circle CASSINI places communication on is the jobs' common period (the least common multiple of
# their periods) in slots; a job's period is cut into at most PERIOD_SLOTS, and a common period of
# more than MAX_CIRCLE_SLOTS (periods that are not near multiples of each other) is not kept: the
# longest period is the circle then, and the offsets hold for a few iterations only.
PERIOD_SLOTS = 200
MAX_CIRCLE_SLOTS = 20_000
# A job's pace is its period stretched by this share (room for a shared machine's jitter and for the
# residual overlap of phases that do not fit apart), then up to the next harmonic of the circle.  Where
# every job's run alone measured how late its iterations come (period_p99_ms), the margin is the latest
# of them instead, at least MIN_PACE_MARGIN: a margin above what the jobs need is time they all wait.
PACE_MARGIN = 0.05
MIN_PACE_MARGIN = 0.01
# CASSINI's compatibility: jobs whose phases, interleaved on the paced circle, still overlap for more
# than this share of their communication cannot be kept apart (their communication does not fit the
# circle); pacing them would only slow the faster ones, so they run free from their offsets.
COMPATIBLE_OVERLAP = 0.1


@dataclass(frozen=True)
class JobTiming:
    """An iteration of a job as sharing sees it: forward, then backward with the communication
    starting with it (the first gradient is ready as the backward pass starts), the next forward
    waiting for the last parameters: period = forward + max(backward, communication). A measured
    period and start of the communication (the job's run alone) replace the modelled ones."""
    job: str
    forward_ms: float
    backward_ms: float
    comm_ms: float
    measured_period_ms: float | None = None
    measured_comm_start_ms: float | None = None
    measured_period_p99_ms: float | None = None

    @property
    def compute_ms(self) -> float:
        return self.forward_ms + self.backward_ms

    @property
    def period_ms(self) -> float:
        if self.measured_period_ms is not None:
            return self.measured_period_ms
        return self.forward_ms + max(self.backward_ms, self.comm_ms)

    @property
    def comm_start_ms(self) -> float:
        return self.forward_ms if self.measured_comm_start_ms is None else self.measured_comm_start_ms

    @property
    def lateness(self) -> float | None:
        """How much longer than its period the job's 99th-percentile iteration took alone; None unmeasured."""
        if self.measured_period_ms is None or self.measured_period_p99_ms is None or self.measured_period_ms <= 0:
            return None
        return max(0.0, self.measured_period_p99_ms / self.measured_period_ms - 1)

    @property
    def intensity(self) -> float:
        """Crux's GPU intensity: compute per iteration over its communication on the busiest link."""
        return self.compute_ms / self.comm_ms if self.comm_ms > 0 else math.inf


def job_timing(job) -> JobTiming:
    """A RegisteredJob's timing from its layer table and `comm_ms` (none given: its bytes at 1 ms
    per MB, which ranks jobs sharing links of one rate as their times would), with its measured
    `period_ms`, `comm_start_ms` and `period_p99_ms` where the job document gives them."""
    forward = sum(layer.fwd_ms or 0.0 for layer in job.layers)
    backward = sum(layer.bwd_ms or 0.0 for layer in job.layers)
    comm = job.comm_ms if job.comm_ms is not None else sum(layer.bytes for layer in job.layers) / 1e6
    return JobTiming(job.job, forward, backward, comm, getattr(job, "period_ms", None),
                     getattr(job, "comm_start_ms", None), getattr(job, "period_p99_ms", None))


class SharingPolicy:
    """How jobs sharing the fabric share its classes and its time, and whether it chooses their paths
    (`chooses_paths`: controller/paths.py pins each job's traffic, in the ranking of `intensity`)."""
    name: ClassVar[str]
    chooses_paths: ClassVar[bool] = False

    def levels(self, timings: Sequence[JobTiming]) -> dict[str, int]:
        """Job id -> priority level, 0 the highest; equal levels share a band of classes."""
        return {timing.job: 0 for timing in timings}

    def offsets_ms(self, timings: Sequence[JobTiming]) -> dict[str, float]:
        """Job id -> how long after the common start its first iteration starts."""
        return {timing.job: 0.0 for timing in timings}

    def paces_ms(self, timings: Sequence[JobTiming]) -> dict[str, float]:
        """Job id -> its pace: iteration i starts no earlier than its first's start + i x pace (0: free)."""
        return {timing.job: 0.0 for timing in timings}


SHARING_POLICIES: dict[str, type[SharingPolicy]] = {}


def register(cls: type[SharingPolicy]) -> type[SharingPolicy]:
    SHARING_POLICIES[cls.name] = cls
    return cls


@register
class Fair(SharingPolicy):
    """Every job the same classes, no offsets: the baseline."""
    name = "fair"


@register
class Intensity(SharingPolicy):
    """Crux's priority: the more compute a job does per unit of communication on its busiest link,
    the more utilization its waiting costs, so it goes first; equal intensities share a level."""
    name = "intensity"

    def levels(self, timings: Sequence[JobTiming]) -> dict[str, int]:
        distinct = sorted({timing.intensity for timing in timings}, reverse=True)
        return {timing.job: distinct.index(timing.intensity) for timing in timings}


@register
class IntensityPaths(Intensity):
    """Crux's path selection with its priority: the bands of `intensity`, and the jobs' paths chosen
    in their ranking, the most intense job's traffic first on the least loaded paths."""
    name = "intensity-paths"
    chooses_paths = True


@register
class TimeShift(SharingPolicy):
    """CASSINI's interleaving: the same classes for all, each job a pace on one circle (`paces`) and
    start offsets that interleave the phases on it (`interleave` of the paced timings)."""
    name = "timeshift"

    def offsets_ms(self, timings: Sequence[JobTiming]) -> dict[str, float]:
        return self.decide(timings)[0]

    def paces_ms(self, timings: Sequence[JobTiming]) -> dict[str, float]:
        return self.decide(timings)[1]

    @staticmethod
    def decide(timings: Sequence[JobTiming]) -> tuple[dict[str, float], dict[str, float]]:
        """Offsets on the paced circle and the paces where the phases fit apart on it (overlapping
        for at most COMPATIBLE_OVERLAP of their communication); else offsets on the jobs' own
        periods and no pace."""
        offsets, overlap = placement(paced(timings))
        if overlap <= COMPATIBLE_OVERLAP:
            return offsets, paces(timings)
        return interleave(timings), {timing.job: 0.0 for timing in timings}


def pace_margin(timings: Sequence[JobTiming]) -> float:
    """How much the pace stretches the periods: the latest measured lateness of the jobs (at least
    MIN_PACE_MARGIN), or PACE_MARGIN where a job's lateness was not measured."""
    lateness = [timing.lateness for timing in timings]
    if not lateness or any(late is None for late in lateness):
        return PACE_MARGIN
    return max(MIN_PACE_MARGIN, *lateness)


def paces(timings: Sequence[JobTiming], margin: float | None = None) -> dict[str, float]:
    """Each job's pace: the circle is the longest period stretched by `margin` (pace_margin's where
    none is given); each job gets the shortest circle / k (k = 1, 2, ...) that is at least its own
    period stretched alike. Harmonics of one circle keep every job's phases at the same places of it
    iteration after iteration, which periods that are not near multiples of each other would not."""
    if not timings:
        return {}
    if margin is None:
        margin = pace_margin(timings)
    circle = max(timing.period_ms for timing in timings) * (1 + margin)
    if circle <= 0:
        return {timing.job: 0.0 for timing in timings}
    return {timing.job: circle / max(1, math.floor(circle / (timing.period_ms * (1 + margin))))
            for timing in timings}


def paced(timings: Sequence[JobTiming]) -> list[JobTiming]:
    """The timings with their paces as their periods (what the jobs will keep to)."""
    pace = paces(timings)
    return [dataclasses.replace(timing, measured_period_ms=pace[timing.job],
                                measured_comm_start_ms=timing.comm_start_ms) for timing in timings]


def interleave(timings: Sequence[JobTiming]) -> dict[str, float]:
    """Start offsets that keep the jobs' communication phases apart, as CASSINI's rotations on the
    circle of the jobs' common period: jobs are placed in turn, the longest communication first
    (ties by id) at offset 0, each next one at the offset within its own period that overlaps least
    with the phases placed so far (the smallest such offset). Every job is taken to share one link
    with every other (the runner's specs share uplinks)."""
    return placement(timings)[0]


def placement(timings: Sequence[JobTiming]) -> tuple[dict[str, float], float]:
    """`interleave`'s offsets, and the share of the jobs' communication on the circle that still
    overlaps another job's (0: the phases fit apart)."""
    if not timings:
        return {}, 0.0
    slot_ms = max(timing.period_ms for timing in timings) / PERIOD_SLOTS
    if slot_ms <= 0:
        return {timing.job: 0.0 for timing in timings}, 0.0
    periods = {timing.job: max(1, round(timing.period_ms / slot_ms)) for timing in timings}
    circle = math.lcm(*periods.values())
    if circle > MAX_CIRCLE_SLOTS:
        circle = max(periods.values())
    busy = np.zeros(circle)
    offsets = {}
    for timing in sorted(timings, key=lambda t: (-t.comm_ms, t.job)):
        phase = _phase(timing, periods[timing.job], slot_ms, circle)
        # overlap[s]: busy slots under the phase moved by s; the circular correlation of the two
        overlap = np.rint(np.fft.ifft(np.fft.fft(busy) * np.conj(np.fft.fft(phase))).real)
        shift = int(np.argmin(overlap[:periods[timing.job]]))
        offsets[timing.job] = shift * slot_ms
        busy += np.roll(phase, shift)
    overlap = float(np.clip(busy - 1, 0, None).sum() / busy.sum()) if busy.sum() else 0.0
    return {timing.job: offsets[timing.job] for timing in timings}, overlap


def _phase(timing: JobTiming, period: int, slot_ms: float, circle: int) -> np.ndarray:
    """1 in the circle's slots where the job communicates, started at offset 0."""
    start = round(timing.comm_start_ms / slot_ms)
    length = min(period, round(timing.comm_ms / slot_ms))
    one = np.zeros(period)
    one[[(start + i) % period for i in range(length)]] = 1
    return np.tile(one, math.ceil(circle / period))[:circle]


def bands(levels: dict[str, int], classes: Sequence[int] = GRADIENT_DSCPS) -> dict[str, tuple[int, ...]]:
    """Job id -> its band of the classes: the levels in order over the classes, near-equal bands
    with the larger ones at the back (the highest levels stay apart); with more levels than
    classes, neighbouring levels share a class."""
    count = max(levels.values(), default=0) + 1
    if count > len(classes):
        return {job: (classes[level * len(classes) // count],) for job, level in levels.items()}
    size, larger = divmod(len(classes), count)  # the last `larger` bands hold one class more
    starts = [level * size + max(0, level - (count - larger)) for level in range(count + 1)]
    return {job: tuple(classes[starts[level]:starts[level + 1]]) for job, level in levels.items()}


@dataclass(frozen=True)
class Sharing:
    """What a policy decides for a set of jobs: each one's band and start offset."""
    policy: str
    bands: dict[str, tuple[int, ...]]
    offsets_ms: dict[str, float]
    intensity: dict[str, float]
    paces_ms: dict[str, float] = dataclasses.field(default_factory=dict)
    chooses_paths: bool = False


def share(policy: str, jobs: Sequence) -> Sharing:
    """The policy's decision for the registered jobs (RegisteredJob)."""
    timings = [job_timing(job) for job in jobs]
    chosen = SHARING_POLICIES[policy]()
    return Sharing(policy, bands(chosen.levels(timings)), chosen.offsets_ms(timings),
                   {timing.job: timing.intensity for timing in timings}, chosen.paces_ms(timings),
                   chosen.chooses_paths)
