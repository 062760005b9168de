"""Spec schema, validation messages, --set overrides and matrix expansion (no network)."""
import dataclasses
import re

import pytest
import yaml
from hypothesis import given, settings, strategies as st

from hostapps.config import Model
from experiments.spec import (Controller, Fault, Flow, Header, Job, RunConfig, SpecError, Topology, load_spec,
                              load_yaml, parse_spec, scheme_of, topology_links)
from helpers import FIXTURES, REPO

FIXTURES = FIXTURES / "experiments"

SLICE_RULE = ("(0 or a multiple of 4 in 1024..1073741824, smaller pieces cost a message per 256 floats or fewer "
              "(ps: each layer pushed and pulled in slices of at most this size, as P3; 0: whole layers; allreduce "
              "ignores it))")
LINK_RATE = "(a rate in Mbit/s 0.8..100000, so that each class's floor, 1% of it, reaches tc's 8 kbit/s)"
MALFORMED = [
    ("topology: {spines: -1}", "topology.spines: -1 is not allowed (an integer >= 1)"),
    ("topology: {spines: two}", "topology.spines: 'two' is not allowed (an integer >= 1)"),
    ("topology: {spines: true}", "topology.spines: true is not allowed (an integer >= 1)"),
    ("topology: {spine: 2}", "topology.spine: unknown field (did you mean spines?)"),
    ("topology: {kind: torus}", "topology.kind: 'torus' is not allowed (one of leafspine, fattree, file)"),
    ("topology: {kind: fattree, k: 3}",
     "topology.k: 3 is not allowed (an even integer >= 2 (fattree only))"),
    ("topology: {host_bw: 0}", "topology.host_bw: 0 is not allowed " + LINK_RATE),
    ("topology: 4", "topology: 4 is not allowed (a mapping with keys kind, spines, leaves, "
                    "hosts_per_leaf, k, host_bw, fabric_bw, mtu, tcp_cc, file)"),
    ("topology: {mtu: 1279}", "topology.mtu: 1279 is not allowed (an integer 1280..9000 (bytes, every "
                              "interface of the fabric))"),
    ("topology: {mtu: 9001}", "topology.mtu: 9001 is not allowed (an integer 1280..9000 (bytes, every "
                              "interface of the fabric))"),
    ("topology: {mtu: 1500.5}", "topology.mtu: 1500.5 is not allowed (an integer 1280..9000 (bytes, every "
                                "interface of the fabric))"),
    ("topology: {tcp_cc: vegas}", "topology.tcp_cc: 'vegas' is not allowed (a TCP congestion control this "
                                  "kernel offers (reno, bbr, cubic), set in every host)"),
    ("controller: {lb: sprey}", "controller.lb: 'sprey' is not allowed (one of ecmp, spray, single)"),
    ("controller: {sched: p3}", "controller.sched: 'p3' is not allowed (one of fifo, layer, tictac, size)"),
    ("job: {mode: ring}", "job.mode: 'ring' is not allowed (one of allreduce, ps)"),
    ("job: {collective: butterfly}",
     "job.collective: 'butterfly' is not allowed (one of ring, halving_doubling, hierarchical, tree)"),
    ("job: {mode: ps, collective: tree}",
     "job.collective: 'tree' is not allowed ('ring' here: only an all-reduce job has one; ps mode pushes to and "
     "pulls from its servers, so it would change nothing)"),
    ("topology: {leaves: 4, hosts_per_leaf: 1}\njob: {collective: hierarchical}",
     "job.collective: 'hierarchical' is not allowed (ring, halving_doubling or tree here: each of the 4 workers is "
     "alone on its leaf, so its cross-leaf ring is the flat ring and it would change nothing)"),
    ("job: {collective: ring, partition_bytes: 4096}",
     "job.partition_bytes: 4096 is not allowed (65536 here: only caramel's and bytescheduler's all-reduce units "
     "and the halving_doubling, hierarchical and tree all-reduces' pipeline segments use it, not send order ready "
     "with collective ring in allreduce mode, so it would change nothing)"),
    ("job: {model: {name: gpt2}}",
     "job.model.name: 'gpt2' is not allowed (one of mlp, resnet50, vgg16, bert_base, inception_v3, bert_base_tf, "
     "trace)"),
    ("job: {model: {scale: 2}}",
     "job.model.scale: 2 is not allowed (a fraction of the profile's tensor sizes in (0, 1])"),
    ("job: {workers: 0}", "job.workers: 0 is not allowed ('all' hosts but the servers, a count >= 1 "
                          "or a list of distinct host names)"),
    ("job: {workers: [h1, h1]}", "job.workers: [h1, h1] is not allowed ('all' hosts but the "
                                 "servers, a count >= 1 or a list of distinct host names)"),
    ("job: {workers: [h1, h9]}", "job.workers.1: 'h9' is not allowed (a host of h1..h4)"),
    ("job: {workers: 5}", "job.workers: 5 is not allowed (at most the 4 hosts of the topology)"),
    ("job: {mode: ps, workers: 4}", "job.workers: 4 is not allowed (at most 3: 4 hosts, 1 of them servers)"),
    ("job: {mode: ps, servers: 4}", "job.servers: 4 is not allowed (fewer than the 4 hosts, workers need one)"),
    ("job: {mode: ps, workers: [h1, h2], servers: [h2]}",
     "job.workers: [h1, h2] is not allowed (hosts apart from the servers h2)"),
    ("job: {iterations: 2}", "job.iterations: 2 is not allowed (at least 3: the first iteration is start-up, the "
                             "last drains the final round, the metrics need one between)"),
    ("job: {eval_every: -1}", "job.eval_every: -1 is not allowed (an integer >= 0 (iterations; 0: only at the end))"),
    ("job: {batch: 30}", "job.batch: 30 is not allowed (a multiple of the 4 workers, the global batch splits "
                         "evenly over them)"),
    ("topology: {kind: fattree, fabric_bw: 50}",
     "topology.fabric_bw: 50.0 is not allowed (the host_bw 100: all links of a fat-tree have one rate)"),
    ("job: {loss_bound: 1.5}", "job.loss_bound: 1.5 is not allowed (a fraction in [0, 1) (transport mlt))"),
    ("job: {transport: quic}", "job.transport: 'quic' is not allowed (one of tcp, mlt)"),
    ("job: {loss_bound: 0.05}", "job.loss_bound: 0.05 is not allowed (0 with transport tcp (a loss bound "
                                "needs the loss-tolerant transport: job.transport mlt))"),
    ("job: {spray: blind}",
     "job.spray: 'blind' is not allowed (adaptive unless job.transport mlt: only mlt draws a source port per "
     "datagram)"),
    ("job: {transport: mlt, spray: blind}",
     "job.spray: 'blind' is not allowed (adaptive unless controller.lb spray: on a per-flow fabric mlt sends each "
     "peer's datagrams from one source port, there is nothing to spray)"),
    ("job: {transport: mlt, spray: hashed}", "job.spray: 'hashed' is not allowed (one of adaptive, blind)"),
    ("job: {transport: mlt, drop_marking: true}",
     "job.drop_marking: true is not allowed (false unless job.loss_bound > 0 with transport mlt)"),
    ("job: {drop_marking: 1}", "job.drop_marking: 1 is not allowed (true or false (transport mlt with "
                               "loss_bound > 0))"),
    ("job: {task: inference}", "job.task: 'inference' is not allowed (train unless job.mode ps: an all-reduce "
                               "job has no parameter server)"),
    ("job: {ps_update: iteration}", "job.ps_update: 'iteration' is not allowed (tensor unless job.mode ps: an "
                                    "all-reduce job has no parameter server)"),
    ("job: {backward: caramel}", "job.backward: 'caramel' is not allowed (reverse unless job.model is a profile: "
                                 "the numpy network is a chain, its backprop has no order to choose)"),
    ("job: {mode: ps, task: serve}", "job.task: 'serve' is not allowed (one of train, inference)"),
    ("job: {mode: allreduce, send_order: tac}",
     "job.send_order: 'tac' is not allowed (ready, best or caramel, bytescheduler in allreduce mode)"),
    ("job: {mode: ps, send_order: caramel}",
     "job.send_order: 'caramel' is not allowed (ready, best or random, priority, tic, tac in ps mode)"),
    ("job: {target_accuracy: 0}", "job.target_accuracy: 0 is not allowed (a fraction in (0, 1])"),
    ("job: {mode: ps, ps_slice_bytes: -4}", "job.ps_slice_bytes: -4 is not allowed " + SLICE_RULE),
    ("job: {mode: ps, ps_slice_bytes: 4098}", "job.ps_slice_bytes: 4098 is not allowed " + SLICE_RULE),
    ("background: [{dst: h2}]",
     "background.0.src: missing (a host name or a list of at most 10 distinct host names (incast))"),
    ("background: [{src: h1, dst: h1}]", "background.0.dst: 'h1' is not allowed (a host other than the sources)"),
    ("background: [{src: [h1, h7], dst: h2}]", "background.0.src.1: 'h7' is not allowed (a host of h1..h4)"),
    ("background: [{src: h1, dst: h2, proto: sctp}]",
     "background.0.proto: 'sctp' is not allowed (one of tcp, udp)"),
    ("faults: [{kind: link_down, link: h1-spine1, at_s: 1, duration_s: 2}]",
     "faults.0.link: 'h1-spine1' is not allowed (a link of the topology written a-b, e.g. h1-leaf1)"),
    ("faults: [{kind: loss, link: leaf1-spine1, at_s: 1, duration_s: 2}]",
     "faults.0.loss_percent: missing (a percentage 0.01..100, nftables drops in 1/10000ths; only with kind loss)"),
    ("faults: [{kind: rate, link: leaf1-spine1, at_s: 1, duration_s: 2, rate_mbps: 10, loss_percent: 1}]",
     "faults.0.loss_percent: 1.0 is not allowed (only with kind loss)"),
    ("faults: [{kind: link_down, link: leaf1-spine1, duration_s: 2}]",
     "faults.0.at_s: missing (seconds after the job starts, 0..86400)"),
    ("cluster: {servers: [s2, localhost]}",
     "cluster.servers: [s2, localhost] is not allowed ([] for this machine alone, or distinct server names, the "
     "first localhost (it runs the controller and keeps the results))"),
    ("cluster: {servers: [localhost, s2, s3, s4, s5]}",
     "cluster.placement: switchbin gives every server a switch; 5 servers but 4 switches (list fewer servers or "
     "use roundrobin)"),
    ("repetitons: 3", "repetitons: unknown field (did you mean repetitions?)"),
    ("repetitions: 0", "repetitions: 0 is not allowed (an integer 1..100)"),
    ("flavour: x", "flavour: unknown field (allowed: topology, controller, cluster, job, jobs, background, faults, "
                   "name, description, repetitions, matrix, include, exclude, confidence, stolen_retries, live)"),
    ("stolen_retries: 4", "stolen_retries: 4 is not allowed (an integer 0..3: how many more times a run runs after "
                          "the fidelity guard failed it while the hypervisor stole 2% or more of the CPUs)"),
    ("matrix: {lb: {values: [ecmp, spray]}}",
     "matrix.lb.field: null is not allowed (the dotted field the scalar values set)"),
    ("matrix: {lb: {field: controller.lb, values: [ecmp, sprey]}}",
     "controller.lb: 'sprey' is not allowed (one of ecmp, spray, single) (in run lb=sprey)"),
    ("matrix: {scheme: {values: {fast: {controller.lbb: spray}}}}",
     "controller.lbb: unknown field (did you mean lb?) (in run scheme=fast)"),
    ("matrix: {scheme: {values: {a: {}, b: {}}, baseline: c}}",
     "matrix.scheme.baseline: 'c' is not allowed (one of a, b)"),
    ("matrix: {scheme: {values: {a: {repetitions: 2}}}}",
     "matrix.scheme.values.a: 'repetitions' is not allowed (fields of topology, controller, cluster, "
     "job, jobs, background, faults)"),
    ("matrix: {mode: {values: {a: {}}}}",
     "matrix: 'mode' is not allowed (an axis name that is not a runs.csv column, unless it is the "
     "scalar axis over that column's field (job.mode))"),
    ("matrix: {bytes_sent: {field: job.batch, values: [1, 2]}}",
     "matrix: 'bytes_sent' is not allowed (an axis name that is not a runs.csv column, unless it is "
     "the scalar axis over that column's field (-))"),
    ("matrix: {scheme: {values: []}}",
     "matrix.scheme.values: [] is not allowed (a non-empty list of scalars (with field) or mapping "
     "of labels to overrides)"),
    ("matrix: {scheme: {values: {'a b': {}}}}",
     "matrix.scheme.values: 'a b' is not allowed (labels of letters, digits and _.+-)"),
    ("matrix: {a: {values: {x: {}}, baseline: x}, b: {values: {y: {}}, baseline: y}}",
     "matrix: [a, b] is not allowed (a baseline on one axis at most)"),
    # Placement depends on the point of the matrix: valid alone, invalid with mode ps.
    ("job: {workers: 4}\nmatrix: {mode: {field: job.mode, values: [allreduce, ps]}}",
     "job.workers: 4 is not allowed (at most 3: 4 hosts, 1 of them servers) (in run mode=ps)"),
    ("- a list", "spec: [a list] is not allowed (a YAML mapping with topology, controller, job, ...)"),
]


