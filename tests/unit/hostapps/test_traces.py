"""Layer profiles from PyTorch profiler traces (hostapps/traces.py): real Kineto traces (ResNet-50 on a
V100 in PyTorch 1.8's layout, a Linear on an MI250 in PyTorch 2's), a synthetic one whose numbers are
worked out by hand, generated ones, and traces that give no profile, each refused with one line."""
import gzip
import json
import math

import pytest
from hypothesis import given, settings, strategies as st

from helpers import FIXTURES
from hostapps import traces
from hostapps.config import ConfigError, Model, ProcessConfig, build_model
from hostapps.profiles import PROFILES, ProfileModel, chain_graph, listing_schedule
from hostapps.traces import TraceError, parse_trace, read_trace, trace_profile

TRACES = FIXTURES / "traces"
RESNET50 = str(TRACES / "resnet50_v100.json.gz")
SYNTHETIC = str(TRACES / "synthetic_cpu.json")
EVALUATE = "autograd::engine::evaluate_function: "


def test_the_synthetic_trace_gives_its_layers_sizes_and_median_times():
    """tests/fixtures/traces/synthetic.py works these numbers out: three matching steps at 1x, 2x and 4x
    the base times (the median is 2x), a fourth without its forward pass that does not count."""
    trace = read_trace(SYNTHETIC)
    assert [layer.name for layer in trace.layers] == ["conv2d.0", "batch_norm.0", "linear.0"]
    assert [layer.params for layer in trace.layers] == [8 * 3 * 3 * 3 + 8, 8 + 8, 10 * 16 + 10]
    assert [layer.bytes for layer in trace.layers] == [4 * layer.params for layer in trace.layers]
    assert [layer.forward_s for layer in trace.layers] == pytest.approx([2 * 104e-6, 2 * 56e-6, 2 * 130e-6])
    assert [layer.backward_s for layer in trace.layers] == pytest.approx([2 * 210e-6, 2 * 90e-6, 2 * 120e-6])
    assert (trace.steps, trace.device) == (3, "CPU")


def test_a_real_resnet50_trace_gives_resnet50_layer_for_layer():
    """Kineto's own sample (PyTorch 1.8, torchvision ResNet-50, batch 32 on a V100, record_shapes): its
    161 gradients make the 107 modules of the hand-written profile, in its order, with its sizes: the
    parameters sum to ResNet-50's 25,557,032 exactly, 4 bytes each (float32) in the trace's types."""
    trace = read_trace(RESNET50)
    written = PROFILES["resnet50"]()
    assert [layer.params for layer in trace.layers] == [layer.params for layer in written.layers]
    assert trace.params == written.params == 25_557_032
    assert trace.bytes == 4 * 25_557_032
    assert trace.layers[0].name == "conv2d.0" and trace.layers[-1].name == "linear.0"
    assert sum(layer.name.startswith("conv2d") for layer in trace.layers) == 53
    assert (trace.steps, trace.device) == (2, "Tesla V100-DGXS-32GB")
    forward = sum(layer.forward_s for layer in trace.layers)
    backward = sum(layer.backward_s for layer in trace.layers)
    # the V100's kernel time of one step: about 33 ms forward and 64 ms backward at batch 32
    assert 0.025 < forward < 0.04 and 0.05 < backward < 0.08
    assert all(layer.forward_s > 0 and layer.backward_s > 0 for layer in trace.layers)


def test_a_pytorch2_gpu_trace_counts_the_kernels_launched_in_each_span():
    """HTA's MI250 sample (PyTorch 2, ROCm): one Linear(128, 128), its bias and weight one layer; its
    times are those of the kernels its spans launched, not the CPU's."""
    trace = read_trace(str(TRACES / "linear_mi250.json.gz"))
    assert [(layer.name, layer.params, layer.bytes) for layer in trace.layers] == [("linear.0", 128 * 128 + 128,
                                                                                     4 * (128 * 128 + 128))]
    assert trace.device == "AMD Radeon Graphics"
    events = json.loads(gzip.decompress((TRACES / "linear_mi250.json.gz").read_bytes()))["traceEvents"]
    kernels = sum(event["dur"] for event in events if event.get("cat") == "kernel") / 1e6
    layer = trace.layers[0]
    assert 0 < layer.forward_s + layer.backward_s < kernels  # the input copy and the optimizer's are outside
    cpu_backward = max(e["ts"] + e["dur"] for e in events if e.get("name", "").endswith("AccumulateGrad")) - min(
        e["ts"] for e in events if e.get("name", "").startswith(EVALUATE))
    assert layer.backward_s < cpu_backward / 1e6 / 10


