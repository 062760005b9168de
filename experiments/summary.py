"""summary.md: per training mode, one row per scheme comparing it with the others and with
the analytical lower bound; then notes on saturated (low-fidelity) and failed runs."""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from experiments.metrics import FIDELITY_CPU_LIMIT, link_imbalance, per_run, tensor_time_p99_s
from experiments.results import read_run_record, read_tables

COLUMNS = ["scheme", "iter time (s)", "speedup", "samples/s", "final acc", "time-to-acc (s)",
           "p99 tensor (ms)", "link imbalance", "lower bound (s)", "fidelity"]


def _number(value: float, digits: int = 3) -> str:
    return "—" if pd.isna(value) else f"{value:.{digits}g}"


def _fidelity(flags: pd.Series) -> str:
    """Over the runs with a CPU record (failed runs have none)."""
    known = flags.dropna().astype(bool)
    if known.empty:
        return "unknown"
    saturated = int((~known).sum())
    return f"saturated {saturated}/{len(known)}" if saturated else "ok"


def _time_to_accuracy(values: pd.Series) -> str:
    reached = values.dropna()
    if reached.empty:
        return "never"
    partly = "" if len(reached) == len(values) else f" ({len(reached)}/{len(values)} reached)"
    return _number(reached.mean()) + partly


def scheme_rows(tables: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """Per mode, the summary table as strings: schemes in spec order, repetitions averaged.
    Failed runs have no metrics and only show in the notes."""
    runs = tables["runs"].copy()
    runs["tensor_p99_ms"] = runs["run_id"].map(per_run(tables["tensors"], tensor_time_p99_s) * 1000)
    runs["link_imbalance"] = runs["run_id"].map(per_run(tables["links"], link_imbalance))
    by_mode = {}
    for mode, mode_runs in runs.groupby("mode", sort=False):
        rows = []
        for scheme, all_reps in mode_runs.groupby("scheme", sort=False):
            group = all_reps.dropna(subset=["iter_time_mean_s"])
            iter_times = group["iter_time_mean_s"]
            spread = "" if iter_times.count() < 2 else f" ± {_number(iter_times.std())}"
            rows.append([
                scheme, _number(iter_times.mean()) + spread, _number(group["speedup_vs_baseline"].mean()),
                _number(group["samples_per_s"].mean(), 4), _number(group["final_accuracy"].mean()),
                _time_to_accuracy(group["time_to_accuracy_s"]), _number(group["tensor_p99_ms"].mean()),
                _number(group["link_imbalance"].mean()), _number(group["lower_bound_s"].mean()),
                _fidelity(group["fidelity_ok"]),
            ])
        by_mode[str(mode)] = pd.DataFrame(rows, columns=COLUMNS)
    return by_mode


def _markdown(table: pd.DataFrame) -> list[str]:
    lines = ["| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    return lines + ["| " + " | ".join(row) + " |" for row in table.itertuples(index=False)]


def render(out_dir: str | Path) -> str:
    """The summary as markdown."""
    tables = read_tables(out_dir)
    runs = tables["runs"]
    lines = ["# Experiment summary", "",
             "Iteration time: mean ± std over repetitions; speedup: baseline's mean iteration time "
             "over this scheme's; lower bound: max(communication bound, measured compute).", ""]
    for mode, table in scheme_rows(tables).items():
        lines += [f"## {mode}", "", *_markdown(table), ""]
    notes = []
    for run in runs.itertuples(index=False):
        record = read_run_record(out_dir, run.run_id) or {}
        if record.get("status") == "failed":
            notes.append(f"- {run.run_id}: failed: {record.get('error') or 'no error recorded'}")
        elif pd.notna(run.fidelity_ok) and not run.fidelity_ok:
            notes.append(f"- {run.run_id}: host CPU saturated (mean {run.cpu_util_mean:.2f} > "
                         f"{FIDELITY_CPU_LIMIT}), its times measure the CPU rather than the network")
        elif math.isnan(run.iter_time_mean_s):
            notes.append(f"- {run.run_id}: no iteration times recorded")
    if notes:
        lines += ["## Notes", "", *notes, ""]
    return "\n".join(lines)


def write_summary(out_dir: str | Path) -> str:
    """Write OUT/summary.md and return its text (the runner prints it)."""
    text = render(out_dir)
    (Path(out_dir) / "summary.md").write_text(text)
    return text
