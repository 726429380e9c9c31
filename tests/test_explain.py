"""`explain`: what each level really runs, in text that belongs to the component."""

import json
import re
import types

import pytest
import torch

import levels
from equivalence.commands import explain as explain_module
from equivalence.commands import host_probe
from equivalence.commands.explain import Explanation, explain
from levels import torchscript as ts

# Ops that only the named component's code could produce, per level's vocabulary.
EXPECTED = {
    "native": {
        "attention": ["aten.bmm", "aten._softmax", "aten.masked_fill"],
        "layer_norm": ["aten.mean", "aten.rsqrt"],
        "mlp": ["aten.addmm", "aten.gelu", "aten.gelu_backward"],
        "lstm": ["aten.sigmoid", "aten.tanh", "aten.stack", "aten.sigmoid_backward"],
        "conv_bn": ["aten.convolution", "aten.var", "aten.add_", "aten.convolution_backward"],
        "rms_norm": ["aten.mean", "aten.rsqrt"],
        "rope": ["aten.cat", "aten.sub", "aten.slice_backward"],
        "swiglu_mlp": ["aten.mm", "aten.silu", "aten.silu_backward"],
        "newton_schulz": ["aten.mm", "aten.linalg_vector_norm"],  # forward only
    },
    "torchscript": {
        "attention": ["aten::softmax", "aten::masked_fill", "aten::matmul"],
        "layer_norm": ["aten::rsqrt", "aten::mean"],
        "mlp": ["aten::erf", "aten::matmul"],
        "lstm": ["prim::Loop", "aten::sigmoid", "aten::tanh"],
        "conv_bn": ["aten::conv2d", "aten::rsqrt", "aten::add_", "torch.jit.freeze"],
        "rms_norm": ["aten::rsqrt", "aten::mean"],
        "rope": ["aten::slice", "aten::cat", "aten::stack"],
        "swiglu_mlp": ["aten::sigmoid", "aten::matmul"],  # SiLU spelled out: the fuser's view
        "newton_schulz": ["aten::matmul", "aten::linalg_vector_norm", "prim::Loop"],
    },
    "compile": {
        "attention": ["scaled_dot_product", "cpp_fused__softmax"],
        "layer_norm": ["cpp_fused", "rsqrt"],
        "mlp": ["extern_kernels.addmm", "erf"],
        "lstm": ["sigmoid", "tanh", "extern_kernels.mm"],
        "conv_bn": ["convolution", "rsqrt"],
        "rms_norm": ["cpp_fused", "rsqrt"],
        "rope": ["cpp_fused_add_mul_slice_sub"],
        "swiglu_mlp": ["extern_kernels.mm", "silu"],
        "newton_schulz": ["extern_kernels.mm", "linalg_vector_norm"],
    },
}


@pytest.mark.parametrize("level", ["native", "torchscript", "compile"])
@pytest.mark.parametrize("component", sorted(EXPECTED["native"]))
def test_explain_shows_the_components_own_ops(component, level):
    text = explain(component, level)
    assert isinstance(text, str) and isinstance(text, Explanation)
    assert component in text.splitlines()[1]
    missing = [op for op in EXPECTED[level][component] if op not in text]
    assert not missing, f"{component}/{level}: {missing} not in:\n{text[:3000]}"
    # Nothing of another component's signature ops leaks in (e.g. a wrong function run).
    if component not in ("lstm", "swiglu_mlp"):
        assert "sigmoid" not in text
    if component not in ("mlp",):
        assert "erf(" not in text and "aten::erf" not in text and "aten.gelu" not in text


def test_rms_norm_native_has_one_reduction_and_no_centring():
    body = explain("rms_norm", "native").section("forward")
    assert "1  aten.mean" in body and "aten.sub" not in body  # LayerNorm's second one is gone


