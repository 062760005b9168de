"""Where the testbed lives: the repo, and the Python of its venv (the controller and the host
apps run under it)."""
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VENV_PYTHON = REPO / ".venv" / "bin" / "python"


def venv_python() -> str:
    """The venv's Python, or this one when there is no venv (a test run from another Python)."""
    return str(VENV_PYTHON) if VENV_PYTHON.exists() else sys.executable