@pytest.mark.parametrize("text,message", MALFORMED, ids=[message.split(":")[0] for _, message in MALFORMED])
def test_malformed_spec_is_rejected_with_one_line_naming_the_field(text, message):
    with pytest.raises(SpecError) as error:
        parse_spec(yaml.safe_load(text))
    assert str(error.value) == f"spec error: {message}"
    assert "\n" not in str(error.value)


PIECE_RULE = "1024..1073741824, smaller pieces cost a message per 256 floats or fewer"
SECONDS = "seconds, > 0 and at most 86400"
MACHINE = "one machine runs at most 128 hosts and 64 switches"
# Specs that once validated and then failed (or never ended) at run time, or exhausted the validator.
RUN_TIME_FAILURES = [
    ("topology: {spines: 5000}", "topology.spines: 5000 is not allowed (at most 4095 spine switches, the DPIDs of "
                                 "one tier)"),
    ("topology: {leaves: 1000000, hosts_per_leaf: 1000000}",  # 10^12 hosts: refused before any is named
     "topology.leaves: 1000000 is not allowed (at most 4095 leaf switches, the DPIDs of one tier)"),
    ("topology: {kind: fattree, k: 92}", "topology.k: 92 is not allowed (at most 4095 edge switches, the DPIDs of "
                                         "one tier; this makes 4232)"),
    ("topology: {hosts_per_leaf: 2000}", "topology.hosts_per_leaf: 2000 is not allowed (at most 1024 ports per "
     "switch, well inside OpenFlow's 0xff00; each leaf would have 2002: hosts_per_leaf + spines)"),
    ("topology: {leaves: 1500}", "topology.leaves: 1500 is not allowed (at most 1024 ports per switch, well inside "
                                 "OpenFlow's 0xff00; each spine would have 1500: leaves)"),
    ("topology: {leaves: 1000, hosts_per_leaf: 1000}", "topology.leaves: 1000 is not allowed (Linux interface "
                                                       "names have at most 15 characters; leaf1000-eth1002 has 16)"),
    ("topology: {leaves: 2, hosts_per_leaf: 65}",
     f"topology.hosts_per_leaf: 65 is not allowed ({MACHINE}; this makes 130 hosts and 4 switches)"),
    ("topology: {leaves: 65, hosts_per_leaf: 1}",
     f"topology.leaves: 65 is not allowed ({MACHINE}; this makes 65 hosts and 67 switches)"),
    ("topology: {spines: 40, leaves: 40, hosts_per_leaf: 1}",
     f"topology.spines: 40 is not allowed ({MACHINE}; this makes 40 hosts and 80 switches)"),
    ("topology: {kind: fattree, k: 8}", f"topology.k: 8 is not allowed ({MACHINE}; this makes 128 hosts and 80 "
                                        "switches)"),
    ("topology: {fabric_bw: .inf}", "topology.fabric_bw: .inf is not allowed " + LINK_RATE),
    ("topology: {host_bw: .nan}", "topology.host_bw: .nan is not allowed " + LINK_RATE),
    ("topology: {host_bw: 1.0e-9}", "topology.host_bw: 1.0e-09 is not allowed " + LINK_RATE),
    ("topology: {host_bw: 0.79}", "topology.host_bw: 0.79 is not allowed " + LINK_RATE),
    ("topology: {host_bw: 100001}", "topology.host_bw: 100001 is not allowed " + LINK_RATE),
    ("topology: {host_bw: 1" + "0" * 400 + "}",  # beyond a float
     "topology.host_bw: " + "1" + "0" * 59 + "... is not allowed " + LINK_RATE),
    ("controller: {stats_interval_s: 3600}", "controller.stats_interval_s: 3600 is not allowed (a period in "
     "seconds, 0.1..60: a run waits up to two periods for its last port statistics)"),
    ("job: {fusion: '²'}", "job.fusion: '²' is not allowed (none, horovod, ddp or a bucket size in bytes as a "
                           f"string, {PIECE_RULE} (allreduce))"),
    ("job: {fusion: '512'}", "job.fusion: '512' is not allowed (none, horovod, ddp or a bucket size in bytes as a "
                             f"string, {PIECE_RULE} (allreduce))"),
    ("job: {fusion: '" + "9" * 5000 + "'}", "job.fusion: '" + "9" * 59 + "... is not allowed (none, horovod, ddp "
                                            f"or a bucket size in bytes as a string, {PIECE_RULE} (allreduce))"),
    ("job: {partition_bytes: 4}", f"job.partition_bytes: 4 is not allowed (a byte count {PIECE_RULE} (allreduce: "
                                  "caramel's first bucket and pipeline segment, bytescheduler's partition))"),
    ("job: {mode: ps, ps_slice_bytes: 1020}", "job.ps_slice_bytes: 1020 is not allowed " + SLICE_RULE),
    ("job: {iterations: 100000}", "job.iterations: 100000 is not allowed (an integer 1..10000)"),
    ("job: {batch: 8192}", "job.batch: 8192 is not allowed (an integer 1..4096 (global batch, split evenly over "
                           "the workers))"),
    ("job: {model: {width: 4096}}",
     "job.model.width: 4096 is not allowed (an integer 1..1024 (mlp only: hidden units per layer))"),
    ("job: {model: {depth: 100}}", "job.model.depth: 100 is not allowed (an integer 1..8 (mlp only: hidden layers))"),
    ("job: {lr: .inf}", "job.lr: .inf is not allowed (a finite learning rate > 0)"),
    ("job: {seed: 4294967296}", "job.seed: 4294967296 is not allowed (an integer 0..4294967295)"),
    ("{repetitions: 2, job: {seed: 4294967295}}", "job.seed: 4294967295 is not allowed (at most 4294967294 with 2 "
                                                  "repetitions: seeds grow by one per repetition up to "
                                                  "2**32 - 1)"),
    ("background: [{src: h1, dst: h2, rate_mbps: .inf}]", "background.0.rate_mbps: .inf is not allowed (0: as "
     "fast as it goes, or a rate in Mbit/s 0.001..100000; iperf3 counts whole bits per second)"),
    ("background: [{src: h1, dst: h2, rate_mbps: 1.0e-9}]", "background.0.rate_mbps: 1.0e-09 is not allowed (0: "
     "as fast as it goes, or a rate in Mbit/s 0.001..100000; iperf3 counts whole bits per second)"),
    ("background: [{src: h1, dst: h2, start_s: .inf}]", "background.0.start_s: .inf is not allowed (seconds after "
                                                        "the job starts, 0..86400)"),
    ("background: [{src: h1, dst: h2, duration_s: 100000}]",
     f"background.0.duration_s: 100000 is not allowed ({SECONDS})"),
    ("background: [" + ", ".join(["{src: h1, dst: h2}"] * 101) + "]",
     "background: [{dst: h2, src: h1}, {dst: h2, src: h1}, {dst: h2, src: h1},... is not allowed (a list of "
     "at most 100 flows: their iperf3 ports stay below the job's)"),
    ("topology: {hosts_per_leaf: 6}\nbackground: [{src: [h1, h2, h3, h4, h5, h6, h7, h8, h9, h10, h11], dst: h12}]",
     "background.0.src: [h1, h2, h3, h4, h5, h6, h7, h8, h9, h10, h11] is not allowed (a host name or a list of at "
     "most 10 distinct host names (incast))"),
    ("faults: [{kind: link_down, link: leaf1-spine1, at_s: .inf, duration_s: 1}]",
     "faults.0.at_s: .inf is not allowed (seconds after the job starts, 0..86400)"),
    ("faults: [{kind: link_down, link: leaf1-spine1, at_s: 0, duration_s: .nan}]",
     f"faults.0.duration_s: .nan is not allowed ({SECONDS})"),
    ("faults: [{kind: rate, link: leaf1-spine1, at_s: 0, duration_s: 1, rate_mbps: 0.5}]",
     "faults.0.rate_mbps: 0.5 is not allowed (only with kind rate: " + LINK_RATE[1:]),
    ("faults: [{kind: loss, link: leaf1-spine1, at_s: 0, duration_s: 1, loss_percent: 0.001}]",
     "faults.0.loss_percent: 0.001 is not allowed (a percentage 0.01..100, nftables drops in 1/10000ths; only "
     "with kind loss)"),
    ("repetitions: 100000000", "repetitions: 100000000 is not allowed (an integer 1..100)"),
    ("repetitions: 60\nmatrix: {mode: {field: job.mode, values: [allreduce, ps]}, lb: {field: controller.lb, "
     "values: [ecmp, spray, single]}, seeds: {field: job.seed, values: [1, 2, 3]}}",
     "repetitions: 60 is not allowed (at most 55 with the matrix's 18 points: at most 1000 runs in all)"),
    ("matrix: {" + ", ".join(f"a{i}: {{field: job.seed, values: [{', '.join(map(str, range(10)))}]}}"
                             for i in range(6)) + "}",
     "matrix: 1000000 points is not allowed (at most 1000 runs in all)"),
    ("matrix: {" + ", ".join(f"a{i}: {{field: job.seed, values: [0, 1]}}" for i in range(8)) + "}",
     "matrix: [a0, a1, a2, a3, a4, a5, a6, a7] is not allowed (at most 6 axes)"),
    ("job: " + "[" * 40 + "]" * 40, "job" + ".0" * 31 + ": is nested deeper than 32 levels"),
]


