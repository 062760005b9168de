"""The matrix: each axis is a name with values; scalar values set one dotted field, mapping values
are labelled sets of dotted-field overrides. The runs are the cartesian product of the axes times
the repetitions (experiments/spec/runs.py), each with a stable run_id such as
`scheme=spray,mode=ps,rep=1`, but the points `exclude` lists; `include` adds overrides to the points
it matches (a mechanism that exists in one mode only, say).

The axis with the baseline may say what each label is measured against (`compare`; the baseline
by default), so that an ablation reports each step's marginal effect against the step before it.
Where the step compared with is excluded, the comparison goes on to that step's own.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from common import schema
from common.schema import show
from experiments.columns import CONFIG_COLUMNS, RESERVED_COLUMNS
from experiments.spec.errors import SpecError, not_allowed
from experiments.spec.schema import CONFIG_KEYS, HEADER_KEYS, LABEL_PATTERN, MAX_REPETITIONS

AXIS_NAME_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# The matrix is sized before it is expanded.
MAX_AXES = 6
MAX_RUNS = 1000


@dataclass(frozen=True)
class Axis:
    """One matrix axis: labelled override sets (dotted field -> value), in spec order."""
    name: str
    values: dict[str, dict[str, Any]]
    baseline: str | None = None
    compare: dict[str, str] = field(default_factory=dict)  # label -> the label it is measured against

    def reference(self, label: str) -> str | None:
        """The label `label` is measured against before exclusions (None for the baseline)."""
        if label == self.baseline:
            return None
        return self.compare.get(label, self.baseline)


@dataclass(frozen=True)
class Selector:
    """Some matrix points: for each axis named, the labels it may have."""
    labels: dict[str, frozenset[str]]

    def matches(self, point: dict[str, str]) -> bool:
        return all(point[axis] in labels for axis, labels in self.labels.items())


@dataclass(frozen=True)
class Include:
    where: Selector
    overrides: dict[str, Any]
    repetitions: int | None = None  # the points it matches run this many repetitions, not the spec's


def label_of(value: Any) -> str:
    """A matrix label as the spec prints it: a string as it is, any other scalar as YAML writes it."""
    return value if isinstance(value, str) else show(value)


def _labelled(path: str, items: list[tuple[Any, dict]]) -> dict[str, dict]:
    """Override sets by label; two labels that print alike (1 and '1', null and 'null') would be one run."""
    values: dict[str, dict] = {}
    keys: dict[str, Any] = {}
    for key, overrides in items:
        label = label_of(key)
        if label in values:
            raise not_allowed(f"{path}.values", key, f"labels that print apart: {show(keys[label])} prints as "
                              f"{label} too")
        values[label], keys[label] = overrides, key
    return values


def _unknown(path: str, key: Any, known: list[str]) -> tuple[str, str]:
    error = schema.unknown_key(path, key, known)
    return error.path, error.problem


def _check_keys(path: str, raw: Any, known: list[str], allowed: str) -> None:
    """raw is a mapping of known keys only."""
    if not isinstance(raw, dict):
        raise not_allowed(path, raw, allowed)
    for key in raw:
        if key not in known:
            raise SpecError(*_unknown(path, key, known))


def parse_axis(name: Any, raw: Any) -> Axis:
    path = f"matrix.{name}"
    if not isinstance(name, str) or not AXIS_NAME_PATTERN.fullmatch(name):
        raise not_allowed("matrix", name, "axis names of letters, digits and _, not starting with a digit")
    _check_keys(path, raw, ["field", "values", "baseline", "compare"],
                "a mapping with values and optionally field, baseline and compare")
    raw_values = raw.get("values")
    if isinstance(raw_values, list) and raw_values:
        field_name = raw.get("field")
        if not isinstance(field_name, str):
            raise not_allowed(f"{path}.field", field_name, "the dotted field the scalar values set")
        for index, value in enumerate(raw_values):
            if isinstance(value, (dict, list)) or value is None:
                raise not_allowed(f"{path}.values.{index}", value, f"a scalar for {field_name}")
        values = _labelled(path, [(value, {field_name: value}) for value in raw_values])
    elif isinstance(raw_values, dict) and raw_values:
        if "field" in raw:
            raise not_allowed(f"{path}.field", raw["field"], "only with a list of scalar values")
        for label, overrides in raw_values.items():
            if overrides is not None and not isinstance(overrides, dict):
                raise not_allowed(f"{path}.values.{label_of(label)}", overrides,
                                  "a mapping of dotted fields to values, e.g. {controller.lb: spray}")
        values = _labelled(path, [(label, overrides or {}) for label, overrides in raw_values.items()])
    else:
        raise not_allowed(f"{path}.values", raw_values,
                          "a non-empty list of scalars (with field) or mapping of labels to overrides")
    for label, overrides in values.items():
        if not LABEL_PATTERN.fullmatch(label):
            raise not_allowed(f"{path}.values", label, "labels of letters, digits and _.+-")
        for key in overrides:
            if str(key).split(".")[0] in HEADER_KEYS:
                raise not_allowed(f"{path}.values.{label}", key, "fields of " + ", ".join(CONFIG_KEYS))
    baseline = raw.get("baseline")
    if baseline is not None and label_of(baseline) not in values:
        raise not_allowed(f"{path}.baseline", baseline, f"one of {', '.join(values)}")
    if name in RESERVED_COLUMNS or (name in CONFIG_COLUMNS and raw.get("field") != CONFIG_COLUMNS[name]):
        raise not_allowed("matrix", name, "an axis name that is not a runs.csv column, unless it "
                          f"is the scalar axis over that column's field ({CONFIG_COLUMNS.get(name, '-')})")
    baseline = None if baseline is None else label_of(baseline)
    return Axis(name, values, baseline, _compare(path, raw.get("compare"), values, baseline))


def _compare(path: str, raw: Any, values: dict[str, dict], baseline: str | None) -> dict[str, str]:
    """An axis's `compare`: label -> the label it is measured against, without a cycle."""
    if raw is None:
        return {}
    if baseline is None:
        raise not_allowed(f"{path}.compare", raw, "only on the axis with a baseline")
    if not isinstance(raw, dict):
        raise not_allowed(f"{path}.compare", raw, "a mapping of labels to the label each is measured against")
    compare = {}
    for key, against in raw.items():
        label, other = label_of(key), label_of(against) if not isinstance(against, (dict, list)) else against
        if label not in values or label == baseline:
            raise not_allowed(f"{path}.compare", key, f"a label of {', '.join(values)} but the baseline {baseline}")
        if other not in values or other == label:
            raise not_allowed(f"{path}.compare.{label}", against, f"another label of {', '.join(values)}")
        compare[label] = other
    for label in compare:
        seen = [label]
        while (label := compare.get(label, baseline)) != baseline:
            if label in seen:
                raise not_allowed(f"{path}.compare", " -> ".join([*seen, label]), "comparisons that lead to the "
                                  "baseline, not round in a circle")
            seen.append(label)
    return compare


