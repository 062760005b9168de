"""Damaged results folders: a run folder someone (or something) broke never stops the aggregation,
the summary or --resume. That run is listed without metrics (or, its run.json damaged, not
counted as a run and run again by --resume), one line says which file and what, and every other
run's row is what it would have been."""
import json
import math
import os
import shutil
import threading
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from experiments import results
from experiments.plots import plot_all
from experiments.spec import load_spec
from experiments.summary import write_summary
from .test_results import FIXTURE_SPEC, make_results

# The fixture's spec with one repetition: its two parameter-server runs for the damage done on
# purpose, all four runs (all-reduce too) for the random damage.
OVERRIDES = ["repetitions=1", "matrix.mode.values=[ps]"]
RANDOM_OVERRIDES = ["repetitions=1"]
SPEC, RANDOM_SPEC = load_spec(FIXTURE_SPEC, OVERRIDES), load_spec(FIXTURE_SPEC, RANDOM_OVERRIDES)
RUN = "scheme=spray,mode=ps,rep=1"
OTHER = "scheme=baseline,mode=ps,rep=1"
RUNS = {run.run_id: run for run in SPEC.runs}
WORKER, SERVER = "h1-worker0", "h4-server0"
FABRIC_JSON = Path("fabrics") / SPEC.runs[0].run_id / "fabric.json"


def _clean(out: Path, overrides: list[str]) -> Path:
    """A valid results folder, aggregated, with a fabric record."""
    make_results(out, overrides)
    (out / FABRIC_JSON).parent.mkdir(parents=True)
    (out / FABRIC_JSON).write_text(json.dumps({"hosts": 8, "switches": 4, "links": 12, "build_s": 1.5}))
    results.aggregate(out)
    return out


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> Path:
    return _clean(tmp_path_factory.mktemp("clean"), OVERRIDES)


@pytest.fixture(scope="module")
def clean_rows(clean) -> dict[str, dict]:
    return _rows(pd.read_csv(clean / "runs.csv"))


@pytest.fixture(scope="module")
def random_clean(tmp_path_factory) -> Path:
    return _clean(tmp_path_factory.mktemp("clean"), RANDOM_OVERRIDES)


def _rows(runs: pd.DataFrame) -> dict[str, dict]:
    """runs.csv rows by run_id, without the comparison with the baseline (another run's data)."""
    return {row["run_id"]: row for row in runs.drop(columns="speedup_vs_baseline").to_dict("records")}


def _same(row: dict, expected: dict) -> bool:
    return row.keys() == expected.keys() and all(
        (pd.isna(row[key]) and pd.isna(expected[key])) or row[key] == expected[key] for key in row)


def _copy(clean: Path, to: Path) -> Path:
    shutil.copytree(clean, to, symlinks=True)
    return to


def _aggregate(out: Path) -> tuple[dict[str, dict], list[str]]:
    said = []
    results.aggregate(out, say=said.append)
    return _rows(pd.read_csv(out / "runs.csv")), said


def _within(seconds: float, call):
    """call() in a thread that must end in time: a reader that blocks on a FIFO fails, not hangs."""
    outcome = []

    def target():
        try:
            outcome.append((call(), None))
        except BaseException as error:  # raised again in the test's thread
            outcome.append((None, error))

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still reading after {seconds} s"
    value, error = outcome[0]
    if error:
        raise error
    return value


def _write_json(path: Path, value) -> None:
    path.unlink()
    path.write_text(json.dumps(value))


def _edit_json(path: Path, **fields) -> None:
    _write_json(path, {**json.loads(path.read_text()), **fields})


def _edit_csv(path: Path, edit) -> None:
    frame = edit(pd.read_csv(path))
    path.unlink()
    frame.to_csv(path, index=False)


def _replace_with_link(path: Path, target: Path) -> None:
    path.unlink() if path.is_file() else shutil.rmtree(path)
    path.symlink_to(target)


def _set_cell(column: str, value: str, at: int = 2):
    """An edit of a table: the cell of row `at` (the third by default) in column becomes value."""
    return lambda frame: frame.assign(**{column: [value if row == at else cell
                                                  for row, cell in enumerate(frame[column])]})


def _truncate(path: Path, keep: float) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * keep)])