@pytest.mark.parametrize("text,message", RUN_TIME_FAILURES,
                         ids=[f"{i}-{message.split(':')[0]}" for i, (_, message) in enumerate(RUN_TIME_FAILURES)])
def test_spec_that_would_fail_at_run_time_is_rejected_naming_the_field(text, message):
    with pytest.raises(SpecError) as error:
        parse_spec(yaml.safe_load(text))
    assert str(error.value) == f"spec error: {message}"
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("document", [
    {"topology": {"spines": 4, "leaves": 8, "hosts_per_leaf": 4}, "job": {"batch": 64}},  # 32 hosts, 12 switches
    {"topology": {"leaves": 2, "hosts_per_leaf": 64}, "job": {"batch": 128}},  # the most hosts
    {"topology": {"spines": 32, "leaves": 32, "hosts_per_leaf": 1}, "job": {"batch": 64}},  # the most switches
    {"topology": {"kind": "fattree", "k": 6}, "job": {"batch": 54}},
    {"topology": {"host_bw": 0.8, "fabric_bw": 100000}},
    {"job": {"fusion": "1024", "iterations": 10000, "batch": 4096, "seed": 4294967196}},
    {"job": {"send_order": "caramel", "partition_bytes": 1024}},
    {"job": {"collective": "tree", "partition_bytes": 1024}},
    {"job": {"collective": "hierarchical", "workers": ["h1", "h2", "h3"]}},  # h3 alone on its leaf, h1 and h2 not
    {"job": {"mode": "ps", "ps_slice_bytes": 1024}, "repetitions": 100},
    {"background": [{"src": "h1", "dst": "h2", "rate_mbps": 0.001, "start_s": 86400, "duration_s": 86400}]},
])
def test_sizes_at_the_limits_are_allowed(document):
    assert len(parse_spec(document).runs) in (1, 100)


