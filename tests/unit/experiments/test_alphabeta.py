"""Which collective, when (experiments/alphabeta.py): on results whose runs took exactly the alpha-beta
model's time at a known alpha per algorithm and beta, the fit gives them back, the prediction is the
measurement, and the crossings are where the model puts them (and not where one alpha for every
algorithm would)."""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
import yaml

from experiments import alphabeta
from experiments.columns import runs_columns
from experiments.results import write_csv
from experiments.spec import load_spec
from experiments.traffic import wire_bytes_per_payload_byte
from helpers import REPO

# A round of the ring costs more than a round of the others (its sends' software is not hidden)
ALPHAS = {"ring": 0.003, "halving_doubling": 0.001, "tree": 0.002, "hierarchical": 0.0025}
BETA = 1.3 * 8 / 20e6  # the host link at 1/1.3 of its 20 Mbit/s
COMPUTE_S = 0.01


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> Path:
    """collectives.yaml's flat fabric (ECMP), every run as long as the model says, plus its compute."""
    out = tmp_path_factory.mktemp("collectives")
    spec = load_spec(REPO / "experiments" / "collectives.yaml", ["exclude=[{fabric: [oversub-ecmp, oversub-spray]}]"])
    (out / "spec.yaml").write_text(yaml.safe_dump(spec.resolved_document(), sort_keys=False))
    rows = []
    for run in spec.runs:
        sizes = alphabeta.runplan.layer_table(run)
        ticks, nbytes = alphabeta.terms(run, sum(layer["bytes"] for layer in sizes))
        rows.append({"run_id": run.run_id, **run.axes, "rep": run.rep, "mode": "allreduce", "workers": 6,
                     "iter_time_mean_s": COMPUTE_S + ticks * ALPHAS[run.job.collective] + nbytes * BETA,
                     "compute_s": COMPUTE_S})
    write_csv(pd.DataFrame(rows, columns=runs_columns([axis.name for axis in spec.axes])), out / "runs.csv")
    return out


def test_runs_that_follow_the_model_give_back_each_algorithms_alpha_and_the_fabrics_beta(out):
    fitted, _ = alphabeta.write_alphabeta(out)
    sizes = fitted["model_bytes"].nunique()
    assert len(fitted) == 4 * sizes and set(fitted["fabric"]) == {"fabric=flat-ecmp"}
    assert fitted["alpha_s"].tolist() == pytest.approx(fitted["collective"].map(ALPHAS).tolist(), rel=1e-6)
    assert fitted["beta_s_per_byte"].tolist() == pytest.approx([BETA] * len(fitted))
    assert fitted["predicted_s"].tolist() == pytest.approx(fitted["measured_s"].tolist())
    assert fitted["fitted_on"].sum() == 8  # each algorithm's smallest and largest model
    # one alpha for all: wrong somewhere
    assert not fitted["fabric_predicted_s"].tolist() == pytest.approx(fitted["measured_s"].tolist(), rel=0.05)
    assert fitted["measured_over_bound"].tolist() == pytest.approx((fitted["measured_s"] / fitted["bound_s"]).tolist())
    assert pd.read_csv(out / "alphabeta.csv")["measured_s"].tolist() == pytest.approx(fitted["measured_s"].tolist())


def test_a_run_that_failed_the_guard_is_left_out_of_the_fit(out, tmp_path):
    """Its time measured the machine: ten times the model's for the ring's smallest model would move alpha."""
    runs = pd.read_csv(out / "runs.csv")
    (spoiled,) = runs.index[(runs["collective"] == "ring") & (runs["size"] == "4KB") & (runs["rep"] == 1)]
    runs.loc[spoiled, "iter_time_mean_s"] *= 10
    runs["fidelity_ok"] = pd.Series(True, index=runs.index, dtype="boolean")
    runs.loc[spoiled, "fidelity_ok"] = False
    (tmp_path / "spec.yaml").write_text((out / "spec.yaml").read_text())
    write_csv(runs, tmp_path / "runs.csv")
    fitted, _ = alphabeta.write_alphabeta(tmp_path)
    assert fitted["alpha_s"].tolist() == pytest.approx(fitted["collective"].map(ALPHAS).tolist(), rel=1e-6)
    runs.loc[spoiled, "fidelity_ok"] = True
    write_csv(runs, tmp_path / "runs.csv")
    fitted, _ = alphabeta.write_alphabeta(tmp_path)
    assert not fitted["alpha_s"].tolist() == pytest.approx(fitted["collective"].map(ALPHAS).tolist(), rel=1e-2)


