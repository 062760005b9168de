"""The schema engine: a knob is declared once, as a dataclass field, and read from YAML (experiment
specs), JSON (the controller's REST documents) or a command line (the host apps), with one error
line naming the field and what is allowed:

    spec error: job.lr: -1 is not allowed (a finite learning rate > 0)
    error: --lr: -1 is not allowed (a finite learning rate > 0)

A field's type annotation says what value it takes (int, float, str, bool, a Literal, a union, a
list, None, or a nested dataclass: a section; a list of sections is a list of documents, such as
the layers and flows of the controller's `POST /jobs`, whose errors name the item:
`flows.2.dport`); `knob` adds its default, what is allowed in words, a check of the parsed value
(and of each item of a list), and, for choices that grow with the testbed, the registry they are
read from (a callable: a new policy registers itself and is a valid choice everywhere). Rules
across fields (two layers with one index, a flow naming an unknown host) are the caller's, checked
on what `build` returns, with the same one-line SchemaError.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import difflib
import functools
import itertools
import re
from dataclasses import field
from types import NoneType, UnionType
from typing import Any, Callable, Iterable, Literal, Union, get_args, get_origin, get_type_hints

import yaml

SHOWN_CHARS = 60


class SchemaError(ValueError):
    """A value a schema refuses, as one line: `<path>: <problem>`."""

    def __init__(self, path: str, problem: str):
        super().__init__(one_line(f"{path}: {problem}"))
        self.path = path
        self.problem = problem


def one_line(text: str) -> str:
    """text with its line breaks and other unprintable characters escaped."""
    return "".join(char if char.isprintable() else char.encode("unicode_escape").decode() for char in text)


class Text(str):
    """Command-line text, shown as typed."""


def show(value: Any) -> str:
    """A value as the user wrote it, cut short: strings quoted, command-line text as typed, the
    rest in YAML's flow style."""
    if isinstance(value, Text):
        text = str(value)
    elif isinstance(value, str):
        text = repr(value)
    else:
        text = yaml.safe_dump(_cut(value, [SHOWN_CHARS]), default_flow_style=True, width=float("inf"))
        text = text.removesuffix("\n").removesuffix("\n...").strip()
    return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]}..."


def _cut(value: Any, budget: list[int]) -> Any:
    """value with only its first values kept, SHOWN_CHARS in all (each shows as a character or
    more), and its strings cut to SHOWN_CHARS + 1 characters: what is cut still shows longer than
    SHOWN_CHARS, and dumping it stays cheap however big the value (a megabyte of a REST document's
    values takes YAML seconds)."""
    budget[0] -= 1
    if isinstance(value, str):
        return value[:SHOWN_CHARS + 1]
    if isinstance(value, list):
        return [_cut(item, budget) for item in itertools.takewhile(lambda _: budget[0] > 0, value)]
    if isinstance(value, dict):
        return {_cut(key, budget): _cut(item, budget)
                for key, item in itertools.takewhile(lambda _: budget[0] > 0, value.items())}
    return value


def not_allowed(path: str, value: Any, allowed: str) -> SchemaError:
    return SchemaError(path, f"{show(value)} is not allowed ({allowed})")


def knob(default: Any = dataclasses.MISSING, allowed: str = "", check: Callable[[Any], bool] | None = None,
         choices: Callable[[], Iterable[str]] | None = None, flag: str | None = None,
         parse: Callable[[str], Any] | None = None, cli: bool = True,
         each: Callable[[Any], bool] | None = None) -> Any:
    """A schema field.

    default: none means required; allowed: what is allowed, in words (choices and Literal fields
    say it themselves); check: of the parsed value; choices: the registry the value must be in
    (read when checking); flag: its command-line flag (default --<name with dashes>); parse: how
    to read it from command-line text (default: by its type); cli: False keeps it off the command
    line; each: a check of each item of a list value (the error names the item), before `check`.
    """
    metadata = {"allowed": allowed, "check": check, "choices": choices, "flag": flag, "parse": parse, "cli": cli,
                "each": each}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def section(cls: type) -> Any:
    """A nested section whose fields all default."""
    return field(default_factory=cls)


