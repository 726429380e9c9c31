"""level="auto": the fastest level that passes the harness, never an unavailable or failing one."""

import json

import pytest
import torch

import levels
import levels.native as native
from equivalence import cards, select
from equivalence.select import TIE, Measurement, choose
from levels import nn as lnn


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    """A cache of our own, and two quick candidates: compiling would take seconds a test."""
    monkeypatch.setenv("LEVELS_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(select, "CANDIDATES", ("native", "torchscript"))
    select.forget()
    yield tmp_path
    select.forget()


def _ok(level, ms, spread=None):
    return Measurement(level, "ok", fwd_ms=ms, fwd_bwd_ms=ms, fwd_spread=spread, fwd_bwd_spread=spread)


def test_choose_the_fastest_and_prefer_the_lower_rung_within_the_tie():
    assert choose([_ok("native", 10.0), _ok("compile", 5.0), _ok("torchscript", 7.0)], "fwd") == "compile"
    # compile is 4% faster than torchscript: as fast as timing can tell, so the lower rung wins
    assert choose([_ok("native", 10.0), _ok("torchscript", 5.2), _ok("compile", 5.0)], "fwd") == "torchscript"
    assert choose([_ok("native", 5.0 * (1 + TIE)), _ok("compile", 5.0)], "fwd") == "native"
    assert choose([_ok("native", 5.0 * (1 + 2 * TIE)), _ok("compile", 5.0)], "fwd") == "compile"


def test_overlapping_spreads_are_a_tie_and_the_lower_rung_wins():
    # 20% apart by the medians, but the p20–p80 intervals overlap: the timing cannot tell
    found = [_ok("native", 6.0, [5.0, 7.5]), _ok("compile", 5.0, [4.5, 6.0])]
    assert choose(found, "fwd") == "native"
    found = [_ok("native", 6.0, [5.8, 6.3]), _ok("compile", 5.0, [4.5, 5.5])]  # clear of it
    assert choose(found, "fwd") == "compile"


def test_the_table_says_as_fast_where_the_spreads_overlap():
    import io

    from rich.console import Console

    from equivalence.commands import select as command
    found = [_ok("native", 6.0, [5.0, 7.5]), _ok("torchscript", 5.8, [5.5, 6.2]),
             _ok("compile", 5.0, [4.5, 6.0]), _ok("triton", 9.0, [8.5, 9.5])]
    d = select.Decision("mlp", "default", "float32", "cpu", "x ≤8×32", "fwd", choose(found, "fwd"), found)
    out = io.StringIO()
    command.print_table([d], "cpu", "tiny", "fwd", Console(file=out, width=150))
    text = out.getvalue()
    assert d.level == "native" and "chosen" in text and "as fast as the fastest (compile)" in text
    assert text.count("≈ as fast") == 2 and "slower" in text  # torchscript, compile; triton


def test_choose_never_picks_a_level_that_did_not_pass():
    found = [_ok("native", 10.0),
             Measurement("compile", "failed", "grad x: rel 0.3 > 1e-05", fwd_ms=0.1, fwd_bwd_ms=0.1),
             Measurement("triton", "interpreted", "emulation", fwd_ms=0.1, fwd_bwd_ms=0.1),
             Measurement("cuda", "unavailable", "needs a GPU", fwd_ms=0.1, fwd_bwd_ms=0.1),
             Measurement("torchscript", "error", "RuntimeError", fwd_ms=0.1, fwd_bwd_ms=0.1)]
    assert choose(found, "fwd_bwd") == "native"
    with pytest.raises(RuntimeError, match="no level passes"):
        choose(found[1:], "fwd_bwd")


def _args(component="layer_norm", size="tiny", variant="default"):
    return cards.get(component).case(size, variant, torch.float32, "cpu", seed=5).args


def test_measured_choice_is_as_fast_as_the_fastest_it_recorded(fresh_cache, monkeypatch):
    d = select.decide("layer_norm", _args(), "fwd_bwd")
    assert d.source == "measured now" and {m.level for m in d.measurements} == {"native", "torchscript"}
    recorded = json.loads((fresh_cache / "auto.json").read_text())
    [entry] = recorded.values()
    ok = [select.Measurement(**m) for m in entry["measurements"] if m["status"] == "ok"]
    fastest = min(ok, key=lambda m: m.fwd_bwd_ms)
    chosen = next(m for m in ok if m.level == d.level)
    assert select.as_fast(chosen, fastest, "fwd_bwd") and chosen.fwd_bwd_spread  # the spread is kept
    select.forget()  # a new process: the decision comes from the disk, nothing is timed again
    monkeypatch.setattr(select, "measure", lambda *a, **k: pytest.fail("measured again"))
    again = select.decide("layer_norm", _args(), "fwd_bwd")
    assert again.source == str(fresh_cache / "auto.json")
    assert again.level == d.level and again.measurements == d.measurements


def test_a_failing_level_is_never_chosen_however_fast(monkeypatch):
    monkeypatch.setattr(native, "layer_norm", lambda x, weight, bias, eps=1e-5:
                        torch.nn.functional.layer_norm(x, x.shape[-1:], weight, bias * 0, eps))
    d = select.decide("layer_norm", _args(), "fwd")
    by = {m.level: m for m in d.measurements}
    assert by["native"].status == "failed" and "bias" in by["native"].reason
    assert d.level == "torchscript"


def test_an_unavailable_level_is_never_chosen(monkeypatch):
    real = levels.status
    monkeypatch.setattr(levels, "status", lambda level, device="cpu", component=None:
                        "switched off by the test" if level == "native" else real(level, device, component))
    d = select.decide("layer_norm", _args(), "fwd")
    assert {m.level: m.status for m in d.measurements}["native"] == "unavailable"
    assert d.level == "torchscript"


def test_interpreted_triton_is_no_candidate(monkeypatch):
    import levels.triton as triton_level
    if not triton_level.INTERPRETED:
        pytest.skip("Triton is compiled for a GPU here")
    monkeypatch.setattr(select, "CANDIDATES", ("native", "triton"))
    d = select.decide("mlp", _args("mlp"), "fwd")
    assert {m.level: m.status for m in d.measurements}["triton"] == "interpreted" and d.level == "native"


def test_decisions_are_per_shape_class_variant_and_pass():
    small, big = _args(size="tiny"), _args(size="small")
    assert select.shape_class(small) != select.shape_class(big)
    assert select.shape_class(_args("mlp")) == "x ≤2×16×32, w1 ≤128×32"  # (2,9,24) and (72,24)
    full = select.decide("attention", _args("attention", variant="full"), "fwd")
    causal = select.decide("attention", _args("attention", variant="causal"), "fwd")
    assert (full.variant, causal.variant) == ("full", "causal")


def test_functional_auto_says_once_that_it_measures(capsys):
    x, w, b = (_args()[k] for k in ("x", "weight", "bias"))
    out = levels.auto.layer_norm(x, w, b)
    assert torch.allclose(out, native.layer_norm(x, w, b), atol=1e-5)
    err = capsys.readouterr().err
    assert err.count("levels auto: first layer_norm call") == 1 and "auto.json" in err
    levels.get("auto").layer_norm(x, w, b)
    assert "levels auto" not in capsys.readouterr().err
    assert levels.auto.choice("layer_norm", x, w, b).level in ("native", "torchscript")
    with pytest.raises(ValueError, match="argument 'weight'"):  # the contract first, as everywhere
        levels.auto.layer_norm(x, w[:3], b)


def test_nn_modules_take_auto_and_train_through_it():
    layer = lnn.LayerNorm(24, level="auto")
    assert layer.level == "auto" and "auto" in repr(layer)
    x = torch.randn(3, 24, requires_grad=True)
    layer(x).sum().backward()
    assert x.grad is not None and layer.weight.grad is not None
    lnn.set_level(layer, "native")
    assert layer.level == "native"
    lnn.set_level(layer, "auto")
    assert layer.level == "auto"


def test_auto_is_no_rung_of_the_ladder():
    assert "auto" not in levels.LEVEL_NAMES
    with pytest.raises(ValueError, match="not a level"):
        levels.resolve("auto")
    assert levels.get("auto") is levels.auto
