"""levels.nn layers load torch's weights, match torch's modules, and switch level."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import levels
from levels import nn as lnn


def test_layer_norm_from_torch():
    ref = nn.LayerNorm(33)
    nn.init.normal_(ref.weight)
    m = lnn.LayerNorm.from_torch(ref)
    x = torch.randn(4, 7, 33)
    torch.testing.assert_close(m(x), ref(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("eps", [None, 1e-5])
@pytest.mark.parametrize("level", ["native", "triton"])
def test_rms_norm_from_torch(eps, level):
    # eps=None: nn.RMSNorm takes torch.finfo(x.dtype).eps at each call, and so does ours
    ref = nn.RMSNorm(33, eps=eps)
    nn.init.normal_(ref.weight)
    m = lnn.RMSNorm.from_torch(ref, level=level)
    x = torch.randn(4, 7, 33, requires_grad=True)
    y = m(x)
    torch.testing.assert_close(y, ref(x), rtol=1e-5, atol=1e-5)
    y.sum().backward()
    assert m.weight.grad is not None and m.weight.grad.shape == (33,)
    with pytest.raises(ValueError, match="weight"):
        lnn.RMSNorm.from_torch(nn.RMSNorm(33, elementwise_affine=False))
    assert set(m.state_dict()) == set(ref.state_dict())


def test_mlp_from_torch():
    fc1, fc2 = nn.Linear(16, 48), nn.Linear(48, 10)
    m = lnn.MLP.from_torch(fc1, fc2)
    x = torch.randn(3, 16)
    torch.testing.assert_close(m(x), fc2(F.gelu(fc1(x))))


def test_lstm_from_torch_and_state_dict():
    ref = nn.LSTM(12, 20, batch_first=True)
    m = lnn.LSTM.from_torch(ref)
    x = torch.randn(3, 6, 12)
    out, (h, c) = m(x)
    want, (wh, wc) = ref(x)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(c, wc)
    fresh = lnn.LSTM(12, 20)
    fresh.load_state_dict(ref.state_dict())  # parameter names are nn.LSTM's
    torch.testing.assert_close(fresh(x)[0], want)
    with pytest.raises(ValueError, match="batch_first"):
        lnn.LSTM.from_torch(nn.LSTM(12, 20))


def test_multihead_attention_from_torch():
    ref = nn.MultiheadAttention(32, 4, batch_first=True)
    m = lnn.MultiheadAttention.from_torch(ref)
    x = torch.randn(2, 9, 32)
    mask = torch.ones(9, 9, dtype=torch.bool).triu(1)
    torch.testing.assert_close(m(x), ref(x, x, x, need_weights=False)[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(m(x, causal=True), ref(x, x, x, attn_mask=mask, need_weights=False)[0],
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("training", [False, True])
def test_conv_bn_from_torch_tracks_running_stats(training):
    conv, bn = nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8)
    with torch.no_grad():
        bn.running_mean.normal_()
        bn.running_var.uniform_(0.5, 2)
    bn.train(training)
    m = lnn.ConvBN.from_torch(conv, bn)
    x = torch.randn(4, 3, 10, 10)
    torch.testing.assert_close(m(x), bn(conv(x)), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(m.bn.running_mean, bn.running_mean)
    torch.testing.assert_close(m.bn.running_var, bn.running_var)
    assert int(m.bn.num_batches_tracked) == int(bn.num_batches_tracked)


def test_level_switching():
    model = nn.Sequential(lnn.LayerNorm(8), lnn.MLP(8, 16))
    assert model[0].level == "native" and "level='native'" in repr(model)
    lnn.set_level(model, 2)
    assert model[0].level == model[1].level == "torchscript"
    model[1].level = "compiled"
    assert model[1].level == "compile"
    with pytest.raises(ValueError, match="argument 'level'"):
        model[0].level = "fortran"
    model[0].level = "cuda"
    if levels.status("cuda") is not None:
        with pytest.raises(NotImplementedError):
            model[0](torch.randn(2, 8))


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("level", ["native", "triton"])
def test_rotary_embedding_rotates_q_and_k_of_grouped_query_attention(level, interleaved):
    # Llama 3's layout at a tiny size: 4 query heads, 2 key/value heads, base 500000; the
    # decoding offset shifts every position. Against the formula written here from the
    # model's definition (HF's rotate_half, Meta's pairs).
    import levels.triton  # noqa: F401  (the interpreter on before triton loads)

    m = lnn.RotaryEmbedding(16, base=500000.0, interleaved=interleaved, level=level)
    q, k = torch.randn(2, 4, 7, 16), torch.randn(2, 2, 7, 16)
    rq, rk = m(q, k, offset=3)
    angles = torch.outer(torch.arange(3, 10, dtype=torch.float64),
                         500000.0 ** -(torch.arange(0, 16, 2, dtype=torch.float64) / 16))
    for x, got in ((q, rq), (k, rk)):
        x = x.double()
        if interleaved:
            x1, x2 = x[..., 0::2], x[..., 1::2]
            want = torch.stack((x1 * angles.cos() - x2 * angles.sin(),
                                x2 * angles.cos() + x1 * angles.sin()), -1).flatten(-2)
        else:
            cos, sin = torch.cat((angles.cos(),) * 2, -1), torch.cat((angles.sin(),) * 2, -1)
            want = x * cos + torch.cat((-x[..., 8:], x[..., :8]), -1) * sin
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    assert m.state_dict() == {}  # the frequencies are rebuilt, never loaded (as in HF)
    with pytest.raises(ValueError, match="argument 'dim' must be a positive even int"):
        lnn.RotaryEmbedding(15)