def test_native_counts_ops_and_marks_views():
    text = explain("layer_norm", "native")
    body = text.section("forward")
    assert "2  aten.mean" in body  # two reductions: mean and variance
    assert "ATen ops" in body
    assert "(view: no kernel)" in explain("lstm", "native").section("forward")


def test_torchscript_explains_fusion_on_this_device():
    text = explain("lstm", "torchscript")
    summary = text.section("forward: optimized graph summary")
    assert "fusion groups:" in summary and "loops kept in the graph (prim::Loop):" in summary
    if "fusion groups: 0" in summary:  # a CPU without LLVM: the reason is given
        assert "LLVM" in summary


def test_torchscript_conv_bn_shows_the_freeze_fold():
    text = explain("conv_bn", "torchscript", variant="eval")
    fold = text.section("torch.jit.freeze")
    assert "after torch.jit.freeze: aten ops aten::conv2d\n" in fold
    assert "aten::batch_norm" in fold.split("after torch.jit.freeze")[0]


def test_compile_shows_the_sdpa_rewrite_and_the_code_without_it():
    text = explain("attention", "compile", variant="full")
    assert "replaced matmul -> scale -> softmax -> matmul" in text
    assert "SDPA rewrite off" in text and "cpp_fused__softmax" in text
    assert "C++/OpenMP" in text


def test_explain_of_an_unavailable_level_gives_the_reason(monkeypatch):
    monkeypatch.setattr(ts, "_SCRIPTED", None)
    monkeypatch.setattr(ts, "_BUILD_ERROR", None)
    monkeypatch.delattr(ts.torch.jit, "script")
    text = explain("mlp", "torchscript")
    assert "cannot run mlp" in text and "no torch.jit.script" in text


def test_other_levels_use_their_own_explain_or_say_there_is_none(monkeypatch):
    fake = types.SimpleNamespace(explain=lambda component, device: f"kernel source for {component}")
    monkeypatch.setattr(levels, "status", lambda level, device="cpu", component=None: None)
    monkeypatch.setattr(levels, "get", lambda level: fake)
    assert "kernel source for mlp" in explain("mlp", "triton")
    monkeypatch.setattr(levels, "get", lambda level: types.SimpleNamespace())
    assert "has no explain yet" in explain("mlp", "cuda")


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="argument 'component'"):
        explain("softmax", "native")
    with pytest.raises(ValueError, match="argument 'level'"):
        explain("mlp", "level9")
    with pytest.raises(ValueError, match="argument 'variant'"):
        explain("mlp", "native", variant="causal")
    with pytest.raises(ValueError, match="argument 'device'"):
        explain("mlp", "native", device="gpu0")


def test_notebook_display_is_the_text():
    text = explain("mlp", "native")
    printed = []
    text._repr_pretty_(types.SimpleNamespace(text=printed.append), cycle=False)
    assert printed == [str(text)]
    assert explain_module.RULE in printed[0]


# ---------------------------------------------------------------------------------------
# Level 4: "Where the microseconds go" (host time of one small call)
# ---------------------------------------------------------------------------------------

HOST = "Where the microseconds go"


def _flat(text: str) -> str:
    """The text with its line breaks undone (paragraphs are wrapped to the rule's width)."""
    return " ".join(text.split())


def _row(body: str, name: str) -> float:
    """The µs column of the table row whose piece is `name`."""
    for line in body.splitlines():
        if line.startswith("  " + name + " ") and line[2 + explain_module.NAME_WIDTH:].strip():
            return float(line[2 + explain_module.NAME_WIDTH:2 + explain_module.NAME_WIDTH + 7])
    raise AssertionError(f"no row {name!r} in:\n{body}")


