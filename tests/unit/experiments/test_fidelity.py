"""The fidelity guard from synthetic samples: each check fails on its own, with its reason."""
import math

import pandas as pd
import pytest

from experiments import fidelity
from experiments.sampler import class_queue_stats, datapath_drops, drain_rows

RATES = pd.DataFrame([("leaf1", 3, "spine1", 100.0, "fabric", "leaf"), ("leaf1", 1, "h1", 100.0, "host", "leaf")],
                     columns=["switch", "port", "peer", "rate_mbps", "tier", "role"])
SECONDS = 10


def cpu(machine: float = 0.5, thread: float = 0.4) -> pd.DataFrame:
    return pd.DataFrame({"time_s": [float(t) for t in range(SECONDS + 1)], "cpu_util": machine,
                         "vswitchd_thread_util": thread})


def queues(dropped_cs1: int = 0) -> pd.DataFrame:
    """leaf1 port 3 sending 1000 packets a second in CS0 while CS1 drops `dropped_cs1` a second."""
    rows = []
    for t in range(SECONDS + 1):
        rows.append((float(t), "leaf1", 3, 0, 9_000_000 * t, 1000 * t, 0, 0))
        rows.append((float(t), "leaf1", 3, 1, 0, 0, dropped_cs1 * t, 0))
    return pd.DataFrame(rows, columns=["time_s", "switch", "port", "cs", "sent_bytes", "sent_pkts",
                                       "dropped_pkts", "backlog_bytes"])


def drains(mbps: float = 100.0, backlog: int = 200_000) -> pd.DataFrame:
    """20 ms drain probes of leaf1 port 3 (100 Mbit/s: 250 KB in 20 ms) finding `backlog` bytes and
    sending at `mbps`."""
    return pd.DataFrame([(float(t), "leaf1", 3, 0.02, backlog, int(mbps * 1e6 / 8 * 0.02))
                         for t in range(SECONDS + 1)],
                        columns=["time_s", "switch", "port", "probe_s", "backlog_bytes", "sent_bytes"])


def sockets(drops: int = 0) -> pd.DataFrame:
    return pd.DataFrame([(0.0, "leaf1", 3, 5), (float(SECONDS), "leaf1", 3, 5 + drops)],
                        columns=["time_s", "switch", "port", "socket_drops"])


def judge(cpu_samples=None, queue_samples=None, drain_samples=None, socket_samples=None, ovs=None,
          lags=(1.0, 2.0), transports=("tcp",)):
    return fidelity.judge(cpu() if cpu_samples is None else cpu_samples,
                          queues() if queue_samples is None else queue_samples,
                          drains() if drain_samples is None else drain_samples,
                          sockets() if socket_samples is None else socket_samples,
                          ovs or {}, RATES, list(lags), 0.0, float(SECONDS),
                          fidelity.app_lag_limit_ms(set(transports)))


def test_a_faithful_run_passes_every_check():
    verdict = judge()
    assert verdict["fidelity_ok"] is True and verdict["fidelity_reason"] == ""
    assert verdict["cpu_util_mean"] == pytest.approx(0.5)
    assert verdict["vswitchd_thread_util_mean"] == pytest.approx(0.4)
    assert verdict["link_rate_frac"] == pytest.approx(1.0)
    assert verdict["class_queue_drops_pkts"] == 0 and verdict["outside_queue_drops_pkts"] == 0
    assert verdict["app_lag_ms_p99"] == 2.0
    assert list(verdict) == fidelity.FIDELITY_COLUMNS


@pytest.mark.parametrize("inputs, reason", [
    ({"cpu_samples": cpu(machine=0.95)}, "machine CPU 0.95 > 0.9"),
    ({"cpu_samples": cpu(thread=0.93)}, "ovs-vswitchd's forwarding thread at 0.93 cores (>= 0.9)"),
    ({"drain_samples": drains(mbps=60, backlog=300_000)},
     "backlogged ports drained at 0.60 of their rate (< 0.9)"),
    ({"drain_samples": drains(mbps=40, backlog=125_000)},  # owed the 125 KB it held, sent 100 KB
     "backlogged ports drained at 0.80 of their rate (< 0.9)"),
    ({"socket_samples": sockets(drops=50)},
     "50 packets dropped outside the class queues (port sockets 50, OVS transmit 0, datapath 0; 10000 sent)"),
    ({"ovs": {"tx_errors_by_port": {"leaf1-eth3": 3}, "tx_errors_suppressed": 40, "datapath_drops": 1}},
     "44 packets dropped outside the class queues (port sockets 0, OVS transmit 43, datapath 1; 10000 sent)"),
    ({"lags": (1.0, 25.5)}, "host-app timers woke 25.5 ms late (p99 > 10 ms)"),
    ({"lags": (1.0, 5.2), "transports": ("tcp", "mlt")}, "host-app timers woke 5.2 ms late (p99 > 4 ms)"),
])
def test_each_check_fails_alone_with_its_reason(inputs, reason):
    verdict = judge(**inputs)
    assert verdict["fidelity_ok"] is False
    assert verdict["fidelity_reason"] == reason