def test_empty_spec_is_one_run_of_defaults():
    spec = parse_spec({})
    assert [run.run_id for run in spec.runs] == ["rep=1"]
    run = spec.runs[0]
    assert run.topology.kind == "leafspine" and run.controller.lb == "ecmp" and run.job.mode == "allreduce"
    assert run.config.worker_hosts == ["h1", "h2", "h3", "h4"] and run.config.server_hosts == []


SHIPPED_SPEC_RUNS = {"smoke": 2, "default": 24, "headline": 65, "ablation": 53, "headline_contended": 18,
                     "loss_sweep": 12, "tictac": 24, "caramel": 18, "lossy_allreduce": 6, "scale": 6, "spraying": 24,
                     "bring_your_own": 2, "collectives": 144, "multijob": 18,
                     "multijob_interleave": 12, "multijob_paths": 15}


@pytest.mark.parametrize("name,runs", SHIPPED_SPEC_RUNS.items())
def test_shipped_specs_are_valid(name, runs):
    spec = load_spec(REPO / "experiments" / f"{name}.yaml")
    assert spec.name == name
    assert len(spec.runs) == runs


def test_every_shipped_spec_is_checked():
    assert {path.stem for path in (REPO / "experiments").glob("*.yaml")} == set(SHIPPED_SPEC_RUNS)