# (what is done to RUN's folder, the file named, what the line says about it)
UNREADABLE = [
    pytest.param(lambda run: _write_json(run / WORKER / "summary.json", [1, 2]),
                 f"{WORKER}/summary.json", "a JSON array, not an object", id="summary-list"),
    pytest.param(lambda run: (run / SERVER / "summary.json").write_text(""),
                 f"{SERVER}/summary.json", "empty", id="summary-empty"),
    pytest.param(lambda run: _edit_json(run / WORKER / "summary.json", final_accuracy="high"),
                 f"{WORKER}/summary.json", "final_accuracy: 'high' is not a number", id="summary-field"),
    pytest.param(lambda run: _edit_json(run / WORKER / "summary.json", wall_time_s=10**30),
                 f"{WORKER}/summary.json", f"wall_time_s: {10**30} is out of range", id="summary-huge"),
    pytest.param(lambda run: _edit_json(run / WORKER / "summary.json", timing=[3.0]),
                 f"{WORKER}/summary.json", "timing: [3.0] is not an object", id="summary-timing"),
    pytest.param(lambda run: _replace_with_link(run / WORKER / "iterations.csv",
                                                run.parent / OTHER / WORKER / "iterations.csv"),
                 f"{WORKER}/iterations.csv", "a symbolic link, not followed", id="csv-link"),
    pytest.param(lambda run: _replace_with_link(run / "cpu.csv", Path("/dev/zero")),
                 "cpu.csv", "a symbolic link, not followed", id="csv-link-to-a-device"),
    pytest.param(lambda run: _replace_with_link(run / WORKER, run.parent / OTHER / WORKER),
                 WORKER, "a symbolic link, not followed", id="process-folder-link"),
    pytest.param(lambda run: _edit_csv(run / WORKER / "iterations.csv", _set_cell("end_s", "soon")),
                 f"{WORKER}/iterations.csv", "end_s: 'soon' on line 4 is not a number", id="csv-cell"),
    pytest.param(lambda run: _truncate(run / SERVER / "tensors.csv", 0.5),
                 f"{SERVER}/tensors.csv", "cut short (its last line does not end)", id="csv-truncated"),
    pytest.param(lambda run: (run / "queues.csv").write_bytes(bytes(range(256)) * 3 + b"\n"),
                 "queues.csv", "not a CSV table", id="csv-garbage"),
    pytest.param(lambda run: (run / "ports.csv").write_text(""), "ports.csv", "empty", id="csv-empty"),
    pytest.param(lambda run: _edit_csv(run / "port_rates.csv", _set_cell("port", "", at=1)),
                 "port_rates.csv", "port: empty on line 3", id="csv-key-empty"),
    pytest.param(lambda run: _edit_csv(run / "port_rates.csv", lambda frame: frame.drop(columns="tier")),
                 "port_rates.csv", "missing columns tier", id="csv-column"),
    pytest.param(lambda run: _truncate(run / WORKER / "model.npz", 0.7),
                 f"{WORKER}/model.npz", "not a NumPy archive", id="npz-truncated"),
    pytest.param(lambda run: _write_json(run / "ovs.json", []), "ovs.json", "a JSON array, not an object",
                 id="ovs-list"),
    pytest.param(lambda run: _edit_json(run / "ovs.json", tx_errors_by_port={"3": "many"}),
                 "ovs.json", "tx_errors_by_port: 3: 'many' is not a number", id="ovs-field"),
    pytest.param(lambda run: ((run / "drain.csv").unlink(), os.mkfifo(run / "drain.csv")),
                 "drain.csv", "not a regular file", id="fifo"),
    pytest.param(lambda run: ((run / "sockets.csv").unlink(), (run / "sockets.csv").mkdir()),
                 "sockets.csv", "not a regular file", id="folder-for-a-file"),
]


@pytest.mark.parametrize("damage,name,what", UNREADABLE)
def test_a_damaged_record_is_named_with_what_is_wrong_and_its_run_is_run_again(clean, clean_rows, tmp_path, damage,
                                                                               name, what):
    out = _copy(clean, tmp_path / "out")
    run_path = results.run_dir(out, RUN)
    damage(run_path)
    with pytest.raises(results.Damaged) as raised:
        _within(60, lambda: results.read_run(out, RUNS[RUN]))
    message = str(raised.value)
    assert message.startswith(f"{run_path / name}: ") and what in message and "\n" not in message
    assert _within(60, lambda: results.completed_run_ids(out, SPEC)) == set(clean_rows) - {RUN}, \
        "--resume runs it again"


