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


class FakeFabric:
    """A fabric that comes up at once and has nothing in it: what run_on_fabric needs around its runs."""

    def __init__(self, *args, workdir, **kwargs):
        workdir.mkdir(parents=True)
        self.cleaned, self.timings = [], {"build_s": 0.0}

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return False

    def wait_reachable(self):
        pass


def test_a_run_that_fails_at_run_time_fails_alone(monkeypatch, tmp_path):
    """Any exception of one run (a ConfigError of the host apps', say) is recorded as that run's
    failure, with its reason, and the next run goes on on the same fabric."""
    from experiments import runner
    from experiments.progress import Progress
    from experiments.results import read_run_record
    from hostapps.config import ConfigError
    spec = load_spec(SMOKE)
    monkeypatch.setattr(runner, "Fabric", FakeFabric)
    monkeypatch.setattr(runner, "fabric_placement", lambda fab: {})
    monkeypatch.setattr(runner, "port_rates", lambda fab: None)
    monkeypatch.setattr(runner, "fabric_memory", lambda run_dirs: {})
    ran = []

    def run_once(fab, out, plans, rates, stats_csv, progress, run):
        ran.append(run.run_id)
        if len(ran) == 1:
            raise ConfigError("--servers", "2 shards but the model has only 1 tensors")
        runner.write_run_record(out, run, "ok", 0.0, 1.0)
        return "ok"

    monkeypatch.setattr(runner, "run_once", run_once)
    with Progress(len(spec.runs), disable=True) as progress:
        runner.run_on_fabric(tmp_path, spec.runs, progress)
    assert ran == [run.run_id for run in spec.runs]
    first, second = (read_run_record(tmp_path, run.run_id) for run in spec.runs)
    assert first["status"] == "failed"
    assert first["error"] == "ConfigError: --servers: 2 shards but the model has only 1 tensors"
    assert second["status"] == "ok"
    assert progress.statuses == {"failed": 1, "ok": 1}
    assert (tmp_path / "fabrics" / spec.runs[0].run_id / "fabric.json").is_file()


def test_a_resumed_fabric_keeps_the_earlier_attempts_record(tmp_path):
    from experiments.runner import fabric_dir
    run = load_spec(SMOKE).runs[0]
    earlier = tmp_path / "fabrics" / run.run_id
    for attempt in (1, 2):
        earlier.mkdir(parents=True)
        (earlier / "fabric.json").write_text(f"attempt {attempt}")
        assert fabric_dir(tmp_path, run) == earlier and not earlier.exists()
    kept = sorted(path.name for path in (tmp_path / "fabrics").iterdir())
    assert kept == [f"{run.run_id}.attempt1", f"{run.run_id}.attempt2"]
    assert (tmp_path / "fabrics" / f"{run.run_id}.attempt2" / "fabric.json").read_text() == "attempt 2"
