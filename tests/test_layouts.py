"""Layouts: every level gets views (strided, transposed, sliced, channels_last), and the
harness both passes them through and watches the memory around them.

The planted bugs here are the two a kernel launcher really makes: indexing a view as if its
stride were 1 (it reads the NaN between the elements) and writing an in-place update with
stride 1 (it writes between the elements, where the harness checks nothing changed). They
are planted into Level 4 itself, by undoing the launchers' own fixes, and into Level 1."""

from __future__ import annotations

import pytest
import torch

import levels.native as native
import levels.triton  # noqa: F401  (first: the interpreter must be on before triton loads)
from equivalence import cards
from equivalence.check import check, check_args, clone_layout
from levels.contract import COMPONENTS

pytest.importorskip("triton")


def _views(case):
    return {name: t for name, t in case.tensors().items()}


@pytest.mark.parametrize("component", COMPONENTS)
def test_strided_layout_makes_every_tensor_a_view_of_the_same_values(component):
    spec = cards.get(component)
    for variant in spec.variants:
        plain = spec.case("tiny", variant, torch.float32, "cpu", seed=5)
        strided = spec.case("tiny", variant, torch.float32, "cpu", seed=5, layout="strided")
        assert strided.layout == "strided" and plain.layout == "contiguous"
        for name, t in _views(strided).items():
            assert not t.is_contiguous(), f"{component}.{name} is still contiguous"
            assert torch.equal(t, plain.args[name]), name


def test_gaps_hold_nan_and_updated_buffers_a_sentinel():
    case = cards.get("conv_bn").case("tiny", "train", torch.float32, "cpu", seed=1, layout="strided")
    storage = lambda t: torch.empty(0).set_(t.untyped_storage())  # noqa: E731
    weight, running_var = storage(case.args["bn_weight"]), storage(case.args["running_var"])
    assert torch.isnan(weight[1::2]).all()  # a read between the elements poisons the result
    assert (running_var[1::2] == cards.GAP_SENTINEL).all()  # a write there shows up
    assert torch.isfinite(running_var[0::2]).all()


def test_clone_layout_keeps_sizes_strides_offset_and_the_memory_around():
    buffer = torch.arange(20.0)
    view = buffer[3::4]
    copy = clone_layout(view)
    assert (copy.size(), copy.stride(), copy.storage_offset()) == (view.size(), view.stride(), 3)
    assert torch.equal(copy, view)
    assert copy.untyped_storage().data_ptr() != buffer.untyped_storage().data_ptr()
    assert torch.equal(torch.empty(0).set_(copy.untyped_storage()), buffer)


def test_check_args_hands_the_level_the_callers_strides(monkeypatch):
    seen = {}
    original = native.layer_norm

    def spy(x, weight, bias, eps=1e-5):
        seen.update(x=x.stride(), weight=weight.stride())
        return original(x, weight, bias, eps)

    monkeypatch.setattr(native, "layer_norm", spy)
    args = cards.get("layer_norm").case("tiny", "default", torch.float32, "cpu", 0, "strided").args
    result = check_args("layer_norm", "native", args)
    assert result.passed, result.summary()
    assert result.layout == "strided"
    assert seen == {"x": args["x"].stride(), "weight": (2,)}


def test_default_check_runs_both_layouts_of_every_variant():
    results = check(level="native", dtype="float32")
    expected = {(c, v, lay) for c in COMPONENTS for v in cards.get(c).variants
                for lay in cards.LAYOUTS}
    assert {(r.component, r.variant, r.layout) for r in results} == expected
    assert all(r.passed for r in results), [r.summary() for r in results if not r.passed]
    # the memory of every input was checked too
    for r in results:
        assert any(c.name.endswith(": unchanged") for c in r.comparisons), r.summary()


def test_unknown_layout_is_refused_by_name():
    with pytest.raises(ValueError, match="layout"):
        check("layer_norm", "native", layout="diagonal")


# ----------------------------------------------------------- planted bugs, Level 1 --

def test_a_write_between_a_buffers_elements_is_caught(monkeypatch):
    original = native.conv_bn

    def scribbles(x, conv_weight, conv_bias, bn_weight, bn_bias, running_mean, running_var,
                  **options):
        out = original(x, conv_weight, conv_bias, bn_weight, bn_bias, running_mean, running_var,
                       **options)
        with torch.no_grad():  # one element past the view's first: between two of its elements
            torch.empty(0, dtype=running_mean.dtype).set_(running_mean.untyped_storage())[1] = 0.0
        return out

    monkeypatch.setattr(native, "conv_bn", scribbles)
    contiguous, strided = check("conv_bn", "native", variant="train")
    assert not contiguous.passed  # there it overwrote the second channel's value
    assert not strided.passed
    bad = [c for c in strided.comparisons if not c.ok]
    assert [c.name for c in bad] == ["running_mean: memory around the view"], strided.summary()


def test_writing_into_an_input_is_caught(monkeypatch):
    original = native.layer_norm

    def mutates(x, weight, bias, eps=1e-5):
        out = original(x, weight, bias, eps)
        with torch.no_grad():
            torch.empty(0, dtype=bias.dtype).set_(bias.untyped_storage())[-1] = 7.0
        return out

    monkeypatch.setattr(native, "layer_norm", mutates)
    for r in check("layer_norm", "native"):
        assert not r.passed
        assert any(c.name == "bias: unchanged" and not c.ok for c in r.comparisons), r.summary()


# ----------------------------------------------------------- planted bugs, Level 4 --

def test_level4_kernel_that_ignores_a_stride_is_caught(monkeypatch):
    # The bug as it was: the launcher handed a stride-2 weight to a kernel that reads
    # w_ptr + cols. Undo the launcher's .contiguous() and the harness must fail it.
    import triton_kernels.layer_norm as kernels
    monkeypatch.setattr(kernels, "layer_norm", lambda x, weight, bias, eps=1e-5:
                        kernels._LayerNorm.apply(x, weight, bias, eps))
    contiguous, strided = check("layer_norm", "triton", "float32")
    assert contiguous.passed, contiguous.summary()  # the bug is invisible without views
    assert not strided.passed
    assert "non-finite" in strided.comparisons[0].problem  # it read the NaN between elements


def test_level4_kernel_that_writes_outside_its_view_is_caught(monkeypatch):
    # The other half of that bug: conv_bn(training=True) updating strided running stats
    # with stride 1 wrote between the view's elements (the parent buffer was corrupted).
    import triton_kernels.conv_bn as kernels
    monkeypatch.setattr(kernels, "conv_bn", lambda x, w, b, gamma, beta, rm, rv, stride, padding,
                        eps, momentum, training: kernels._ConvBN.apply(
                            x, w, b, gamma.contiguous(), beta.contiguous(), rm, rv, tuple(stride),
                            tuple(padding), eps, momentum, training))
    contiguous, strided = check("conv_bn", "triton", "float32", variant="train")
    assert contiguous.passed, contiguous.summary()
    bad = {c.name for c in strided.comparisons if not c.ok}
    assert {"running_mean: memory around the view", "running_var: memory around the view"} <= bad
