"""A spec's runs: the header, the base config (spec plus `--set`), and every point of the matrix
times the repetitions, each validated as a whole `RunConfig`.
"""
from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments.spec.checks import check_config
from experiments.spec.errors import SpecError, build, not_allowed
from experiments.spec.matrix import MAX_AXES, MAX_RUNS, Axis, parse_axis, parse_include, parse_selector
from experiments.spec.overrides import apply_sets, set_dotted
from experiments.spec.reading import read_document, shape_problem, value_parts
from experiments.spec.schema import HEADER_KEYS, Controller, Header, Job, RunConfig, Topology
from hostapps.config import U32


@dataclass(frozen=True)
class Run:
    """One run of the experiment: a point of the matrix and a repetition."""
    run_id: str          # e.g. "scheme=spray,mode=ps,rep=1": axis=label parts, then rep
    index: int           # 0-based position in the run order
    rep: int             # 1-based repetition
    axes: dict[str, str]  # axis name -> value label, in axis order
    config: RunConfig    # fully resolved: base spec + --set + this point's overrides
    alone: str = ""      # a job of several run alone, the reference of its slowdown: its name

    @property
    def topology(self) -> Topology:
        return self.config.topology

    @property
    def controller(self) -> Controller:
        return self.config.controller

    @property
    def job(self) -> Job:
        return self.config.job

    @property
    def job_runs(self) -> list[Run]:
        """Each job's run as if alone (RunConfig.job_configs): [self] for a run of one job."""
        if not self.config.jobs:
            return [self]
        return [dataclasses.replace(self, config=view) for view in self.config.job_configs]

    @property
    def job_names(self) -> list[str]:
        """The names of the run's jobs; [""] for a spec of one job."""
        return [self.alone] if self.alone else self.config.job_names

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: run_id, index, rep, axes, config, and the resolved host placement."""
        return {
            "run_id": self.run_id, "index": self.index, "rep": self.rep, "axes": dict(self.axes),
            "config": dataclasses.asdict(self.config), "alone": self.alone,
            "worker_hosts": self.config.worker_hosts, "server_hosts": self.config.server_hosts,
        }


ALONE = "alone"  # the axes' label of a job run alone


def alone_run_id(name: str, rep: int) -> str:
    return f"{ALONE}={name},rep={rep}"


def alone_config(config: RunConfig) -> RunConfig:
    """A job's alone run: its config as a run of one job, whatever the sharing."""
    return dataclasses.replace(config, controller=dataclasses.replace(config.controller, sharing="fair"))


def alone_key(config: RunConfig) -> str:
    """What tells alone runs apart (RunConfig holds lists: no hash)."""
    return json.dumps(dataclasses.asdict(alone_config(config)), sort_keys=True, default=str)


@dataclass(frozen=True)
class Spec:
    header: Header
    base: RunConfig      # the spec without the matrix (after --set)
    axes: list[Axis]
    runs: list[Run]
    # Each point's labels (in axis order) -> the labels of the point it is measured against (None
    # for the baseline's points, and every point of a spec without a baseline).
    references: dict[tuple[str, ...], tuple[str, ...] | None] = dataclasses.field(default_factory=dict)

    def reference(self, axes: dict[str, str]) -> dict[str, str] | None:
        """The axes of the point a point (axis -> label) is measured against, None if none."""
        labels = self.references.get(tuple(axes[axis.name] for axis in self.axes))
        return None if labels is None else dict(zip([axis.name for axis in self.axes], labels))

    @property
    def name(self) -> str:
        return self.header.name

    @property
    def baseline(self) -> tuple[str, str] | None:
        """(axis name, label) that speedups are measured against, if an axis marks one."""
        return next(((axis.name, axis.baseline) for axis in self.axes if axis.baseline), None)

    def resolved_document(self) -> dict[str, Any]:
        """The spec with every default filled in; parse_spec of it gives the same runs."""
        config = dataclasses.asdict(self.base)
        if self.base.jobs:
            del config["job"]  # the first of jobs
        return {
            "name": self.header.name, "description": self.header.description,
            **config,
            "repetitions": self.header.repetitions, "matrix": copy.deepcopy(self.header.matrix),
            "include": copy.deepcopy(self.header.include), "exclude": copy.deepcopy(self.header.exclude),
            "confidence": self.header.confidence, "stolen_retries": self.header.stolen_retries,
        }