def test_triton_explain_shows_the_recorded_host_breakdown_labelled_as_recorded():
    recorded = json.loads(host_probe.RECORDED.read_text())
    text = explain("layer_norm", "triton")  # on the CPU: the recording, never a measurement
    title = next(s.title for s in text.sections if s.title.startswith(HOST))
    assert "recorded elsewhere, not measured here" in title
    body = text.section(HOST)
    assert "RECORDED, not measured here" in body and "MEASURED" not in body
    for fact in (recorded["gpu"], recorded["date"], recorded["versions"],
                 "reports/h100-host-probe.json", recorded["command"]):
        assert fact in body
    ln, bwd = recorded["layer_norm"], recorded["layer_norm_bwd"]
    expected = {
        "validate_layer_norm": ln["validate_layer_norm"],
        "_on_kernel_device": ln["_on_kernel_device"],
        "3 allocations: y, mean, rstd": ln["3x torch.empty"],
        "launch (triton_kernels/launch.py)": ln["fast launch only"],
        "= the Level 4 call": ln["L4 levels.triton.layer_norm no_grad"],
        "eager F.layer_norm (yardstick)": ln["eager F.layer_norm no_grad"],
        "launch through kernel[grid]": ln["JIT launch only"],
        "compiled launcher alone (ck.run)": ln["ck.run raw"],
        "autograd.Function.apply": ln["_LayerNorm.apply"] - ln["tln.layer_norm (after validation)"],
        "Level 4 forward + backward": bwd["L4 fwd+bwd"],
    }
    for name, us in expected.items():
        assert _row(body, name) == pytest.approx(us, abs=0.051), name
    # the pieces add up to the call: the remainder is named, not hidden
    pieces = ["validate_layer_norm", "_on_kernel_device", "3 allocations: y, mean, rstd",
              "launch (triton_kernels/launch.py)", "the rest (call - the above)"]
    assert sum(_row(body, p) for p in pieces) == pytest.approx(_row(body, "= the Level 4 call"),
                                                               abs=0.3)
    lesson = _flat(body.split("The lesson:")[1])
    for fix in ("validate once", "skip autograd.Function", "direct launches", "CUDA graphs",
                "levels.nn.cuda_graph", "rows of 4096"):
        assert fix in lesson
    # readable in a terminal: nothing wider than the rule, no cut-off cell
    assert all(len(line) <= len(explain_module.RULE) for line in body.splitlines())
    assert "..." not in body


def test_mlp_host_breakdown_is_recorded_too_and_other_components_say_who_has_one():
    recorded = json.loads(host_probe.RECORDED.read_text())["mlp"]
    body = explain("mlp", "triton").section(HOST)
    assert _row(body, "validate_mlp") == pytest.approx(recorded["validate_mlp"], abs=0.051)
    assert _row(body, "2 GEMMs (one timed, x 2)") == pytest.approx(
        2 * recorded["tg.gemm gelu into out, check=False"], abs=0.051)
    assert _row(body, "the call, direct launches off") == pytest.approx(
        recorded["L4 mlp no_grad, fast launch OFF"], abs=0.051)
    assert "check=False" in _flat(body) and "TFLOP/s" in body
    other = _flat(explain("lstm", "triton").section(HOST))
    assert "Not broken down for lstm" in other and "layer_norm and mlp" in other


def test_a_missing_recording_gives_the_message_and_how_to_make_it(monkeypatch, tmp_path):
    monkeypatch.setattr(host_probe, "RECORDED", tmp_path / "h100-host-probe.json")
    body = _flat(explain("layer_norm", "triton").section(HOST))
    assert "is missing" in body and "scripts/probe_host.py" in body
    assert "host_breakdown('layer_norm')" in body and "µs" not in body
    (tmp_path / "h100-host-probe.json").write_text("{not json")
    assert "could not be read" in explain("layer_norm", "triton").section(HOST)


