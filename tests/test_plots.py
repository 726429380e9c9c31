"""The pictures: drawn from report rows, with the first call and break-even, not only speed."""

import matplotlib

matplotlib.use("Agg")

from matplotlib import pyplot as plt  # noqa: E402

from equivalence import plots  # noqa: E402

SETTINGS = {"dtype": "float32", "size": "small"}
ENV = {"cpu_threads": 2, "torch": "2.13"}


def _timing(ms):
    return {"median_ms": ms, "p20_ms": ms * 0.9, "p80_ms": ms * 1.2}


def _row(component, level, fwd, first, be=None, status="ok", cache=None, check="pass"):
    t = _timing(fwd) if status == "ok" else None
    t2 = _timing(3 * fwd) if status == "ok" else None
    tp = {"tflops": 1e-3 / fwd, "tbps": 2e-3 / fwd} if status == "ok" else {}
    return {"component": component, "level": level, "status": status, "check": check,
            "reason": "" if status == "ok" else "no GPU", "fwd": t, "fwd_bwd": t2,
            "first_call_ms": first if status == "ok" else None, "first_call_cache": cache,
            "break_even_calls_vs_native": be, "throughput": {"fwd": tp, "fwd_bwd": tp}}


ROWS = [_row("layer_norm", "native", 10.0, 50.0),
        _row("layer_norm", "torchscript", 12.0, 40.0, be="never"),
        _row("layer_norm", "compile", 2.0, 9000.0, be=2, cache="cold"),
        _row("layer_norm", "cuda", 0, 0, status="skip"),
        _row("mlp", "native", 5.0, 20.0),
        _row("mlp", "torchscript", 5.0, 30.0, be="never", check="FAIL"),
        _row("mlp", "compile", 4.0, 3000.0, be=1494, cache="warm"),
        _row("mlp", "cuda", 0, 0, status="skip")]


def _texts(fig):
    return [t.get_text() for ax in fig.axes for t in ax.texts] + [fig._suptitle.get_text()]


def _drawn(monkeypatch, draw):
    """Run `draw` and return the figure it saved, still open, to read what is on it."""
    saved = {}
    monkeypatch.setattr(plt, "close", lambda fig=None: saved.setdefault("fig", fig))
    path = draw()
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return saved["fig"]


def test_compare_figure_shows_first_call_cache_and_break_even(tmp_path, monkeypatch):
    fig = _drawn(monkeypatch, lambda: plots.levels_figure(ROWS, SETTINGS, ENV, tmp_path / "c.png"))
    texts = "\n".join(_texts(fig))
    assert "cold cache" in texts and "warm cache" in texts
    assert "pays off after 2 calls" in texts and "never pays off" in texts
    assert "check FAILED" in texts and "unavailable here" in texts
    assert "compile is up to 5.0× faster" in fig._suptitle.get_text()
    top, bottom = fig.axes[0], fig.axes[2]
    assert top.get_shared_y_axes().joined(top, fig.axes[1])  # one scale across components
    assert "speed-up" in top.get_ylabel() and "first call" in bottom.get_ylabel()
    assert top.get_yscale() == bottom.get_yscale() == "log"
    # bars: layer_norm has 3 timed levels x 2 passes on top, 3 first calls below
    assert len(top.patches) == 6 and len(bottom.patches) == 3
    assert any(getattr(c, "errorbar", None) for c in top.containers)


def test_headline_says_when_nothing_beats_native():
    rows = [_row("mlp", "native", 5.0, 20.0), _row("mlp", "compile", 6.0, 900.0, be="never")]
    assert plots._headline(rows).startswith("no level is measurably faster than native in steady state")


def test_headline_takes_the_best_pass_and_only_a_measurable_win():
    native, fast = _row("mlp", "native", 6.0, 20.0), _row("mlp", "compile", 2.0, 900.0, be=5)
    fast["fwd_bwd"] = _timing(18.0 / 2.5)  # forward 3.0×, forward+backward 2.5×
    assert "3.0× faster than native in steady state (mlp, forward)" in plots._headline([native, fast])
    near = _row("mlp", "compile", 5.5, 900.0)  # 1.09× by the medians, the spreads overlap
    assert plots._headline([native, near]).startswith("no level is measurably faster")


def test_scaling_figure_is_log_log_with_a_line_per_level(tmp_path, monkeypatch):
    points = [{"level": lvl, "value": v, "fwd_bwd": _timing(v * k + 1)}
              for lvl, k in (("native", 1.0), ("compile", 0.3)) for v in (1, 2, 4, 8)]
    fig = _drawn(monkeypatch, lambda: plots.scaling_figure(points, "mlp", "rows", SETTINGS, ENV,
                                                           tmp_path / "s.png"))
    ax = fig.axes[0]
    assert ax.get_xscale() == ax.get_yscale() == "log"
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert {"1 native", "3 compile"} <= set(labels) and "ms" in ax.get_ylabel()
    assert len([line for line in ax.get_lines() if len(line.get_xdata()) == 4]) >= 2


def test_roofline_puts_levels_under_the_measured_roofs(tmp_path, monkeypatch):
    ceilings = {"dtype": "float32", "matmul_tflops": 0.06, "copy_tbps": 0.005}
    fig = _drawn(monkeypatch, lambda: plots.roofline_figure(ROWS[:3], ceilings, SETTINGS, ENV,
                                                            tmp_path / "r.png"))
    ax = fig.axes[0]
    assert "memory-bound" in ax.get_title()  # intensity 0.5 FLOP/B, the ridge is at 12
    assert len(ax.collections) >= 6  # 3 levels x (fwd, fwd+bwd) points
    assert any("GB/s" in t.get_text() for t in ax.texts) and any("TFLOP/s" in t.get_text() for t in ax.texts)