def test_timers_a_little_late_measure_the_machine_only_where_mlt_paces():
    """mlt's pacer makes up PACING_BURST_S of a late wake-up, no more; emulated compute all of it."""
    assert judge(lags=(5.2,))["fidelity_ok"] is True
    assert judge(lags=(3.9,), transports=("mlt",))["fidelity_ok"] is True
    assert judge(lags=(4.1,), transports=("mlt",))["fidelity_ok"] is False


def test_a_reason_says_how_much_the_hypervisor_stole_when_it_stole_enough_to_name():
    stolen = cpu(machine=0.95).assign(steal_util=[0.0] * SECONDS + [0.3])  # 3% on average, 30% at the peak
    verdict = judge(cpu_samples=stolen, lags=(6.0,), transports=("mlt",))
    assert verdict["cpu_steal_mean"] == pytest.approx(0.3 / (SECONDS + 1))
    assert verdict["fidelity_reason"] == ("machine CPU 0.95 > 0.9 (0.03 of it stolen by the hypervisor); "
                                          "host-app timers woke 6.0 ms late (p99 > 4 ms, "
                                          "the hypervisor stole up to 30% of the CPUs)")
    idle = cpu(machine=0.95).assign(steal_util=0.001)  # what an idle minute steals here: not worth a word
    assert judge(cpu_samples=idle, lags=(6.0,), transports=("mlt",))["fidelity_reason"] == (
        "machine CPU 0.95 > 0.9; host-app timers woke 6.0 ms late (p99 > 4 ms)")
    assert math.isnan(judge()["cpu_steal_mean"]), "a cpu.csv from before steal was sampled"


def test_reasons_add_up():
    verdict = judge(cpu_samples=cpu(machine=0.99, thread=0.99), lags=(50.0,))
    assert verdict["fidelity_reason"].count(";") == 2


def test_class_queue_drops_are_counted_but_are_the_network_not_the_machine():
    verdict = judge(queue_samples=queues(dropped_cs1=7))
    assert verdict["class_queue_drops_pkts"] == 7 * SECONDS and verdict["fidelity_ok"] is True


def test_a_few_outside_drops_in_many_packets_are_tolerated():
    verdict = judge(socket_samples=sockets(drops=1))  # 1 in 10000 sent: at the limit
    assert verdict["outside_queue_drops_pkts"] == 1 and verdict["fidelity_ok"] is True


def test_a_port_owes_only_the_backlog_it_held():
    verdict = judge(drain_samples=drains(mbps=10, backlog=20_000))  # 25 KB sent in 20 ms: all it had
    assert verdict["link_rate_frac"] == pytest.approx(1.0) and verdict["fidelity_ok"] is True
    assert judge(drain_samples=drains(mbps=200))["link_rate_frac"] == pytest.approx(1.0), "HTB's burst"


def test_without_backlog_links_are_not_judged_on_their_rate():
    verdict = judge(drain_samples=drains().iloc[:0])
    assert math.isnan(verdict["link_rate_frac"]) and verdict["fidelity_ok"] is True


def test_drain_rows_from_two_dumps():
    first = [["leaf1", 3, 0, 1000, 1, 0, 18028], ["leaf1", 3, 5, 50, 1, 0, 9014], ["leaf1", 4, 0, 7, 1, 0, 0]]
    second = [["leaf1", 3, 0, 19000, 3, 0, 9014], ["leaf1", 3, 5, 9064, 2, 0, 0], ["leaf1", 4, 0, 7, 1, 0, 0]]
    assert drain_rows(first, second, 0.021) == [["leaf1", 3, 0.021, 27042, 27014]]


def test_samples_outside_the_training_window_do_not_count():
    samples = cpu(machine=0.5)
    samples.loc[samples["time_s"] == 0.0, "cpu_util"] = 1.0  # start-up, before the window
    verdict = fidelity.judge(samples, queues(), drains(), sockets(), {}, RATES, [], 0.5, float(SECONDS))
    assert verdict["cpu_util_mean"] == pytest.approx(0.5) and math.isnan(verdict["app_lag_ms_p99"])


def test_a_window_between_two_samples_is_judged_by_the_one_covering_it():
    samples = cpu(machine=0.5)
    samples.loc[samples["time_s"] == 4.0, "cpu_util"] = 0.97  # over (3, 4]
    verdict = fidelity.judge(samples, queues(), drains(), sockets(), {}, RATES, [], 3.2, 3.6)
    assert verdict["cpu_util_mean"] == pytest.approx(0.97) and verdict["fidelity_ok"] is False


def test_no_cpu_samples_means_unknown():
    verdict = judge(cpu_samples=cpu().iloc[:0])
    assert verdict["fidelity_ok"] is pd.NA
    assert verdict["fidelity_reason"] == "no CPU samples in the training window"


