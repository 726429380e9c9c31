"""`levels bench` timing sides in rounds (goals.figures_in_rounds): every side timed once a
round, the order rotated, a failing side reported and left out. On the CPU: the figures'
arithmetic and the schedule, not a GPU's clock."""

from __future__ import annotations

import pytest
import torch

from equivalence.commands.bench import goals


def _side(label, calls, work=200):
    def fn():
        if not calls or calls[-1] != label:  # one entry per stretch of calls of one side
            calls.append(label)
        return sum(range(work))
    return fn


def _spec(level, fn, **kw):
    return dict(component="swiglu_mlp", name="forward toy", level=level, dtype=torch.float32,
                shape={"M": 1}, fn=fn, **kw)


def test_every_side_is_timed_each_round_in_a_rotated_order(monkeypatch):
    monkeypatch.setattr(goals, "time_fn", _quick_time_fn)
    calls = []
    specs = [_spec("native", _side("a", calls)),
             _spec("triton", _side("b", calls), baseline="eager", against=0, goal=0.9),
             _spec("cuda", _side("c", calls), baseline="eager", against=0, goal=0.9)]
    figs = goals.figures_in_rounds(specs, "cpu", rounds=3)
    # the first calls in the specs' order, then rounds 0, 1, 2 rotated by one each
    assert "".join(calls) == "abc" + "abc" + "bca" + "cab"
    assert [f.level for f in figs] == ["native", "triton", "cuda"]
    base = figs[0]
    assert base.ratio is None and base.goal is None and len(base.extra["round_ms"]) == 3
    for f in figs[1:]:
        assert f.baseline_ms == base.ms and f.ratio == pytest.approx(base.ms / f.ms)
        assert f.met == (f.ratio >= 0.9)
        assert len(f.extra["round_ratios"]) == 3 and f.extra["rounds"] == 3
        assert f.spread_ms[0] <= f.ms <= f.spread_ms[1]
        assert f.extra["sm_mhz"] == [None, None, None]  # a CPU has no SM clock to read


def test_a_side_that_raises_is_reported_and_left_out(monkeypatch, capsys):
    monkeypatch.setattr(goals, "time_fn", _quick_time_fn)

    def broken():
        raise RuntimeError("out of shared memory")

    specs = [_spec("native", lambda: None),
             _spec("triton", broken, baseline="eager", against=0, goal=0.9),
             _spec("cuda", lambda: None, baseline="eager", against=0, goal=0.9)]
    figs = goals.figures_in_rounds(specs, "cpu", rounds=2)
    assert [f.level for f in figs] == ["native", "cuda"]
    assert "triton forward toy failed: RuntimeError: out of shared memory" in capsys.readouterr().err
    # a level whose baseline failed has nothing to be compared with: left out too
    figs = goals.figures_in_rounds([_spec("native", broken), specs[2]], "cpu", rounds=2)
    assert figs == []


def _quick_time_fn(fn, device, **_):
    """time_fn's shape at a fraction of its time: a few calls, their median."""
    import time

    from equivalence.timing import Timing
    ms = []
    for _ in range(5):
        t0 = time.perf_counter()
        fn()
        ms.append((time.perf_counter() - t0) * 1e3)
    ms.sort()
    return Timing(ms[2], ms[1], ms[3], 5, "test")


# --- the benches that time their sides in rounds, on the CPU with stand-ins -----------------

SMALL = {"bench": {"rows": (24,), "K": 16, "hidden": 32, "N": 16},
         "gpt2-small": {"rows": (8,), "K": 16, "hidden": 32, "N": 16}}


