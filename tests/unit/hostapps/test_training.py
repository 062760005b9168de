"""End-to-end training: in-process jobs (threads) and real processes through the CLI."""
import csv
import json
import subprocess
import sys
import time

import numpy as np
import pytest

from hostapps.collectives import ps_phase
from hostapps.config import Model, ProcessConfig
from hostapps.data import CLASSES, load_split
from hostapps.profiles import resnet50
from hostapps.records import ITERATION_COLUMNS, TENSOR_COLUMNS, Recorder
from hostapps.transport import Peer

from helpers.loopback import run_job
from helpers import REPO

REPO = str(REPO)


def test_the_digits_split_is_stratified_disjoint_and_seeded():
    split = load_split(3)
    assert split.x_train.shape == (1347, 64) and split.x_test.shape == (450, 64)
    assert split.x_train.dtype == np.float32 and 0 <= split.x_train.min() and split.x_train.max() == 1
    # Every image lands in one set: no row of the test set is also a training row.
    train_rows = {row.tobytes() for row in split.x_train}
    assert not any(row.tobytes() in train_rows for row in split.x_test)  # the 1797 images are distinct
    # Each class gives a quarter of its images (its count rounded) to the test set.
    train_counts, test_counts = np.bincount(split.y_train, minlength=CLASSES), np.bincount(split.y_test)
    assert np.array_equal(test_counts, np.round((train_counts + test_counts) * 0.25).astype(int))
    again, other = load_split(3), load_split(4)
    assert np.array_equal(again.y_test, split.y_test) and np.array_equal(again.x_train, split.x_train)
    assert not np.array_equal(other.y_test, split.y_test)


def test_allreduce_ps_and_single_worker_reach_the_same_parameters(loopback_addresses):
    options = dict(iterations=20, batch=32, eval_every=0, model=Model(width=64, depth=2), momentum=0.5)
    single = run_job(loopback_addresses, 1, **options)[0]["model"].params
    allreduce = run_job(loopback_addresses, 4, **options)
    ps = run_job(loopback_addresses, 4, "ps", 2, **options)
    untrained = run_job(loopback_addresses, 1, **{**options, "iterations": 1})[0]["model"].params
    assert np.abs(single - untrained).max() > 1e-2  # 20 iterations really moved the parameters
    for result in allreduce + ps:
        assert np.abs(result["model"].params - single).max() < 1e-4


def test_workers_start_their_first_iteration_at_start_at_and_train_alike(loopback_addresses):
    """--start-at: connected, every worker waits for it (the jobs sharing a fabric start at their
    offsets); the parameters are those of a job that starts at once."""
    options = dict(iterations=3, batch=32, eval_every=0, model=Model(width=16, depth=1))
    at_once = run_job(loopback_addresses, 2, **options)
    start_at = time.time() + 1.5
    later = run_job(loopback_addresses, 2, **options, start_at=start_at)
    assert all(result["recorder"].iterations[0]["start_s"] >= start_at for result in later)
    assert np.array_equal(later[0]["model"].params, at_once[0]["model"].params)


def test_a_paced_worker_starts_iteration_i_no_earlier_than_start_at_plus_i_paces(loopback_addresses):
    """--pace: the time-shift policy's circle; each iteration waits for its place on it, and the
    parameters are those of a job that runs free."""
    options = dict(iterations=3, batch=32, eval_every=0, model=Model(width=16, depth=1))
    free = run_job(loopback_addresses, 2, **options)
    start_at = time.time() + 1.0
    paced = run_job(loopback_addresses, 2, **options, start_at=start_at, pace=0.4)
    for result in paced:
        starts = [row["start_s"] for row in result["recorder"].iterations]
        assert all(start >= start_at + i * 0.4 for i, start in enumerate(starts))
        assert starts[2] - starts[0] < 0.8 + 0.3  # it waited for its places, not more
    assert np.array_equal(paced[0]["model"].params, free[0]["model"].params)


def test_ps_parameter_slicing_reaches_the_same_parameters_slice_by_slice(loopback_addresses):
    options = dict(iterations=12, batch=32, eval_every=0, model=Model(width=64, depth=2), momentum=0.5)
    single = run_job(loopback_addresses, 1, **options)[0]["model"].params
    whole = run_job(loopback_addresses, 2, "ps", 2, **options)
    sliced = run_job(loopback_addresses, 2, "ps", 2, ps_slice_bytes=4096, **options)
    for result in whole + sliced:
        assert np.allclose(result["model"].params, single, atol=1e-6)
    # fc1 and fc2 (4160 floats, 16640 bytes) go as 5 slices of 3328 bytes, out (2600 bytes) whole; slice k is
    # pushed as step 2k and pulled as step 2k + 1, under the layer's tensor id.
    messages = sliced[0]["recorder"].messages
    expected = {(0, 2 * k, 3328) for k in range(5)} | {(1, 2 * k, 3328) for k in range(5)} | {(2, 0, 2600)}
    for direction, step in (("send", 0), ("recv", 1)):
        assert {(m.tensor, m.step, m.nbytes) for m in messages if m.iteration == 1 and m.direction == direction} == {
            (tensor, push + step, nbytes) for tensor, push, nbytes in expected}


