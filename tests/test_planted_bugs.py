"""The harness must catch real bugs. Each test plants one into Level 1 and expects `check`
to fail; a harness that passes these is a harness that cannot fail."""

import math

import pytest
import torch
import torch.nn.functional as F

import levels.native as native
from equivalence.check import check

ORIGINAL = {name: getattr(native, name)
            for name in ("attention", "layer_norm", "mlp", "lstm", "conv_bn", "rms_norm", "rope",
                         "swiglu_mlp", "newton_schulz")}


def plant(monkeypatch, component, fn):
    monkeypatch.setattr(native, component, fn)


def failed(component, dtype, variant=None, status="fail"):
    """The results that did not pass; each must have failed the way expected ("fail": the
    numbers were compared and are wrong; "error": the level raised), never by accident."""
    results = check(component, "native", dtype, "cpu", "tiny", variant=variant)
    assert results, "nothing was checked"
    bad = [r for r in results if r.status != "pass"]
    for r in bad:
        assert r.status == status, (r.status, r.reason)
    return bad


DTYPES = ["float32", "bfloat16"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_wrong_attention_scale_is_caught(monkeypatch, dtype):
    # 1/D instead of 1/sqrt(D): a classic slip
    plant(monkeypatch, "attention",
          lambda q, k, v, causal=False, scale=None: ORIGINAL["attention"](q, k, v, causal, 1 / q.shape[-1]))
    assert failed("attention", dtype, "full")


@pytest.mark.parametrize("dtype", DTYPES)
def test_off_by_one_causal_mask_is_caught(monkeypatch, dtype):
    def leaky(q, k, v, causal=False, scale=None):  # each query also sees the next key
        n = q.shape[-2]
        s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(2), float("-inf"))
        return torch.softmax(s, -1) @ v
    plant(monkeypatch, "attention", leaky)
    bad = failed("attention", dtype, "causal")
    assert bad and bad[0].variant == "causal"


def test_rms_norm_with_layer_norms_variance_is_caught(monkeypatch):
    # The centred variance instead of the mean square: LayerNorm's statistic in RMSNorm.
    # Rows of mean 0.5 and spread 2 make them differ by 3%: far outside float32's bound.
    def centred(x, weight, eps=1e-6):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.var(-1, unbiased=False, keepdim=True) + eps)
                * weight.float()).to(x.dtype)
    plant(monkeypatch, "rms_norm", centred)
    assert failed("rms_norm", "float32")