def test_host_probe_without_a_gpu_says_why(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "no CUDA GPU" in host_probe.unavailable_reason("cuda")
    with pytest.raises(host_probe.HostProbeUnavailable, match="no CUDA GPU"):
        host_probe.host_breakdown("layer_norm")
    with pytest.raises(ValueError, match="layer_norm, mlp"):
        host_probe.host_breakdown("lstm")


def test_a_live_breakdown_is_labelled_measured_and_a_failed_one_falls_back(monkeypatch):
    live = {**host_probe.recorded_breakdown("layer_norm"), "status": "measured",
            "gpu": "Some GPU", "command": "host_breakdown('layer_norm')", "kernel_us": 3.21}
    monkeypatch.setattr(host_probe, "unavailable_reason", lambda device="cuda": None)
    monkeypatch.setattr(host_probe, "host_breakdown", lambda component, device: live)
    text = explain_module.host_time_section("layer_norm", "cuda")
    assert text.title.endswith("(measured here)")
    assert "MEASURED here, now: Some GPU" in text.body and "RECORDED" not in text.body
    assert _row(text.body, "GPU time of the call") == 3.2  # shown to 0.1 µs
    assert "the GPU's own part of it is 3.2 µs" in _flat(text.body)

    def broken(component, device):
        raise RuntimeError("boom")

    monkeypatch.setattr(host_probe, "host_breakdown", broken)
    body = _flat(explain_module.host_time_section("layer_norm", "cuda").body)
    assert "RECORDED, not measured here (the live probe failed: RuntimeError: boom)" in body


def test_the_cards_measure_every_recorded_key(monkeypatch):
    # What the probe measures is on the cards (HOST_PROBE["measure"]); with the timers
    # stubbed, running them yields the recorded file's keys, group by group, and the rows
    # timed through kernel[grid] go to the process started without direct launches.
    import contextlib

    monkeypatch.setattr(host_probe, "_host_us", lambda fn, batch=50: 1.0)
    monkeypatch.setattr(host_probe, "_cpu_us", lambda fn: 1.0)
    monkeypatch.setattr(host_probe, "_kernel_us", lambda fn, dev: 1.0)
    monkeypatch.setattr(host_probe, "_fast_launch_on", lambda: True)
    monkeypatch.setattr(torch.cuda, "device", lambda dev: contextlib.nullcontext())
    deferred = {}

    def without_direct_launches(keys, dev):
        deferred.update(keys)
        return {group: {k: 2.0 for k in ks} for group, ks in keys.items()}

    monkeypatch.setattr(host_probe, "_in_jit_process", without_direct_launches)
    raw = host_probe._collect({group: None for group in host_probe._measures()},
                              torch.device("cpu"))
    recorded = host_probe.load_recorded()
    assert list(raw) == ["layer_norm", "mlp", "layer_norm_bwd"]
    # (no GPU here: the compiled kernel's own launcher cannot be reached, and says why)
    no_gpu = {"CompiledKernel[grid](...) all args", "ck.run raw maxerr",
              "driver get_current_stream", "ck.run raw"}
    for group, keys in raw.items():
        measured = {k for k in keys if not k.endswith(" error")}
        assert set(recorded[group]) - measured <= no_gpu, group
    assert {k for ks in deferred.values() for k in ks} == {
        "L4 levels.triton.layer_norm no_grad, fast launch OFF", "L4 mlp no_grad, fast launch OFF",
        "L4 fwd+bwd, fast launch OFF"}
    assert raw["mlp"]["L4 mlp no_grad, fast launch OFF"] == 2.0


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the child measures")
def test_the_process_without_direct_launches_reports_why_it_could_not_measure():
    # The rows timed through kernel[grid] run in `python -m equivalence.commands.host_probe`
    # started with LEVELS_TRITON_FAST_LAUNCH=0; here it cannot time anything, and says so
    # per row instead of losing the others.
    got = host_probe._in_jit_process({"mlp": ["L4 mlp no_grad, fast launch OFF"]}, "cuda")
    why = got["mlp"]["L4 mlp no_grad, fast launch OFF error"]
    assert "the process without direct launches failed" in why and "no CUDA GPU" in why


def test_the_host_probe_layouts_come_from_the_cards():
    from equivalence import cards

    assert host_probe.PROBED == ("layer_norm", "mlp")
    for component in host_probe.PROBED:
        spec = cards.get(component).host_probe["layout"]
        lay = host_probe.layout(component)
        assert lay.call == spec["call"] and len(lay.pieces) == len(spec["pieces"])
        assert all(isinstance(r.keys, tuple) for r in (lay.total, *lay.pieces, *lay.alternatives))


@pytest.mark.gpu
@pytest.mark.parametrize("component", host_probe.PROBED)
def test_live_host_breakdown_times_every_piece(component):
    d = host_probe.host_breakdown(component, "cuda")
    assert d["status"] == "measured" and d["gpu"] and not d["errors"], d["errors"]
    rows = [d["total"], d["eager"], *d["pieces"], *d["alternatives"]]
    bad = {r["name"]: r["us"] for r in rows if r["us"] is None or (r["us"] <= 0 and not r["derived"])}
    assert not bad, bad
    # a difference of two medians may dip below 0 by noise, never by a large amount
    assert all(r["us"] > -0.25 * d["total"]["us"] for r in rows if r["derived"]), rows
    assert 0 < d["kernel_us"] < d["total"]["us"]  # a tiny call: the host's, not the GPU's
    assert sum(p["us"] for p in d["pieces"]) == pytest.approx(d["total"]["us"], abs=0.1)
    section = explain(component, "triton", device="cuda").section(HOST)
    assert "MEASURED here, now" in section and "GPU time of the call" in section


@pytest.mark.parametrize("level", ["triton", "cuda"])
def test_kernel_levels_show_the_host_path_before_and_after_as_recorded(level):
    # the lesson needs no GPU: it reads the two committed `levels bench --overhead` runs and
    # the GPT's training tables (reports/), and says which files
    from equivalence.commands import host_path
    for component in ("layer_norm", "mlp"):
        title, body = host_path.section(component, level)
        assert title == host_path.TITLE
        assert re.search(r"forward +\d+\.\d us \([+-]\d+\) +\d+\.\d us \([+-]\d+\) +\d+\.\d us", body), body
        assert re.search(r"forward\+backward +\d+\.\d us", body)
        assert "reports/h100-overhead-before-host-path.json" in body and "tokens/s" in body
        # Level 4's third stage, the C++ replay, with its own run's eager
        assert (("replayed" in body and "host-path-replay/overhead-replay.json" in body)
                == (level == "triton")), body
        # and where the GPT's eager step waits now: the host's clock against the GPU's
        assert re.search(r"backward \d+\.\d ms into the step, the GPU finished it at \d+\.\d ms "
                         r"\((GPU|host)-bound\); eagerly \d\.\d\dx", body), body
        # the H100 tables: eager against torch's model, compiled whole against native's
        assert re.search(r"On one H100 \(reports/training-tables-h100-2026-11-26/\): \d\.\d\dx "
                         r"the torch-modules model eagerly, and compiled whole \d\.\d\dx", body), body
        assert ("compiled-static-launch" in body) == (level == "triton"), body
        # and the same table with the runs stepped in turn
        assert re.search(r"reports/training-interleaved/3-train-gpt-gpu\.json\): \d\.\d\dx the "
                         r"torch-modules model eagerly", body), body
    # the LSTM's section adds its model, before and after the recurrence's work
    _, body = host_path.section("lstm", level)
    assert re.search(r"this level against nn\.LSTM's model: \d\.\d\dx before \(reports/training-"
                     r"interleaved/4-train-lstm-gpu\.json\), \d\.\d\dx after", body), body
    assert (("replayed" in body and "on the wall for" in body) if level == "triton"
            else "recurrence's kernels, forward+backward a layer: " in body), body
    assert "LSTM LM" not in host_path.section("layer_norm", level)[1]
    text = explain("layer_norm", level, "cpu")
    assert host_path.TITLE in text