def test_the_profile_is_the_hand_written_kind_and_its_model_runs_the_traced_times():
    profile = trace_profile(SYNTHETIC)
    trace = read_trace(SYNTHETIC)
    assert profile.graph == () and profile.params == trace.params
    assert profile.forward_s == pytest.approx(sum(layer.forward_s for layer in trace.layers))
    assert profile.backward_s == pytest.approx(sum(layer.backward_s for layer in trace.layers))
    assert profile.source == "synthetic_cpu.json: CPU, 3 steps, median"
    model = ProfileModel(profile, scale=1.0, link_mbps=10_000)  # the reference link: times as traced
    assert model.forward_s == pytest.approx([layer.forward_s for layer in trace.layers])
    assert model.backward_s == pytest.approx([layer.backward_s for layer in trace.layers])
    half = ProfileModel(profile, scale=0.5, link_mbps=1000)
    assert [layer.size for layer in half.layers] == [round(layer.params / 2) for layer in trace.layers]
    assert half.backward_s == pytest.approx([s * 0.5 * 10 for s in model.backward_s])
    # a chain: every schedule of it is its listing order
    assert model.schedule == listing_schedule(chain_graph(3))


def test_the_host_apps_build_the_traced_model_and_name_its_flag():
    config = ProcessConfig(role="worker", rank=0, workers=[("127.0.0.1", 7000)], model=Model(trace=SYNTHETIC))
    assert config.model.name == "trace" and config.model.profile == "trace"
    assert [layer.size for layer in build_model(config).layers] == [2, 1, 2]  # scale 0.01, at least 1
    missing = ProcessConfig(role="worker", rank=0, workers=[("127.0.0.1", 7000)], model=Model(trace="no/such.json"))
    with pytest.raises(ConfigError, match=r"^--model-trace: 'no/such.json' cannot be read \(No such file"):
        build_model(missing)


def _write(tmp_path, document, name="trace.json") -> str:
    path = tmp_path / name
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    return str(path)


def _synthetic() -> dict:
    return json.loads(open(SYNTHETIC).read())


def _without(predicate) -> dict:
    doc = _synthetic()
    doc["traceEvents"] = [event for event in doc["traceEvents"] if not predicate(event)]
    return doc


def _stripped_shapes() -> dict:
    doc = _synthetic()
    for event in doc["traceEvents"]:
        event.get("args", {}).pop("Input Dims", None)
    return doc


def _bad_event() -> dict:
    doc = _synthetic()
    doc["traceEvents"][3]["ts"] = "soon"
    return doc


@pytest.mark.parametrize("document,problem", [
    ("{not json", r"is not JSON \(Expecting property name enclosed in double quotes: line 1 column 2"),
    ({"schemaVersion": 1}, r"is not a Chrome trace \(a JSON object with a traceEvents list"),
    ({"schema": "1.1.0-chakra.0.0.4", "nodes": []}, r"is a PyTorch execution trace \(ops and tensors, no times\)"),
    (_without(lambda event: "Backward" in event["name"] or "AccumulateGrad" in event["name"]),
     r"has no backward pass \(no torch::autograd::AccumulateGrad op: profile training steps"),
    (_stripped_shapes(), r"has no gradient sizes \(no Input Dims on its AccumulateGrad ops\): record it with "
                         r"torch.profiler.profile\(record_shapes=True\)"),
    (_without(lambda event: event["name"].startswith("aten::")),
     r"has a backward node whose forward op is not in the step \(profile whole steps\)"),
    (_bad_event(), r"has a malformed event: traceEvents.3 \('aten::convolution'\) has no numeric ts and dur >= 0"),
])
def test_a_trace_that_gives_no_profile_is_refused_with_one_line(tmp_path, document, problem):
    with pytest.raises(TraceError, match=f"^{problem}") as error:
        read_trace(_write(tmp_path, document))
    assert "\n" not in str(error.value)


def test_a_real_inference_trace_has_no_backward_pass():
    with pytest.raises(TraceError, match=r"^has no backward pass"):
        read_trace(str(TRACES / "inference_no_backward.json.gz"))


def test_unreadable_too_large_and_too_many_layers(tmp_path, monkeypatch):
    with pytest.raises(TraceError, match=r"^cannot be read \(No such file or directory\)$"):
        read_trace(str(tmp_path / "missing.json"))
    (tmp_path / "bad.json.gz").write_bytes(b"not gzip at all")
    with pytest.raises(TraceError, match=r"^cannot be read \(Not a gzipped file"):
        read_trace(str(tmp_path / "bad.json.gz"))
    monkeypatch.setattr(traces, "MAX_TRACE_BYTES", 1000)
    with pytest.raises(TraceError, match=r"^is larger than 0 MiB of JSON, which every host app would parse: keep one"):
        read_trace(_write(tmp_path, _synthetic(), "large.json"))
    monkeypatch.setattr(traces, "MAX_TRACE_BYTES", 1 << 20)
    monkeypatch.setattr(traces, "MAX_LAYERS", 2)
    with pytest.raises(TraceError, match=r"^has 3 layers, more than the 2 a job document takes$"):
        read_trace(_write(tmp_path, _synthetic(), "many.json"))


