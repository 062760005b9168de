"""atomic_open: whole files or none, through a temporary file that no one else can have prepared."""
import os
import stat
from pathlib import Path

import pytest

from common import files
from common.files import atomic_open, write_text


def test_the_file_appears_whole_with_the_permissions_of_a_plain_open(tmp_path):
    old = os.umask(0o022)
    try:
        write_text(tmp_path / "a.csv", "x,y\n1,2\n")
    finally:
        os.umask(old)
    assert (tmp_path / "a.csv").read_text() == "x,y\n1,2\n"
    assert stat.S_IMODE((tmp_path / "a.csv").stat().st_mode) == 0o644  # not mkstemp's 0o600
    assert os.listdir(tmp_path) == ["a.csv"]


def test_the_temporary_file_keeps_the_suffix_and_is_hidden_beside_the_target(tmp_path):
    with atomic_open(tmp_path / "plot.png", "wb") as file:
        temporary = Path(file.name)
        file.write(b"\x89PNG")
    assert temporary.parent == tmp_path and temporary.name.startswith(".") and temporary.suffix == ".png"
    assert not temporary.exists() and (tmp_path / "plot.png").read_bytes() == b"\x89PNG"


def test_an_exception_leaves_the_old_file_and_no_temporary(tmp_path):
    (tmp_path / "run.json").write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_open(tmp_path / "run.json") as file:
            file.write("half")
            raise RuntimeError("interrupted")
    assert os.listdir(tmp_path) == ["run.json"] and (tmp_path / "run.json").read_text() == "old"


def test_a_link_planted_at_a_temporary_name_is_never_followed(tmp_path):
    """Another user who can guess the temporary name must not make us write elsewhere."""
    victim = tmp_path / "victim"
    victim.write_text("precious")
    for name in (".summary.tmp.json", ".summary.json.tmp"):  # the fixed names writers have used
        (tmp_path / name).symlink_to(victim)
    write_text(tmp_path / "summary.json", "{}")
    assert victim.read_text() == "precious"
    assert not (tmp_path / "summary.json").is_symlink() and (tmp_path / "summary.json").read_text() == "{}"


def test_a_link_at_the_target_is_replaced_not_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / "ports.csv").symlink_to(victim)
    write_text(tmp_path / "ports.csv", "new")
    assert victim.read_text() == "precious" and not (tmp_path / "ports.csv").is_symlink()


def test_two_writers_of_one_file_do_not_share_a_temporary(tmp_path):
    with atomic_open(tmp_path / "cpu.csv") as first, atomic_open(tmp_path / "cpu.csv") as second:
        assert first.name != second.name
        first.write("first")
        second.write("second")
    assert (tmp_path / "cpu.csv").read_text() == "first"  # the outer block ends last
    assert os.listdir(tmp_path) == ["cpu.csv"]


def test_the_data_and_the_rename_are_synced_before_the_block_returns(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append((stat.S_IFMT(os.fstat(fd).st_mode), os.path.exists(tmp_path / "queues.csv")))
        real_fsync(fd)

    monkeypatch.setattr(files.os, "fsync", fsync)
    write_text(tmp_path / "queues.csv", "time_s\n")
    # the file's data before the rename, then the folder that holds the new name
    assert synced == [(stat.S_IFREG, False), (stat.S_IFDIR, True)]


@pytest.mark.parametrize("mode", ["r", "a", "x", "r+"])
def test_only_write_modes_are_allowed(tmp_path, mode):
    with pytest.raises(ValueError, match="mode"):
        with atomic_open(tmp_path / "a.txt", mode):
            pass
    assert os.listdir(tmp_path) == []
