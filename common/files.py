"""Files written whole or not at all: a reader (the runner, `--resume`, the aggregation) never finds
half a file after an interruption, only the old one or none.

    with atomic_open(path) as file:
        file.write(text)
"""
import os
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator


@contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", **kwargs) -> Iterator[IO]:
    """Open a temporary sibling of `path` for writing; rename it over `path` once the block ends
    without an exception (else delete it). The temporary name keeps the suffix (matplotlib and
    numpy choose a format by it) and starts with a dot (globs of the folder skip it)."""
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.tmp{path.suffix}")
    try:
        with open(tmp, mode, **kwargs) as file:
            yield file
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_open(path) as file:
        file.write(text)
