"""The float64 references agree with torch's own modules, on random and odd shapes.

The references in equivalence/cards are written from the math; these tests are what
lets them be trusted as the ground truth for every level."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from equivalence import cards

f64 = dict(dtype=torch.float64)


def close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("B,H,Nq,Nk,D,causal", [
    (1, 1, 1, 1, 8, False), (1, 1, 1, 1, 8, True), (2, 3, 37, 37, 16, False), (2, 3, 37, 37, 16, True),
    (1, 2, 5, 70, 64, False), (1, 2, 70, 5, 32, False), (2, 1, 129, 129, 128, True)])
@pytest.mark.parametrize("scale", [None, 0.3])
def test_attention_reference_matches_sdpa(B, H, Nq, Nk, D, causal, scale):
    q, k, v = torch.randn(B, H, Nq, D, **f64), torch.randn(B, H, Nk, D, **f64), torch.randn(B, H, Nk, D, **f64)
    ref, = cards.get("attention").reference(dict(q=q, k=k, v=v, causal=causal, scale=scale))
    close(ref, F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale))


@pytest.mark.parametrize("shape", [(7,), (3, 1023), (2, 5, 129), (4, 4096)])
def test_layer_norm_reference_matches_nn(shape):
    m = nn.LayerNorm(shape[-1], **f64)
    with torch.no_grad():
        m.weight.normal_()
        m.bias.normal_()
    x = torch.randn(shape, **f64) * 3 + 1
    ref, = cards.get("layer_norm").reference(dict(x=x, weight=m.weight, bias=m.bias, eps=m.eps))
    close(ref, m(x))


@pytest.mark.parametrize("shape", [(7,), (3, 1), (3, 1023), (2, 5, 129), (4, 4096)])
@pytest.mark.parametrize("eps", [1e-6, 0.1])
def test_rms_norm_reference_matches_torch(shape, eps):
    # torch's own op, F.rms_norm, through the layer a user builds (nn.RMSNorm)
    m = nn.RMSNorm(shape[-1], eps=eps, **f64)
    with torch.no_grad():
        m.weight.normal_()
    x = torch.randn(shape, **f64) * 3 + 1
    ref, = cards.get("rms_norm").reference(dict(x=x, weight=m.weight, eps=eps))
    close(ref, m(x))
    close(ref, F.rms_norm(x, (shape[-1],), m.weight, eps))


@pytest.mark.parametrize("rows,K,Hd,N", [((5,), 3, 7, 2), ((2, 9), 24, 72, 20), ((64,), 256, 1024, 128)])
def test_mlp_reference_matches_linear_gelu_linear(rows, K, Hd, N):
    fc1, fc2 = nn.Linear(K, Hd, **f64), nn.Linear(Hd, N, **f64)
    x = torch.randn(*rows, K, **f64)
    ref, = cards.get("mlp").reference(dict(x=x, w1=fc1.weight, b1=fc1.bias, w2=fc2.weight, b2=fc2.bias))
    close(ref, fc2(F.gelu(fc1(x))))


@pytest.mark.parametrize("rows,K,Hd,N", [((5,), 3, 7, 2), ((2, 9), 24, 44, 20), ((64,), 256, 688, 128)])
def test_swiglu_mlp_reference_matches_llamas_mlp(rows, K, Hd, N):
    gate, up = nn.Linear(K, Hd, bias=False, **f64), nn.Linear(K, Hd, bias=False, **f64)
    down = nn.Linear(Hd, N, bias=False, **f64)
    x = torch.randn(*rows, K, **f64) * 2  # the gate's pre-activations well into SiLU's curve
    ref, = cards.get("swiglu_mlp").reference(dict(x=x, w_gate=gate.weight, w_up=up.weight,
                                                  w_down=down.weight))
    close(ref, down(F.silu(gate(x)) * up(x)))  # HF LlamaMLP's forward


@pytest.mark.parametrize("B,T,I,H", [(1, 1, 1, 1), (3, 5, 12, 16), (2, 17, 33, 65)])
def test_lstm_reference_matches_nn_lstm(B, T, I, H):
    m = nn.LSTM(I, H, batch_first=True, **f64)
    x, h0, c0 = torch.randn(B, T, I, **f64), torch.randn(1, B, H, **f64), torch.randn(1, B, H, **f64)
    out, h, c = cards.get("lstm").reference(dict(x=x, h0=h0, c0=c0, w_ih=m.weight_ih_l0, w_hh=m.weight_hh_l0,
                                                 b_ih=m.bias_ih_l0, b_hh=m.bias_hh_l0))
    want, (want_h, want_c) = m(x, (h0, c0))
    close(out, want)
    close(h, want_h)
    close(c, want_c)


@pytest.mark.parametrize("N,Ci,Hh,W,Co,k,stride,padding", [
    (2, 3, 9, 11, 5, 3, 2, 1), (1, 4, 8, 8, 6, 1, 1, 0), (3, 2, 7, 5, 4, (3, 2), (2, 1), (0, 1)),
    (2, 8, 16, 16, 16, 5, 1, 2)])
@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("conv_bias", [True, False])
def test_conv_bn_reference_matches_conv2d_batchnorm2d(N, Ci, Hh, W, Co, k, stride, padding, training,
                                                       conv_bias):
    conv = nn.Conv2d(Ci, Co, k, stride, padding, bias=conv_bias, **f64)
    bn = nn.BatchNorm2d(Co, momentum=0.3, **f64)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.normal_()
        bn.running_mean.normal_()
        bn.running_var.uniform_(0.5, 2)
    mean0, var0 = bn.running_mean.clone(), bn.running_var.clone()
    bn.train(training)
    x = torch.randn(N, Ci, Hh, W, **f64)
    got = cards.get("conv_bn").reference(dict(
        x=x, conv_weight=conv.weight, conv_bias=conv.bias, bn_weight=bn.weight, bn_bias=bn.bias,
        running_mean=mean0, running_var=var0, stride=stride, padding=padding, eps=bn.eps,
        momentum=bn.momentum, training=training))
    close(got[0], bn(conv(x)))  # this call updates bn's running statistics in training mode
    if training:
        close(got[1], bn.running_mean)
        close(got[2], bn.running_var)
    else:
        assert len(got) == 1


def _hf_apply_rotary_pos_emb(x, cos, sin):
    """HF transformers' apply_rotary_pos_emb (models/llama/modeling_llama.py), written out:
    cos and sin are (N, D) there, the two halves repeated."""
    def rotate_half(t):
        t1, t2 = t[..., :t.shape[-1] // 2], t[..., t.shape[-1] // 2:]
        return torch.cat((-t2, t1), dim=-1)
    return x * cos + rotate_half(x) * sin


def _meta_apply_rotary_emb(x, freqs):
    """Meta's llama/model.py apply_rotary_emb: pairs (2i, 2i+1) as complex numbers times
    polar(1, freqs)."""
    z = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(z * torch.polar(torch.ones_like(freqs), freqs)).flatten(-2)


@pytest.mark.parametrize("B,H,N,D,base", [(1, 1, 1, 2, 10000.0), (2, 3, 37, 16, 10000.0),
                                          (1, 2, 100, 128, 500000.0), (2, 1, 9, 96, 10000.0)])
def test_rope_reference_matches_hf_and_meta(B, H, N, D, base):
    # real tables: position n, frequency base**(-2i/D), as both models build them
    inv_freq = base ** -(torch.arange(0, D, 2, **f64) / D)
    freqs = torch.outer(torch.arange(N, **f64), inv_freq)  # (N, D/2)
    x = torch.randn(B, H, N, D, **f64)
    card = cards.get("rope")
    half, = card.reference(dict(x=x, cos=freqs.cos(), sin=freqs.sin(), interleaved=False))
    emb = torch.cat((freqs, freqs), dim=-1)
    close(half, _hf_apply_rotary_pos_emb(x, emb.cos(), emb.sin()))
    inter, = card.reference(dict(x=x, cos=freqs.cos(), sin=freqs.sin(), interleaved=True))
    close(inter, _meta_apply_rotary_emb(x, freqs))
