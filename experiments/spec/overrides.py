"""`--set key=value` overrides and matrix points: dotted fields set in a raw spec document."""
from __future__ import annotations

import copy
from typing import Any

import yaml

from common.schema import show
from experiments.spec.errors import SpecError, not_allowed
from experiments.spec.reading import load_yaml


def set_dotted(document: dict, key: str, value: Any) -> None:
    """Set a dotted field of a raw spec document in place. A mapping value merges into a
    mapping field (its keys may be dotted too); any other value replaces the field."""
    parts = key.split(".")
    if not all(parts):
        raise not_allowed(key, value, "a dotted field name such as topology.spines")
    node = document
    for depth, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            path = ".".join(parts[:depth + 1])
            raise SpecError(path, f"{show(child)} has no fields, so {key} cannot be set")
        node = child
    last = parts[-1]
    if isinstance(value, dict) and isinstance(node.get(last), dict):
        for sub_key, sub_value in value.items():
            set_dotted(node[last], str(sub_key), sub_value)
    else:
        node[last] = copy.deepcopy(value)


def apply_sets(document: dict, assignments: list[str]) -> None:
    """Apply command-line `key=value` overrides (value parsed as YAML) to a raw document."""
    for assignment in assignments:
        key, separator, text = assignment.partition("=")
        if not separator or not key:
            raise SpecError(f"--set {assignment}", "expected key=value, e.g. topology.spines=4")
        try:
            value = load_yaml(text)
        except yaml.YAMLError as error:
            raise not_allowed(key, text, f"a YAML value: {str(error).splitlines()[0]}") from None
        set_dotted(document, key.strip(), value)