def dotted(path: str, key: str) -> str:
    """Paths of YAML specs: job.model.width, background.0.src."""
    return f"{path}.{key}" if path else key


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def allowed_text(declared: dataclasses.Field, annotation: Any) -> str:
    if declared.metadata.get("allowed"):
        return declared.metadata["allowed"]
    if declared.metadata.get("choices"):
        return f"one of {', '.join(declared.metadata['choices']())}"
    if get_origin(annotation) is Literal:
        return f"one of {', '.join(map(str, get_args(annotation)))}"
    return ""


def _may_be(annotation: Any, raw: Any) -> bool:
    """Whether raw is of a type the annotated one takes (a union's member, a list's items and a
    literal's choices may still refuse it)."""
    origin = get_origin(annotation)
    if origin in (Union, UnionType):
        return any(_may_be(member, raw) for member in get_args(annotation))
    if dataclasses.is_dataclass(annotation):
        return raw is None or isinstance(raw, dict)
    if origin is list:
        return isinstance(raw, list)
    if origin is Literal:
        return not isinstance(raw, bool) and raw in get_args(annotation)
    if annotation is NoneType:
        return raw is None
    if annotation is bool:
        return isinstance(raw, bool)
    if annotation is Any:
        return True
    return isinstance(raw, (int, float) if annotation is float else annotation) and not isinstance(raw, bool)


def _parse(annotation: Any, raw: Any, path: str, allowed: str, join: Callable[[str, str], str],
           text: bool = False, pace: Callable[[Iterable], Iterable] = iter) -> Any:
    """raw converted to the annotated type, or SchemaError. Checks are the caller's. text: raw
    may be command-line text to read as the type (errors show the text as typed); pace: as in
    `build`."""
    if text and isinstance(raw, str):
        value = from_text(annotation, raw)
        try:
            return _parse(annotation, value, path, allowed, join, pace=pace)
        except SchemaError:
            raise not_allowed(path, raw, allowed) from None
    origin = get_origin(annotation)
    if origin in (Union, UnionType):
        for member in get_args(annotation):
            if _may_be(member, raw):  # trying the others would only format errors to drop
                try:
                    return _parse(member, raw, path, allowed, join, pace=pace)
                except SchemaError:
                    continue
        raise not_allowed(path, raw, allowed)
    if dataclasses.is_dataclass(annotation):
        return build(annotation, raw, path, join=join, text=text, pace=pace)
    if not _may_be(annotation, raw):
        raise not_allowed(path, raw, allowed)
    if origin is list:
        (item,) = get_args(annotation)
        if dataclasses.is_dataclass(item):
            return [build(item, value, join(path, str(index)), join=join, pace=pace)
                    for index, value in pace(enumerate(raw))]
        as_is = _as_is(item)
        return [value if type(value) in as_is else _parse(item, value, join(path, str(index)), allowed, join)
                for index, value in pace(enumerate(raw))]
    if annotation is float:
        try:
            return float(raw)
        except OverflowError:  # an integer beyond any float
            raise not_allowed(path, raw, allowed) from None
    return raw


@functools.cache
def _plan(cls: type) -> tuple[tuple[str, ...], tuple[tuple, ...]]:
    """cls's field names, and per field what `build` uses: the field, its annotation, the types
    of the values it takes as they are (and of a list's items), whether it is required, its
    check, choices and item check."""
    hints = _type_hints(cls)
    plan = tuple((declared, hints[declared.name], _as_is(hints[declared.name]), _items_as_is(hints[declared.name]),
                  declared.default is dataclasses.MISSING and declared.default_factory is dataclasses.MISSING,
                  declared.metadata.get("check"), declared.metadata.get("choices"), declared.metadata.get("each"))
                 for declared in dataclasses.fields(cls))
    return tuple(declared.name for declared in dataclasses.fields(cls)), plan


