"""Profiling: warm/cold first calls, host time, measured ceilings, scaling, traces."""

import json
import sys
import types

import pytest
import torch

from equivalence import ceilings, profile as prof
from equivalence.profile import Profile, profile, scaling


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("LEVELS_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _blank(level="compile") -> Profile:
    return Profile("mlp", level, "default", "float32", "cpu", "tiny", {}, "skip")


def test_first_call_is_cold_when_the_cache_gains_files_and_warm_when_not(tmp_path, monkeypatch):
    monkeypatch.setattr(prof, "_cache_dirs", lambda level, device: [tmp_path])
    p = _blank()
    prof._timed_first_call(p, "compile", lambda: (tmp_path / "kernel.so").write_bytes(b"x"),
                           torch.device("cpu"))
    assert p.first_call_cache == "cold" and "gained 1 file" in p.first_call_cache_detail
    assert p.first_call_ms > 0
    p = _blank()
    prof._timed_first_call(p, "compile", lambda: None, torch.device("cpu"))
    assert p.first_call_cache == "warm" and "gained 0 file" in p.first_call_cache_detail


def test_levels_without_a_disk_cache_say_nothing_about_one():
    p = profile("layer_norm", "native", size="tiny", min_time_s=0.01)
    assert p.status == "ok" and p.first_call_cache is None


def test_compile_watches_inductors_cache_dir():
    from torch._inductor.runtime.cache_dir_utils import cache_dir
    assert [str(d) for d in prof._cache_dirs("compile", torch.device("cpu"))] == [cache_dir()]


def test_level5_cache_comes_from_its_build_report(monkeypatch):
    build = types.ModuleType("cuda_kernels.build")
    report = {"last": None}
    build.last_build = lambda: report["last"]
    monkeypatch.setitem(sys.modules, "cuda_kernels.build", build)

    def builds(cached):
        return lambda: report.update(last={"cached": cached, "dir": "/tmp/ext", "seconds": 1.0})

    p = _blank("cuda")
    prof._timed_first_call(p, "cuda", builds(False), torch.device("cpu"))
    assert (p.first_call_cache, p.first_call_cache_detail) == ("cold", "/tmp/ext")
    prof._timed_first_call(p, "cuda", builds(True), torch.device("cpu"))
    assert p.first_call_cache == "warm"  # load_inline found the compiled library on disk
    prof._timed_first_call(p, "cuda", lambda: None, torch.device("cpu"))
    assert p.first_call_cache == "warm" and "already loaded" in p.first_call_cache_detail
    report["last"] = {}  # a build module that does not say
    prof._timed_first_call(p, "cuda", lambda: None, torch.device("cpu"))
    assert p.first_call_cache == "unknown"


def test_host_time_and_fractions_of_the_measured_ceilings(cache_dir):
    c = ceilings.get("cpu", "float32")
    assert c.source == "measured now" and c.copy_tbps > 0 and c.matmul_tflops > 0
    p = profile("mlp", "native", size="small", min_time_s=0.02, host_size="tiny", ceilings=c)
    assert p.status == "ok" and p.host["size"] == "tiny" and p.host["median_ms"] > 0
    # the tiny problem is ~1000x less work: its time is the per-call floor, well under small's
    assert p.host["median_ms"] < p.fwd_bwd["median_ms"]
    tp = p.to_dict()["throughput"]["fwd_bwd"]
    assert tp["of_matmul"] == pytest.approx(tp["tflops"] / c.matmul_tflops)
    assert tp["of_copy"] == pytest.approx(tp["tbps"] / c.copy_tbps)
    assert 0 < tp["of_matmul"] < 2  # a GEMM-bound MLP near, never far above, its own GEMM


def test_ceilings_are_measured_once_and_cached_per_device_and_dtype(cache_dir, monkeypatch):
    first = ceilings.get("cpu", "float32")
    monkeypatch.setattr(ceilings, "_measure_copy_tbps", lambda d: pytest.fail("measured twice"))
    monkeypatch.setattr(ceilings, "_measure_matmul_tflops", lambda d, t: pytest.fail("measured twice"))
    again = ceilings.get("cpu", torch.float32)
    assert again.source == str(cache_dir / "ceilings.json")
    assert (again.copy_tbps, again.matmul_tflops) == (first.copy_tbps, first.matmul_tflops)
    data = json.loads((cache_dir / "ceilings.json").read_text())
    [key] = data
    assert "torch " + torch.__version__ in key and "float32" in data[key]["matmul_tflops"]
    monkeypatch.setattr(ceilings, "_measure_matmul_tflops", lambda d, t: 0.5)
    assert ceilings.get("cpu", "bf16").matmul_tflops == 0.5  # a new dtype is measured


def test_an_implausible_ceiling_is_measured_again_and_the_best_round_kept(cache_dir, monkeypatch):
    paper = {"copy_tbps": 1.0, "matmul_tflops": 1.0, "source": "a datasheet"}
    monkeypatch.setattr(ceilings, "known_figures", lambda device, dtype: paper)
    rounds = iter([0.01, 0.02, 0.6, 0.5, 0.1])  # a busy machine, then a quiet round
    monkeypatch.setattr(ceilings, "_measure_matmul_tflops", lambda d, t: next(rounds))
    monkeypatch.setattr(ceilings, "_measure_copy_tbps", lambda d: 0.8)
    c = ceilings.get("cpu", "float32")
    assert c.matmul_tflops == 0.6 and c.doubts == [] and next(rounds) == 0.5  # 3 rounds, no more
    monkeypatch.setattr(ceilings, "_measure_matmul_tflops", lambda d, t: 0.01)  # busy throughout
    c = ceilings.get("cpu", "float32", remeasure=True)
    assert c.source == "measured now" and c.matmul_tflops == 0.01
    assert len(c.doubts) == 1 and "1% of the 1 on paper" in c.doubts[0] and "--remeasure" in c.doubts[0]
    assert ceilings.get("cpu", "float32").doubts == c.doubts  # kept with the figures


def test_ceilings_are_keyed_by_torch_and_a_cpu_has_figures_on_paper():
    assert f"torch {torch.__version__}" in ceilings.cache_key("cpu")
    paper = ceilings.known_figures("cpu", "float32")
    if paper["matmul_tflops"] is not None:  # Linux: /proc/cpuinfo
        assert "threads" in paper["source"] and paper["matmul_tflops"] > 0


def test_a_level_above_its_roof_is_never_shown_without_why(cache_dir, tmp_path, capsys):
    from equivalence.cli import main
    from equivalence.commands.profile import roof_warnings
    from equivalence.commands.console import fmt_roof

    assert fmt_roof(1.53) == "153% ⚠" and fmt_roof(0.5) == "50%"
    row = {"level": "native", "throughput": {"fwd": {"of_matmul": 1.53, "of_copy": 0.2},
                                             "fwd_bwd": {"of_matmul": 0.9, "of_copy": 1.2}}}
    [matmul, copy] = roof_warnings([row], "mlp")
    assert "153% of the matmul roof" in matmul and "stale" in matmul and "--remeasure" in matmul
    assert "120% of the copy roof" in copy and "cache" in copy
    # a cached roof a level lands above (measured under load) is measured again, once
    key = ceilings.cache_key("cpu")
    cache_dir.mkdir(parents=True)
    (cache_dir / "ceilings.json").write_text(json.dumps(
        {key: {"copy_tbps": 1e-9, "matmul_tflops": {"float32": 1e-9}, "measured": "long ago"}}))
    assert main(["profile", "--component", "mlp", "--level", "native", "--size", "tiny",
                 "--out", str(tmp_path / "out")]) == 0
    data = json.loads((tmp_path / "out" / "profile-mlp.json").read_text())
    assert data["ceilings"]["source"] == "measured now" and data["ceilings"]["matmul_tflops"] > 1e-6
    assert data["rows"][0]["throughput"]["fwd_bwd"]["of_matmul"] < 1


def test_scaling_stretches_one_dimension():
    dim, points = scaling("layer_norm", "native", size="tiny", factors=(0.5, 1, 2), min_time_s=0.01)
    assert dim == "rows" and [p["value"] for p in points] == [1, 2, 4]
    assert all(p["status"] == "ok" and p["fwd_bwd"]["median_ms"] > 0 for p in points)
    assert points[2]["shape"]["N"] == points[0]["shape"]["N"]  # only rows changes


def test_trace_is_a_chrome_trace(tmp_path):
    p = profile("layer_norm", "native", size="tiny", min_time_s=0.01, trace_dir=tmp_path)
    data = json.loads((tmp_path / "layer_norm-native.json").read_text())
    assert p.trace.endswith("layer_norm-native.json") and data["traceEvents"]
    names = {e.get("name", "") for e in data["traceEvents"]}
    assert {"layer_norm native fwd+bwd #1", "layer_norm native fwd+bwd #3"} <= names
    assert "aten::rsqrt" in names  # the ops inside each call, not only our labels


def test_level5_built_in_the_background_is_charged_to_its_first_row(monkeypatch):
    # compare builds Level 5 in a thread while the rows before it run; the first Level 5
    # row waits for it and its first call is charged with the build, once.
    import threading

    from equivalence.commands.compare import Level5Build

    build = types.SimpleNamespace(loaded=lambda: False, last_build=lambda: None)
    ran = threading.Event()

    def load(device):
        ran.set()
        build.last_build = lambda: {"seconds": 24.5, "cached": False, "dir": "/tmp/ext"}

    build.load = load
    monkeypatch.setitem(sys.modules, "cuda_kernels.build", build)
    monkeypatch.setattr(__import__("cuda_kernels"), "build", build, raising=False)
    background = Level5Build("cuda")
    background.thread.join(timeout=10)
    assert ran.is_set()
    first, second = _blank("cuda"), _blank("cuda")
    for p in (first, second):
        p.status, p.first_call_ms = "ok", 300.0
        background.charge(p)
    assert first.first_call_ms == pytest.approx(24_800.0) and first.first_call_cache == "cold"
    assert "built in the background" in first.first_call_cache_detail
    assert second.first_call_ms == 300.0  # the build is paid once


def test_level5_build_failure_in_the_background_is_kept_for_the_rows(monkeypatch):
    from equivalence.commands.compare import Level5Build

    def load(device):
        raise RuntimeError("nvcc: error")

    build = types.SimpleNamespace(loaded=lambda: False, last_build=lambda: None, load=load)
    monkeypatch.setitem(sys.modules, "cuda_kernels.build", build)
    monkeypatch.setattr(__import__("cuda_kernels"), "build", build, raising=False)
    background = Level5Build("cuda")
    background.thread.join(timeout=10)
    assert not background.thread.is_alive()  # the failure ended the thread, nothing raised
    p = _blank("cuda")
    p.status, p.reason = "error", "BuildError: nvcc: error"
    background.charge(p)  # an error row keeps its own reason and is not charged
    assert p.first_call_ms is None or p.first_call_ms == _blank("cuda").first_call_ms


def test_compare_starts_no_level5_build_without_a_gpu():
    from equivalence.commands.compare import Level5Build
    assert Level5Build.start("cpu") is None


def test_compare_checks_level4_in_threads_after_all_timing_poisoned_throughout(monkeypatch):
    # On a GPU, Level 4's checks (Triton compiles) run in threads beside the other levels'
    # checks, all after every row was timed. The poisoning is one process-wide switch: it
    # must stay on in every thread until the last check ends, then be as it was.
    import threading
    import time as _time

    from equivalence.commands import compare as C

    events = []

    def fake_profile(comp, target, *a, **k):
        events.append(("profile", comp, target))
        p = _blank("cpu")
        p.status = "ok"
        return p

    def fake_check(comp, target, dtype, device, size, variant, seed):
        start = torch.are_deterministic_algorithms_enabled()
        if target == "triton":
            _time.sleep(0.2)  # long enough that the main thread's checks run meanwhile
        events.append(("check", comp, target, variant, threading.current_thread().name,
                       start and torch.are_deterministic_algorithms_enabled()))
        return types.SimpleNamespace(status="pass", variant=variant)

    monkeypatch.setattr(C, "profile", fake_profile)
    monkeypatch.setattr(C, "check_case", fake_check)
    monkeypatch.setattr(C, "_threaded_checks", lambda device: True)
    monkeypatch.setattr(C, "break_even_calls", lambda level, native: None)
    was = torch.are_deterministic_algorithms_enabled()
    rows = C._rows(["attention", "layer_norm"], ["native", "triton", "cuda"], torch.float32,
                   torch.device("cpu"), "tiny", "tiny", 0, on_step=None)
    assert torch.are_deterministic_algorithms_enabled() == was
    kinds = [e[0] for e in events]
    assert kinds.index("check") == 6  # every row timed before the first check
    checks = [e for e in events if e[0] == "check"]
    assert all(e[5] for e in checks)  # poisoned (deterministic mode) from start to end
    main = threading.main_thread().name
    assert {e[4] == main for e in checks if e[2] == "triton"} == {False}
    assert {e[4] == main for e in checks if e[2] != "triton"} == {True}
    # the main thread's checks did not wait for Level 4's: they were done first
    assert max(i for i, e in enumerate(checks) if e[2] != "triton") < \
        max(i for i, e in enumerate(checks) if e[2] == "triton")
    from equivalence import cards
    expected = [list(cards.get(c).variants) for c in ("attention", "layer_norm") for _ in range(3)]
    assert [[c.variant for c in r.checks] for r in rows] == expected  # in order, every variant


def test_rows_of_one_component_share_one_draw_and_never_each_others_copies(monkeypatch):
    from equivalence import cards

    drawn = []
    real = cards.Card.case

    def counting(self, *a, **k):
        drawn.append(a)
        return real(self, *a, **k)

    monkeypatch.setattr(cards.Card, "case", counting)
    cache, seen = {}, []

    def mutating(x, weight, bias, eps=1e-5):
        seen.append(x.detach().clone())
        with torch.no_grad():
            x.add_(1000.0)  # a level that writes into its input: the next row must not see it
        return torch.nn.functional.layer_norm(x, x.shape[-1:], weight, bias, eps)

    def run(level=None, seed=7, **kw):
        return profile("layer_norm", level, size="tiny", seed=seed, min_time_s=0.01,
                       case_cache=cache, **kw)

    a, b = run(fn=mutating), run("native")
    assert a.status == "ok" and b.status == "ok"
    assert len(drawn) == 1  # the second row reused the first one's case
    assert {"draw", "open", "inputs", "first_call"} <= set(b.wall_s)
    [case] = cache.values()
    torch.testing.assert_close(seen[0], case.args["x"], rtol=0, atol=0)  # the pristine draw
    run("native", seed=8)
    run("native", seed=8, variant="default")
    assert len(drawn) == 2 and len(cache) == 1  # a new seed draws anew, keeping one case
    profile("layer_norm", "native", size="tiny", seed=8, min_time_s=0.01)
    assert len(drawn) == 3  # without a cache every call draws its own
