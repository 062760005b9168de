"""The host-app command line: every bad number is one 'error: --FLAG: ...' line and exit status 2."""

import pytest
from hypothesis import given, strategies as st

from hostapps.__main__ import main
from hostapps.config import (ConfigError, build_parser, config_from_args, parse_addresses,
                             parse_layer_dscp, process_arguments)

BASE = ["worker", "--rank", "0", "--workers", "127.0.0.1:7101,127.0.0.1:7102"]
PS = ["--mode", "ps", "--servers", "127.0.0.1:7103"]


TIMEOUT = "seconds > 0, at most 86400: a peer silent this long is an error"
LINK = "Mbit/s > 0, at most 1000000: the host's link (mlt pacing, profile timing)"
SCALE = "a fraction of the profile's tensor sizes in (0, 1]"
TAG = ("an integer 0..4294967295: the job's number, in every frame it sends, so that jobs sharing hosts never take "
       "each other's messages")
PIECES = "1024..1073741824, smaller pieces cost a message per 256 floats or fewer"
FUSION = f"none, horovod, ddp or a bucket size in bytes as a string, {PIECES} (allreduce)"
LAYER_DSCP = "is not TENSOR:DSCP with TENSOR 0..4294967295 and DSCP 0..63"


@pytest.mark.parametrize("args, message", [
    (["--timeout", "nan"], f"--timeout: nan is not allowed ({TIMEOUT})"),
    (["--timeout", "inf"], f"--timeout: inf is not allowed ({TIMEOUT})"),
    (["--timeout", "-1"], f"--timeout: -1 is not allowed ({TIMEOUT})"),
    (["--timeout", "1e300"], f"--timeout: 1e300 is not allowed ({TIMEOUT})"),
    (["--lr", "nan"], "--lr: nan is not allowed (a finite learning rate > 0)"),
    (["--lr", "inf"], "--lr: inf is not allowed (a finite learning rate > 0)"),
    (["--scale", "nan"], f"--scale: nan is not allowed ({SCALE})"),
    (["--scale", "2"], f"--scale: 2 is not allowed ({SCALE})"),
    (["--link-mbps", "inf"], f"--link-mbps: inf is not allowed ({LINK})"),
    (["--link-mbps", "0"], f"--link-mbps: 0 is not allowed ({LINK})"),
    (["--quiet-ms", "nan"], "--quiet-ms: nan is not allowed (milliseconds > 0, at most --timeout (mlt: silence "
                            "after which a message within the loss bound is complete))"),
    (["--quiet-ms", "5000", "--timeout", "4"], "--quiet-ms: 5000 is not allowed (milliseconds > 0, at most "
                                               "--timeout)"),
    (["--momentum", "nan"], "--momentum: nan is not allowed (a fraction in [0, 1))"),
    (["--loss-bound=-inf"], "--loss-bound: -inf is not allowed (a fraction in [0, 1) (transport mlt))"),
    (["--loss-bound", "1"], "--loss-bound: 1 is not allowed (a fraction in [0, 1) (transport mlt))"),
    (["--loss-bound", "0.1"], "--loss-bound: 0.1 is not allowed (0 with transport tcp (a loss bound needs the "
                              "loss-tolerant transport: --transport mlt))"),
    (["--rank", "2²"], "--rank: 2² is not allowed (this process's index in --workers or --servers)"),
    (["--rank", "2"], "--rank: 2 is out of range for 2 workers"),
    (["--rank", "-1"], "--rank: -1 is not allowed (this process's index in --workers or --servers)"),
    (["--tag", "-1"], f"--tag: -1 is not allowed ({TAG})"),
    (["--tag", "4294967296"], f"--tag: 4294967296 is not allowed ({TAG})"),
    (["--tag", "nan"], f"--tag: nan is not allowed ({TAG})"),
    (["--seed", "-1"], "--seed: -1 is not allowed (an integer 0..4294967295)"),
    (["--seed", "4294967296"], "--seed: 4294967296 is not allowed (an integer 0..4294967295)"),
    (["--eval-every", "-5"], "--eval-every: -5 is not allowed (an integer >= 0 (iterations; 0: only at the end))"),
    (["--workers", "127.0.0.1:7²"], "--workers: bad address '127.0.0.1:7²' (expected host:port, port 1..65535)"),
    (["--workers", "127.0.0.1:70000"], "--workers: bad address '127.0.0.1:70000' (expected host:port, port "
                                       "1..65535)"),
    (["--mode", "ps", "--servers", "127.0.0.1:0"], "--servers: bad address '127.0.0.1:0' (expected host:port, "
                                                   "port 1..65535)"),
    (["--mtu-payload", "65004"], "--mtu-payload: 65004 is not allowed (a multiple of 4 in 64..65000 (mlt: payload "
                                 "bytes per datagram, the same in every process))"),
    (["--sport-range", "0"], "--sport-range: 0 is not allowed (an integer 1..1024 (mlt: UDP source ports a "
                             "sender sprays over; 1 on a per-flow fabric))"),
    (["--fusion", "2²"], f"--fusion: 2² is not allowed ({FUSION})"),
    (["--fusion", "٣"], f"--fusion: ٣ is not allowed ({FUSION})"),
    (["--fusion", "512"], f"--fusion: 512 is not allowed ({FUSION})"),
    (["--layer-dscp", "0:2²"], f"--layer-dscp: '0:2²' {LAYER_DSCP}"),
    (["--layer-dscp", "4294967296:8"], f"--layer-dscp: '4294967296:8' {LAYER_DSCP}"),
    (["--iterations", "1.5"], "--iterations: 1.5 is not allowed (an integer 1..10000)"),
    (["--model", "alexnet"], "--model: alexnet is not allowed (one of mlp, resnet50, vgg16, bert_base, inception_v3, "
                             "bert_base_tf, trace)"),
    (["--send-order", "tac"], "--send-order: 'tac' is not allowed (ready, best or caramel, bytescheduler in "
                              "allreduce mode)"),
    (["--transport", "quic"], "--transport: quic is not allowed (one of tcp, mlt)"),
    (["--drop-marking"], "--drop-marking: true is not allowed (false unless --loss-bound > 0 with transport mlt)"),
    (["--collective", "butterfly"], "--collective: butterfly is not allowed (one of ring, halving_doubling, "
                                    "hierarchical, tree)"),
    (["--collective", "hierarchical"], "--leaves: 0 leaves for 2 workers (collective hierarchical needs the leaf "
                                       "of every worker)"),
    (["--leaves", "1,2"], "--leaves: not allowed with collective ring (only hierarchical and tree read it)"),
    (["--collective", "tree", "--leaves", "1,2,1"], "--leaves: 3 leaves for 2 workers (the leaf of every worker, "
                                                     "or none)"),
    (["--collective", "hierarchical", "--leaves", "1,x"], "--leaves: 'x' is not a leaf number 0..999999999"),
    (["--collective", "tree", *PS], "--collective: 'tree' is not allowed ('ring' here: only an all-reduce job "
                                    "has one; ps mode pushes to and pulls from its servers, so it would change "
                                    "nothing)"),
    (["--partition-bytes", "4096"], "--partition-bytes: 4096 is not allowed (65536 here: only caramel's and "
                                    "bytescheduler's all-reduce units and the halving_doubling, hierarchical and tree "
                                    "all-reduces' pipeline segments use it, not send order ready with collective ring "
                                    "in allreduce mode, so it would change nothing)"),
    (["--bogus", "1"], "unrecognized arguments: --bogus 1"),
])
def test_a_bad_number_is_one_line_naming_its_flag(args, message, capsys):
    argv = [*BASE, *args]
    with pytest.raises(ConfigError) as error:
        config_from_args(argv)
    assert str(error.value) == message
    assert main(argv) == 2
    assert capsys.readouterr().err == f"error: {message}\n"