def test_default_spec_compares_load_balancing_with_the_transport_held():
    spec = load_spec(REPO / "experiments" / "default.yaml")
    assert spec.baseline == ("scheme", "tcp-ecmp")
    schemes = {run.axes["scheme"]: (run.job.transport, run.controller.lb) for run in spec.runs}
    assert schemes == {"tcp-ecmp": ("tcp", "ecmp"), "mlt-ecmp": ("mlt", "ecmp"), "mlt-spray": ("mlt", "spray"),
                       "mlt-single": ("mlt", "single")}
    against = {run.axes["scheme"]: spec.reference(run.axes)["scheme"] for run in spec.runs
               if spec.reference(run.axes)}
    assert against == {"mlt-ecmp": "tcp-ecmp", "mlt-spray": "mlt-ecmp", "mlt-single": "mlt-ecmp"}
    ps_run = next(run for run in spec.runs if run.job.mode == "ps")
    assert ps_run.config.worker_hosts == ["h1", "h2", "h3"] and ps_run.config.server_hosts == ["h4"]


MATRIX_SPEC = """
job: {seed: 7}
repetitions: 2
matrix:
  scheme:
    values:
      base: null
      fast: {controller.lb: single, job: {model: {width: 8}}}
    baseline: base
  mode: {field: job.mode, values: [allreduce, ps]}
"""


def test_ps_slice_bytes_defaults_to_whole_layers_and_is_taken_in_ps_mode():
    assert parse_spec({}).runs[0].job.ps_slice_bytes == 0
    assert parse_spec({"job": {"mode": "ps", "ps_slice_bytes": 4096}}).runs[0].job.ps_slice_bytes == 4096
    with pytest.raises(SpecError, match=r"^spec error: job\.ps_slice_bytes: 4096 is not allowed \(0 here: only a "
                                        r"parameter server slices layers"):
        parse_spec({"job": {"ps_slice_bytes": 4096}})