def test_mlp_level5_times_eager_and_each_version_in_rounds(monkeypatch):
    """Level 5's sides (eager and every gemm.cu version) are timed together in rounds, issue
    #28's goals on the default version only; a version whose one call takes > 1 s (here v1
    at the bench shape) is that call's figure, never timed in the rounds."""
    import cuda_kernels.mlp as k5
    import levels
    from equivalence import cards
    from equivalence.commands.bench import mlp as bench

    native = levels.get("native")
    calls = []  # (version, M) of every call of the stand-in kernels
    timed = set()  # the (version, M) called while time_fn timed a side

    def fake_mlp(x, w1, b1, w2, b2, version=None):
        calls.append((version, x.shape[0]))
        return native.mlp(x, w1, b1, w2, b2)

    def fake_one_call_ms(fn, device):  # one_call_ms synchronizes a GPU; here: 2 s for v1, bench
        fn()
        return 2000.0 if calls[-1] == (1, 24) else 0.5

    def recording_time_fn(fn, device, **kw):
        before = len(calls)
        t = _quick_time_fn(fn, device, **kw)
        timed.update(calls[before:])
        return t

    monkeypatch.setattr(goals, "time_fn", recording_time_fn)
    monkeypatch.setattr(levels, "status", lambda level, device, component: None)
    monkeypatch.setattr(bench, "LEVEL5_SHAPES", SMALL)
    monkeypatch.setattr(bench, "one_call_ms", fake_one_call_ms)
    monkeypatch.setattr(k5, "mlp", fake_mlp)
    monkeypatch.setattr(k5, "VERSIONS", {1: "naive", 2: "tiles", 4: "tensor cores"})
    monkeypatch.setattr(k5, "default_version", lambda: 4)
    monkeypatch.setattr(k5, "V4_TILES", {0: "auto", 3: "128x128"})
    monkeypatch.setattr(k5, "mlp_forward", lambda *t, version, tile: fake_mlp(*t, version=version))
    figs = bench._level5("cpu", cards.get("mlp"), torch.float32)

    assert (1, 24) not in timed and (1, 8) in timed  # v1 out of the bench shape's rounds only
    assert {(2, 24), (4, 24), (2, 8), (4, 8)} <= timed
    by = {(f.name, f.level): f for f in figs}
    expected_goals = {("forward", "bench"): 0.95, ("forward", "gpt2-small"): 0.85,
                      ("forward+backward", "bench"): 0.9, ("forward+backward", "gpt2-small"): 0.9}
    assert bench.LEVEL5_GOALS == expected_goals
    for (what, label), goal in expected_goals.items():
        name = f"{what} {label}"
        eager = by[name, "native"]
        assert eager.goal is None and eager.extra["rounds"] == goals.ROUNDS
        for v in (1, 2, 4):
            f = by[f"{name} cuda v{v}", "cuda"]
            assert f.extra["version"] == v and f.baseline_ms == eager.ms
            assert f.goal == (goal if v == 4 else None)
            assert f.met == (None if v != 4 else f.ratio >= goal)
            if (v, label) == (1, "bench"):  # the one call, out of the rounds
                assert f.ms == 2000.0 and f.spread_ms == (2000.0, 2000.0)
                assert "not timed repeatedly" in f.notes and "rounds" not in f.extra
            else:
                assert f.extra["rounds"] == goals.ROUNDS
                assert len(f.extra["round_ratios"]) == goals.ROUNDS
        # the tile sweep: no goal, against the eager forward's median from the rounds
        sweep = by[f"forward {label} cuda v4 sweep tile=3 128x128", "cuda"]
        assert sweep.goal is None and sweep.baseline_ms == by[f"forward {label}", "native"].ms


def test_newton_schulz_times_a_comparison_in_rounds_keeping_the_skipped(monkeypatch):
    """A parameter list: the loop baseline, Level 1 batched and the library call timed in
    rounds, kernel time asked for; a level not here keeps its "not timed" figure in place."""
    import levels
    from equivalence.commands.bench import newton_schulz as bench

    primes = []

    def recording_time_fn(fn, device, prime=False, **kw):
        primes.append(prime)
        return _quick_time_fn(fn, device)

    monkeypatch.setattr(goals, "time_fn", recording_time_fn)
    monkeypatch.setattr(levels, "status", lambda level, device, component:
                        None if level == "native" else f"{level}: not on this machine")
    figs = bench._parameter_list_figures("toy list", (((16, 32), 3), ((32, 16), 2)),
                                         torch.float32, "cpu")
    assert [f.level for f in figs] == ["native loop", "native", "compile", "triton", "cuda",
                                       "library"]
    loop, batched, *skipped, lib = figs
    assert all(f.notes.startswith("not timed") for f in skipped)
    for f in (loop, batched, lib):
        assert f.name == "toy list" and f.extra["rounds"] == goals.ROUNDS
        assert "end_to_end_ms" in f.extra
    assert batched.baseline_ms == lib.baseline_ms == loop.ms and loop.baseline_ms is None
    # each round's time_fn asked for kernel time; one end-to-end timing per side after them
    assert primes == [True] * 3 * goals.ROUNDS + [False] * 3
