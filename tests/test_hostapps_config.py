"""The host-app command line: every bad number is one 'error: --FLAG: ...' line and exit status 2."""
import pytest
from hypothesis import given, strategies as st

from hostapps.__main__ import main
from hostapps.config import ConfigError, config_from_args, parse_addresses, parse_layer_dscp

BASE = ["worker", "--rank", "0", "--workers", "127.0.0.1:7101,127.0.0.1:7102"]
PS = ["--mode", "ps", "--servers", "127.0.0.1:7103"]


@pytest.mark.parametrize("args, message", [
    (["--timeout", "nan"], "--timeout: nan is not allowed (seconds > 0, finite)"),
    (["--timeout", "inf"], "--timeout: inf is not allowed (seconds > 0, finite)"),
    (["--timeout", "-1"], "--timeout: -1.0 is not allowed (seconds > 0, finite)"),
    (["--timeout", "1e300"], "--timeout: 1e+300 is not allowed (seconds, at most 86400)"),
    (["--lr", "nan"], "--lr: nan is not allowed (> 0, finite)"),
    (["--lr", "inf"], "--lr: inf is not allowed (> 0, finite)"),
    (["--scale", "nan"], "--scale: nan is not allowed (a fraction of the profile's tensor sizes in (0, 1])"),
    (["--scale", "2"], "--scale: 2.0 is not allowed (a fraction of the profile's tensor sizes in (0, 1])"),
    (["--link-mbps", "inf"], "--link-mbps: inf is not allowed (Mbit/s > 0, at most 1000000)"),
    (["--link-mbps", "0"], "--link-mbps: 0.0 is not allowed (Mbit/s > 0, at most 1000000)"),
    (["--quiet-ms", "nan"], "--quiet-ms: nan is not allowed (milliseconds > 0, at most --timeout)"),
    (["--quiet-ms", "5000", "--timeout", "4"], "--quiet-ms: 5000.0 is not allowed (milliseconds > 0, at most "
                                               "--timeout)"),
    (["--momentum", "nan"], "--momentum: nan is not allowed (a fraction in [0, 1))"),
    (["--loss-bound=-inf"], "--loss-bound: -inf is not allowed (a fraction in [0, 1))"),
    (["--loss-bound", "1"], "--loss-bound: 1.0 is not allowed (a fraction in [0, 1))"),
    (["--rank", "2²"], "--rank: invalid int value: '2²'"),
    (["--rank", "2"], "--rank: 2 is out of range for 2 workers"),
    (["--rank", "-1"], "--rank: -1 is out of range for 2 workers"),
    (["--job", "-1"], "--job: -1 is not allowed (an integer 0..4294967295, the frame header's job field)"),
    (["--job", "4294967296"], "--job: 4294967296 is not allowed (an integer 0..4294967295, the frame header's "
                              "job field)"),
    (["--job", "nan"], "--job: invalid int value: 'nan'"),
    (["--seed", "-1"], "--seed: -1 is not allowed (an integer 0..4294967295)"),
    (["--seed", "4294967296"], "--seed: 4294967296 is not allowed (an integer 0..4294967295)"),
    (["--eval-every", "-5"], "--eval-every: must be 0 (at the end only) or more, got -5"),
    (["--workers", "127.0.0.1:7²"], "--workers: bad address '127.0.0.1:7²' (expected host:port, port 1..65535)"),
    (["--workers", "127.0.0.1:70000"], "--workers: bad address '127.0.0.1:70000' (expected host:port, port "
                                       "1..65535)"),
    ([*PS[:2], "--servers", "127.0.0.1:0"], "--servers: bad address '127.0.0.1:0' (expected host:port, port "
                                           "1..65535)"),
    (["--mtu-payload", "65004"], "--mtu-payload: must be a multiple of 4 in 64..65000, got 65004"),
    (["--sport-range", "0"], "--sport-range: must be 1..1024 source ports, got 0"),
    (["--fusion", "2²"], "--fusion: '2²' is neither a byte count nor a preset (none, horovod, ddp)"),
    (["--fusion", "٣"], "--fusion: '٣' is neither a byte count nor a preset (none, horovod, ddp)"),
    (["--layer-dscp", "0:2²"], "--layer-dscp: '0:2²' is not TENSOR:DSCP with TENSOR 0..4294967295 and DSCP 0..63"),
    (["--layer-dscp", "4294967296:8"], "--layer-dscp: '4294967296:8' is not TENSOR:DSCP with TENSOR 0..4294967295 "
                                       "and DSCP 0..63"),
    (["--iterations", "1.5"], "--iterations: invalid int value: '1.5'"),
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
    cfg = config_from_args([*BASE, "--timeout", "86400", "--job", "4294967295", "--seed", "4294967295",
                            "--link-mbps", "1e6", "--quiet-ms", "0.5", "--loss-bound", "0.5", "--fusion", "1024",
                            "--layer-dscp", "4294967295:63", "--workers", "127.0.0.1:1,127.0.0.1:65535"])
    assert (cfg.job, cfg.seed, cfg.fusion_bytes, cfg.layer_dscp) == (2**32 - 1, 2**32 - 1, 1024, {2**32 - 1: 63})
    assert cfg.workers == [("127.0.0.1", 1), ("127.0.0.1", 65535)]


def test_layer_dscp_argument():
    assert parse_layer_dscp("") == {}
    assert parse_layer_dscp("0:48,1:40,7:16") == {0: 48, 1: 40, 7: 16}
    for bad in ("0:64", "a:1", "3", "1:-2"):
        with pytest.raises(ConfigError, match="--layer-dscp"):
            parse_layer_dscp(bad)


@given(st.text(st.characters(blacklist_characters=",:"), max_size=8))
def test_any_port_text_is_an_address_or_one_config_error(port):
    try:
        addresses = parse_addresses("--workers", f"10.0.0.1:{port}")
    except ConfigError as e:
        assert str(e).startswith("--workers: bad address")
        return
    assert addresses == [("10.0.0.1", int(port))] and port.isascii() and 0 < int(port) < 65536


@given(st.text(max_size=12))
def test_any_layer_dscp_text_is_a_mapping_or_one_config_error(text):
    try:
        mapping = parse_layer_dscp(text)
    except ConfigError as e:
        assert str(e).startswith("--layer-dscp: ")
        return
    assert all(0 <= tensor < 2**32 and 0 <= dscp < 64 for tensor, dscp in mapping.items())
