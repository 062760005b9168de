"""`python -m experiments` commands (without the network runner) and the progress display."""
import importlib.util
import io
import signal
import subprocess
import sys
import threading
import types

import pytest

import experiments
from experiments.__main__ import RESULTS_DIR, _import_runner, main
from experiments.progress import Progress
from helpers import REPO

SMOKE = str(REPO / "experiments" / "smoke.yaml")


def test_validate_lists_the_expanded_runs(capsys):
    assert main(["validate", SMOKE]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "smoke: 2 runs (2 matrix points x 1 repetition(s))"
    assert "mode=allreduce,rep=1" in lines[1] and "workers=h1,h2,h3,h4 servers=-" in lines[1]
    assert "mode=ps,rep=1" in lines[2] and "workers=h1,h2,h3 servers=h4" in lines[2]


def test_validate_applies_set_and_reports_errors_on_one_line(capsys):
    assert main(["validate", SMOKE, "--set", "job.iterations=12"]) == 0
    assert "iterations=12" in capsys.readouterr().out
    assert main(["validate", SMOKE, "--set", "topology.spines=-1"]) == 2
    captured = capsys.readouterr()
    assert captured.err == "spec error: topology.spines: -1 is not allowed (an integer >= 1)\n"
    assert captured.out == ""


def test_run_hands_the_validated_spec_to_the_runner(monkeypatch, tmp_path):
    calls = []
    runner = types.ModuleType("experiments.runner")
    runner.run_experiment = lambda spec, out_dir, resume, live: calls.append((spec, out_dir, resume, live))
    monkeypatch.setitem(sys.modules, "experiments.runner", runner)
    assert main(["run", SMOKE, "--out", str(tmp_path), "--set", "repetitions=2", "--resume"]) == 0
    (spec, out_dir, resume, live), = calls
    assert len(spec.runs) == 4 and out_dir == tmp_path and resume is True and live is None
    assert main(["run", SMOKE, "--live"]) == 0
    assert calls[1][1].parent == RESULTS_DIR and calls[1][1].name.startswith("smoke-") and calls[1][3] == 8765
    assert main(["run", SMOKE, "--set", "live=9000"]) == 0
    assert calls[2][3] == 9000


def test_run_rejects_resume_without_out_and_bad_specs(capsys):
    assert main(["run", SMOKE, "--resume"]) == 2
    assert "--resume needs --out" in capsys.readouterr().err
    assert main(["run", SMOKE, "--set", "controller.lb=random"]) == 2


def test_plan_prints_placement_crossing_links_and_traffic_per_iteration(capsys):
    assert main(["plan", SMOKE, "--set", "cluster.servers=[localhost, s2]"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "smoke: 2 runs on 1 fabric(s)"
    assert "  localhost  2 switches, 2 hosts: leaf1 spine1 h1 h2" in lines
    assert "  s2         2 switches, 2 hosts: leaf2 spine2 h3 h4" in lines
    assert "  links crossing servers: 2 of 8 (leaf1-spine2, leaf2-spine1)" in lines
    # The ring h1 h2 h3 h4 crosses twice (h2->h3, h4->h1), half of each pair over each crossing
    # link: 2 x 1.5 models in 1.5 models' time at 100 Mbit/s would be 200 Mbit/s between the servers;
    # but a ring chunk of this small MLP (a quarter of 13.9 KB) is less than a frame, and the three
    # switches after its first link each store and forward it whole: 3 times its transfer a tick, which
    # the chain of the unit's ticks cannot overlap.
    allreduce = next(line for line in lines if line.strip().startswith("mode=allreduce"))
    assert "->     66.6 Mbit/s (33.3)" in allreduce, allreduce
    assert main(["plan", SMOKE]) == 0
    assert "  links crossing servers: 0 of 8" in capsys.readouterr().out


def test_plan_of_a_job_that_sends_nothing(capsys):
    """One worker's all-reduce: its bound is 0 s (found by the generated specs: plan divided by it)."""
    assert main(["plan", SMOKE, "--set", "job.workers=[h1]"]) == 0
    assert "  mode=allreduce,rep=1      0.00 MB (0.00 MB) ->        - Mbit/s (-) in 0.0 ms" in \
        capsys.readouterr().out.splitlines()


def test_plot_needs_a_results_directory(tmp_path, capsys):
    assert main(["plot", str(tmp_path)]) == 2
    assert "has no runs.csv" in capsys.readouterr().err


def test_module_entry_point():
    result = subprocess.run([sys.executable, "-m", "experiments", "validate", SMOKE],
                            capture_output=True, text=True, cwd=REPO, timeout=60)
    assert result.returncode == 0 and result.stdout.startswith("smoke: 2 runs")


@pytest.mark.parametrize("content,problem", [
    (bytes(range(256)) * 4, "is not a text file (a NUL byte at offset 0)"),
    (b"name: \xff\xfe\n", "is not UTF-8 text (byte 0xff at offset 6)"),
    (b"a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + b"".join(  # "billion laughs"
        b"a%d: &a%d [%s]\n" % (i, i, b", ".join([b"*a%d" % (i - 1)] * 10)) for i in range(1, 10)),
     "is not allowed (a3 has more than 10000 values with its aliases expanded)"),
    (b"[" * 200000, "is not allowed (the document is nested deeper than 32 levels at line 1, column 33)"),
], ids=["binary", "bad-utf8", "alias-bomb", "deep-nesting"])
def test_validate_refuses_hostile_files_with_one_line(tmp_path, content, problem):
    """Refused at the limit, not after expanding the aliases or the nesting (that would take
    minutes and gigabytes: the 60 s timeout fails the test)."""
    path = tmp_path / "spec.yaml"
    path.write_bytes(content)
    result = subprocess.run([sys.executable, "-m", "experiments", "validate", str(path)],
                            capture_output=True, text=True, cwd=REPO, timeout=60)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == f"spec error: {path}: {problem}\n"


@pytest.mark.parametrize("name,problem", [("missing.yaml", "No such file or directory"), (".", "Is a directory")])
def test_validate_refuses_unreadable_paths_with_one_line(tmp_path, capsys, name, problem):
    assert main(["validate", str(tmp_path / name)]) == 2
    assert capsys.readouterr().err == f"spec error: {tmp_path / name}: cannot be read ({problem})\n"


def test_progress_counts_runs_and_iterations():
    stream = io.StringIO()
    with Progress(2, file=stream) as progress:
        progress.start_run("mode=allreduce,rep=1", 30)
        progress.iteration(10)
        progress.iteration(30)
        assert progress.current.n == 30
        progress.end_run("ok")
        progress.start_run("mode=ps,rep=1", 30)
        progress.iteration(3)
        progress.end_run("failed")
        assert progress.runs.n == 2 and dict(progress.statuses) == {"ok": 1, "failed": 1}
    text = stream.getvalue()
    assert "mode=allreduce,rep=1" in text and "run 2/2" in text and "failed=1" in text


def test_progress_can_be_silenced():
    stream = io.StringIO()
    with Progress(1, file=stream, disable=True) as progress:
        progress.start_run("rep=1", 5)
        progress.iteration(5)
        progress.end_run("ok")
    assert stream.getvalue() == ""


def test_an_interrupt_while_the_runner_imports_arrives_once_it_is_imported(monkeypatch):
    """An interrupt inside a C extension's initialisation (matplotlib's ft2font) made the interpreter
    abort; held over the import, it raises KeyboardInterrupt after it, in Python code."""
    imported = []

    class InterruptedRunner:  # a meta path finder: experiments.runner, interrupted mid-import
        def find_spec(self, name, path=None, target=None):
            if name != "experiments.runner":
                return None
            return importlib.util.spec_from_loader(name, self)

        def create_module(self, spec):
            return None

        def exec_module(self, module):
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)  # this thread's: pytest may run others
            module.run_experiment = lambda *args: 0
            imported.append(module)

    # Whatever the import leaves behind is undone after the test: the stand-in must not outlive it.
    monkeypatch.setitem(sys.modules, "experiments.runner", None)
    del sys.modules["experiments.runner"]
    monkeypatch.setattr(experiments, "runner", None, raising=False)
    monkeypatch.setattr(sys, "meta_path", [InterruptedRunner(), *sys.meta_path])
    with pytest.raises(KeyboardInterrupt):
        _import_runner()
    assert imported, "the interrupt cut the import short"
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, set())



