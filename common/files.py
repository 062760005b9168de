"""Files written whole or not at all: a reader (the runner, `--resume`, the aggregation) never finds
half a file after an interruption or a crash of the machine, only the old one or none.

    with atomic_open(path) as file:
        file.write(text)
"""
import os
import secrets
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator


@contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", **kwargs) -> Iterator[IO]:
    """Open a new temporary sibling of `path` for writing (mode "w", "wb", "w+"...; kwargs go to
    open); once the block ends without an exception, sync it and rename it over `path` (else
    delete it).

    The temporary name is random and the file created exclusively (open's "x": O_CREAT | O_EXCL,
    which fails on any existing name, a symbolic link included), so nothing another user planted
    in the folder is ever written through; its permissions are a plain open's (0o666 less the
    umask). The name starts with a dot (globs of the folder skip it) and keeps the suffix (libraries
    given file.name choose a format by it)."""
    if not mode.startswith("w"):
        raise ValueError(f"mode: {mode!r} is not allowed (a write mode: w, wb, w+...)")
    path = Path(path)
    # 64 random bits: a name already there is someone's doing, and open fails on it.
    tmp = path.with_name(f".{path.stem}.{secrets.token_hex(8)}.tmp{path.suffix}")
    file = open(tmp, "x" + mode[1:], **kwargs)
    try:
        with file:
            yield file
            file.flush()
            os.fsync(file.fileno())  # the data on disk before the name points at it
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _sync_folder(path.parent)  # the rename itself survives a crash of the machine


def _sync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_open(path) as file:
        file.write(text)