def test_good_numbers_pass():
    cfg = config_from_args([*BASE, "--timeout", "86400", "--tag", "4294967295", "--seed", "4294967295",
                            "--link-mbps", "1e6", "--quiet-ms", "0.5", "--loss-bound", "0.5", "--fusion", "1024",
                            "--transport", "mlt",
                            "--layer-dscp", "4294967295:63", "--workers", "127.0.0.1:1,127.0.0.1:65535"])
    assert (cfg.tag, cfg.seed, cfg.fusion_bytes, cfg.layer_dscp) == (2**32 - 1, 2**32 - 1, 1024, {2**32 - 1: 63})
    assert cfg.workers == [("127.0.0.1", 1), ("127.0.0.1", 65535)]


def test_layer_dscp_argument():
    assert parse_layer_dscp("") == {}
    assert parse_layer_dscp("0:48,1:40,7:16") == {0: 48, 1: 40, 7: 16}
    for bad in ("0:64", "a:1", "3", "1:-2"):
        with pytest.raises(ValueError, match="is not TENSOR:DSCP"):
            parse_layer_dscp(bad)


@given(st.text(st.characters(blacklist_characters=",:"), max_size=8))
def test_any_port_text_is_an_address_or_one_error(port):
    try:
        addresses = parse_addresses(f"10.0.0.1:{port}")
    except ValueError as e:
        assert str(e).startswith("bad address")
        return
    assert addresses == [("10.0.0.1", int(port))] and port.isascii() and 0 < int(port) < 65536


@given(st.text(max_size=12))
def test_any_layer_dscp_text_is_a_mapping_or_one_error(text):
    try:
        mapping = parse_layer_dscp(text)
    except ValueError as e:
        assert "is not TENSOR:DSCP" in str(e)
        return
    assert all(0 <= tensor < 2**32 and 0 <= dscp < 64 for tensor, dscp in mapping.items())


def test_the_runners_command_line_gives_back_the_config():
    """A knob is written once: the command line the runner writes is read back into the same config."""
    cfg = config_from_args([*BASE, *PS[:2], "--servers", "127.0.0.1:7103", "--model", "resnet50", "--scale",
                            "0.5", "--lr", "0.125", "--transport", "mlt", "--loss-bound", "0.05", "--drop-marking",
                            "--send-order", "best", "--layer-dscp", "0:48,3:40", "--out", "/tmp/x"])
    assert config_from_args(["worker", *process_arguments(cfg)]) == cfg
    assert cfg.order == "tac", "best at a parameter server"
    cfg = config_from_args([*BASE, "--collective", "hierarchical", "--leaves", "3,1"])
    assert config_from_args(["worker", *process_arguments(cfg)]) == cfg and cfg.leaves == [3, 1]


def test_every_knob_is_a_flag():
    flags = {action.option_strings[0] for action in build_parser()._actions if action.option_strings}
    assert {"--model", "--width", "--send-order", "--credit-bytes", "--layer-dscp", "--timeout"} <= flags
    assert "--role" not in flags and "--policy" not in flags and "--profile" not in flags