def test_matrix_expands_cartesian_product_with_repetitions_outermost():
    spec = parse_spec(yaml.safe_load(MATRIX_SPEC))
    assert [run.run_id for run in spec.runs] == [
        f"scheme={scheme},mode={mode},rep={rep}"
        for rep in (1, 2) for scheme in ("base", "fast") for mode in ("allreduce", "ps")]
    assert [run.index for run in spec.runs] == list(range(8))
    assert spec.baseline == ("scheme", "base")


def test_matrix_overrides_merge_into_sections_and_seeds_follow_repetition():
    runs = {run.run_id: run for run in parse_spec(yaml.safe_load(MATRIX_SPEC)).runs}
    fast = runs["scheme=fast,mode=ps,rep=2"]
    assert fast.controller.lb == "single" and fast.job.mode == "ps"
    assert fast.job.model.width == 8 and fast.job.model.depth == 2  # merged, not replaced
    assert runs["scheme=base,mode=ps,rep=2"].job.model.width == 64
    assert {run.job.seed for run in runs.values() if run.rep == 1} == {7}
    assert {run.job.seed for run in runs.values() if run.rep == 2} == {8}


def test_matrix_points_validate_again_only_the_sections_they_override():
    flows = [{"src": "h1", "dst": "h2"}] * 100
    spec = parse_spec({"background": flows, "repetitions": 2,
                       "matrix": {"seed": {"field": "job.seed", "values": list(range(20))},
                                  "lr": {"field": "job.lr", "values": [0.1 * i for i in range(1, 21)]}}})
    assert len(spec.runs) == 800
    assert len({id(run.config.background) for run in spec.runs}) == 1  # built once, for the base
    with pytest.raises(SpecError, match=r"^spec error: background\.0\.dst: 'h9' is not allowed \(a host of "
                                        r"h1\.\.h4\) \(in run flows=bad\)$"):
        parse_spec({"background": flows,
                    "matrix": {"flows": {"values": {"ok": {}, "bad": {"background": [{"src": "h1", "dst": "h9"}]}}}}})


def test_scalar_axis_labels_numbers_as_yaml():
    spec = parse_spec({"job": {"transport": "mlt"},
                       "matrix": {"bound": {"field": "job.loss_bound", "values": [0, 0.5]}}})
    assert [run.run_id for run in spec.runs] == ["bound=0,rep=1", "bound=0.5,rep=1"]
    assert spec.runs[1].job.loss_bound == 0.5


def test_resolved_document_round_trips():
    spec = parse_spec(yaml.safe_load(MATRIX_SPEC), ["topology.host_bw=50"])
    again = parse_spec(yaml.safe_load(yaml.safe_dump(spec.resolved_document(), sort_keys=False)))
    assert again.runs == spec.runs
    assert again.runs[0].topology.host_bw == 50.0


def test_set_overrides_fields_with_yaml_values():
    spec = parse_spec({}, ["topology.spines=4", "job.workers=[h2, h3]", "job.model={name: vgg16}",
                           "background=[{src: h1, dst: h4, rate_mbps: 20}]"])
    run = spec.runs[0]
    assert run.topology.spines == 4
    assert run.config.worker_hosts == ["h2", "h3"]
    assert run.job.model.name == "vgg16"
    assert run.config.background[0].rate_mbps == 20.0 and run.config.background[0].proto == "tcp"


@pytest.mark.parametrize("assignment,message", [
    ("topology.spines", "--set topology.spines: expected key=value, e.g. topology.spines=4"),
    ("topology.spine=3", "topology.spine: unknown field (did you mean spines?)"),
    ("job.mode.x=1", "job.mode: 'allreduce' has no fields, so job.mode.x cannot be set"),
    ("topology..spines=1", "topology..spines: 1 is not allowed (a dotted field name such as topology.spines)"),
    ("controller.lb=[ecmp", "controller.lb: '[ecmp' is not allowed (a YAML value: while parsing a flow "
                            "sequence)"),
])
def test_bad_set_is_a_spec_error(assignment, message):
    with pytest.raises(SpecError) as error:
        parse_spec({"job": {"mode": "allreduce"}}, [assignment])
    assert str(error.value) == f"spec error: {message}"


def test_matrix_value_wins_over_set():
    spec = parse_spec({"matrix": {"lb": {"field": "controller.lb", "values": ["single"]}}},
                      ["controller.lb=spray", "job.transport=mlt"])
    assert spec.base.controller.lb == "spray" and spec.runs[0].controller.lb == "single"


@given(st.integers(min_value=-1000, max_value=1000))
def test_set_spines_accepts_exactly_the_counts_one_machine_runs(spines):
    assignment = [f"topology.spines={spines}"]
    if 1 <= spines <= 62:  # and 2 leaves: 64 switches
        assert parse_spec({}, assignment).runs[0].topology.spines == spines
    else:
        with pytest.raises(SpecError, match=r"topology.spines: -?\d+ is not allowed"):
            parse_spec({}, assignment)


def test_topology_links_count_every_cable():
    leafspine = topology_links(Topology(spines=2, leaves=3, hosts_per_leaf=2))
    assert len(leafspine) == 3 * 2 + 3 * 2
    assert frozenset({"h6", "leaf3"}) in leafspine and frozenset({"leaf3", "spine2"}) in leafspine
    fattree = topology_links(Topology(kind="fattree", k=4))
    assert len(fattree) == 16 + 16 + 16  # host-edge, edge-agg, agg-core for k=4
    assert frozenset({"h16", "edge8"}) in fattree and frozenset({"agg8", "core4"}) in fattree


