"""Progress of an experiment on the terminal: run i/N of the matrix with an ETA, and below it
the current run's iterations; with a live view (experiments/live.py), in the browser too.

    with Progress(len(spec.runs)) as progress:
        for run in spec.runs:
            progress.start_run(run.run_id, run.job.iterations)
            ...  progress.iteration(i)  as the host apps report iteration i (1-based, done)
            progress.end_run("ok")
"""
from __future__ import annotations

import math
import sys
from collections import Counter
from typing import IO

from tqdm import tqdm


class Progress:
    def __init__(self, total_runs: int, file: IO[str] = sys.stderr, disable: bool = False, live=None):
        self.file = file
        self.disable = disable
        self.runs = tqdm(total=total_runs, desc="runs", unit="run", position=0, file=file, disable=disable)
        self.current: tqdm | None = None
        self.statuses: Counter[str] = Counter()
        self.live = live  # a LiveView, or None
        self._run_id = ""

    def start_run(self, run_id: str, iterations: int, bound_s: float = math.nan) -> None:
        self._close_current()
        self.runs.set_description(f"run {self.runs.n + 1}/{self.runs.total}")
        self.current = tqdm(total=iterations, desc=run_id, unit="it", position=1, leave=False,
                            file=self.file, disable=self.disable)
        self._run_id = run_id
        if self.live is not None:
            self.live.run_started(run_id, iterations, bound_s)

    def iteration(self, done: int, ends: list[float] = ()) -> None:
        """The current run has finished `done` iterations (not an increment: reports may skip), the
        last ones at `ends` (epoch seconds)."""
        if self.current is not None:
            self.current.update(done - self.current.n)
        if self.live is not None:
            self.live.iteration(done, list(ends))

    def job_iterations(self, jobs: dict[str, dict]) -> None:
        """A run of several jobs: per job (its name), its hosts and its rank-0 worker's iteration
        ends so far (epoch seconds): the live view shows the jobs apart."""
        if self.live is not None:
            self.live.job_iterations(jobs)

    def end_run(self, status: str, run_id: str = "") -> None:
        """status: ok, failed, or skipped for a run --resume found finished."""
        if self.live is not None:
            self.live.run_ended(run_id or self._run_id, status)
        self._close_current()
        self.statuses[status] += 1
        self.runs.set_postfix(dict(self.statuses), refresh=False)
        self.runs.update(1)

    def _close_current(self) -> None:
        if self.current is not None:
            self.current.close()
            self.current = None

    def fabric_up(self, fab, port_rates) -> None:
        if self.live is not None:
            self.live.fabric_up(fab, port_rates)

    def fabric_down(self) -> None:
        if self.live is not None:
            self.live.fabric_down()

    def sampling(self, sampler) -> None:
        if self.live is not None:
            self.live.sampling(sampler)

    def close(self) -> None:
        self._close_current()
        self.runs.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
