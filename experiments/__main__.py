"""Command line: `python -m experiments run|validate|plan|plot|aggregate ...` (see --help)."""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from common.signals import signals_deferred
from experiments.plan import plan_text
from experiments.runplan import check_live_port, dry_run
from experiments.spec import Spec, SpecError, load_spec

RESULTS_DIR = Path(__file__).resolve().parent.parent / "results"
LIVE_PORT = 8765


def _import_runner():
    """experiments.runner.run_experiment (the network side: Mininet, OVS, Ryu, matplotlib), imported
    with Ctrl-C held: an interrupt inside a C extension's initialisation (matplotlib's ft2font) aborts
    the interpreter instead of stopping it, so the signal is delivered right after the imports. The
    handlers hold it rather than a signal mask, which numpy's BLAS threads would not share."""
    with signals_deferred():
        from experiments.runner import run_experiment
    return run_experiment


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m experiments",
                                     description="Run, check and plot testbed experiments.")
    commands = parser.add_subparsers(dest="command", required=True)
    set_help = "override a spec field, value parsed as YAML (repeatable), e.g. --set topology.spines=4"

    run = commands.add_parser("run", help="run every run of a spec on the emulated fabric (root)")
    run.add_argument("spec", help="YAML spec file")
    run.add_argument("--out", type=Path, help=f"results directory (default: {RESULTS_DIR}/<name>-<time>)")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=set_help)
    run.add_argument("--resume", action="store_true", help="skip the runs --out already finished")
    run.add_argument("--live", nargs="?", type=int, const=LIVE_PORT, metavar="PORT",
                     help=f"serve a live view of the experiment on 127.0.0.1:PORT (default {LIVE_PORT}; a spec's "
                          "`live: PORT` does the same)")

    validate = commands.add_parser("validate", help="check a spec and list its runs (no root needed)")
    validate.add_argument("spec", help="YAML spec file")
    validate.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=set_help)

    plan = commands.add_parser("plan", help="where each fabric's nodes land on the cluster's servers and the "
                               "traffic one iteration sends between servers (no root needed)")
    plan.add_argument("spec", help="YAML spec file")
    plan.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=set_help)

    plot = commands.add_parser("plot", help="redraw the plots of a results directory from its CSVs")
    plot.add_argument("dir", type=Path, help="results directory (holding runs.csv)")

    aggregate = commands.add_parser("aggregate", help="re-read a results directory's run folders into its "
                                    "CSVs, summary.md and plots (a damaged run is named and left out)")
    aggregate.add_argument("dir", type=Path, help="results directory (holding spec.yaml)")
    return parser


def run_list(spec: Spec) -> str:
    """The expanded runs, one line each (a run of several jobs: a line per job under it), as
    `validate` prints them."""
    alone = sum(1 for run in spec.runs if run.alone)
    points = len({tuple(run.axes.values()) for run in spec.runs if not run.alone})
    extra = len(spec.runs) - alone - points * spec.header.repetitions
    lines = [f"{spec.name}: {len(spec.runs)} runs ({points} matrix points x {spec.header.repetitions} "
             f"repetition(s)" + (f", {extra:+d} where include sets repetitions" if extra else "")
             + (f", and {alone} of a job alone, the references of their slowdowns)" if alone else ")")]
    if spec.baseline:
        lines.append("baseline: {}={}".format(*spec.baseline))
    width = max(len(run.run_id) for run in spec.runs)
    for run in spec.runs:
        if run.config.jobs:
            lines.append(f"{run.index + 1:>3}  {run.run_id:<{width}}  {len(run.config.jobs)} jobs, "
                         f"lb={run.controller.lb} sharing={run.controller.sharing}")
        for name, job_run in zip(run.job_names, run.job_runs):
            config = job_run.config
            servers = ",".join(config.server_hosts) or "-"
            head = (f"{'':>3}  {'  ' + name:<{width}}" if run.config.jobs
                    else f"{run.index + 1:>3}  {run.run_id:<{width}}")
            lines.append(f"{head}  {config.job.mode:<9} lb={run.controller.lb:<6} "
                         f"sched={run.controller.sched} transport={config.job.transport} "
                         f"workers={','.join(config.worker_hosts)} servers={servers} "
                         f"iterations={config.job.iterations} seed={config.job.seed}")
    return "\n".join(lines)


def redraw(command: str, out: Path) -> int:
    """`plot` and `aggregate`: a damaged or missing runs.csv or spec.yaml is one line, status 2."""
    from experiments.plots import plot_all  # pandas and matplotlib only here
    from experiments.results import aggregate
    from experiments.summary import write_summary
    try:
        if command == "aggregate":
            aggregate(out)
            write_summary(out)
            print(out / "summary.md")
        elif not (out / "runs.csv").exists():
            raise ValueError(f"{out} has no runs.csv")
        for path in plot_all(out):
            print(path)
    except (ValueError, OSError) as error:
        print(f"{command}: {error}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command in ("plot", "aggregate"):
        return redraw(args.command, args.dir)
    try:
        spec = load_spec(args.spec, args.set)
        plans = dry_run(spec)  # what the runner will compute for each run, without a fabric
    except SpecError as error:
        print(error, file=sys.stderr)
        return 2
    if args.command == "validate":
        print(run_list(spec))
        return 0
    if args.command == "plan":
        print(plan_text(spec.name, plans))
        return 0
    if args.resume and args.out is None:
        print("run: --resume needs --out, the directory to resume", file=sys.stderr)
        return 2
    try:
        check_live_port(args.live, "--live")  # the spec's live: was checked with the spec
    except SpecError as error:
        print(f"run: {error.path}: {error.problem}", file=sys.stderr)
        return 2
    out = args.out or RESULTS_DIR / f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_experiment = _import_runner()
    live = args.live if args.live is not None else spec.header.live
    failed = run_experiment(spec, out, args.resume, live)
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # `validate SPEC | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