def test_mlp_reaches_90_percent_with_the_default_budget(loopback_addresses):
    defaults = ProcessConfig(role="worker", rank=0, workers=[("127.0.0.1", 1)])
    summary = run_job(loopback_addresses, 1)[0]
    assert summary["iterations"] == defaults.iterations
    assert summary["final_accuracy"] >= 0.90


def test_conv_model_trains(loopback_addresses):
    summary = run_job(loopback_addresses, 2, model=Model(conv=4, width=32, depth=1), iterations=150, eval_every=0)[0]
    assert summary["final_accuracy"] >= 0.85


def test_profile_overlaps_communication_with_backprop(loopback_addresses):
    # ResNet-50 at 1/1000 scale: 107 real tensors (~100 KB), ~15 ms of emulated compute per iteration.
    summaries = run_job(loopback_addresses, 2, model=Model("resnet50", scale=0.001), iterations=3, eval_every=0)
    recorder = summaries[0]["recorder"]
    assert summaries[0]["param_count"] == sum(max(1, round(layer.params * 0.001)) for layer in resnet50()[0])
    sends = [m for m in recorder.messages if m.direction == "send" and m.iteration == 1]
    backward = [s for s in recorder.spans if s[0] == "backward 1"][0]
    # Wait-free backprop: the first gradients go out before backward of that iteration ends.
    assert min(m.start_s for m in sends) < backward[3]