def test_sampler_parses_tc_and_ovs_coverage():
    qdiscs = [
        {"kind": "htb", "handle": "1:", "dev": "leaf1-eth3", "root": True, "bytes": 9, "packets": 1,
         "drops": 0, "backlog": 0},
        {"kind": "pfifo_head_drop", "handle": "15:", "dev": "leaf1-eth3", "parent": "1:15", "bytes": 900,
         "packets": 3, "drops": 2, "backlog": 18028},
        {"kind": "pfifo_head_drop", "handle": "10:", "dev": "eth0", "parent": "1:10", "bytes": 1,
         "packets": 1, "drops": 0, "backlog": 0},  # not a switch port of ours
    ]
    assert class_queue_stats(qdiscs, {"leaf1-eth3": ("leaf1", 3)}) == [["leaf1", 3, 5, 900, 3, 2, 18028]]
    coverage = ("datapath_drop_upcall_error   0.0/sec  0.000/sec  0.0000/sec   total: 12\n"
                "drop_action_of_pipeline      0.8/sec  3.367/sec  0.0561/sec   total: 259\n"
                "datapath_drop_invalid_port   0.0/sec  0.000/sec  0.0000/sec   total: 3\n"
                "datapath_drop_userspace_action_error   0.8/sec  7.617/sec  0.1269/sec   total: 509\n")
    assert datapath_drops(coverage) == 15, "neither the controller's drop rules nor packets for it count"


def samples(**inputs) -> dict:
    """One server's sampler records, faithful but for `inputs` (as judge() takes them)."""
    return {"cpu": inputs.get("cpu_samples", cpu()), "queues": inputs.get("queue_samples", queues()),
            "drains": inputs.get("drain_samples", drains()), "sockets": inputs.get("socket_samples", sockets()),
            "ovs": inputs.get("ovs", {})}


def judge_servers(by_server: dict, lags=(1.0, 2.0)) -> dict:
    return fidelity.judge_servers(by_server, RATES, list(lags), 0.0, float(SECONDS))


def test_one_server_is_judged_as_before():
    assert judge_servers({"localhost": samples(cpu_samples=cpu(thread=0.93))}) == judge(cpu_samples=cpu(thread=0.93))


def test_every_server_is_judged_on_its_own_samples_one_part_per_failing_server():
    verdict = judge_servers({"localhost": samples(), "10.0.0.2": samples(cpu_samples=cpu(machine=0.3, thread=0.93)),
                             "10.0.0.3": samples()})
    assert verdict["fidelity_ok"] is False
    assert verdict["fidelity_reason"] == "10.0.0.2: ovs-vswitchd's forwarding thread at 0.93 cores (>= 0.9)"
    assert verdict["vswitchd_thread_util_mean"] == pytest.approx(0.93)  # the worst server's figures
    assert verdict["cpu_util_mean"] == pytest.approx(0.5)
    verdict = judge_servers({"localhost": samples(socket_samples=sockets(drops=50)),
                             "10.0.0.2": samples(drain_samples=drains(mbps=60, backlog=300_000))}, lags=(25.5,))
    assert verdict["fidelity_reason"] == (
        "localhost: 50 packets dropped outside the class queues (port sockets 50, OVS transmit 0, datapath 0; "
        "10000 sent); host-app timers woke 25.5 ms late (p99 > 10 ms)"
        " | 10.0.0.2: backlogged ports drained at 0.60 of their rate (< 0.9)")  # the host apps judged once
    assert verdict["link_rate_frac"] == pytest.approx(0.6) and verdict["outside_queue_drops_pkts"] == 50
    assert verdict["app_lag_ms_p99"] == 25.5 and list(verdict) == fidelity.FIDELITY_COLUMNS


def test_a_server_without_samples_fails_the_guard():
    verdict = judge_servers({"localhost": samples(), "10.0.0.2": None})
    assert verdict["fidelity_ok"] is False and verdict["fidelity_reason"] == "10.0.0.2: no samples from its sampler"
    early = cpu().assign(time_s=cpu()["time_s"] - 100)  # none in the training window
    verdict = judge_servers({"localhost": samples(), "10.0.0.2": samples(cpu_samples=early)})
    assert verdict["fidelity_ok"] is False
    assert verdict["fidelity_reason"] == "10.0.0.2: no CPU samples in the training window"


def test_this_machine_without_samples_in_the_window_leaves_the_verdict_unknown_unless_another_fails():
    early = cpu().assign(time_s=cpu()["time_s"] - 100)
    verdict = judge_servers({"localhost": samples(cpu_samples=early), "10.0.0.2": samples()})
    assert verdict["fidelity_ok"] is pd.NA
    assert verdict["fidelity_reason"] == "localhost: no CPU samples in the training window"
    verdict = judge_servers({"localhost": samples(cpu_samples=early), "10.0.0.2": samples(cpu_samples=cpu(0.95))})
    assert verdict["fidelity_ok"] is False
