"""Your own code in the harness: a function (fn=) or a module registered as a level.

A student's function goes through the very same check as a level: the contract's validator
first, poisoned allocations, both layouts, the memory checks, the float32 bound. So the
planted bugs below are the ones a student really writes (an unbiased variance, a kernel that
reads a weight as if its stride were 1) and each must fail; the correct one must pass."""

from __future__ import annotations

import inspect
import sys
import types

import pytest
import torch

import levels
from equivalence import cards, select
from equivalence import check as check_module
from equivalence.commands.agree import REFERENCE, agreement
from equivalence.check import check, check_args
from equivalence.commands.compare import compare
from equivalence.profile import profile
from levels import nn as lnn


@pytest.fixture(autouse=True)
def no_registered_levels():
    yield
    for name in levels.registered():
        levels.unregister(name)


# ------------------------------------------------------------- a student's functions --

def my_layer_norm(x, weight, bias, eps=1e-5):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)  # biased, as nn.LayerNorm
    return (x - mean) * torch.rsqrt(var + eps) * weight + bias


def unbiased_variance(x, weight, bias, eps=1e-5):
    mean = x.mean(-1, keepdim=True)
    var = x.var(-1, keepdim=True)  # divides by N - 1: the classic layernorm bug
    return (x - mean) * torch.rsqrt(var + eps) * weight + bias


def ignores_weight_stride(x, weight, bias, eps=1e-5):
    # What a kernel does with `w_ptr + cols`: the weight read as if its stride were 1
    flat = torch.as_strided(weight, weight.shape, (1,), weight.storage_offset())
    return my_layer_norm(x, flat, bias, eps)


def my_mlp(x, w1, b1, w2, b2):
    return torch.nn.functional.gelu(x @ w1.T + b1) @ w2.T + b2


def _module(name="student_levels", **functions):
    """A real module, as a student's file would be."""
    module = types.ModuleType(name)
    module.__dict__.update(functions)
    return module


# ------------------------------------------------------------------------ fn= --

def test_a_correct_function_passes_both_layouts_under_its_own_name():
    results = check("layer_norm", fn=my_layer_norm)
    assert {r.layout for r in results} == set(cards.LAYOUTS)
    for r in results:
        assert r.passed, r.summary()
        assert r.level == "fn:my_layer_norm" and r.tolerance == 1e-5 and not r.tf32
        assert any(c.name == "grad weight" for c in r.comparisons)
        assert any(c.name.endswith(": unchanged") for c in r.comparisons)  # memory checked


def test_a_wrong_variance_fails_in_both_layouts():
    for r in check("layer_norm", fn=unbiased_variance):
        assert r.status == "fail", r.summary()
        assert not next(c for c in r.comparisons if c.name == "out").ok


def test_a_function_that_ignores_the_weights_stride_fails_in_the_strided_layout():
    contiguous, strided = check("layer_norm", fn=ignores_weight_stride)
    assert contiguous.passed, contiguous.summary()  # invisible without views
    assert strided.status == "fail"
    assert "non-finite" in strided.comparisons[0].problem  # it read the NaN between elements


def test_check_args_takes_a_function_and_keeps_the_callers_strides():
    args = cards.get("layer_norm").case("tiny", "default", torch.float32, "cpu", 0, "strided").args
    seen = {}

    def spy(x, weight, bias, eps=1e-5):
        seen.update(weight=weight.stride())
        return my_layer_norm(x, weight, bias, eps)

    r = check_args("layer_norm", args, fn=spy)
    assert r.passed and r.level == "fn:spy" and r.layout == "strided", r.summary()
    assert seen == {"weight": (2,)}
    assert not check_args("layer_norm", args=args, fn=ignores_weight_stride).passed
    assert check_args("layer_norm", "native", args).passed  # the positional level still works