@pytest.mark.parametrize("damage,name,what", [case for case in UNREADABLE if case.id in ("summary-list", "fifo")])
def test_a_damaged_record_leaves_its_run_without_metrics_and_says_which_file(clean, clean_rows, tmp_path, damage,
                                                                             name, what):
    out = _copy(clean, tmp_path / "out")
    run_path = results.run_dir(out, RUN)
    damage(run_path)
    rows, said = _within(60, lambda: _aggregate(out))
    (line,) = said
    assert line.startswith(f"aggregate: {RUN}: its records cannot be read, left without metrics ({run_path / name}: ")
    assert what in line and "\n" not in line
    assert math.isnan(rows[RUN]["iter_time_mean_s"]) and rows[RUN]["data_gaps"].startswith("records unreadable: ")
    assert all(_same(rows[run_id], clean_rows[run_id]) for run_id in clean_rows if run_id != RUN)
    assert f"- {RUN}: metrics left empty: records unreadable: {run_path / name}: " in write_summary(out)


HARMLESS = [
    pytest.param(lambda run: _edit_json(run / WORKER / "summary.json", timing=None), id="timing-null"),
    pytest.param(lambda run: _edit_json(run / WORKER / "summary.json", timing={"lag_ms_p99": None}),
                 id="lag-null"),
    pytest.param(lambda run: [(run / name).write_bytes(b"\x00junk") for name in
                              ("notes.txt", "core", f"{WORKER}/stdout.log", f"{SERVER}/.swp", "run.json.bak")],
                 id="files-of-no-contract"),
    pytest.param(lambda run: (run / "h9-worker7").mkdir() or (run / "h9-worker7" / "iterations.csv").write_text("x"),
                 id="a-process-the-run-has-not"),
    pytest.param(lambda run: _edit_csv(run / "cpu.csv", lambda frame: frame.assign(extra="x")), id="extra-column"),
]


@pytest.mark.parametrize("damage", HARMLESS)
def test_what_no_contract_reads_changes_nothing(clean, clean_rows, tmp_path, damage):
    out = _copy(clean, tmp_path / "out")
    damage(results.run_dir(out, RUN))
    rows, said = _aggregate(out)
    assert said == []
    assert all(_same(rows[run_id], clean_rows[run_id]) for run_id in clean_rows)
    assert results.completed_run_ids(out, SPEC) == set(clean_rows)


# (what is done to RUN's run.json, what the line says about it)
RECORDS = [
    pytest.param(lambda record: _edit_json(record, faults=5), "faults: 5 is not a list of strings", id="faults-int"),
    pytest.param(lambda record: _edit_json(record, faults="controller restarted"),
                 "faults: 'controller restarted' is not a list of strings", id="faults-string"),
    pytest.param(lambda record: _edit_json(record, faults=[{"at": 3}]), "faults: [{'at': 3}] is not a list of strings",
                 id="faults-objects"),
    pytest.param(lambda record: _edit_json(record, start_s=None), "start_s: missing", id="start-null"),
    pytest.param(lambda record: _edit_json(record, end_s="later"), "end_s: 'later' is not a number", id="end-text"),
    pytest.param(lambda record: _edit_json(record, error=["x"]), "error: ['x'] is not a string", id="error-list"),
    pytest.param(lambda record: _edit_json(record, link_bound_s={}), "link_bound_s: {} is not a number",
                 id="bound-object"),
    pytest.param(lambda record: _edit_json(record, status="done"), "status: 'done' is not one of ok, failed",
                 id="status"),
    pytest.param(lambda record: _write_json(record, ["ok"]), "a JSON array, not an object", id="list"),
    pytest.param(lambda record: record.write_bytes(b'{"status": \xff}'),
                 "not JSON ('utf-8' codec can't decode byte 0xff", id="garbage"),
    pytest.param(lambda record: _replace_with_link(record, record.parent.parent / OTHER / "run.json"),
                 "a symbolic link, not followed", id="link"),
]


