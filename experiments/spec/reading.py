"""Reading a spec file: small UTF-8 text whose YAML, nested and expanded (aliases) within limits,
is loaded before anything else looks at it; every failure is one SpecError line naming the file.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterable

import yaml

from common.schema import show
from experiments.spec.errors import SpecError

# What one spec may ask for. Reading: a small text file whose values, YAML aliases expanded, are
# few and shallow (the shipped specs: under 3 KB, 200 values, 8 levels). PyYAML's pure-Python
# parser, needed to bound the nesting while composing, reads about 300 KB/s.
MAX_SPEC_BYTES = 256 * 1024
MAX_VALUES = 10_000
MAX_DEPTH = 32
TOO_MANY_VALUES = f"has more than {MAX_VALUES} values with its aliases expanded"


class YamlLimitError(yaml.YAMLError):
    """Valid YAML that no spec may be: nested too deeply, too large with its aliases expanded, or
    containing itself."""


def shape_problem(root: Any, parts: Callable[[Any], Iterable[tuple[str, Any]]]) -> tuple[str, str] | None:
    """(dotted path, problem) where root, with its shared parts (YAML aliases) expanded, is nested
    deeper than MAX_DEPTH levels, has more than MAX_VALUES values or contains itself; else None.

    parts(x) gives x's labelled parts. Linear in the distinct parts: each is measured once, so
    an alias bomb costs what its text does."""
    measured: dict[int, tuple[int, int]] = {}  # id -> (values, levels) of a part measured
    open_ids = {id(root)}
    stack = [[root, [], iter(parts(root)), 1, 1]]  # part, path, parts left, values, levels so far
    while stack:
        entry = stack[-1]
        step = next(entry[2], None)
        if step is None:
            stack.pop()
            open_ids.discard(id(entry[0]))
            measured[id(entry[0])] = (entry[3], entry[4])
            if stack:
                parent = stack[-1]
                parent[3] += entry[3]
                parent[4] = max(parent[4], entry[4] + 1)
                if parent[3] > MAX_VALUES:
                    return ".".join(parent[1]), TOO_MANY_VALUES
            continue
        label, child = step
        path = entry[1] + [label]
        if id(child) in open_ids:
            return ".".join(path), "contains itself (a recursive alias)"
        if id(child) in measured:
            values, levels = measured[id(child)]
            if len(path) + levels > MAX_DEPTH:
                return ".".join(path), f"is nested deeper than {MAX_DEPTH} levels"
            entry[3] += values
            entry[4] = max(entry[4], levels + 1)
            if entry[3] > MAX_VALUES:
                return ".".join(entry[1]), TOO_MANY_VALUES
        elif len(path) >= MAX_DEPTH:
            return ".".join(path), f"is nested deeper than {MAX_DEPTH} levels"
        else:
            open_ids.add(id(child))
            stack.append([child, path, iter(parts(child)), 1, 1])
    return None


def value_parts(value: Any) -> Iterable[tuple[str, Any]]:
    """The keys and items of a loaded YAML value."""
    if isinstance(value, dict):
        for key, item in value.items():
            label = key if isinstance(key, str) else show(key)
            yield from ((label, key), (label, item))
    elif isinstance(value, (list, tuple, set, frozenset)):
        yield from ((str(index), item) for index, item in enumerate(value))


def _node_parts(node: yaml.Node) -> Iterable[tuple[str, yaml.Node]]:
    """The keys and items of a composed YAML node."""
    if isinstance(node, yaml.MappingNode):
        for key, item in node.value:
            label = key.value if isinstance(key, yaml.ScalarNode) else "?"
            yield from ((label, key), (label, item))
    elif isinstance(node, yaml.SequenceNode):
        yield from ((str(index), item) for index, item in enumerate(node.value))


class _SpecLoader(yaml.SafeLoader):
    """yaml.SafeLoader within the spec limits, failing early: nesting bounded while scanning (the
    scanner looks ahead across every open bracket, in quadratic time) and composing (before
    Python's recursion limit), values counted while composing, the composed document measured
    with its aliases expanded before any value is constructed (PyYAML copies merged keys while
    constructing: merges of merges grow exponentially), and values its constructors cannot
    build reported as YAML errors."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._values = 0

    @staticmethod
    def _too_deep(mark: yaml.Mark) -> YamlLimitError:
        return YamlLimitError(f"the document is nested deeper than {MAX_DEPTH} levels at line {mark.line + 1}, "
                              f"column {mark.column + 1}")

    def fetch_flow_collection_start(self, token_class: type) -> None:
        if self.flow_level >= MAX_DEPTH:
            raise self._too_deep(self.get_mark())
        super().fetch_flow_collection_start(token_class)

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        if self._depth >= MAX_DEPTH:
            raise self._too_deep(self.peek_event().start_mark)
        self._values += 1
        if self._values > MAX_VALUES:
            raise YamlLimitError(f"the document {TOO_MANY_VALUES}")
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self) -> yaml.Node:
        node = super().compose_document()
        problem = shape_problem(node, _node_parts)
        if problem:
            raise YamlLimitError(f"{problem[0] or 'the document'} {problem[1]}")
        return node

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        """A mapping whose keys are distinct, as Python compares them (1, 1.0 and true are one key):
        YAML would keep the last value silently. Keys a merge (<<) brings may be overridden."""
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value if isinstance(node, yaml.MappingNode) else ():
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                earlier = seen.setdefault(key, key)
            except TypeError:  # an unhashable key: PyYAML's own error says so
                continue
            if earlier is not key:
                again = "" if show(key) == show(earlier) else f" (as {show(key)})"
                raise yaml.constructor.ConstructorError(
                    None, None, f"found the key {show(earlier)} twice in one mapping{again}", key_node.start_mark)
        return super().construct_mapping(node, deep)

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except ValueError as error:  # e.g. the date 2020-13-45, an integer of over 4300 digits
            raise yaml.constructor.ConstructorError(None, None, str(error), node.start_mark) from None


def load_yaml(text: str) -> Any:
    """yaml.safe_load of text within the spec limits; every failure is a yaml.YAMLError."""
    loader = _SpecLoader(text)
    try:
        return loader.get_single_data()
    except RecursionError:  # the limits above keep PyYAML well inside Python's; should they not
        raise YamlLimitError("the document is nested too deeply") from None
    finally:
        loader.dispose()


def read_document(path: str | Path) -> Any:
    """The YAML document of a spec file, read within the limits above."""
    where = str(path)
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_SPEC_BYTES + 1)
    except OSError as error:
        raise SpecError(where, f"cannot be read ({error.strerror or error})") from None
    if len(data) > MAX_SPEC_BYTES:
        raise SpecError(where, f"is more than {MAX_SPEC_BYTES // 1024} KiB, too large for a spec")
    nul = data.find(b"\0")
    if nul >= 0:
        raise SpecError(where, f"is not a text file (a NUL byte at offset {nul})")
    try:
        text = data.decode()
    except UnicodeDecodeError as error:
        raise SpecError(where, f"is not UTF-8 text (byte {data[error.start]:#04x} at offset {error.start})") from None
    try:
        document = load_yaml(text)
    except YamlLimitError as error:
        raise SpecError(where, f"is not allowed ({error})") from None
    except yaml.YAMLError as error:
        raise SpecError(where, f"is not valid YAML ({' '.join(str(error).split())})") from None
    return document
