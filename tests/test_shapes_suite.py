"""The model-shape suite (equivalence/shapes.py), its runner (`levels bench --suite models`,
equivalence/commands/bench/suite.py) and the per-call overhead measurement
(equivalence/commands/bench/overhead.py),
on a CPU: every shape is a real model's and builds through its spec and the contract, the
runner writes every shape (the tiny twins) to JSON and a plot, the goals are judged right,
and nothing that could not run is hidden."""

import argparse
import io
import json
import math
import statistics

import pytest
import torch
import torch.nn.functional as F

import levels
from equivalence import calls, cards, plots, shapes
from equivalence.commands.bench import overhead, reports, suite, suite_report
from equivalence.timing import Timing
from levels.contract import COMPONENTS, VALIDATORS


# ---------------------------------------------------------------------------------------
# The suite's shapes
# ---------------------------------------------------------------------------------------

def test_every_component_has_six_shapes_each_from_a_named_model():
    for component in COMPONENTS:
        mine = shapes.SHAPES[component]
        assert len(mine) >= 6, component
        assert len({s.name for s in mine}) == len(mine), f"{component}: shape names repeat"
        spec = cards.get(component)
        for s in mine:
            assert s.component == component
            assert s.model.strip() and len(s.source) > 20, f"{s.name} names no model or source"
            assert s.dtype in ("bfloat16", "float32")
            assert s.directions, s.name
            for variant, pass_ in s.directions:
                assert variant in spec.variants and pass_ in shapes.PASSES, (s.name, variant, pass_)
    # what the issue asks the suite to cover
    att = shapes.SHAPES["attention"]
    assert {s.sizes["D"] for s in att} == {64, 128}
    assert any(s.sizes["N"] & (s.sizes["N"] - 1) for s in att), "an N that is no power of two"
    assert any(len(s.directions) == 1 for s in att) and any(len(s.directions) == 2 for s in att)
    convs = shapes.SHAPES["conv_bn"]
    assert {1, 3} <= {s.sizes["k"] for s in convs} and any(s.sizes["stride"] == 2 for s in convs)
    assert {56, 28, 14, 7} <= {s.sizes["H"] // s.sizes["stride"] for s in convs} | \
        {s.sizes["H"] for s in convs}
    for s in convs:
        assert ("eval", shapes.FWD) in s.directions
    lstm = shapes.SHAPES["lstm"]
    assert min(s.sizes["B"] for s in lstm) == 1 and max(s.sizes["B"] for s in lstm) == 128
    assert all(256 <= s.sizes["H"] <= 1024 for s in lstm)
    assert any(s.dtype == "float32" for s in lstm)  # the headline goal is an fp32 one


def _expected_sizes(shape):
    """What the contract's validator must report for this shape's sizes."""
    s = shape.sizes
    if shape.component == "attention":
        return dict(B=s["B"], H=s["H"], Nq=s["N"], Nk=s["N"], D=s["D"])
    if shape.component in ("layer_norm", "rms_norm"):
        return dict(M=math.prod(s["rows"]), N=s["N"])
    if shape.component in ("mlp", "swiglu_mlp"):
        return dict(M=math.prod(s["rows"]), K=s["K"], hidden=s["hidden"], N=s["N"])
    if shape.component == "lstm":
        return dict(B=s["B"], T=s["T"], I=s["I"], H=s["H"])
    if shape.component == "rope":
        return dict(B=s["B"], H=s["H"], N=s["N"], D=s["D"])
    if shape.component == "newton_schulz":
        return dict(M=min(s["rows"], s["cols"]), N=max(s["rows"], s["cols"]),
                    transposed=s["rows"] > s["cols"])
    out = (s["H"] + 2 * s["padding"] - s["k"]) // s["stride"] + 1
    return dict(N=s["N"], C_in=s["C_in"], C_out=s["C_out"], kH=s["k"], H_out=out)


@pytest.mark.parametrize("shape", shapes.shapes(), ids=lambda s: f"{s.component}/{s.name}")
def test_full_shape_passes_the_contract_without_allocating(shape):
    for variant, _ in shape.directions:
        args = shapes.fake_args(shape, variant)
        tensors = [v for v in args.values() if isinstance(v, torch.Tensor)]
        assert tensors and all(t.device.type == "meta" for t in tensors)  # shapes only
        got = VALIDATORS[shape.component](**args)
        for key, value in _expected_sizes(shape).items():
            assert got[key] == value, (shape.name, key, got[key], value)
        main = {"attention": "q", "newton_schulz": "G"}.get(shape.component, "x")
        assert args[main].dtype == getattr(torch, shape.dtype)
        flops = cards.get(shape.component).flops(args)
        nbytes = cards.get(shape.component).min_bytes(args)
        forward_only = not cards.get(shape.component).differentiable  # newton_schulz
        assert flops["fwd"] > 0 and (flops["bwd"] > 0 or forward_only) and nbytes["fwd"] > 0
        if shape.component == "conv_bn" and shape.sizes.get("channels_last"):
            assert args["x"].is_contiguous(memory_format=torch.channels_last)


def test_attention_head_dims_are_ones_level_4_has():
    from triton_kernels.attention import MAX_HEAD_DIM

    for s in shapes.SHAPES["attention"]:
        assert s.sizes["D"] <= MAX_HEAD_DIM and s.tiny()["D"] <= MAX_HEAD_DIM, s.name


@pytest.mark.parametrize("component", COMPONENTS)
def test_tiny_twins_build_and_keep_the_structure(component):
    for shape in shapes.SHAPES[component]:
        tiny, full = shape.tiny(), shape.sizes
        for variant, _ in shape.directions:
            args = shapes.make_args(shape, variant, torch.float32, "cpu", seed=0, tiny=True)
            VALIDATORS[component](**args)
            elements = sum(v.numel() for v in args.values() if isinstance(v, torch.Tensor))
            assert elements < 500_000, (shape.name, elements)  # CPU-sized: < 2 MB in fp32
        for key in ("k", "stride", "padding", "channels_last"):
            assert tiny.get(key) == full.get(key), (shape.name, key)
        width = {"attention": "N", "layer_norm": "N", "mlp": "hidden", "lstm": "H",
                 "conv_bn": "H", "rms_norm": "N", "rope": "N", "swiglu_mlp": "hidden",
                 "newton_schulz": "cols"}[component]
        pow2 = full[width] & (full[width] - 1) == 0
        assert (tiny[width] & (tiny[width] - 1) == 0) == pow2 or tiny[width] == 1, shape.name


def test_shapes_can_be_chosen_by_pattern_and_a_bad_one_names_the_choices():
    picked = shapes.shapes(patterns=["gpt2-*"])
    assert picked and all(s.name.startswith("gpt2-") for s in picked)
    assert [s.name for s in shapes.shapes(["mlp"], ["mlp/llama2-*"])] == \
        ["llama2-7b-train", "llama2-7b-decode"]
    with pytest.raises(ValueError, match="matched no shape.*mlp/gpt2-small-train"):
        shapes.shapes(["mlp"], ["resnet*"])


# ---------------------------------------------------------------------------------------
# The goals: geometric mean, minimum, floor, and what a missing figure means
# ---------------------------------------------------------------------------------------

def _entry(component, shape, ratio, status="ok", variant="default", reason=""):
    side = {"status": status, "ratio": ratio if status == "ok" else None, "reason": reason}
    return {"component": component, "shape": shape, "direction": "fwd", "variant": variant,
            "group": suite.group_of(component, variant), "levels": {"triton": side}}


def _status(entries, group):
    return next(r for r in suite.summarize(entries, ["triton"]) if r["group"] == group)


def test_geomean_and_minimum():
    assert suite.geomean([2.0, 0.5]) == pytest.approx(1.0)
    assert suite.geomean([1.2, 1.2, None]) == pytest.approx(1.2)
    assert suite.geomean([]) is None
    r = _status([_entry("attention", "a", 1.5), _entry("attention", "b", 0.8)], "attention")
    assert r["geomean"] == pytest.approx(math.sqrt(1.5 * 0.8))
    assert r["min"] == 0.8 and r["min_at"] == "b fwd" and r["timed"] == 2


def test_kernel_time_ratios_are_summarized_beside_but_never_judged():
    # GPU runs also time kernels alone (the host's time per call left out): reported next
    # to the end-to-end ratios, which alone decide the goals.
    entries = [_entry("layer_norm", "a", 0.5), _entry("layer_norm", "b", 0.8)]
    entries[0]["levels"]["triton"]["kernel_ratio"] = 1.2
    entries[1]["levels"]["triton"]["kernel_ratio"] = 1.05
    r = _status(entries, "layer_norm")
    assert r["kernel_geomean"] == pytest.approx(math.sqrt(1.2 * 1.05)) and r["kernel_min"] == 1.05
    assert r["status"] == "missed" and r["geomean"] == pytest.approx(math.sqrt(0.4))
    assert _status([_entry("layer_norm", "a", 1.1)], "layer_norm")["kernel_geomean"] is None


def test_one_shape_below_the_floor_misses_the_goal_whatever_the_mean():
    entries = [_entry("attention", "a", 3.0), _entry("attention", "b", 1.5),
               _entry("attention", "c", 0.69)]
    r = _status(entries, "attention")
    assert r["geomean"] > 1.0 and r["geomean_met"]
    assert r["floor_met"] is False and r["status"] == "missed"
    assert r["below_floor"] == ["c fwd 0.69×"]
    entries[2] = _entry("attention", "c", 0.7)  # exactly the floor is allowed
    assert _status(entries, "attention")["status"] == "met"


def test_each_group_has_its_own_goal():
    ratios = [0.95, 0.9, 0.92]  # geomean 0.923: enough for the MLP (0.9), not for attention (1.0)
    assert _status([_entry("mlp", str(i), r) for i, r in enumerate(ratios)], "mlp")["status"] == "met"
    assert _status([_entry("attention", str(i), r) for i, r in enumerate(ratios)],
                   "attention")["status"] == "missed"
    train = _status([_entry("conv_bn", "a", 0.3, variant="train")], "conv_bn train")
    assert train["status"] == "no goal" and train["goal"] is None and "eval" in train["note"]
    assert _status([_entry("conv_bn", "a", 1.1, variant="eval")], "conv_bn eval")["status"] == "met"


def test_failed_skipped_and_missing_figures_are_never_a_met_goal():
    error = [_entry("lstm", "a", 1.5), _entry("lstm", "b", None, status="error", reason="boom")]
    r = _status(error, "lstm")
    assert r["status"] == "missed" and r["failed"] == ["b fwd: error"]
    wrong = [_entry("lstm", "a", 1.5), _entry("lstm", "b", None, status="wrong")]
    assert _status(wrong, "lstm")["status"] == "missed"
    skipped = [_entry("lstm", "a", 1.5), _entry("lstm", "b", None, status="skip", reason="no D=256")]
    r = _status(skipped, "lstm")
    assert r["status"] == "incomplete" and r["untimed"] == ["b fwd: no D=256"]
    nothing = [_entry("lstm", "a", None, status="skip", reason="Level 5 has no lstm kernels yet")]
    r = _status(nothing, "lstm")
    assert r["status"] == "not evaluated" and "no lstm kernels" in r["note"]


# ---------------------------------------------------------------------------------------
# The runner, on a CPU: the smoke path
# ---------------------------------------------------------------------------------------

def _quick_time_fn(fn, device, min_time_s=0.0, warmup=0, max_runs=0, prime=False):
    """Three calls, wall clock: the runner's bookkeeping is under test here, not the timer
    (equivalence.timing has its own tests), and the real one would take a minute."""
    import time

    times = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    times.sort()
    return Timing(times[1], times[0], times[2], 3, "test: 3 calls, wall clock")


@pytest.fixture
def quick_timer(monkeypatch):
    monkeypatch.setattr(suite, "time_fn", _quick_time_fn)


def test_cpu_run_writes_every_shape_and_a_plot(tmp_path, quick_timer, monkeypatch):
    out = tmp_path / "suite.json"
    report = suite.run("cpu", ["native", "triton", "cuda"], out_path=out, command="test")
    saved = json.loads(out.read_text())
    assert saved["complete"] and saved["smoke"] and "GPU" in saved["note"]
    assert saved["environment"]["torch"] and saved["settings"]["levels"] == ["native", "triton", "cuda"]
    assert len(saved["entries"]) == sum(len(s.directions) for s in shapes.shapes())
    assert {(e["component"], e["shape"]) for e in saved["entries"]} == \
        {(s.component, s.name) for s in shapes.shapes()}
    for e in saved["entries"]:
        assert e["tiny"] and e["flops"] > 0 and e["min_bytes"] > 0
        assert e["libraries"] and e["best_library"], e["shape"]
        native = e["levels"]["native"]
        assert native["status"] == "ok" and native["ratio"] > 0, (e["shape"], native["reason"])
        assert native["p20_ms"] <= native["median_ms"] <= native["p80_ms"]
        assert native["first_call_ms"] > 0
        if e["pass"] == shapes.FWD:  # the level's output was compared with the library's
            assert native["rel_diff"] <= native["bound"]
        for name in ("triton", "cuda"):  # cannot run (as a speed) here: skipped, with the reason
            assert e["levels"][name]["status"] == "skip" and e["levels"][name]["reason"]
    assert "interpreter" in saved["entries"][0]["levels"]["triton"]["reason"]
    for e in saved["entries"]:
        if e["component"] == "attention":  # SDPA's CUDA-only backends: recorded, with why
            cudnn = e["libraries"]["SDPA CUDNN_ATTENTION"]
            assert cudnn["status"] == "skip" and cudnn["reason"]
    groups = {r["group"] for r in saved["summary"]}
    assert groups == {"attention", "layer_norm", "mlp", "lstm", "conv_bn eval", "conv_bn train",
                      "rms_norm", "rope", "swiglu_mlp", "newton_schulz"}
    assert all(r["timed"] == r["entries"] for r in saved["summary"] if r["level"] == "native")
    assert {r["status"] for r in saved["summary"] if r["level"] == "cuda"} <= \
        {"not evaluated", "no goal"}

    drawn = {}
    monkeypatch.setattr(plots._pyplot(), "close", lambda fig=None: drawn.setdefault("fig", fig))
    png = plots.suite_figure(report, tmp_path / "suite.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    fig = drawn["fig"]
    assert [ax.get_title(loc="left").split(" ")[0] for ax in fig.axes] == list(COMPONENTS)
    assert fig._suptitle.get_text().startswith("CPU smoke run")
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels[0].startswith("GPT-2 small") and labels[0].endswith("fwd")


def test_a_level_that_disagrees_with_the_library_is_marked_wrong(quick_timer):
    def off_by_ten_percent(x, weight, bias, eps=1e-5):
        return F.layer_norm(x, (x.shape[-1],), weight, bias, eps) * 1.1

    levels.register("scaled_ln", {"layer_norm": off_by_ten_percent})
    try:
        shape = shapes.get("layer_norm", "gpt2-small-train")
        entries = suite.measure_shape(shape, ["scaled_ln"], "cpu", tiny=True, dtype="float32")
    finally:
        levels.unregister("scaled_ln")
    fwd = next(e for e in entries if e["pass"] == shapes.FWD)["levels"]["scaled_ln"]
    assert fwd["status"] == "wrong" and fwd["ratio"] is None
    assert fwd["rel_diff"] == pytest.approx(0.1, rel=0.05) and "F.layer_norm" in fwd["reason"]
    row = next(r for r in suite.summarize(entries, ["scaled_ln"]) if r["group"] == "layer_norm")
    assert row["status"] == "missed"


def test_nothing_timed_writes_nothing(tmp_path, quick_timer, monkeypatch):
    def broken(args):
        raise RuntimeError("this library call is not built here")

    monkeypatch.setattr(suite, "library_impls",
                        lambda component, device, dtype: [calls.Impl("lib", "library", broken)])
    out = tmp_path / "empty.json"
    report = suite.run("cpu", ["cuda"], ["layer_norm"], ["gpt2-small-train"], out_path=out)
    assert not out.exists()
    lib = report["entries"][0]["libraries"]["lib"]
    assert lib["status"] == "skip" and "not built here" in lib["reason"]


def test_a_run_cut_short_can_be_resumed(tmp_path, quick_timer):
    out = tmp_path / "suite.json"
    picked = ["layer_norm/gpt2-small-train", "layer_norm/llama2-7b-decode"]
    first = suite.run("cpu", ["native"], ["layer_norm"], picked, out_path=out)
    earlier = json.loads(out.read_text())
    earlier["entries"] = [e for e in earlier["entries"] if e["shape"] != "llama2-7b-decode"]
    earlier["entries"].pop()  # and gpt2-small-train without its fwd+bwd: not finished either
    again = suite.run("cpu", ["native"], ["layer_norm"], picked, out_path=out, resume=earlier)
    assert [(e["shape"], e["direction"]) for e in again["entries"]] == \
        [(e["shape"], e["direction"]) for e in first["entries"]]
    assert again["resumed"]["shapes"] == []  # nothing was complete: everything timed again
    earlier = json.loads(out.read_text())
    earlier["entries"] = [e for e in earlier["entries"] if e["shape"] != "llama2-7b-decode"]
    kept = suite.run("cpu", ["native"], ["layer_norm"], picked, resume=earlier)
    assert kept["resumed"]["shapes"] == ["layer_norm/gpt2-small-train"]
    assert kept["entries"][:2] == earlier["entries"]  # as measured then, not again
    assert [e["shape"] for e in kept["entries"]] == ["gpt2-small-train"] * 2 + ["llama2-7b-decode"]
    with pytest.raises(ValueError, match="levels"):
        suite.run("cpu", ["torchscript"], ["layer_norm"], picked, resume=earlier)


def _bench_args(**given):
    p = argparse.ArgumentParser()
    p.add_argument("--component")
    p.add_argument("--device")
    p.add_argument("--out")
    suite_report.add_suite_arguments(p)
    overhead.add_overhead_arguments(p)
    argv = []
    for k, v in given.items():
        argv += [f"--{k}"] if v is True else [f"--{k}", str(v)]
    return p.parse_args(argv)


def test_suite_command_on_a_cpu_says_it_is_a_smoke_run(tmp_path, quick_timer):
    from rich.console import Console

    text = io.StringIO()
    args = _bench_args(suite="models", device="cpu", component="layer_norm", level="native",
                       shapes="gpt2-*", out=tmp_path)
    assert suite_report.run_suite(args, Console(file=text, width=200)) == 0
    printed = text.getvalue()
    assert "smoke run" in printed and "needs a CUDA GPU" in printed
    json_path = tmp_path / "cpu-suite-models.json"
    assert json_path.exists() and json_path.with_suffix(".png").exists()
    saved = json.loads(json_path.read_text())
    assert [e["shape"] for e in saved["entries"]] == ["gpt2-small-train"] * 2 + \
        ["gpt2-medium-train"] * 2 + ["gpt2-xl-train"] * 2
    assert saved["command"].startswith("levels bench --suite models --device cpu")
    assert "goals: per component" in printed and "gpt2-xl-train" in printed
    with pytest.raises(ValueError, match="two different runs"):
        suite_report.run_suite(_bench_args(suite="models", overhead=True, device="cpu"), Console(file=text))


def test_output_paths_and_device_names():
    assert reports.output_path(None, "cpu", "suite-models").as_posix() == \
        "levels-reports/cpu-suite-models.json"  # a smoke run is not a recorded result
    assert reports.output_path("x/y.json", "cpu", "suite-models").as_posix() == "x/y.json"
    assert reports.output_path("x", "cpu", "overhead").as_posix() == "x/cpu-overhead.json"
    assert reports.gpu_slug("NVIDIA H100 80GB HBM3") == "h100"
    assert reports.gpu_slug("NVIDIA H200") == "h200"
    assert reports.gpu_slug("NVIDIA A100-SXM4-80GB") == "a100"
    assert reports.gpu_slug("NVIDIA GeForce RTX 4090") == "rtx-4090"


# ---------------------------------------------------------------------------------------
# Per-call overhead
# ---------------------------------------------------------------------------------------

def test_overhead_on_a_cpu_measures_levels_eager_and_validation():
    report = overhead.measure(["layer_norm", "mlp"], ["native", "triton", "cuda"], "cpu",
                              min_time_s=0.02)
    rows = {(r["component"], r["level"]): r for r in report["rows"]}
    assert set(rows) == {(c, n) for c in ("layer_norm", "mlp")
                         for n in ("eager", "native", "triton", "cuda")}
    for c in ("layer_norm", "mlp"):
        eager, native = rows[(c, "eager")], rows[(c, "native")]
        assert eager["status"] == native["status"] == "ok"
        assert eager["host_fwd"]["median_ms"] > 0 and native["host_fwd_bwd"]["median_ms"] > 0
        assert eager["validate"] is None  # eager PyTorch runs no validator of ours
        assert 0 < native["validate"]["median_ms"] < native["host_fwd"]["median_ms"]
        # timed in the same interleaved rounds, and compared round by round (a paired
        # difference: the median of the rounds' differences, its p20/p80 beside it)
        for key in ("host_fwd", "host_fwd_bwd"):
            mine, theirs = native[f"{key}_rounds_ms"], eager[f"{key}_rounds_ms"]
            assert len(mine) == len(theirs) == overhead.ROUNDS
            assert native[key]["median_ms"] == pytest.approx(statistics.median(mine))
            diffs = sorted((a - b) * 1e3 for a, b in zip(mine, theirs))
            assert native[f"{key}_vs_eager_us"] == pytest.approx(statistics.median(diffs))
            assert (diffs[0] <= native[f"{key}_vs_eager_p20_us"] <= native[f"{key}_vs_eager_us"]
                    <= native[f"{key}_vs_eager_p80_us"] <= diffs[-1])
        assert native["kernel_fwd"] is None and native["gpu_ops_per_call"] is None  # GPU only
        for name in ("triton", "cuda"):
            assert rows[(c, name)]["status"] == "skip" and rows[(c, name)]["reason"]
    assert report["goals"] == []  # a GPU goal
    assert report["settings"]["size"] == "tiny" and report["environment"]["torch"]


def test_overhead_command_writes_its_report(tmp_path):
    from rich.console import Console

    text = io.StringIO()
    args = _bench_args(overhead=True, device="cpu", component="layer_norm", level="native,cuda",
                       out=tmp_path / "o.json")
    assert overhead.run_overhead(args, Console(file=text, width=200)) == 0
    saved = json.loads((tmp_path / "o.json").read_text())
    assert [(r["level"], r["status"]) for r in saved["rows"]] == \
        [("eager", "ok"), ("native", "ok"), ("cuda", "skip")]
    assert saved["command"] == "levels bench --overhead --device cpu --component layer_norm " \
                               "--level native,cuda"
    assert "validation" in text.getvalue() and "GPU figure" in text.getvalue()


def test_overhead_goals_are_eager_plus_ten_microseconds_forward_forty_with_backward():
    rows = [{"component": "layer_norm", "level": "triton", "host_fwd_vs_eager_us": 9.5,
             "host_fwd_bwd_vs_eager_us": 40.5},
            {"component": "layer_norm", "level": "cuda", "host_fwd_vs_eager_us": 10.5,
             "host_fwd_bwd_vs_eager_us": 39.5},
            {"component": "mlp", "level": "triton", "status": "skip", "reason": "no GPU",
             "host_fwd_vs_eager_us": None, "host_fwd_bwd_vs_eager_us": None},
            {"component": "mlp", "level": "native", "host_fwd_vs_eager_us": 99.0,
             "host_fwd_bwd_vs_eager_us": 99.0}]
    got = {(g["component"], g["level"], g["pass"]): g["status"] for g in overhead.goals(rows, "cuda")}
    assert got == {("layer_norm", "triton", "fwd"): "met", ("layer_norm", "triton", "fwd+bwd"): "missed",
                   ("layer_norm", "cuda", "fwd"): "missed", ("layer_norm", "cuda", "fwd+bwd"): "met",
                   ("mlp", "triton", "fwd"): "not evaluated", ("mlp", "triton", "fwd+bwd"): "not evaluated"}