@functools.cache
def _as_is(annotation: Any) -> frozenset[type]:
    """The types whose values the annotated type takes unchanged (str, int, None, ...)."""
    members = get_args(annotation) if get_origin(annotation) in (Union, UnionType) else (annotation,)
    return frozenset(member for member in members if member in (str, int, float, bool, NoneType))


def _items_as_is(annotation: Any) -> frozenset[type]:
    """The types of the items a list the annotated type takes has unchanged (none: not a list, a
    list of sections, or a union in which more than one type may take a list)."""
    members = get_args(annotation) if get_origin(annotation) in (Union, UnionType) else (annotation,)
    lists = [member for member in members if get_origin(member) is list or member is Any]
    if len(lists) != 1 or lists[0] is Any:
        return frozenset()
    return _as_is(get_args(lists[0])[0])


def unknown_key(path: str, key: Any, known: list[str], join: Callable[[str, str], str] = dotted) -> SchemaError:
    close = difflib.get_close_matches(str(key), known, n=1)
    hint = f"did you mean {close[0]}?" if close else f"allowed: {', '.join(known)}"
    return SchemaError(join(path, str(key)), f"unknown field ({hint})")


def build(cls: type, raw: Any, path: str = "", also_known: tuple[str, ...] = (), base: Any = None,
          join: Callable[[str, str], str] = dotted, text: bool = False,
          pace: Callable[[Iterable], Iterable] = iter) -> Any:
    """An instance of schema dataclass cls from a raw mapping (None: all defaults).

    also_known: keys the caller handles itself, only to suggest them for typos; base: an instance
    of cls whose values the fields raw leaves out keep, instead of their defaults; join: how a
    field's path is made from its section's (dotted, or flags for a command line); text: string
    values of typed fields are command-line text, read as their type; pace: how the items of a
    list are gone through (the controller's REST API passes one that yields to its OpenFlow side
    now and then: a document of thousands of sections takes tens of milliseconds).
    """
    known, plan = _plan(cls)
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise not_allowed(path or "document", raw, f"a mapping with keys {', '.join(known)}")
    for key in raw:
        if key not in known:
            raise unknown_key(path, key, list(known) + list(also_known), join)
    values = {}
    for declared, annotation, as_is, items_as_is, required, check, choices, each in plan:
        name = declared.name
        if name not in raw:
            if required and base is None:
                raise SchemaError(join(path, name), f"missing ({allowed_text(declared, annotation)})")
            continue
        raw_value = raw[name]
        if type(raw_value) in as_is:  # a value of the type: nothing to parse (most of a big document)
            value = raw_value
        elif items_as_is and type(raw_value) is list and all(type(item) in items_as_is for item in raw_value):
            value = list(raw_value)
        else:
            value = _parse(annotation, raw_value, join(path, name), allowed_text(declared, annotation), join, text,
                           pace)
        for index, item in pace(enumerate(value if each and isinstance(value, list) else ())):
            if not each(item):
                raise not_allowed(join(join(path, name), str(index)), raw_value[index],
                                  allowed_text(declared, annotation))
        if (check and not check(value)) or (choices and value not in choices()):
            raise not_allowed(join(path, name), raw_value, allowed_text(declared, annotation))
        values[name] = value
    return cls(**values) if base is None else dataclasses.replace(base, **values)


def defaults(cls: type) -> dict[str, Any]:
    """Each field's default (a section's as an instance)."""
    return {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
            for f in dataclasses.fields(cls)
            if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING}


# -- command lines ---------------------------------------------------------------------------------
ASCII_INTEGER = re.compile(r"[+-]?[0-9]+")


def flag_of(declared: dataclasses.Field) -> str:
    return declared.metadata.get("flag") or "--" + declared.name.replace("_", "-")


def _cli_fields(cls: type) -> Iterable[tuple[dataclasses.Field, Any]]:
    """(field, annotation) of every command-line field, sections flattened."""
    hints = _type_hints(cls)
    for declared in dataclasses.fields(cls):
        annotation = hints[declared.name]
        if dataclasses.is_dataclass(annotation):
            yield from _cli_fields(annotation)
        elif declared.metadata.get("cli", True):
            yield declared, annotation