def parse_selector(path: str, raw: Any, axes: list[Axis]) -> Selector:
    """{AXIS: LABEL or [LABELS]}: the points it names."""
    by_name = {axis.name: axis for axis in axes}
    if not isinstance(raw, dict) or not raw:
        raise not_allowed(path, raw, "a mapping of axis names to a label or a list of labels, e.g. "
                          "{mode: allreduce}")
    labels = {}
    for name, value in raw.items():
        if name not in by_name:
            raise SpecError(*_unknown(path, name, list(by_name)))
        chosen = value if isinstance(value, list) else [value]
        for item in chosen:
            if isinstance(item, (dict, list)) or label_of(item) not in by_name[name].values:
                raise not_allowed(f"{path}.{name}", item, f"a label of {', '.join(by_name[name].values)}")
        labels[name] = frozenset(label_of(item) for item in chosen)
    return Selector(labels)


def parse_include(path: str, raw: Any, axes: list[Axis]) -> Include:
    _check_keys(path, raw, ["where", "set", "repetitions"], "a mapping with where and set, repetitions or both")
    if "set" not in raw and "repetitions" not in raw:
        raise not_allowed(path, raw, "a mapping with where and set, repetitions or both")
    overrides = raw.get("set", {})
    if not isinstance(overrides, dict) or ("set" in raw and not overrides):
        raise not_allowed(f"{path}.set", overrides, "a mapping of dotted fields to values, e.g. "
                          "{job.ps_slice_bytes: 65536}")
    for key in overrides:
        if str(key).split(".")[0] in HEADER_KEYS:
            raise not_allowed(f"{path}.set", key, "fields of " + ", ".join(CONFIG_KEYS))
    repetitions = raw.get("repetitions")
    if repetitions is not None and (isinstance(repetitions, bool) or not isinstance(repetitions, int)
                                    or not 1 <= repetitions <= MAX_REPETITIONS):
        raise not_allowed(f"{path}.repetitions", repetitions, f"an integer 1..{MAX_REPETITIONS}")
    return Include(parse_selector(f"{path}.where", raw.get("where"), axes), {str(k): v for k, v in overrides.items()},
                   repetitions)
