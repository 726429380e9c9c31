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