@pytest.mark.parametrize("command", ["validate", "plan"])
def test_validate_and_plan_load_no_network_nor_tables_nor_plots(command):
    """They run where Mininet is not installed and answer at once: no Mininet, pandas or matplotlib."""
    probe = ("import sys; from experiments.__main__ import main; code = main([sys.argv[1], sys.argv[2]]); "
             "loaded = sorted({name.split('.')[0] for name in sys.modules} & {'mininet', 'pandas', 'matplotlib', "
             "'emulation', 'ryu'}); print('loaded:', *loaded, file=sys.stderr); sys.exit(code)")
    result = subprocess.run([sys.executable, "-c", probe, command, SMOKE], capture_output=True, text=True,
                            cwd=REPO, timeout=60)
    assert result.returncode == 0 and result.stdout.startswith("smoke: 2 runs")
    assert result.stderr.splitlines()[-1] == "loaded:"


CRASHED_ONCE_UP = {  # specs that validated, then failed every run once the fabric was up
    "shards": ("topology: {leaves: 4}\njob: {mode: ps, servers: 5, model: {depth: 1}, batch: 3}\n",
               "job.servers: 5 shards but the model has only 2 tensors"),
    "slices": ("job: {mode: ps, model: {name: vgg16, scale: 0.1}, ps_slice_bytes: 1024}\n",
               "job.ps_slice_bytes: 1024 bytes cut layer fc6"),
    "live-rest": ("live: 8080\n", "live: 8080 is not allowed"),
    "live-openflow": ("live: 6653\n", "live: 6653 is not allowed"),
    "overlapping-faults": ("faults: [{kind: rate, link: h1-leaf1, at_s: 0, duration_s: 10, rate_mbps: 10}, "
                           "{kind: rate, link: h1-leaf1, at_s: 5, duration_s: 10, rate_mbps: 20}]\n",
                           "faults.1.at_s: 5.0 is not allowed"),
    "labels-alike": ("matrix: {case: {baseline: 1, values: {1: {}, '1': {}}}}\n",
                     "matrix.case.values: '1' is not allowed"),
}


@pytest.mark.parametrize("command", ["validate", "plan", "run"])
@pytest.mark.parametrize("name", CRASHED_ONCE_UP)
def test_a_spec_the_runner_would_fail_on_is_refused_before_any_network(tmp_path, capsys, monkeypatch, command, name):
    monkeypatch.setitem(sys.modules, "experiments.runner", None)  # run: refused before the runner is imported
    text, problem = CRASHED_ONCE_UP[name]
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    assert main([command, str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"spec error: {problem}") and captured.err.count("\n") == 1
    assert captured.out == ""


def test_run_refuses_the_controllers_ports_for_the_live_view(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "experiments.runner", None)
    assert main(["run", SMOKE, "--live", "8080"]) == 2
    assert capsys.readouterr().err == ("run: --live: 8080 is not allowed (a port 1024..65535 of 127.0.0.1 other "
                                       "than the controller's OpenFlow 6653 and REST 8080)\n")
