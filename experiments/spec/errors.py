"""The spec's one error: a line naming the field and what is allowed."""
from __future__ import annotations

from typing import Any

from common import schema
from common.schema import SchemaError, one_line, show


class SpecError(SchemaError):
    """A spec problem, as one line: `spec error: <dotted path>: <what is wrong>`."""

    def __init__(self, path: str, problem: str):
        super().__init__(path, problem)
        self.args = (one_line(f"spec error: {path}: {problem}"),)


def not_allowed(path: str, value: Any, allowed: str) -> SpecError:
    return SpecError(path, f"{show(value)} is not allowed ({allowed})")


def build(cls: type, raw: Any, path: str = "", also_known: tuple[str, ...] = (), base: Any = None) -> Any:
    """schema.build, its errors as SpecErrors."""
    try:
        return schema.build(cls, raw, path, also_known, base)
    except SpecError:
        raise
    except SchemaError as error:
        raise SpecError(error.path, error.problem) from None