@pytest.mark.parametrize("damage,what", RECORDS)
def test_a_damaged_run_record_is_named_with_what_is_wrong_and_its_run_is_run_again(clean, clean_rows, tmp_path,
                                                                                   damage, what):
    out = _copy(clean, tmp_path / "out")
    record = results.run_dir(out, RUN) / "run.json"
    damage(record)
    with pytest.raises(results.Damaged) as raised:
        results.checked_run_record(out, RUN)
    assert str(raised.value).startswith(f"{record}: {what}") and "\n" not in str(raised.value)
    assert results.read_run_record(out, RUN) is None
    assert results.completed_run_ids(out, SPEC) == set(clean_rows) - {RUN}


@pytest.mark.parametrize("damage,what", [case for case in RECORDS if case.id in ("faults-int", "garbage")])
def test_a_damaged_run_record_is_no_run(clean, clean_rows, tmp_path, damage, what):
    out = _copy(clean, tmp_path / "out")
    record = results.run_dir(out, RUN) / "run.json"
    damage(record)
    rows, said = _aggregate(out)
    (line,) = said
    assert line.startswith(f"aggregate: {RUN}: {record}: {what}") and "\n" not in line
    assert line.endswith("; not counted as a run (--resume runs it again)")
    assert RUN not in rows and all(_same(rows[run_id], clean_rows[run_id]) for run_id in rows)
    write_summary(out)


def test_records_that_give_no_metrics_leave_their_run_without_them(clean, clean_rows, tmp_path, monkeypatch):
    """A metric that fails on what a run recorded (here on links of rate 0, which no fabric has)
    costs that run its metrics, and only that run."""
    out = _copy(clean, tmp_path / "out")
    _edit_csv(results.run_dir(out, RUN) / "port_rates.csv", lambda frame: frame.assign(rate_mbps=0))
    uplink_imbalance = results.metrics.uplink_imbalance

    def strict(links: pd.DataFrame) -> float:
        if (links["rate_mbps"] == 0).any():
            raise ZeroDivisionError("float division by zero")
        return uplink_imbalance(links)

    monkeypatch.setattr(results.metrics, "uplink_imbalance", strict)
    rows, said = _aggregate(out)
    assert said == [f"aggregate: {RUN}: its records give no metrics, left without metrics (ZeroDivisionError: "
                    "float division by zero)"]
    assert rows[RUN]["data_gaps"] == "metrics failed: ZeroDivisionError: float division by zero"
    assert math.isnan(rows[RUN]["iter_time_mean_s"]) and _same(rows[OTHER], clean_rows[OTHER])


def test_a_run_folder_that_is_a_link_is_no_run(clean, clean_rows, tmp_path):
    out = _copy(clean, tmp_path / "out")
    _replace_with_link(results.run_dir(out, RUN), results.run_dir(out, OTHER))
    assert results.read_run_record(out, RUN) is None
    rows, said = _aggregate(out)
    assert said == [f"aggregate: {RUN}: {results.run_dir(out, RUN)}: a symbolic link, not followed; not counted as "
                    "a run (--resume runs it again)"]
    assert RUN not in rows


def test_a_damaged_fabric_record_is_left_out_of_the_summary_with_a_line(clean, tmp_path):
    out = _copy(clean, tmp_path / "out")
    for value, what in (([], "a JSON array, not an object"), ({"servers": 3, "hosts": "a|b\nc"}, None)):
        _write_json(out / FABRIC_JSON, value)
        summary = write_summary(out)
        if what:
            assert f"- {out / FABRIC_JSON}: {what}; left out" in summary.splitlines()
        else:  # odd values are shown, but cannot break the table
            assert f"| {FABRIC_JSON.parent.name} | a/b c | — | — | — |" in summary
    (out / "fabrics" / "linked").symlink_to(out / FABRIC_JSON.parent)
    assert f"- {out / 'fabrics' / 'linked'}: a symbolic link, not followed; left out" in write_summary(out).splitlines()