def test_relative_paths_are_from_the_repository_root():
    assert traces.trace_path("tests/fixtures/traces/synthetic_cpu.json") == TRACES / "synthetic_cpu.json"
    assert read_trace("tests/fixtures/traces/synthetic_cpu.json") == read_trace(SYNTHETIC)


# -- generated traces ---------------------------------------------------------------------------
def op(name, start, end, sequence=None, dims=None, thread=1):
    args = {} if sequence is None else {"Sequence number": sequence}
    if dims is not None:
        args["Input Dims"], args["Input type"] = dims, ["float"] * len(dims)
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": thread, "ts": start, "dur": end - start,
            "args": args}


def node(name, start, end, sequence=None, dims=None, thread=2):
    return [op(EVALUATE + name, start, end, sequence, thread=thread), op(name, start, end, sequence, dims, thread)]


def chain_trace(layers: list[tuple[list[list[int]], int, int, int]], gpu: bool) -> dict:
    """A step of a chain of modules on a forward thread 1 and a backward thread 2: each layer
    (parameter shapes, forward us, parameter-free ops' us after it, backward us). With gpu, each op
    launches one kernel of its duration, and the CPU runs ahead in no time."""
    events, kernels, now = [op("ProfilerStep#1", 0, 10**9, thread=1)], [], 0

    def launch(thread, at, duration):
        correlation = len(kernels) + 1
        kernels.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": thread,
                        "ts": at, "dur": 0, "args": {"correlation": correlation}})
        kernels.append({"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 10**8 + at,
                        "dur": duration, "args": {"correlation": correlation}})

    for number, (shapes, forward, free, _) in enumerate(layers):
        cost = 0 if gpu else forward
        events.append(op("aten::module", now, now + cost + 1, 2 * number, shapes))
        if gpu:
            launch(1, now, forward)
        now += cost + 1
        events.append(op("aten::relu", now, now + (0 if gpu else free) + 1, 2 * number + 1))
        if gpu:
            launch(1, now, free)
        now += (0 if gpu else free) + 1
    now += 5
    for number in reversed(range(len(layers))):
        shapes, _, free, backward = layers[number]
        events += node("ReluBackward0", now, now + (0 if gpu else free) + 1, 2 * number + 1)
        if gpu:
            launch(2, now, free)
        now += (0 if gpu else free) + 1
        events += node("ModuleBackward0", now, now + (0 if gpu else backward) + 1, 2 * number)
        if gpu:
            launch(2, now, backward)
        now += (0 if gpu else backward) + 1
        for shape in shapes:
            events += node("torch::autograd::AccumulateGrad", now, now + 1, None, [shape])
            now += 1
    return {"traceEvents": events + kernels, "deviceProperties": [{"name": "Test GPU"}] if gpu else []}


LAYER = st.tuples(st.lists(st.lists(st.integers(1, 9), min_size=1, max_size=3), min_size=1, max_size=3),
                  st.integers(1, 500), st.integers(0, 100), st.integers(1, 500))


def test_a_trace_without_forward_compute_is_refused():
    with pytest.raises(TraceError, match=r"^has no measured compute in its forward or backward pass$"):
        parse_trace(chain_trace([([[4]], 0, 0, 5)], gpu=True))


@settings(max_examples=40, deadline=None)
@given(layers=st.lists(LAYER, min_size=1, max_size=12), gpu=st.booleans())
def test_a_generated_chain_reads_back_its_layers_and_times(layers, gpu):
    """Sizes, order and times come back as generated: a layer's forward is its op and the free ops after
    it, its backward the free ops before it and its own; on a GPU, the kernels' times, not the CPU's."""
    trace = parse_trace(chain_trace(layers, gpu))
    assert [layer.params for layer in trace.layers] == [sum(math.prod(s) for s in shapes)
                                                        for shapes, *_ in layers]
    # CPU wall time counts each op's extra microsecond and the gaps (the accumulations' us) too
    slack = 0 if gpu else 1
    for layer, (shapes, forward, free, backward) in zip(trace.layers, layers):
        assert layer.forward_s * 1e6 == pytest.approx(forward + free + 2 * slack, abs=5 * slack + 1e-6)
        assert layer.backward_s * 1e6 == pytest.approx(backward + free + (2 + len(shapes)) * slack,
                                                       abs=1e-6 + slack)
    assert trace.device == ("Test GPU" if gpu else "CPU")