def run_id(axes: dict[str, str], rep: int) -> str:
    return ",".join([f"{axis}={label}" for axis, label in axes.items()] + [f"rep={rep}"])


def scheme_of(run_id: str) -> str:
    """A run_id without its rep and mode parts: the configuration compared within a mode."""
    parts = [part for part in run_id.split(",") if part.split("=")[0] not in ("rep", "mode")]
    return ",".join(parts) or "base"


def _resolve(document: dict, base: RunConfig | None = None, sections: set[str] = frozenset(),
             runs: bool = True) -> RunConfig:
    """The checked RunConfig of a document; with base, only its sections named in `sections` are
    built (the others are base's, built from the same values). runs: it is run as it is (not the
    base of a matrix)."""
    if document.get("jobs") and "job" in document:
        raise not_allowed("job", document["job"], "left out with jobs: each job of jobs has its own fields")
    config_document = {key: value for key, value in document.items()
                       if key not in HEADER_KEYS and (base is None or key in sections)}
    config = build(RunConfig, config_document, also_known=HEADER_KEYS, base=base)
    check_config(config, runs)
    return config


def parse_spec(document: Any, sets: list[str] = ()) -> Spec:
    """Validate a raw spec document (plus --set overrides) and expand its runs."""
    if not isinstance(document, dict):
        raise not_allowed("spec", document, "a YAML mapping with topology, controller, job, ...")
    problem = shape_problem(document, value_parts)
    if problem:
        raise SpecError(problem[0] or "spec", problem[1])
    document = copy.deepcopy(document)
    apply_sets(document, list(sets))
    header = build(Header, {key: document[key] for key in HEADER_KEYS if key in document})
    if len(header.matrix) > MAX_AXES:
        raise not_allowed("matrix", list(header.matrix), f"at most {MAX_AXES} axes")
    base = _resolve(document, runs=not header.matrix)
    axes = [parse_axis(name, raw) for name, raw in header.matrix.items()]
    if sum(axis.baseline is not None for axis in axes) > 1:
        raise not_allowed("matrix", [axis.name for axis in axes if axis.baseline], "a baseline on one axis at most")
    point_count = math.prod(len(axis.values) for axis in axes)
    if point_count > MAX_RUNS:
        raise SpecError("matrix", f"{point_count} points is not allowed (at most {MAX_RUNS} runs in all)")
    if point_count * header.repetitions > MAX_RUNS:
        raise not_allowed("repetitions", header.repetitions, f"at most {MAX_RUNS // point_count} with the "
                          f"matrix's {point_count} points: at most {MAX_RUNS} runs in all")
    excluded = [parse_selector(f"exclude.{index}", raw, axes) for index, raw in enumerate(header.exclude)]
    includes = [parse_include(f"include.{index}", raw, axes) for index, raw in enumerate(header.include)]
    points = [dict(zip([axis.name for axis in axes], labels))
              for labels in itertools.product(*[list(axis.values) for axis in axes])]
    points = [point for point in points if not any(selector.matches(point) for selector in excluded)]
    if not points:
        raise not_allowed("exclude", header.exclude, "points that leave some to run")
    resolved = []
    repetitions: dict[tuple[str, ...], int] = {}
    for point in points:
        chosen = [include.repetitions for include in includes
                  if include.repetitions is not None and include.where.matches(point)]
        repetitions[tuple(point.values())] = max(chosen, default=header.repetitions)
        overrides = [(str(key), value) for axis in axes for key, value in axis.values[point[axis.name]].items()]
        overrides += [(key, value) for include in includes if include.where.matches(point)
                      for key, value in include.overrides.items()]
        # Only the sections a point overrides are copied and validated again: a big background
        # list is checked once, not once per point.
        sections = {key.split(".")[0] for key, _ in overrides}
        point_document = {key: copy.deepcopy(value) if key in sections else value for key, value in document.items()}
        for key, value in overrides:
            set_dotted(point_document, key, value)
        try:
            resolved.append((point, _resolve(point_document, base, sections)))
        except SpecError as error:
            point_name = ",".join(f"{axis}={label}" for axis, label in point.items())
            raise SpecError(error.path, f"{error.problem} (in run {point_name})") from None
    references = _references(axes, resolved)
    # Repetitions outermost: each scheme is measured once before any is measured again,
    # so slow drift of the host affects every scheme alike. Seeds differ per repetition
    # and are equal across schemes, making repetitions paired comparisons.
    if sum(repetitions.values()) > MAX_RUNS:
        raise not_allowed("include", header.include, f"repetitions that keep to at most {MAX_RUNS} runs in all "
                          f"({sum(repetitions.values())} asked)")
    runs = []
    for point, config in resolved:
        count = repetitions[tuple(point.values())]
        for entry in config.jobs or [config.job]:
            if entry.seed + count - 1 > U32:
                field = f"jobs.{config.jobs.index(entry)}.seed" if config.jobs else "job.seed"
                raise not_allowed(field, entry.seed, f"at most {U32 + 1 - count} with "
                                  f"{count} repetitions: seeds grow by one per repetition up to "
                                  "2**32 - 1")
    for rep in range(1, max(repetitions.values()) + 1):
        repeated = [(point, _with_rep_seeds(config, rep)) for point, config in resolved
                    if repetitions[tuple(point.values())] >= rep]
        # each job of several alone first, once per distinct config: the reference of its slowdown
        alone: dict[str, str] = {}
        for _, config in repeated:
            for name, view in zip(config.job_names, config.job_configs if config.jobs else []):
                key = alone_key(view)
                if key not in alone:
                    label = name if name not in alone.values() else f"{name}.{len(alone)}"
                    alone[key] = label
                    runs.append(Run(alone_run_id(label, rep), len(runs), rep, {axis.name: ALONE for axis in axes},
                                    alone_config(view), alone=name))
        for point, config in repeated:
            runs.append(Run(run_id(point, rep), len(runs), rep, point, config))
    return Spec(header, base, axes, runs, references)