@pytest.mark.parametrize("table", ["iterations", "tensors", "links", "queues"])
def test_a_damaged_aggregated_table_is_read_as_empty_with_a_line(clean, tmp_path, table):
    out = _copy(clean, tmp_path / "out")
    (out / f"{table}.csv").write_bytes(b"\x00\xff garbage\n")
    said = []
    tables = results.read_tables(out, say=said.append)
    assert tables[table].empty and not tables["runs"].empty
    (line,) = said
    assert line.startswith(f"{out / table}.csv: not a CSV table (") and line.endswith("; left out")
    write_summary(out)


def test_a_damaged_runs_table_is_one_line_naming_it(clean, tmp_path):
    out = _copy(clean, tmp_path / "out")
    _edit_csv(out / "runs.csv", _set_cell("iter_time_mean_s", "fast", at=1))
    with pytest.raises(ValueError) as raised:
        results.read_tables(out)
    assert str(raised.value) == f"{out / 'runs.csv'}: iter_time_mean_s: 'fast' on line 3 is not a number"


def test_plots_skip_a_damaged_table_and_a_scheme_without_fabric_ports(clean, tmp_path):
    out = _copy(clean, tmp_path / "out")
    (out / "tensors.csv").write_text("run_id,garbage\n")
    links = pd.read_csv(out / "links.csv")
    links.loc[links["run_id"] == RUN, "tier"] = "host"
    links.to_csv(out / "links.csv", index=False)
    assert sorted(path.name for path in plot_all(out)) == ["accuracy.png", "iteration_time.png",
                                                           "link_utilization.png", "speedup.png"]


# ------------------------------------------------------------------------------ random damage

# What is done to a file, or to a folder (a run's or a process's).
FILE_DAMAGE = ["delete", "empty", "garbage", "truncate", "append", "json-type", "json-field", "csv-column",
               "csv-cell", "csv-extra-column", "link", "fifo", "folder", "beside"]
FOLDER_DAMAGE = ["delete", "link", "file", "beside", "inside"]
JSON_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-3, 10**20), st.floats(), st.text(max_size=5),
                        st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(),
                                                                               max_size=2))
CELLS = st.one_of(st.sampled_from(["abc", "", "nan", "inf", "-", "1e999", "1,5", '"', "\x00", "True", "10**9"]),
                  st.text(max_size=6))
STRAY_NAMES = st.sampled_from(["notes.txt", "core", ".hidden", "h9-worker7", "run.json.bak", "iterations.csv~",
                               "summary.json.tmp"])


def _targets(clean: Path) -> list[Path]:
    """Every file and folder of the run folders, and the fabric record."""
    below = sorted(path.relative_to(clean) for path in (clean / "runs").rglob("*"))
    return [*below, FABRIC_JSON]