def from_text(annotation: Any, text: str) -> Any:
    """Command-line text as the annotated type; what it cannot be is returned as text, for the
    schema to refuse with its allowed text (int() takes '²' and '٣': only ASCII digits are)."""
    members = get_args(annotation) if get_origin(annotation) in (Union, UnionType) else (annotation,)
    if str in members or annotation is Any:
        return str(text)
    for member in members:
        if member is int and ASCII_INTEGER.fullmatch(text):
            return int(text)
        if member is float:
            try:
                return float(text)
            except ValueError:
                continue
    return text


def add_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
    """One flag per command-line field of cls (sections flattened): a bool field is a switch, the
    others take text that `from_arguments` reads; help is the field's allowed text and default."""
    base = _defaults_flat(cls)
    for declared, annotation in _cli_fields(cls):
        help_text = allowed_text(declared, annotation)
        if annotation is bool:
            parser.add_argument(flag_of(declared), dest=declared.name, action="store_true", default=None,
                                help=help_text)
            continue
        default = base.get(declared.name, dataclasses.MISSING)
        shown = "" if default is dataclasses.MISSING or default in ("", None, [], {}) else f" (default {default})"
        parser.add_argument(flag_of(declared), dest=declared.name, default=None, metavar=declared.name.upper(),
                            required=default is dataclasses.MISSING, help=help_text + shown)


def _defaults_flat(cls: type) -> dict[str, Any]:
    values = {}
    for name, value in defaults(cls).items():
        values.update(dataclasses.asdict(value) if dataclasses.is_dataclass(value) else {name: value})
    return values


def _flag_join(cls: type) -> Callable[[str, str], str]:
    flags = {declared.name: flag_of(declared) for declared, _ in _cli_fields(cls)}
    return lambda path, key: flags.get(key, key)


def from_arguments(cls: type, namespace: argparse.Namespace, extra: dict[str, Any] | None = None) -> Any:
    """An instance of cls from parsed command-line flags (and `extra` values, e.g. a positional
    argument); errors name the flag."""
    def raw_of(section_cls: type) -> dict[str, Any]:
        raw = {}
        for declared in dataclasses.fields(section_cls):
            annotation = _type_hints(section_cls)[declared.name]
            if dataclasses.is_dataclass(annotation):
                raw[declared.name] = raw_of(annotation)
                continue
            text = getattr(namespace, declared.name, None)
            if text is None:
                continue
            parse = declared.metadata.get("parse")
            if parse:
                try:
                    raw[declared.name] = parse(text)
                except ValueError as error:
                    raise SchemaError(flag_of(declared), str(error)) from None
            elif annotation is bool:
                raw[declared.name] = True
            else:
                raw[declared.name] = Text(text)
        return raw

    return build(cls, {**raw_of(cls), **(extra or {})}, join=_flag_join(cls), text=True)


def to_arguments(instance: Any, cls: type | None = None) -> list[str]:
    """The command line that gives back `instance` (only the fields of cls, one of its bases)."""
    cls = cls or type(instance)
    argv = []
    for declared, annotation in _cli_fields(cls):
        value = _value_at(instance, cls, declared.name)
        if annotation is bool:
            argv += [flag_of(declared)] if value else []
        elif value is not None:
            argv += [flag_of(declared), format_value(value)]
    return argv


def _value_at(instance: Any, cls: type, name: str) -> Any:
    hints = _type_hints(cls)
    for declared in dataclasses.fields(cls):
        if declared.name == name:
            return getattr(instance, name)
        if dataclasses.is_dataclass(hints[declared.name]):
            try:
                return _value_at(getattr(instance, declared.name), hints[declared.name], name)
            except KeyError:
                continue
    raise KeyError(name)


def format_value(value: Any) -> str:
    if isinstance(value, float):
        return repr(value)  # exact: 0.1 stays 0.1
    return str(value)