def test_fault_on_fattree_link_is_valid():
    spec = parse_spec({"topology": {"kind": "fattree", "k": 4},
                       "faults": [{"kind": "loss", "link": "core1-agg1", "at_s": 0, "duration_s": 5,
                                   "loss_percent": 1}]})
    assert spec.runs[0].config.faults[0].loss_percent == 1.0
    assert len(spec.runs[0].config.hosts) == 16


@pytest.mark.parametrize("run_id,scheme", [
    ("scheme=spray,mode=ps,rep=2", "scheme=spray"), ("mode=ps,rep=1", "base"), ("a=1,b=x,rep=3", "a=1,b=x")])
def test_scheme_of_drops_rep_and_mode(run_id, scheme):
    assert scheme_of(run_id) == scheme


ALIAS_BOMB = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(  # "billion laughs": 10^10 values
    f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 10))
MERGE_BOMB = "a0: &a0 {x: 1}\n" + "".join(  # each merge doubles the pairs PyYAML would copy
    f"a{i}: &a{i} {{<<: [*a{i - 1}, *a{i - 1}]}}\n" for i in range(1, 40))


@pytest.mark.parametrize("content,problem", [
    (b"topology: {spines: 2\n", r"is not valid YAML \(while parsing a flow mapping .* line 1, column 11: "),
    (b"job: {seed: 2020-13-45}\n",
     r"is not valid YAML \(month must be in 1\.\.12 in .*, line 1, column 13: job: {seed: 2020-13-45} \^\)$"),
    (b"job: {seed: " + b"9" * 5000 + b"}\n",
     r"is not valid YAML \(Exceeds the limit \(4300 digits\) .*, line 1, column 13: job: {seed: 9+ \.\.\. \^\)$"),
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", r"is not a text file \(a NUL byte at offset 8\)$"),
    (b"name: caf\xe9\n", r"is not UTF-8 text \(byte 0xe9 at offset 9\)$"),
    (b"# a comment\n" * 30000, r"is more than 256 KiB, too large for a spec$"),
    (ALIAS_BOMB.encode(), r"is not allowed \(a3 has more than 10000 values with its aliases expanded\)$"),
    (MERGE_BOMB.encode(), r"is not allowed \(the document has more than 10000 values with its aliases expanded\)$"),
    (b"matrix: &m {a: {values: *m}}\n", r"is not allowed \(matrix\.a\.values contains itself \(a recursive alias\)\)$"),
    (b"job: " + b"[" * 100000, r"is not allowed \(the document is nested deeper than 32 levels at line 1, "
                               r"column 38\)$"),
    (b"".join(b"  " * i + b"k%d:\n" % i for i in range(100)), r"is not allowed \(the document is nested deeper "
                                                                  r"than 32 levels at line 32, column 63\)$"),
])
def test_file_that_is_no_spec_is_one_line(tmp_path, content, problem):
    path = tmp_path / "spec.yaml"
    path.write_bytes(content)
    with pytest.raises(SpecError) as error:
        load_spec(path)
    assert re.match(rf"spec error: {re.escape(str(path))}: {problem}", str(error.value)), str(error.value)
    assert "\n" not in str(error.value)


def test_aliases_within_limits_are_expanded(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text("job: {mode: ps}\nmatrix:\n  loss:\n    values:\n"
                    "      low: {faults: &faults [{kind: loss, link: h1-leaf1, at_s: 0, duration_s: 9, "
                    "loss_percent: 1}]}\n"
                    "      mlt: {job.transport: mlt, faults: *faults}\n")
    low, mlt = load_spec(path).runs
    assert low.config.faults == mlt.config.faults and low.config.faults[0].link == "h1-leaf1"
    assert (low.job.transport, mlt.job.transport) == ("tcp", "mlt")


@pytest.mark.parametrize("where,problem", [
    ("missing.yaml", "cannot be read (No such file or directory)"),
    (".", "cannot be read (Is a directory)"),
    ("/proc/self/mem", "cannot be read (Input/output error)"),  # opens, then fails to read
])
def test_unreadable_file_is_one_line(tmp_path, where, problem):
    path = tmp_path / where
    with pytest.raises(SpecError) as error:
        load_spec(path)
    assert str(error.value) == f"spec error: {path}: {problem}"


def test_set_value_within_the_same_limits():
    with pytest.raises(SpecError, match=r"^spec error: job: '\[\[\[.*\.\.\. is not allowed \(a YAML value: the "
                                        r"document is nested deeper than 32 levels at line 1, column 33\)$"):
        parse_spec({}, ["job=" + "[" * 1000])


def test_line_breaks_in_names_stay_escaped_on_the_one_line():
    with pytest.raises(SpecError) as error:
        parse_spec({"topology": {"spines\nleaves": 2}})
    assert str(error.value) == "spec error: topology.spines\\nleaves: unknown field (did you mean spines?)"


def test_documents_built_in_python_are_measured_too():
    shared: list = ["x"] * 10
    for _ in range(4):
        shared = [shared] * 10
    with pytest.raises(SpecError, match=r"^spec error: background\.0\.0: has more than 10000 values"):
        parse_spec({"background": [shared]})
    looped: dict = {}
    looped["job"] = looped
    with pytest.raises(SpecError, match=r"^spec error: job: contains itself \(a recursive alias\)$"):
        parse_spec(looped)


FIELD_NAMES = sorted({f.name for cls in (Header, RunConfig, Topology, Controller, Job, Model, Flow, Fault)
                      for f in dataclasses.fields(cls)} | {"field", "values", "baseline"})
SCALARS = (st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.floats() | st.text(max_size=10)
           | st.dates() | st.sampled_from(["ps", "mlt", "h1", "h4", "leaf1-spine1", "all", "fattree", "loss", "rate",
                                           "spray", "best", "1024", "none"]))
KEYS = (st.sampled_from(FIELD_NAMES) | st.sampled_from(["controller.lb", "job.mode", "topology.spines", "job.model"])
        | st.text(max_size=6) | st.integers(-3, 3))
YAMLISH = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=5),
                       max_leaves=30)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(KEYS, YAMLISH, max_size=6))