def _with_rep_seeds(config: RunConfig, rep: int) -> RunConfig:
    """The config of repetition rep: every job's seed grown by rep - 1."""
    if config.jobs:
        return dataclasses.replace(config, jobs=[dataclasses.replace(entry, seed=entry.seed + rep - 1)
                                                 for entry in config.jobs])
    return dataclasses.replace(config, job=dataclasses.replace(config.job, seed=config.job.seed + rep - 1))


def alone_runs(spec: Spec) -> dict[tuple[str, str], str]:
    """(run_id, job name) -> the run_id of that job alone, for every job of a run of several."""
    alone = {(run.rep, alone_key(run.config)): run.run_id for run in spec.runs if run.alone}
    return {(run.run_id, name): alone[(run.rep, alone_key(view))]
            for run in spec.runs if run.config.jobs
            for name, view in zip(run.config.job_names, run.config.job_configs)}


def _references(axes: list[Axis], resolved: list[tuple[dict[str, str], RunConfig]]
                ) -> dict[tuple[str, ...], tuple[str, ...] | None]:
    """Each point's reference point (Axis.compare, else the baseline), stepping past excluded ones;
    an explicit comparison of two points that run the same configuration is refused."""
    configs = {tuple(point.values()): config for point, config in resolved}
    axis = next((axis for axis in axes if axis.baseline is not None), None)
    if axis is None:
        return {labels: None for labels in configs}
    at = [a.name for a in axes].index(axis.name)
    references: dict[tuple[str, ...], tuple[str, ...] | None] = {}
    for labels, config in configs.items():
        step = label = labels[at]
        while (step := axis.reference(step)) is not None:
            other = labels[:at] + (step,) + labels[at + 1:]
            if other in configs:
                break
        else:
            if label != axis.baseline:
                point = ",".join(f"{a.name}={value}" for a, value in zip(axes, labels))
                raise not_allowed(f"matrix.{axis.name}.baseline", axis.baseline,
                                  f"a label run wherever {label} is: nothing to measure {point} against")
            references[labels] = None
            continue
        references[labels] = other
        if label in axis.compare and configs[other] == config:
            where = ",".join(f"{a.name}={value}" for a, value in zip(axes, labels) if a is not axis)
            raise not_allowed(f"matrix.{axis.name}.compare.{label}", step,
                              f"a label whose runs differ from {label}'s" + (f" (with {where})" if where else "")
                              + ": the two run the same configuration, the step would change nothing")
    return references


def load_spec(path: str | Path, sets: list[str] = ()) -> Spec:
    """Read, validate and expand a YAML spec file."""
    return parse_spec(read_document(path), sets)