def cli(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "hostapps", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def start(*args):
    return subprocess.Popen([sys.executable, "-m", "hostapps", *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def peer_list(addresses):
    return ",".join(f"{host}:{port}" for host, port in addresses)


def test_an_iterations_delivered_fraction_weighs_its_received_messages_by_bytes_in_all_and_per_phase(tmp_path):
    recorder = Recorder(0, "worker", 0)
    server = Peer("server", 0)
    recorder.log_message(0, 0, 0, 1000, "recv", server, 1.0, 1.1, 0.9)  # a push (reduce), as a server gets it
    recorder.log_message(0, 1, 1, 3000, "recv", server, 1.0, 1.1, 1.0)
    recorder.log_message(0, 1, 0, 5000, "send", server, 1.0, 1.1, 1.0)
    recorder.add_iteration(0, 1.0, 1.2, 0.1, 0.5, None)
    recorder.add_iteration(1, 1.2, 1.3, 0.0, 0.4, None)  # received nothing: all of nothing arrived
    recorder.write(str(tmp_path), {0: ("fc1", "0"), 1: ("fc2", "1")}, {}, lambda tensor, step: ps_phase(step))
    with open(tmp_path / "iterations.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["delivered_fraction"] for r in rows] == ["0.9750", "1.0000"]
    assert [(r["delivered_fraction_reduce"], r["delivered_fraction_gather"]) for r in rows] == [
        ("0.9000", "1.0000"), ("", "")]  # a phase with nothing received has no fraction
    assert [r["bytes_recv"] for r in rows] == ["4000", "0"]


@pytest.mark.slow
def test_cli_ps_job_writes_the_output_contract(loopback_addresses, tmp_path):
    addrs = loopback_addresses(4)
    common = ["--workers", peer_list(addrs[:2]), "--servers", peer_list(addrs[2:]), "--mode", "ps",
              "--iterations", "12", "--batch", "32", "--eval-every", "5", "--timeout", "20"]
    procs = [start("worker", "--rank", str(r), "--out", str(tmp_path / (f"w{r}")), *common) for r in range(2)]
    procs += [start("server", "--rank", str(s), "--out", str(tmp_path / (f"s{s}")), *common) for s in range(2)]
    outputs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, outputs
    with open(tmp_path / "w1" / "iterations.csv") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == ITERATION_COLUMNS and len(rows) == 12
    assert [r["test_accuracy"] != "" for r in rows] == [i in (4, 9, 11) for i in range(12)]
    assert all(float(r["start_s"]) > 1e9 and float(r["end_s"]) >= float(r["start_s"]) for r in rows)
    assert all(int(r["bytes_sent"]) > 0 and int(r["bytes_recv"]) > 0 for r in rows[:-1])
    with open(tmp_path / "s0" / "iterations.csv") as f:
        server_rows = list(csv.DictReader(f))
    assert len(server_rows) == 12 and all(r["role"] == "server" and r["loss"] == "" for r in server_rows)
    with open(tmp_path / "w0" / "tensors.csv") as f:
        tensors = list(csv.DictReader(f))
    assert tuple(tensors[0]) == TENSOR_COLUMNS
    assert {t["direction"] for t in tensors} == {"send", "recv"}
    assert {t["peer"] for t in tensors} == {"server0", "server1"}
    summary = json.loads((tmp_path / "w0" / "summary.json").read_text())
    assert summary["iterations"] == 12 and summary["bytes_per_iteration"] == 4 * summary["param_count"]
    assert summary["blas_threads"] == 1  # OpenBLAS would take every core, and spin
    assert summary["final_accuracy"] == float(rows[-1]["test_accuracy"]) or abs(
        summary["final_accuracy"] - float(rows[-1]["test_accuracy"])) < 1e-4
    trace = json.loads((tmp_path / "w0" / "trace.json").read_text())
    assert {e["cat"] for e in trace["traceEvents"]} >= {"compute", "comm"}
    final = [np.load(tmp_path / (f"w{r}") / "model.npz") for r in range(2)]
    assert set(final[0].files) == {"fc1", "fc2", "out"}
    assert all(np.array_equal(final[0][k], final[1][k]) for k in final[0].files)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["allreduce", "ps"])
def test_missing_peer_makes_every_process_fail_within_the_timeout(loopback_addresses, mode):
    addrs = loopback_addresses(4)
    servers = ["--servers", peer_list(addrs[3:])] if mode == "ps" else []
    workers = addrs[:3] if mode == "ps" else addrs
    common = ["--workers", peer_list(workers), *servers, "--mode", mode, "--timeout", "3", "--iterations", "1000",
              "--batch", "48"]
    # allreduce: worker 3 never starts; ps: the only server never starts.
    started = time.monotonic()
    procs = [start("worker", "--rank", str(r), *common) for r in range(3)]
    outputs = [p.communicate(timeout=30) for p in procs]
    assert time.monotonic() - started < 15
    for p, (out, err) in zip(procs, outputs):
        assert p.returncode == 1, (out, err)
        assert err.startswith("error: worker") and "Traceback" not in err


@pytest.mark.slow
def test_peer_dying_mid_run_fails_the_others(loopback_addresses):
    addrs = loopback_addresses(3)
    common = ["--workers", peer_list(addrs), "--timeout", "3", "--iterations", "10000", "--eval-every", "0",
              "--batch", "48"]
    procs = [start("worker", "--rank", str(r), *common) for r in range(3)]
    time.sleep(2.5)
    assert all(p.poll() is None for p in procs)
    procs[1].kill()
    started = time.monotonic()
    outputs = [p.communicate(timeout=30) for p in (procs[0], procs[2])]
    assert time.monotonic() - started < 10
    for p, (out, err) in zip((procs[0], procs[2]), outputs):
        assert p.returncode == 1
        # the dead peer, or (a slow start on a loaded machine) a peer blocked behind it
        assert "worker1" in err or "closed the connection" in err or "timed out after 3.0 s" in err, err


@pytest.mark.parametrize("args, message", [
    (["--mode", "foo"], "error: --mode: foo is not allowed (one of allreduce, ps)"),
    (["--model", "alexnet"], "error: --model: alexnet is not allowed (one of mlp, resnet50, vgg16, bert_base, "
                             "inception_v3, bert_base_tf, trace)"),
    (["--batch", "1"], "error: --batch: global batch 1 does not split evenly over 2 workers"),
    (["--mode", "ps", "--servers", "127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003,127.0.0.1:7004"],
     "error: --servers: 4 shards but the model has only 3 tensors, so shard 3 would hold no data"),
    (["--transport", "mlt", "--timeout", "nan"], "error: --timeout: nan is not allowed (seconds > 0, at most 86400: "
                                                 "a peer silent this long is an error)"),
    (["--workers", "nohost"], "error: --workers: bad address 'nohost' (expected host:port, port 1..65535)"),
    (["--mode", "ps", "--servers", "127.0.0.1:7001", "--ps-slice-bytes", "4098"],
     "error: --ps-slice-bytes: 4098 is not allowed (0 or a multiple of 4 in 1024..1073741824, smaller pieces cost "
     "a message per 256 floats or fewer (ps: each layer pushed and pulled in slices of at most this size, as P3; "
     "0: whole layers; allreduce ignores it))"),
    (["--mode", "ps", "--servers", "127.0.0.1:7001", "--model", "vgg16", "--scale", "0.1", "--ps-slice-bytes",
      "1024"], "error: --ps-slice-bytes: 1024 bytes cut layer fc6 (41105816 bytes) into 40143 slices, more than "
               "the 32768 the message step field can number"),
])
def test_bad_input_is_one_line_naming_the_argument(args, message):
    base = {"--workers": "127.0.0.1:7101,127.0.0.1:7102"}
    argv = ["worker", "--rank", "0"]
    for key, value in base.items():
        if key not in args:
            argv += [key, value]
    result = cli(*argv, *args, timeout=30)
    assert result.returncode == 2
    assert result.stderr == message + "\n"
