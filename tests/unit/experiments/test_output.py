"""start_output: the runner (root) writes only into folders no other user can change under it."""
import os
import stat
from pathlib import Path

import pytest

from experiments import results
from experiments.spec import load_spec
from helpers import FIXTURES

SPEC = load_spec(FIXTURES / "experiments" / "two_schemes.yaml")
OTHER_UID = 4242
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="folders of another user need root to make")


def _refused(out: Path, match: str, resume: bool = False) -> str:
    with pytest.raises(ValueError, match=match) as raised:
        results.start_output(out, SPEC, resume=resume)
    message = str(raised.value)
    assert message.startswith(f"--out {out}: ") and "\n" not in message
    return message


def test_new_folders_are_created_0o755_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        results.start_output(tmp_path / "results" / "exp", SPEC, resume=False)
    finally:
        os.umask(old)
    for folder in (tmp_path / "results", tmp_path / "results" / "exp"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o755


def test_an_output_folder_that_is_a_link_is_refused(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "out").symlink_to(tmp_path / "elsewhere")
    _refused(tmp_path / "out", "is a symbolic link")
    _refused(tmp_path / "out", "is a symbolic link", resume=True)
    assert os.listdir(tmp_path / "elsewhere") == []


def test_a_results_root_that_is_a_link_is_refused(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "results").symlink_to(tmp_path / "elsewhere")
    _refused(tmp_path / "results" / "exp", f"{tmp_path / 'results'} is a symbolic link")
    assert os.listdir(tmp_path / "elsewhere") == []


def test_an_output_path_through_a_file_is_refused(tmp_path):
    (tmp_path / "out").write_text("")
    _refused(tmp_path / "out", "is not a folder")


def test_our_own_folder_resumes(tmp_path):
    out = tmp_path / "out"
    out.mkdir(mode=0o700)
    results.start_output(out, SPEC, resume=False)
    results.start_output(out, SPEC, resume=True)
    assert (out / "spec.yaml").is_file()


@as_root
def test_an_output_folder_of_another_user_is_refused(tmp_path):
    out = tmp_path / "out"
    out.mkdir(mode=0o755)
    os.chown(out, OTHER_UID, OTHER_UID)
    _refused(out, f"is owned by uid {OTHER_UID}")
    assert os.listdir(out) == []


@as_root
def test_a_results_root_of_another_user_is_refused(tmp_path):
    root = tmp_path / "results"
    root.mkdir(mode=0o755)
    os.chown(root, OTHER_UID, OTHER_UID)
    _refused(root / "exp", f"{root} is owned by uid {OTHER_UID}")
    assert os.listdir(root) == []


@as_root
@pytest.mark.parametrize("mode", [0o775, 0o757, 0o777])
def test_folders_others_can_write_are_refused_as_root(tmp_path, mode):
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(mode)
    _refused(out, "is writable by other users")
    root = tmp_path / "results"
    root.mkdir()
    root.chmod(mode)
    _refused(root / "exp", "is writable by other users")
    assert os.listdir(out) == [] and os.listdir(root) == []


@as_root
def test_a_sticky_shared_root_like_tmp_is_a_results_root(tmp_path):
    """In a sticky folder (/tmp) no other user can rename or delete what we create; what they
    created before us is theirs, and refused as an output folder."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    results.start_output(shared / "exp", SPEC, resume=False)
    assert (shared / "exp" / "spec.yaml").is_file()
    (shared / "theirs").mkdir()
    os.chown(shared / "theirs", OTHER_UID, OTHER_UID)
    _refused(shared / "theirs", "is owned by uid")


@pytest.mark.parametrize("damage,what", [
    (lambda spec: spec.write_bytes(b"name: [\xff"), "not YAML"),
    (lambda spec: (spec.unlink(), spec.symlink_to("/etc/hostname")), "a symbolic link, not followed"),
    (lambda spec: spec.write_text("[1, 2]\n"), "differs from the spec given"),
])
def test_resuming_a_folder_with_a_damaged_spec_is_one_line_naming_it(tmp_path, damage, what):
    out = tmp_path / "out"
    results.start_output(out, SPEC, resume=False)
    damage(out / "spec.yaml")
    with pytest.raises(ValueError) as raised:
        results.start_output(out, SPEC, resume=True)
    message = str(raised.value)
    assert message.startswith(f"{out / 'spec.yaml'}: {what}") and "\n" not in message
    with pytest.raises(ValueError, match="holds results already"):
        results.start_output(out, SPEC, resume=False)
