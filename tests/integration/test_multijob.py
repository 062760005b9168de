"""Two jobs on one fabric end to end (root): each job's frames carry a tag of its own, so neither
takes the other's messages, and each finishes with the parameters it has when it runs alone with the
same seed, under every sharing policy."""
import json

import numpy as np
import pandas as pd
import yaml

from helpers.fabric import experiments_cli, finish, leftovers

# Two MLP jobs whose all-reduces both cross the spines (h1-h3 and h2-h4 on a 2x2x2 leaf-spine), one
# over TCP and one over mlt, each run alone and then beside the other under each sharing policy.
SPEC = {
    "name": "two_jobs",
    "topology": {"spines": 2, "leaves": 2, "hosts_per_leaf": 2, "host_bw": 100, "fabric_bw": 100},
    "jobs": [
        {"name": "tcp", "workers": ["h1", "h3"], "iterations": 6, "batch": 32, "eval_every": 0,
         "model": {"name": "mlp", "width": 64, "depth": 1}},
        {"name": "mlt", "workers": ["h2", "h4"], "iterations": 6, "batch": 32, "eval_every": 0, "seed": 7,
         "transport": "mlt", "start_s": 0.5, "model": {"name": "mlp", "width": 64, "depth": 1}},
    ],
    "matrix": {"sharing": {"baseline": "fair", "values": {
        policy: {"controller.sharing": policy} for policy in ("fair", "intensity", "timeshift")}}},
}


def models(out, run_id, host):
    return np.load(out / "runs" / run_id / f"{host}-worker0" / "model.npz")


def test_two_jobs_share_the_fabric_and_each_trains_as_it_does_alone(tmp_path):
    spec = tmp_path / "two_jobs.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    out = tmp_path / "out"
    status, _, stderr = finish(experiments_cli(str(spec), "--out", str(out), cwd=tmp_path), timeout=420)
    assert status == 0, stderr[-2000:]
    runs = pd.read_csv(out / "runs.csv", keep_default_na=False, na_values=[""])
    assert len(runs) == 2 + 3 * 2, "each job alone, then a row per job under each policy"
    for policy in ("fair", "intensity", "timeshift"):
        run_id = f"sharing={policy},rep=1"
        record = json.loads((out / "runs" / run_id / "run.json").read_text())
        assert record["status"] == "ok", record["error"]
        tags = [job["tag"] for job in record["jobs"]]
        assert len(set(tags)) == 2
        for name, host in (("tcp", "h1"), ("mlt", "h2")):
            alone, shared = models(out, f"alone={name},rep=1", host), models(out, run_id, host)
            assert set(alone.files) == set(shared.files)
            assert all(np.array_equal(alone[key], shared[key]) for key in alone.files), (policy, name)
        iterations = pd.read_csv(out / "runs" / run_id / "h2-worker0" / "iterations.csv")
        assert set(iterations["job"]) == {tags[1]}, "the mlt job's records carry its own tag"
        row = runs[(runs["run_id"] == run_id) & (runs["job"] == "mlt")].iloc[0]
        assert row["slowdown_vs_alone"] > 0 and row["jct_s"] > 0
    intensity = json.loads((out / "runs" / "sharing=intensity,rep=1" / "run.json").read_text())
    assert all(job["band"] for job in intensity["jobs"]), "the controller gave each job its classes"
    assert (out / "multijob.csv").exists() and (out / "plots" / "job_iteration_time.png").exists()
    assert leftovers() == []
