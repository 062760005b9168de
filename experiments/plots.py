"""The result plots, drawn from the aggregated CSVs only (so `python -m experiments plot DIR`
can redraw them): one figure per question, one panel per training mode, one colour per scheme."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import matplotlib

matplotlib.use("Agg")  # files only; no display on the testbed
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from experiments.metrics import fabric_link_utilization, link_imbalance, per_run  # noqa: E402
from experiments.results import read_tables  # noqa: E402
from common.files import atomic_open  # noqa: E402


def _panels(rows: pd.DataFrame) -> tuple[plt.Figure, list[tuple[plt.Axes, pd.DataFrame]]]:
    """A figure with a panel per training mode, and each panel with its mode's rows."""
    by_mode = list(rows.groupby("mode", sort=False))
    figure, axes = plt.subplots(1, len(by_mode), figsize=(5.5 * len(by_mode), 4), squeeze=False)
    for ax, (mode, _) in zip(axes[0], by_mode):
        ax.set_title(mode)
    return figure, [(ax, mode_rows) for ax, (_, mode_rows) in zip(axes[0], by_mode)]


def _colors(schemes: list[str]) -> dict[str, tuple]:
    palette = plt.get_cmap("tab10")
    return {scheme: palette(index % 10) for index, scheme in enumerate(schemes)}


def _save(figure: plt.Figure, path: Path) -> Path:
    figure.tight_layout()
    with atomic_open(path, "wb") as file:
        figure.savefig(file, dpi=110, format="png")
    plt.close(figure)
    return path