def _damage(out: Path, target: Path, data) -> None:
    path = out / target
    if not os.path.lexists(path) or any((out / Path(*target.parts[:end])).is_symlink()
                                        for end in range(1, len(target.parts) + 1)):
        return  # gone with an earlier damage, or a link to another run's: never damaged through a link
    if path.is_dir():
        kind = data.draw(st.sampled_from(FOLDER_DAMAGE), label=f"{target}")
        event(f"folder: {kind}")
        if kind == "delete":
            shutil.rmtree(path)
        elif kind == "link":
            siblings = [p for p in path.parent.parent.glob(f"*/{path.name}") if p != path] or [Path("/")]
            _replace_with_link(path, data.draw(st.sampled_from(siblings)))
        elif kind == "file":
            shutil.rmtree(path)
            path.write_bytes(data.draw(st.binary(max_size=20)))
        else:
            folder = path.parent if kind == "beside" else path
            stray = folder / data.draw(STRAY_NAMES)
            if not os.path.lexists(stray):
                stray.mkdir() if data.draw(st.booleans()) else stray.write_bytes(data.draw(st.binary(max_size=20)))
        return
    kind = data.draw(st.sampled_from(FILE_DAMAGE), label=f"{target}")
    event(f"file: {kind}")
    content = path.read_bytes() if path.is_file() else b""
    if kind == "delete":
        path.unlink()
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "garbage":
        path.write_bytes(data.draw(st.binary(min_size=1, max_size=300)))
    elif kind == "truncate" and content:
        path.write_bytes(content[:data.draw(st.integers(0, len(content) - 1))])
    elif kind == "append":
        path.write_bytes(content + data.draw(st.binary(min_size=1, max_size=40)))
    elif kind == "json-type":
        path.write_text(json.dumps(data.draw(st.sampled_from([[], [1, "a"], 3, 2.5, "ok", None, True]))))
    elif kind == "json-field" and path.suffix == ".json":
        record = json.loads(content)
        if isinstance(record, dict) and record:
            key = data.draw(st.sampled_from(sorted(record)))
            if data.draw(st.booleans()):
                del record[key]
            else:
                record[key] = data.draw(JSON_VALUES)
            path.write_text(json.dumps(record))
    elif kind.startswith("csv") and path.suffix == ".csv":
        frame = pd.read_csv(path)
        column = data.draw(st.sampled_from(list(frame.columns)))
        if kind == "csv-column":
            frame = frame.drop(columns=column) if data.draw(st.booleans()) else frame.rename(columns={column: "x"})
        elif kind == "csv-cell" and len(frame):
            frame = _set_cell(column, data.draw(CELLS), data.draw(st.integers(0, len(frame) - 1)))(frame)
        else:
            frame = frame.assign(extra=data.draw(CELLS))
        frame.to_csv(path, index=False)
    elif kind == "link":
        siblings = [p for p in path.parents[2].glob(f"*/**/{path.name}") if p != path]
        path.unlink()
        path.symlink_to(data.draw(st.sampled_from([*siblings, Path("/dev/zero"), Path("/etc/passwd"),
                                                   path.parent / "nowhere"])))
    elif kind == "fifo":
        path.unlink()
        os.mkfifo(path)
    elif kind == "folder":
        path.unlink()
        path.mkdir()
    elif kind == "beside":
        stray = path.parent / data.draw(STRAY_NAMES)
        if not os.path.lexists(stray):
            stray.write_bytes(data.draw(st.binary(max_size=40)))


@settings(max_examples=int(os.environ.get("DAMAGE_EXAMPLES", "5")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_random_damage_never_stops_the_aggregation_nor_the_summary(random_clean, tmp_path_factory, data):
    """DAMAGE_EXAMPLES=1000 runs a thousand damaged folders (5 by default: a few seconds)."""
    clean_rows = _rows(pd.read_csv(random_clean / "runs.csv"))
    out = _copy(random_clean, tmp_path_factory.mktemp("damaged") / "out")
    targets = data.draw(st.lists(st.sampled_from(_targets(random_clean)), min_size=1, max_size=3, unique=True))
    for target in targets:
        _damage(out, target, data)
    damaged = {target.parts[1] for target in targets if target.parts[0] == "runs"}
    rows, said = _within(60, lambda: _aggregate(out))
    write_summary(out)
    event(f"lines said: {len(said)}")
    for line in said:
        assert "\n" not in line and any(line.startswith(f"aggregate: {run_id}: ") for run_id in damaged), line
    for run_id, expected in clean_rows.items():
        if run_id not in damaged:
            assert _same(rows[run_id], expected), run_id
        elif run_id not in rows:  # not a run: said so, unless its run.json is gone
            assert any(line.startswith(f"aggregate: {run_id}: ") for line in said) or \
                not os.path.lexists(results.run_dir(out, run_id) / "run.json")
    assert _within(60, lambda: results.completed_run_ids(out, RANDOM_SPEC)) >= set(clean_rows) - damaged
    shutil.rmtree(out.parent)



def test_the_aggregate_command_redraws_a_damaged_folder_and_refuses_one_without_spec(clean, tmp_path, capsys):
    from experiments.__main__ import main
    out = _copy(clean, tmp_path / "out")
    _write_json(next(out.glob("runs/*/run.json")), [])
    assert main(["aggregate", str(out)]) == 0
    assert (out / "summary.md").exists() and str(out / "summary.md") in capsys.readouterr().out
    (out / "spec.yaml").unlink()
    assert main(["aggregate", str(out)]) == 2
    error = capsys.readouterr().err
    assert error.startswith("aggregate: ") and error.count("\n") == 1, error
    (out / "runs.csv").write_text("not,a\nruns table")
    assert main(["plot", str(out)]) == 2
    assert capsys.readouterr().err.startswith("plot: ")