def test_the_contract_is_validated_before_the_function_runs(monkeypatch):
    calls = []
    validate = levels.contract.VALIDATORS["layer_norm"]

    def recording_validator(*args, **kwargs):
        calls.append("validate")
        return validate(*args, **kwargs)

    def student(x, weight, bias, eps=1e-5):
        calls.append("student")
        return my_layer_norm(x, weight, bias, eps)

    monkeypatch.setitem(levels.contract.VALIDATORS, "layer_norm", recording_validator)
    assert check("layer_norm", fn=student, layout="contiguous")[0].passed
    assert calls == ["validate", "student"] * 2  # with gradients, then under no_grad
    calls.clear()
    with pytest.raises(ValueError, match="argument 'weight'"):  # a wrong input never reaches it
        levels.own("layer_norm", student).layer_norm(torch.randn(2, 4), torch.ones(3),
                                                     torch.zeros(4))
    assert calls == ["validate"]


def test_a_function_that_raises_is_an_error_with_its_line():
    def broken(x, weight, bias, eps=1e-5):
        raise RuntimeError("not written yet")

    line = inspect.getsourcelines(broken)[1] + 1
    [r] = check("layer_norm", fn=broken, layout="contiguous")
    assert r.status == "error" and "not written yet" in r.reason
    assert f"test_own_code.py:{line}" in r.reason, r.reason


@pytest.mark.parametrize("wrong, problem", [
    (lambda x, weight, bias, eps=1e-5: my_layer_norm(x, weight, bias, eps)[..., :-1], "shape"),
    (lambda x, weight, bias, eps=1e-5: my_layer_norm(x, weight, bias, eps).double(), "dtype"),
    (lambda x, weight, bias, eps=1e-5: (my_layer_norm(x, weight, bias, eps), 1.0), "values"),
])
def test_wrong_outputs_fail_naming_what_is_wrong(wrong, problem):
    [r] = check("layer_norm", fn=wrong, layout="contiguous")
    assert r.status == "fail", r.summary()
    assert problem in r.summary()


def test_tf32_is_declared_never_assumed():
    [plain] = check("layer_norm", fn=my_layer_norm, layout="contiguous")
    [declared] = check("layer_norm", fn=my_layer_norm, layout="contiguous", uses_tf32=True)
    assert plain.tolerance == 1e-5 and not plain.tf32
    assert declared.tf32 and declared.tolerance == 4e-3

    def tf32_mlp(x, w1, b1, w2, b2):
        return my_mlp(x, w1, b1, w2, b2)

    tf32_mlp.uses_tf32 = True  # or as an attribute
    [r] = check("mlp", fn=tf32_mlp, layout="contiguous")
    assert r.passed and r.tf32 and r.tolerance == 4e-3
    [r] = check("mlp", fn=tf32_mlp, layout="contiguous", dtype="bfloat16")
    assert r.tolerance == 3.1e-2  # TF32 is about float32 only


def test_bad_uses_raise_clear_errors():
    with pytest.raises(ValueError, match="either a level or fn="):
        check("layer_norm", "native", fn=my_layer_norm)
    args = cards.get("layer_norm").case("tiny", "default", torch.float32, "cpu", 0).args
    with pytest.raises(ValueError, match="either a level or fn="):
        check_args("layer_norm", "native", args, fn=my_layer_norm)
    with pytest.raises(ValueError, match="one component"):
        check(fn=my_layer_norm)
    with pytest.raises(TypeError, match="levels.register"):
        check("layer_norm", fn=_module(layer_norm=my_layer_norm))
    with pytest.raises(ValueError, match="uses_tf32"):
        check("layer_norm", "native", uses_tf32=True)
    with pytest.raises(ValueError, match="argument 'level'.*fn="):
        check("layer_norm", "my_layer_norm")  # the message says how to check a function
    with pytest.raises(ValueError, match="pass a level .* or your function as fn="):
        check_args("layer_norm", args=args)


# -------------------------------------------------------------- register --