def test_random_documents_fail_only_with_one_line_spec_errors(document):
    try:
        parse_spec(document)
    except SpecError as error:
        assert "\n" not in str(error)


@settings(max_examples=200, deadline=None)
@given(st.text(st.sampled_from(list("ab1.: -[]{},&*!|>'\"\n#?%@`\t\\<=~")) | st.characters(), max_size=60))
def test_random_text_loads_or_fails_as_yaml(text):
    try:
        load_yaml(text)
    except yaml.YAMLError:
        pass


def test_fixture_spec_loads():
    spec = load_spec(FIXTURES / "two_schemes.yaml")
    assert len(spec.runs) == 8


FAULT = "{{kind: {kind}, link: {link}, at_s: {at}, duration_s: 10{extra}}}"
EXTRA = {"loss": ", loss_percent: 1", "rate": ", rate_mbps: 10", "link_down": ""}


@pytest.mark.parametrize("kind", ["loss", "rate", "link_down"])
def test_overlapping_faults_of_one_kind_on_one_link_are_refused(kind):
    """The link has one nftables table, one HTB rate and one carrier: the first fault's end would end
    the second's condition too, unrecorded."""
    faults = [FAULT.format(kind=kind, link="h1-leaf1", at=0, extra=EXTRA[kind]),
              FAULT.format(kind=kind, link="leaf1-h1", at=5, extra=EXTRA[kind])]
    with pytest.raises(SpecError) as error:
        parse_spec(yaml.safe_load(f"faults: [{', '.join(faults)}]"))
    assert str(error.value) == (
        f"spec error: faults.1.at_s: 5.0 is not allowed (a time outside 0..10 s, when faults.0 holds the same "
        f"link with a {kind} fault: a link has one loss rule, one rate and one carrier, the end of one fault "
        "would end the other's)")


def test_faults_of_one_link_may_follow_each_other_or_differ_in_kind():
    faults = [FAULT.format(kind="loss", link="h1-leaf1", at=0, extra=EXTRA["loss"]),
              FAULT.format(kind="loss", link="h1-leaf1", at=10, extra=EXTRA["loss"]),
              FAULT.format(kind="rate", link="h1-leaf1", at=5, extra=EXTRA["rate"]),
              FAULT.format(kind="loss", link="h2-leaf1", at=5, extra=EXTRA["loss"])]
    assert len(parse_spec(yaml.safe_load(f"faults: [{', '.join(faults)}]")).runs[0].config.faults) == 4


@pytest.mark.parametrize("labels,message", [
    ("{1: {}, '1': {}}", "matrix.case.values: '1' is not allowed (labels that print apart: 1 prints as 1 too)"),
    ("{1.0: {}, '1.0': {}}", "matrix.case.values: '1.0' is not allowed (labels that print apart: 1.0 prints as "
                             "1.0 too)"),
    ("{true: {}, 'true': {}}", "matrix.case.values: 'true' is not allowed (labels that print apart: true prints "
                               "as true too)"),
    ("{null: {}, 'null': {}}", "matrix.case.values: 'null' is not allowed (labels that print apart: null prints "
                               "as null too)"),
    ("[1, '1']", "matrix.case.values: '1' is not allowed (labels that print apart: 1 prints as 1 too)"),
])
def test_matrix_labels_that_print_alike_are_refused(labels, message):
    field = "field: job.seed, " if labels.startswith("[") else ""
    with pytest.raises(SpecError) as error:
        parse_spec(yaml.safe_load(f"matrix: {{case: {{{field}values: {labels}}}}}"))
    assert str(error.value) == f"spec error: {message}"


def test_matrix_baseline_is_the_label_as_printed():
    spec = parse_spec(yaml.safe_load("job: {transport: mlt, loss_bound: 0.1}\nmatrix: {marks: {field: "
                                     "job.drop_marking, values: [false, true], baseline: false}}"))
    assert spec.baseline == ("marks", "false")
    spec = parse_spec(yaml.safe_load("matrix: {case: {values: {null: {}, x: {}}, baseline: null}}"))
    assert [run.run_id for run in spec.runs] == ["case=null,rep=1", "case=x,rep=1"] and spec.baseline is None


@pytest.mark.parametrize("text,line", [
    ("job: {seed: 1, seed: 2}", 1),
    ("matrix:\n  case:\n    values: {1: {}, 1.0: {}}", 3),
    ("matrix:\n  case:\n    values: {1: {}, true: {}}", 3),
])
def test_a_key_twice_in_one_mapping_is_refused(tmp_path, text, line):
    """YAML would keep the last value silently (and 1, 1.0 and true are one key to Python)."""
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    with pytest.raises(SpecError, match=rf"^spec error: {path}: is not valid YAML \(found the key .+ twice in one "
                                        rf"mapping.* line {line}, column \d+"):
        load_spec(path)


def test_merge_keys_may_be_overridden(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text("job: {<<: {seed: 1, lr: 0.1}, seed: 2}\n")
    assert load_spec(path).runs[0].job.seed == 2