def iteration_time(tables: dict[str, pd.DataFrame], path: Path) -> Path | None:
    """Mean iteration time per scheme, error bars over repetitions, the fluid and the tight bound as
    bars; a scheme
    with runs that failed the fidelity guard is drawn hatched and says how many."""
    runs = tables["runs"].dropna(subset=["iter_time_mean_s"])
    if runs.empty:
        return None
    runs = runs.assign(guard_failed=runs["fidelity_ok"].eq(False))
    figure, panels = _panels(runs)
    for ax, mode_runs in panels:
        stats = mode_runs.groupby("scheme", sort=False).agg(
            mean=("iter_time_mean_s", "mean"), std=("iter_time_mean_s", "std"), bound=("lower_bound_s", "mean"),
            tight=("tight_bound_s", "mean"),
            failed=("guard_failed", "sum"), runs=("guard_failed", "size"))
        positions = np.arange(len(stats))
        bars = ax.bar(positions, stats["mean"], yerr=stats["std"].fillna(0), capsize=4, color="tab:blue",
                      label="measured")
        for bar, failed, total in zip(bars, stats["failed"], stats["runs"]):
            if failed:
                bar.set_hatch("//")
                bar.set_facecolor("tab:gray")
                ax.annotate(f"guard failed {failed}/{total}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                            textcoords="offset points", xytext=(0, 14), ha="center", fontsize=7, color="tab:red")
        ax.hlines(stats["bound"], positions - 0.4, positions + 0.4, colors="black", linewidth=2,
                  label="lower bound (fluid)")
        ax.hlines(stats["tight"], positions - 0.4, positions + 0.4, colors="tab:orange", linewidth=2,
                  linestyles="--", label="tight bound")
        ax.set_xticks(positions, stats.index, rotation=20, ha="right")
        ax.set_ylabel("iteration time (s)")
        ax.legend()
    return _save(figure, path)


def scaling(tables: dict[str, pd.DataFrame], path: Path) -> Path | None:
    """Iteration time against the number of workers, with the fluid and the tight bound: drawn when
    the runs have more than one fabric size (experiments/scale.yaml). Runs that failed the fidelity
    guard are hollow."""
    runs = tables["runs"].dropna(subset=["iter_time_mean_s"])
    if runs.empty or runs.groupby("mode")["workers"].nunique().max() < 2:
        return None
    figure, panels = _panels(runs)
    for ax, mode_runs in panels:
        for ok, marker_face in ((True, "tab:blue"), (False, "none")):
            chosen = mode_runs[mode_runs["fidelity_ok"].eq(True) == ok]
            ax.scatter(chosen["workers"], chosen["iter_time_mean_s"], edgecolors="tab:blue", facecolors=marker_face,
                       label="measured" if ok else "measured, guard failed")
        means = mode_runs.groupby("workers")[["iter_time_mean_s", "lower_bound_s", "tight_bound_s"]].mean()
        ax.plot(means.index, means["iter_time_mean_s"], color="tab:blue")
        ax.plot(means.index, means["lower_bound_s"], color="black", linestyle="--", marker="_",
                label="lower bound (fluid)")
        ax.plot(means.index, means["tight_bound_s"], color="tab:orange", linestyle=":", marker="_",
                label="tight bound")
        ax.set_xticks(means.index)
        ax.set_xlabel("workers")
        ax.set_ylabel("iteration time (s)")
        ax.set_ylim(bottom=0)
        ax.legend()
    return _save(figure, path)


def accuracy(tables: dict[str, pd.DataFrame], path: Path) -> Path | None:
    """Test accuracy against wall-clock time since each run's first iteration, every run."""
    iterations = tables["iterations"]
    workers = iterations[iterations["role"] == "worker"]
    start = workers.groupby("run_id")["start_s"].min()
    evaluated = workers[(workers["rank"] == 0) & workers["test_accuracy"].notna()]
    if evaluated.empty:
        return None
    colors = _colors(list(tables["runs"]["scheme"].unique()))
    figure, panels = _panels(evaluated)
    for ax, mode_rows in panels:
        labelled = set()
        for run_id, rows in mode_rows.groupby("run_id", sort=False):
            scheme = rows["scheme"].iloc[0]
            rows = rows.sort_values("end_s")
            ax.plot(rows["end_s"] - start[run_id], rows["test_accuracy"], marker=".", color=colors[scheme],
                    label=None if scheme in labelled else scheme)
            labelled.add(scheme)
        ax.set_xlabel("wall-clock time (s)")
        ax.set_ylabel("test accuracy")
        ax.legend()
    return _save(figure, path)


def tensor_cdf(tables: dict[str, pd.DataFrame], path: Path) -> Path | None:
    """CDF of single tensor transfer times, repetitions pooled."""
    tensors = tables["tensors"]
    if tensors.empty:
        return None
    colors = _colors(list(tables["runs"]["scheme"].unique()))
    figure, panels = _panels(tensors)
    for ax, mode_rows in panels:
        for scheme, rows in mode_rows.groupby("scheme", sort=False):
            durations_ms = np.sort((rows["end_s"] - rows["start_s"]).to_numpy() * 1000)
            fraction = np.arange(1, len(durations_ms) + 1) / len(durations_ms)
            ax.step(durations_ms, fraction, where="post", color=colors[scheme], label=scheme)
        ax.set_xscale("log")
        ax.set_xlabel("tensor transfer time (ms)")
        ax.set_ylabel("fraction of transfers")
        ax.legend()
    return _save(figure, path)


def link_utilization(tables: dict[str, pd.DataFrame], path: Path) -> Path | None:
    """Each fabric port's mean utilization per scheme (a dot a port and repetition), with the
    scheme's imbalance (max/mean, averaged over repetitions) above it."""
    links = tables["links"]
    if links[links["tier"] == "fabric"].empty:
        return None
    figure, panels = _panels(links)
    for ax, mode_links in panels:
        schemes = list(mode_links["scheme"].unique())
        for position, scheme in enumerate(schemes):
            rows = mode_links[mode_links["scheme"] == scheme]
            utilization = rows.groupby("run_id").apply(fabric_link_utilization).to_numpy().ravel()
            if not np.isfinite(utilization).any():
                continue  # no fabric port of this scheme's runs has a utilization
            imbalance = per_run(rows, link_imbalance).mean()
            jitter = np.linspace(-0.2, 0.2, len(utilization))
            ax.scatter(position + jitter, utilization, s=12, color="tab:blue")
            ax.annotate(f"max/mean {imbalance:.2f}", (position, np.nanmax(utilization)),
                        textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
        ax.set_xticks(range(len(schemes)), schemes, rotation=20, ha="right")
        ax.set_ylim(0, max(1.0, ax.get_ylim()[1] * 1.1))  # the scale of the link's capacity
        ax.set_ylabel("fabric port utilization (fraction of rate)")
    return _save(figure, path)


COMPARISON_STYLE = {"baseline": ("tab:blue", "against the baseline"),
                    "step": ("tab:orange", "against the step it adds to")}


def speedup(tables: dict[str, pd.DataFrame], path: Path) -> Path | None:
    """Each scheme's speedup with its paired interval as whiskers, against the baseline and (in an
    ablation) against the step it adds to; a line at 1 (no effect), and a hollow marker where the
    interval holds it (not significant)."""
    rows = tables["effects"]
    rows = rows[(rows["metric"] == "speedup") & rows["estimate"].notna()]
    if rows.empty:
        return None
    figure, panels = _panels(rows)
    for ax, mode_rows in panels:
        schemes = list(dict.fromkeys(mode_rows["scheme"]))
        comparisons = [c for c in COMPARISON_STYLE if (mode_rows["comparison"] == c).any()]
        for offset, comparison in zip(np.linspace(-0.15, 0.15, len(comparisons)), comparisons):
            color, label = COMPARISON_STYLE[comparison]
            chosen = mode_rows[mode_rows["comparison"] == comparison].set_index("scheme").reindex(schemes)
            x = np.arange(len(schemes)) + offset
            whiskers = np.vstack([(chosen["estimate"] - chosen["low"]).fillna(0),
                                  (chosen["high"] - chosen["estimate"]).fillna(0)])
            ax.errorbar(x, chosen["estimate"], yerr=whiskers, fmt="none", ecolor=color, capsize=4)
            significant = chosen["significant"].fillna(False).astype(bool).to_numpy()
            for chosen_points, style, text in ((significant, {"color": color}, label),
                                               (~significant, {"facecolors": "white", "edgecolors": color},
                                                f"{label}, not significant")):
                if chosen_points.any():
                    ax.scatter(x[chosen_points], chosen["estimate"][chosen_points], zorder=3, label=text, **style)
        ax.axhline(1.0, color="black", linewidth=1)
        ax.set_xticks(range(len(schemes)), [scheme.split("=", 1)[-1] for scheme in schemes], rotation=20,
                      ha="right")
        level = mode_rows["level"].iloc[0]
        ax.set_ylabel(f"speedup (x), {level:.0%} interval")
        ax.legend(fontsize=7)
    return _save(figure, path)


def job_iteration_time(tables: dict[str, pd.DataFrame], path: Path) -> Path | None:
    """Each job's mean iteration time beside the others under each scheme, against its time alone
    (the first bar of each job), error bars over repetitions; each bar labelled with its slowdown."""
    runs = tables["runs"]
    runs = runs[runs["job"].astype("string").fillna("") != ""].dropna(subset=["iter_time_mean_s"])
    if runs.empty or not runs["slowdown_vs_alone"].notna().any():
        return None
    runs = runs.assign(setting=runs["scheme"].map(lambda scheme: "alone" if scheme.startswith("alone=") else scheme))
    stats = runs.groupby(["job", "setting"], sort=False).agg(
        mean=("iter_time_mean_s", "mean"), std=("iter_time_mean_s", "std"), slowdown=("slowdown_vs_alone", "mean"))
    jobs = list(dict.fromkeys(runs["job"]))
    settings = ["alone", *[setting for setting in dict.fromkeys(runs["setting"]) if setting != "alone"]]
    colors = _colors(settings)
    figure, ax = plt.subplots(figsize=(max(5.5, 1.6 * len(jobs) * len(settings) / 2), 4))
    width = 0.8 / len(settings)
    for index, setting in enumerate(settings):
        shown = [(position, stats.loc[(job, setting)]) for position, job in enumerate(jobs)
                 if (job, setting) in stats.index]
        if not shown:
            continue
        x = np.array([position for position, _ in shown]) + (index - (len(settings) - 1) / 2) * width
        bars = ax.bar(x, [row["mean"] for _, row in shown], width, yerr=[0 if pd.isna(row["std"]) else row["std"]
                                                                         for _, row in shown],
                      capsize=3, color=colors[setting], label=setting.split("=", 1)[-1])
        if setting != "alone":
            for bar, (_, row) in zip(bars, shown):
                if pd.notna(row["slowdown"]):
                    ax.annotate(f"{row['slowdown']:.2f}x", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                                ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(jobs)), jobs)
    ax.set_ylabel("iteration time (s), labelled: slowdown vs alone")
    ax.set_title("each job beside the others, against alone")
    ax.legend(fontsize=7)
    return _save(figure, path)


def job_link_utilization(tables: dict[str, pd.DataFrame], path: Path) -> Path | None:
    """A timeline per scheme (its first repetition with records) and leaf uplink of which job's bytes
    went on it (job_uplinks.csv: each job's received messages on the uplink the measured ECMP
    placement put their flow on), stacked in Mbit/s, against what the port's counters say it sent
    (links.csv, black): the gap is headers, retransmissions and the counters' coarser polling."""
    uplinks = tables.get("job_uplinks", pd.DataFrame())
    if uplinks is None or uplinks.empty:
        return None
    links = tables["links"]
    first = uplinks.assign(rep=uplinks["run_id"].str.extract(r"rep=(\d+)", expand=False).astype(float))
    chosen = first.sort_values("rep").groupby("scheme", sort=False)["run_id"].first()
    schemes = [scheme for scheme in dict.fromkeys(uplinks["scheme"]) if scheme in chosen.index]
    ports = sorted({(row.switch, row.uplink) for row in uplinks.itertuples(index=False)})
    jobs = list(dict.fromkeys(uplinks["job"]))
    colors = _colors(jobs)
    figure, axes = plt.subplots(len(schemes), len(ports), figsize=(3.6 * len(ports), 2.4 * len(schemes)),
                                squeeze=False, sharey=True)
    for row_axes, scheme in zip(axes, schemes):
        run_id = chosen[scheme]
        rows = uplinks[uplinks["run_id"] == run_id]
        start = rows["time_s"].min()
        bin_s = float(np.diff(np.unique(rows["time_s"])).min()) if rows["time_s"].nunique() > 1 else 0.1
        for ax, (switch, uplink) in zip(row_axes, ports):
            on_port = rows[(rows["switch"] == switch) & (rows["uplink"] == uplink)]
            table = on_port.pivot_table(index="time_s", columns="job", values="bytes", aggfunc="sum")
            grid = np.arange(start, rows["time_s"].max() + bin_s / 2, bin_s)
            table = table.reindex(grid, method="nearest", tolerance=bin_s / 4).fillna(0.0)
            table = table.reindex(columns=jobs, fill_value=0.0)
            ax.stackplot(table.index - start, *(table[job] * 8 / bin_s / 1e6 for job in jobs),
                         colors=[colors[job] for job in jobs], labels=jobs, linewidth=0)
            port = links[(links["run_id"] == run_id) & (links["switch"] == switch) & (links["peer"] == uplink)]
            if not port.empty:
                ax.step(port["time_s"] - start, port["tx_mbps"], where="pre", color="black", linewidth=0.8,
                        label="port counters")
                rate = port["rate_mbps"].dropna()
                if len(rate):
                    ax.axhline(float(rate.iloc[0]), color="grey", linestyle=":", linewidth=0.8)
            ax.set_xlim(0, grid[-1] - start + bin_s)
            ax.set_title(f"{scheme.split('=', 1)[-1]}: {switch} -> {uplink}", fontsize=8)
            ax.tick_params(labelsize=7)
        row_axes[0].set_ylabel("Mbit/s", fontsize=8)
    axes[-1][0].set_xlabel("seconds from the run's first bytes on an uplink", fontsize=8)
    handles, labels = axes[0][0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="upper right", fontsize=7)
    return _save(figure, path)


PLOTS: dict[str, Callable[[dict[str, pd.DataFrame], Path], Path | None]] = {
    "job_iteration_time": job_iteration_time,
    "job_link_utilization": job_link_utilization,
    "speedup": speedup,
    "iteration_time": iteration_time,
    "accuracy": accuracy,
    "scaling": scaling,
    "tensor_cdf": tensor_cdf,
    "link_utilization": link_utilization,
}


def plot_all(out_dir: str | Path) -> list[Path]:
    """Draw every plot with data into OUT/plots/<name>.png; return the files written."""
    tables = read_tables(out_dir)
    plot_dir = Path(out_dir) / "plots"
    plot_dir.mkdir(exist_ok=True)
    written = (plot(tables, plot_dir / f"{name}.png") for name, plot in PLOTS.items())
    return [path for path in written if path is not None]
