"""Bad inputs raise a clear error naming the argument, at every level that can run here,
before any kernel sees them."""

import os
import subprocess
import sys

import pytest
import torch

import levels
from equivalence import cards
from levels.contract import COMPONENTS


def runnable(component):
    return [n for n in levels.LEVEL_NAMES if levels.status(n, "cpu", component) is None]


def good_args(component):
    case = cards.get(component).case("tiny", next(iter(cards.get(component).variants)),
                                     torch.float32, "cpu", seed=0)
    return dict(case.args)


def expect(component, exc, arg, **changes):
    """Every runnable level raises `exc` mentioning `arg` for these changed arguments."""
    names = runnable(component)
    assert "native" in names
    for name in names:
        args = good_args(component) | changes
        with pytest.raises(exc) as info:
            getattr(levels.get(name), component)(**args)
        assert f"'{arg}'" in str(info.value), (name, str(info.value))
        assert component in str(info.value)


def test_attention_bad_inputs():
    a = good_args("attention")
    q = a["q"]
    expect("attention", ValueError, "k", k=a["k"][..., :8])  # head dim mismatch
    expect("attention", ValueError, "q", q=q[0])  # rank 3
    expect("attention", TypeError, "q", q=q.to(torch.int32))  # integer dtype
    expect("attention", TypeError, "v", v=a["v"].double())  # mixed dtypes
    expect("attention", ValueError, "k", k=a["k"].to("meta"))  # mixed devices
    expect("attention", ValueError, "k", k=torch.cat([a["k"], a["k"][:, :1]], 1),
           v=torch.cat([a["v"], a["v"][:, :1]], 1))  # 3 K/V heads do not divide 2
    expect("attention", ValueError, "causal_alignment", causal=True, causal_alignment="bottom")
    expect("attention", TypeError, "kv_lens", kv_lens=torch.tensor([3.0]))
    expect("attention", ValueError, "kv_lens", kv_lens=torch.tensor([3, 4]))
    expect("attention", ValueError, "scale", scale=-1.0)
    expect("attention", TypeError, "causal", causal=1)
    expect("attention", TypeError, "q", q=q.numpy())


def test_layer_norm_bad_inputs():
    a = good_args("layer_norm")
    expect("layer_norm", ValueError, "weight", weight=a["weight"][:-1])
    expect("layer_norm", ValueError, "bias", bias=a["bias"][None])
    expect("layer_norm", TypeError, "x", x=a["x"].long())
    expect("layer_norm", TypeError, "weight", weight=a["weight"].half())
    expect("layer_norm", ValueError, "eps", eps=0.0)


def test_mlp_bad_inputs():
    a = good_args("mlp")
    expect("mlp", ValueError, "w1", w1=a["w1"].t())
    expect("mlp", ValueError, "w2", w2=a["w2"][:, :-1])
    expect("mlp", ValueError, "b1", b1=a["b1"][:-1])
    expect("mlp", ValueError, "w1", w1=a["w1"][None])
    expect("mlp", TypeError, "b2", b2=a["b2"].to(torch.bfloat16))


def test_lstm_bad_inputs():
    a = good_args("lstm")
    expect("lstm", ValueError, "x", x=a["x"][0])
    expect("lstm", ValueError, "h0", h0=a["h0"][0])
    expect("lstm", ValueError, "c0", c0=a["c0"][:, :1])
    expect("lstm", ValueError, "w_hh", w_hh=a["w_hh"][:-1])
    expect("lstm", ValueError, "w_ih", w_ih=a["w_ih"][:, :-1])
    expect("lstm", TypeError, "x", x=a["x"].to(torch.int64))
    expect("lstm", ValueError, "b_hh", b_hh=a["b_hh"].to("meta"))


def test_conv_bn_bad_inputs():
    a = good_args("conv_bn")
    expect("conv_bn", ValueError, "conv_weight", conv_weight=a["conv_weight"][:, :-1])
    expect("conv_bn", ValueError, "x", x=a["x"][0])
    expect("conv_bn", ValueError, "running_var", running_var=a["running_var"][:-1])
    expect("conv_bn", ValueError, "stride", stride=0)
    expect("conv_bn", TypeError, "padding", padding=(1, 1, 1))
    expect("conv_bn", ValueError, "momentum", momentum=1.5)
    expect("conv_bn", TypeError, "training", training="yes")
    expect("conv_bn", TypeError, "x", x=a["x"].to(torch.uint8))
    expect("conv_bn", ValueError, "x", x=a["x"][:, :, :1, :1], padding=0)  # smaller than the kernel


def test_a_mismatch_is_reported_on_the_odd_one_out():
    """The size most of the tensors carrying it agree on is the expected one: the message names
    the tensor that differs, not one that agrees with the others (a transposed w1 was once
    reported against a shape derived from w1 itself)."""
    def message(component, **changes):
        with pytest.raises(ValueError) as info:
            getattr(levels.get("native"), component)(**(good_args(component) | changes))
        return str(info.value)

    ln = good_args("layer_norm")
    N = ln["x"].shape[-1]
    assert f"'x' must be of shape (..., N) with N = {N}, the length of weight and bias" in \
        message("layer_norm", x=ln["x"][..., :-1])
    assert "'weight'" in message("layer_norm", weight=ln["weight"][:-1])  # as before
    lstm = good_args("lstm")
    B, H = lstm["x"].shape[0], lstm["w_hh"].shape[1]
    assert f"'w_hh' must be of shape (4*hidden, hidden) = {(4 * H, H)}, with hidden = {H}" in \
        message("lstm", w_hh=torch.randn(4 * (H // 2), H // 2))
    assert f"'x' must be of shape (B, T, input_size) with B = {B} as h0 and c0 have it" in \
        message("lstm", x=lstm["x"][:1])
    assert "'c0'" in message("lstm", c0=lstm["c0"][:, :1])  # as before
    cb = good_args("conv_bn")
    Cout = cb["conv_weight"].shape[0]
    assert f"'conv_weight' must be of shape (C_out, C_in, kH, kW) = ({Cout}," in \
        message("conv_bn", conv_weight=cb["conv_weight"][:-1])
    assert "'running_var'" in message("conv_bn", running_var=cb["running_var"][:-1])  # as before


@pytest.mark.parametrize("component", COMPONENTS)
def test_every_component_rejects_integer_input(component):
    first = next(k for k, v in good_args(component).items() if isinstance(v, torch.Tensor))
    expect(component, TypeError, first, **{first: good_args(component)[first].to(torch.int32)})


def test_unknown_level_is_a_clear_error():
    with pytest.raises(ValueError, match="argument 'level' must be one of 1=native"):
        levels.resolve("tensorflow")
    assert levels.resolve(3).name == "compile" and levels.resolve("4").name == "triton"


def test_unavailable_level_says_why():
    assert "needs a CUDA GPU" in levels.status("cuda", "cpu")
    with pytest.raises(NotImplementedError, match="Level 5"):
        levels.get("cuda").mlp(*good_args("mlp").values())


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter is used only without a GPU")
def test_triton_imported_too_early_is_reported_not_crashed():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = "import triton, levels; print(levels.status('triton', 'cpu', 'mlp'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         check=True)
    assert "triton was imported before `levels`" in out.stdout
