"""A host app started on another server: its argv and folder as the server's root shell sees them."""
import json
import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from emulation.cluster import remote_argv

PRINTER = "import json, os, sys; print(json.dumps([os.getcwd(), *sys.argv[1:]]))"
WORDS = st.lists(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=12),
                 max_size=4)


def as_the_server_runs_it(argv: list[str]) -> list[str]:
    """ssh joins its words with spaces and the server's shell parses the line again."""
    line = " ".join(remote_argv([sys.executable, "-c", PRINTER, *argv[1:]], argv[0]))
    done = subprocess.run(["sh", "-c", line], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


@settings(max_examples=25, deadline=None)
@given(words=WORDS)
def test_every_word_reaches_the_remote_process_as_it_was(tmp_path_factory, words):
    folder = tmp_path_factory.mktemp("a repo with spaces $(touch pwned) 'quoted'")
    assert as_the_server_runs_it([str(folder), *words]) == [str(folder), *words]
    assert not (folder / "pwned").exists()


def test_without_a_folder_the_command_runs_where_the_shell_starts(tmp_path):
    line = " ".join(remote_argv(["pwd"], None))
    done = subprocess.run(["sh", "-c", line], cwd=tmp_path, capture_output=True, text=True)
    assert done.stdout.strip() == str(tmp_path)