class _FirstBatchDweight(torch.autograd.Function):
    """RMSNorm whose backward sums dweight over the rows of the first batch element only:
    the reduction over every leading dimension, half done."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        ctx.save_for_backward(x, weight)
        ctx.eps = eps
        return ORIGINAL["rms_norm"](x, weight, eps)

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        with torch.enable_grad():
            xd, wd = x.detach().requires_grad_(), weight.detach().requires_grad_()
            dx, _ = torch.autograd.grad(ORIGINAL["rms_norm"](xd, wd, ctx.eps), (xd, wd), dy)
        xhat = x.float() * torch.rsqrt((x.float() ** 2).mean(-1, keepdim=True) + ctx.eps)
        dweight = (dy.float() * xhat)[0].reshape(-1, x.shape[-1]).sum(0)
        return dx, dweight.to(weight.dtype), None


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_dweight_over_one_batch_element_is_caught(monkeypatch, dtype):
    plant(monkeypatch, "rms_norm", lambda x, weight, eps=1e-6: _FirstBatchDweight.apply(x, weight, eps))
    bad = failed("rms_norm", dtype)
    assert bad and all(any(c.name == "grad weight" and not c.ok for c in r.comparisons) for r in bad)
    assert all(c.ok for r in bad for c in r.comparisons if c.name in ("out", "grad x"))


@pytest.mark.parametrize("dtype", DTYPES)
def test_dropped_mlp_bias_is_caught(monkeypatch, dtype):
    plant(monkeypatch, "mlp", lambda x, w1, b1, w2, b2: F.linear(F.gelu(F.linear(x, w1, b1)), w2) + 0 * b2)
    bad = failed("mlp", dtype)
    assert any(c.name == "out" and not c.ok for c in bad[0].comparisons)


@pytest.mark.parametrize("dtype", DTYPES)
def test_swapped_gate_and_up_is_caught(monkeypatch, dtype):
    # silu(up) * gate instead of silu(gate) * up: the same ops, the weights' roles swapped
    plant(monkeypatch, "swiglu_mlp", lambda x, w_gate, w_up, w_down:
          ORIGINAL["swiglu_mlp"](x, w_up, w_gate, w_down))
    bad = failed("swiglu_mlp", dtype)
    assert any(c.name == "out" and not c.ok for c in bad[0].comparisons)


def test_sigmoid_gate_instead_of_silu_is_caught(monkeypatch):
    # GLU's sigmoid(gate) * up, SwiGLU's missing factor of gate: caught in every output
    plant(monkeypatch, "swiglu_mlp", lambda x, w_gate, w_up, w_down:
          F.linear(torch.sigmoid(F.linear(x, w_gate)) * F.linear(x, w_up), w_down))
    assert failed("swiglu_mlp", "bfloat16")


def test_tanh_gelu_is_caught_in_fp32_and_below_bf16s_resolution(monkeypatch):
    # The tanh approximation differs from erf GELU by ~1e-3: caught at fp32, and honestly
    # *not* a bug bf16 can see (its rounding, 3.9e-3 a step, is larger), so bf16 must pass:
    # the bound is the dtype's resolution, not a net that catches everything.
    plant(monkeypatch, "mlp", lambda x, w1, b1, w2, b2:
          F.linear(F.gelu(F.linear(x, w1, b1), approximate="tanh"), w2, b2))
    assert failed("mlp", "float32")
    assert not failed("mlp", "bfloat16")


@pytest.mark.parametrize("dtype", DTYPES)
def test_transposed_lstm_gate_order_is_caught(monkeypatch, dtype):
    def swap_if(t):  # treat rows as (f, i, g, o) instead of (i, f, g, o)
        i, f, g, o = t.chunk(4, dim=0)
        return torch.cat([f, i, g, o])
    plant(monkeypatch, "lstm", lambda x, h0, c0, w_ih, w_hh, b_ih, b_hh: ORIGINAL["lstm"](
        x, h0, c0, swap_if(w_ih), swap_if(w_hh), swap_if(b_ih), swap_if(b_hh)))
    assert failed("lstm", dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_dropped_layer_norm_bias_is_caught(monkeypatch, dtype):
    plant(monkeypatch, "layer_norm", lambda x, weight, bias, eps=1e-5:
          ORIGINAL["layer_norm"](x, weight, bias * 0, eps))
    assert failed("layer_norm", dtype)


def test_biased_running_variance_is_caught(monkeypatch):
    # BatchNorm2d tracks the *unbiased* variance; tracking the biased one is a real bug that
    # only the running-statistics comparison can see. It moves running_var by m/(n-1) ~ 2e-3
    # at the tiny size: visible at fp32, below bf16's resolution (so fp32 only).
    def biased(x, conv_weight, conv_bias, bn_weight, bn_bias, running_mean, running_var, stride=1,
               padding=0, eps=1e-5, momentum=0.1, training=False):
        rv = running_var
        rv0 = rv.clone()
        out = ORIGINAL["conv_bn"](x, conv_weight, conv_bias, bn_weight, bn_bias, running_mean, rv,
                                  stride, padding, eps, momentum, training)
        n = out.numel() // out.shape[1]
        with torch.no_grad():  # undo the n/(n-1) correction of the update just made
            rv.copy_(rv0 * (1 - momentum) + (rv - rv0 * (1 - momentum)) * (n - 1) / n)
        return out
    plant(monkeypatch, "conv_bn", biased)
    bad = failed("conv_bn", "float32", "train")
    assert [c.name for c in bad[0].comparisons if not c.ok] == ["running_var", "running_var (no grad)"]


def test_nan_is_caught(monkeypatch):
    def poisoned(x, weight, bias, eps=1e-5):
        y = ORIGINAL["layer_norm"](x, weight, bias, eps)
        return y.index_fill(-1, torch.tensor([3]), float("nan"))
    plant(monkeypatch, "layer_norm", poisoned)
    bad = failed("layer_norm", "float32")
    assert "non-finite" in bad[0].comparisons[0].problem


def test_unwritten_output_is_caught(monkeypatch):
    # A "kernel" that forgets the last row: its torch.empty output is poisoned with NaN
    # while the check runs, so the forgotten row cannot pass by luck (e.g. zeros).
    def forgetful(x, weight, bias, eps=1e-5):
        y = ORIGINAL["layer_norm"](x, weight, bias, eps)
        out = torch.empty_like(y)
        out[..., :-1, :] = y[..., :-1, :]
        return out
    plant(monkeypatch, "layer_norm", forgetful)
    bad = failed("layer_norm", "float32")
    assert "non-finite" in bad[0].comparisons[0].problem


def test_wrong_output_dtype_is_caught(monkeypatch):
    # e.g. a kernel that accumulates in fp32 and forgets to cast back
    plant(monkeypatch, "layer_norm", lambda x, weight, bias, eps=1e-5:
          ORIGINAL["layer_norm"](x.float(), weight.float(), bias.float(), eps))
    bad = failed("layer_norm", "bfloat16")
    assert "dtype" in bad[0].comparisons[0].problem


def test_rope_pairs_of_the_other_layout_are_caught(monkeypatch):
    # interleaved=True computed with half-split pairs (i, i + D/2): Meta's checkpoints
    # loaded into HF's layout without permuting the q/k projections, the classic port bug
    plant(monkeypatch, "rope", lambda x, cos, sin, interleaved=False:
          ORIGINAL["rope"](x, cos, sin, False))
    bad = failed("rope", "bfloat16")
    assert bad and all(r.variant == "interleaved" for r in bad)


class _RopeRotatingBackTheWrongWay(torch.autograd.Function):
    # a right forward, and a backward that rotates dy by +theta instead of -theta
    @staticmethod
    def forward(ctx, x, cos, sin, interleaved):
        ctx.save_for_backward(cos, sin)
        ctx.interleaved = interleaved
        return native.rope_math(x, cos, sin, interleaved)

    @staticmethod
    def backward(ctx, dy):
        cos, sin = ctx.saved_tensors
        return native.rope_math(dy, cos, sin, ctx.interleaved), None, None, None


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_backward_with_the_wrong_sign_is_caught(monkeypatch, dtype):
    plant(monkeypatch, "rope", lambda x, cos, sin, interleaved=False:
          _RopeRotatingBackTheWrongWay.apply(x, cos, sin, interleaved))
    bad = failed("rope", dtype)
    assert len(bad) == 4  # both variants, both layouts
    for r in bad:
        assert [c.name for c in r.comparisons if not c.ok] == ["grad x"], r.summary()


def test_missing_backward_is_caught(monkeypatch):
    plant(monkeypatch, "layer_norm", lambda x, weight, bias, eps=1e-5:
          ORIGINAL["layer_norm"](x, weight, bias, eps).detach())
    bad = failed("layer_norm", "float32", status="error")
    assert "grad" in bad[0].reason


def test_a_crashing_level_is_an_error_not_a_skip(monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("kernel exploded")
    plant(monkeypatch, "mlp", boom)
    bad = failed("mlp", "float32", status="error")
    assert "kernel exploded" in bad[0].reason


# ---- newton_schulz: forward only; its bf16 bound is 16u (the card says why), still far
# below what each of these slips does

def _frobenius(t):
    return t / (torch.linalg.vector_norm(t.float(), dim=(-2, -1), keepdim=True) + 1e-7)


def _newton_schulz_with(bad_steps=None, bad_coefficients=None, normalize=_frobenius):
    def bad(G, steps=5, coefficients=(3.4445, -4.7750, 2.0315), eps=1e-7):
        a, b, c = bad_coefficients or coefficients
        tall = G.shape[-2] > G.shape[-1]
        X = G.mT if tall else G
        X = normalize(X).to(G.dtype)
        for _ in range(steps if bad_steps is None else bad_steps):
            A = X @ X.mT
            X = a * X + (b * A + c * A @ A) @ X
        return X.mT if tall else X
    return bad


# bf16 where its bound is widest (16u); the normalization slips in float32; each slip of
# one matrix in the one-matrix variant, the batch's own slip in the batched one
@pytest.mark.parametrize("bug, dtype, variant", [("four-steps", "bfloat16", "default"),
                                                 ("coefficient-typo", "bfloat16", "default"),
                                                 ("max-norm", "float32", "default"),
                                                 ("one-norm-per-batch", "float32", "batched")])
def test_newton_schulz_slips_are_caught(monkeypatch, dtype, bug, variant):
    fn = {"four-steps": _newton_schulz_with(bad_steps=4),
          "coefficient-typo": _newton_schulz_with(bad_coefficients=(3.4445, -4.7750, 2.315)),
          # the largest entry instead of the Frobenius norm: singular values start too big
          "max-norm": _newton_schulz_with(normalize=lambda t: t / t.abs().max()),
          # the whole batch's norm for every matrix: each starts too small, and five steps
          # do not bring its singular values into the band
          "one-norm-per-batch": _newton_schulz_with(normalize=lambda t: t / t.float().norm())}[bug]
    plant(monkeypatch, "newton_schulz", fn)
    assert failed("newton_schulz", dtype, variant)


def test_newton_schulz_band_check_fails_a_singular_value_outside_it():
    from equivalence import cards

    card = cards.get("newton_schulz")
    G = torch.randn(12, 20, dtype=torch.float64)
    args = dict(G=G, steps=5, coefficients=(3.4445, -4.7750, 2.0315), eps=1e-7)
    ref, = card.reference(args)
    assert all(ok for _, ok, _ in card.properties(args, [ref]))
    U, S, Vh = torch.linalg.svd(ref, full_matrices=False)
    for bad_value in (1.5, 0.3):  # one direction blown up, one not converged
        S2 = S.clone()
        S2[0] = bad_value
        (_, ok, problem), = card.properties(args, [U @ torch.diag(S2) @ Vh])
        assert not ok and "singular values" in problem