def test_the_ring_and_halving_doubling_cross_where_their_rounds_and_bytes_balance(out):
    _, crossed = alphabeta.write_alphabeta(out)
    row = crossed[(crossed["first"] == "ring") & (crossed["second"] == "halving_doubling")].iloc[0]
    # Below a segment (64 KiB: one, unpipelined): the ring's 10 rounds of a sixth of the model against 6 rounds
    # with 3.5 models through the busiest link of their rounds (the fold, halving, doubling, unfold) to the
    # ring's 10/6: 10 alpha_ring - 6 alpha_hd = (3.5 - 10/6) S beta on the wire, at 25 KB
    wire = wire_bytes_per_payload_byte(9000, "mlt")
    crossing = (10 * ALPHAS["ring"] - 6 * ALPHAS["halving_doubling"]) / ((3.5 - 10 / 6) * wire * BETA)
    assert row["predicted_bytes"] == pytest.approx(crossing, rel=0.01)
    # measured between 14 and 58 KB, where the runs change order; the curves are straight: nearly the model's
    assert 14440 < row["measured_bytes"] < 57640
    assert row["measured_over_predicted"] == pytest.approx(1, abs=0.3)
    # one alpha for the ring's rounds and halving-doubling's puts it elsewhere, or nowhere
    assert not row["fabric_predicted_bytes"] == pytest.approx(crossing, rel=0.3)
    assert (pd.read_csv(out / "crossovers.csv")[["first", "second"]].apply(tuple, axis=1).tolist()
            == crossed[["first", "second"]].apply(tuple, axis=1).tolist())


def test_crossings_of_measured_curves_are_interpolated_in_log_size():
    # -1 at 1 and +1 at 100: half way in log size, at 10
    assert alphabeta.measured_crossing([1, 100, 1000], [1, 6, 9], [2, 5, 8]) == pytest.approx(10)
    assert math.isnan(alphabeta.measured_crossing([1, 100], [1, 2], [2, 3]))


def test_a_fit_that_would_need_a_negative_term_keeps_the_other_alone():
    # every time exactly 0.5 s a round, bandwidth falling: beta alone would be negative
    assert alphabeta.fit([(2, 100, 1.0), (4, 50, 2.0), (6, 10, 3.0)]) == pytest.approx((0.5, 0.0))


def test_the_command_line_writes_both_tables_or_says_in_one_line_what_is_missing(out, tmp_path, capsys):
    assert alphabeta.main([str(out)]) == 0
    assert "ring" in capsys.readouterr().out and (out / "crossovers.csv").exists()
    assert alphabeta.main([str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'spec.yaml'}: missing\n"


def test_each_algorithm_has_its_alpha_and_the_fabric_one_beta():
    # ring: 2 ms a round, halving-doubling 0.5 ms; 1 us a byte for both
    points = [("ring", 10, 1_000, 0.021), ("ring", 10, 1_000_000, 1.02),
              ("halving_doubling", 6, 2_000, 0.005), ("halving_doubling", 22, 2_000_000, 2.011)]
    alphas, beta = alphabeta.fit_rounds(points)
    assert alphas == pytest.approx({"ring": 0.002, "halving_doubling": 0.0005}) and beta == pytest.approx(1e-6)


def test_an_alpha_that_would_be_negative_is_none():
    # the small run faster than its bytes at the fabric's beta: no time a round, not a negative one
    alphas, beta = alphabeta.fit_rounds([("ring", 10, 1_000, 0.011), ("ring", 10, 1_000_000, 1.01),
                                         ("tree", 6, 10_000, 0.004), ("tree", 22, 1_000_000, 1.0)])
    assert alphas["tree"] == 0 and alphas["ring"] > 0 and beta > 0
    assert alphabeta.fit_rounds([]) == ({}, 0.0)


def test_the_fit_weighs_a_small_models_time_as_much_as_a_large_ones():
    # 1 ms a round and 1 us a byte, but the large runs of the long pipeline pay 10 ms more a round:
    # in absolute seconds they would set alpha, and the small model would be predicted 5x too slow
    points = [(10, 1_000, 0.011), (10, 1_000_000, 1.01), (6, 2_000, 0.008), (30, 1_000_000, 1.33)]
    alpha, beta = alphabeta.fit(points)
    for ticks, nbytes, seconds in points[:1] + points[2:3]:
        assert ticks * alpha + nbytes * beta == pytest.approx(seconds, rel=0.35)
