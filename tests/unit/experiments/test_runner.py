"""The runner's checks before it touches the machine."""
import os

import pytest

from experiments.spec import load_spec
from helpers import REPO

SMOKE = REPO / "experiments" / "smoke.yaml"


def test_runner_refuses_to_run_without_root(monkeypatch, tmp_path):
    from experiments.runner import run_experiment
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(SystemExit, match="needs root"):
        run_experiment(load_spec(SMOKE), tmp_path / "out", resume=False)
    assert not (tmp_path / "out").exists()