def test_a_registered_module_is_a_level_for_the_harness():
    info = levels.register("mine", _module(layer_norm=my_layer_norm, mlp=my_mlp))
    assert info.name == "mine" and levels.resolve("Mine") == info
    assert levels.LEVEL_NAMES == ("native", "torchscript", "compile", "triton", "cuda")
    assert levels.names() == levels.LEVEL_NAMES + ("mine",)
    for r in check("layer_norm", "mine") + check("mlp", "mine", layout="strided"):
        assert r.passed and r.level == "mine", r.summary()
    for r in check("attention", "mine", variant="causal"):
        assert r.status == "skip" and r.reason == "'mine' has no attention function"
    assert levels.status("mine", "cpu", "lstm") == "'mine' has no lstm function"


def test_check_without_a_level_runs_the_registered_ones_after_the_five(monkeypatch):
    levels.register("mine", _module(layer_norm=my_layer_norm))
    seen = []
    monkeypatch.setattr(check_module, "check_case", lambda comp, level, *a, **k: seen.append(level))
    check("layer_norm", layout="contiguous")
    assert seen == list(levels.LEVEL_NAMES) + ["mine"]


def test_a_registered_planted_bug_fails_like_a_level():
    levels.register("buggy", {"layer_norm": ignores_weight_stride})  # a dict works too
    contiguous, strided = check("layer_norm", "buggy")
    assert contiguous.passed and strided.status == "fail", strided.summary()


def test_registered_levels_in_agreement_profile_and_compare():
    levels.register("mine", _module(layer_norm=my_layer_norm))
    a = agreement("layer_norm", level_names=["native", "mine"],
                  fns={"student": unbiased_variance, "cuda_less": my_layer_norm})
    assert a.names == [REFERENCE, "native", "mine", "student", "cuda_less"], a.skipped
    truth = a.matrix[0]
    assert truth[2] < 1e-5 and truth[4] < 1e-5 and truth[3] > 1e-3  # the bug disagrees
    with pytest.raises(ValueError, match="names no level"):
        agreement("layer_norm", level_names=["native"], fns={"mine": my_layer_norm})

    p = profile("layer_norm", "mine", size="tiny", min_time_s=0.01)
    assert p.status == "ok" and p.level == "mine" and p.fwd_bwd["median_ms"] > 0
    p = profile("layer_norm", fn=my_layer_norm, size="tiny", min_time_s=0.01)
    assert p.status == "ok" and p.level == "fn:my_layer_norm" and p.fwd["median_ms"] > 0
    assert profile("attention", "mine", size="tiny").status == "skip"
    with pytest.raises(ValueError, match="either a level or fn="):
        profile("layer_norm", "native", fn=my_layer_norm)

    report = compare(["layer_norm"], ["native", "mine"], size="tiny", check_size="tiny",
                     fns={"student": unbiased_variance})
    rows = {r["level"]: r for r in report["rows"]}
    assert report["settings"]["levels"] == ["native", "mine", "student"]
    assert rows["mine"]["status"] == "ok" and rows["mine"]["check"] == "pass"
    assert rows["student"]["status"] == "ok" and rows["student"]["check"] == "FAIL"
    assert rows["student"]["break_even_calls_vs_native"] is not None  # timed like a level
    with pytest.raises(ValueError, match="one component"):
        compare(["layer_norm", "mlp"], ["native"], fns={"student": my_layer_norm})


def test_a_registered_level_in_levels_nn():
    levels.register("mine", _module(layer_norm=my_layer_norm))
    layer = lnn.LayerNorm(24, level="mine")
    torch.nn.init.normal_(layer.weight)
    x = torch.randn(3, 5, 24)
    expected = torch.nn.functional.layer_norm(x, (24,), layer.weight, layer.bias)
    torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-5)
    assert "mine" in repr(layer)
    lnn.set_level(layer, "native")
    assert layer.level == "native"
    attention = lnn.MultiheadAttention(16, 2, level="mine")
    with pytest.raises(NotImplementedError, match="'mine' has no attention function"):
        attention(torch.randn(1, 3, 16))
    # validated before your code; x is the odd one out (weight and bias agree on 24)
    with pytest.raises(ValueError, match="argument 'x'"):
        levels.get("mine").layer_norm(torch.randn(3, 4), layer.weight, layer.bias)
    with pytest.raises(ValueError, match="argument 'weight'"):
        levels.get("mine").layer_norm(torch.randn(3, 24), layer.weight[:4], layer.bias)


def test_optional_unavailable_reason_and_uses_tf32():
    def unavailable_reason(device, component=None):
        return "needs a GPU" if device.type != "cuda" else None

    levels.register("gpu_only", _module(layer_norm=my_layer_norm,
                                        unavailable_reason=unavailable_reason))
    [r] = check("layer_norm", "gpu_only", layout="contiguous")
    assert r.status == "skip" and r.reason == "needs a GPU"
    levels.register("tf32", _module(mlp=my_mlp, uses_tf32=lambda component, device, dtype:
                                    dtype == torch.float32))
    [r] = check("mlp", "tf32", layout="contiguous")
    assert r.passed and r.tf32 and r.tolerance == 4e-3


def test_register_refuses_bad_uses_by_name():
    for taken in ("native", "Triton", "3", "compiled", "auto"):
        with pytest.raises(ValueError, match="choose a name of your own"):
            levels.register(taken, _module(layer_norm=my_layer_norm))
    with pytest.raises(ValueError, match="lowercase identifier"):
        levels.register("my level", _module(layer_norm=my_layer_norm))
    with pytest.raises(ValueError, match="none of the component functions"):
        levels.register("empty", _module())
    with pytest.raises(TypeError, match="'layer_norm' must be a function"):
        levels.register("bad", _module(layer_norm=3))
    with pytest.raises(TypeError, match="not one function"):
        levels.register("one", my_layer_norm)
    with pytest.raises(TypeError, match="uses_tf32"):
        levels.register("bad", _module(layer_norm=my_layer_norm, uses_tf32="yes"))
    with pytest.raises(ValueError, match="no level 'nothing' is registered"):
        levels.unregister("nothing")
    with pytest.raises(ValueError, match="is a level of the ladder"):
        levels.unregister("native")
    assert levels.registered() == ()


def test_register_again_replaces_and_unregister_forgets():
    levels.register("mine", _module(layer_norm=unbiased_variance))
    levels.register("mine", _module(layer_norm=my_layer_norm))  # a notebook cell run twice
    assert check("layer_norm", "mine", layout="contiguous")[0].passed
    levels.unregister("mine")
    assert levels.names() == levels.LEVEL_NAMES
    with pytest.raises(ValueError, match="argument 'level'"):
        check("layer_norm", "mine")


def test_auto_chooses_among_the_five_rungs_only(tmp_path, monkeypatch):
    # A registered level is no candidate of levels.auto: it is someone's code under test.
    levels.register("mine", _module(layer_norm=my_layer_norm))
    assert select.CANDIDATES == levels.LEVEL_NAMES
    assert levels.get("auto") is sys.modules["levels.auto"]
    with pytest.raises(ValueError, match="'auto' is not a level"):
        levels.resolve("auto")
    monkeypatch.setenv("LEVELS_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(select, "CANDIDATES", ("native",))  # no compile in a unit test
    select.forget()
    try:
        layer = lnn.LayerNorm(16, level="auto")
        x = torch.randn(4, 16)
        torch.testing.assert_close(layer(x), torch.nn.functional.layer_norm(x, (16,)))
        decision = levels.auto.choice("layer_norm", x, layer.weight, layer.bias)
        assert decision.level == "native"
        assert [m.level for m in decision.measurements] == ["native"]
    finally:
        select.forget()
