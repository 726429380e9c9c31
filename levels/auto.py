"""level="auto": each call runs the fastest level that passes the harness for it.

    import levels
    y = levels.auto.layer_norm(x, w, b)          # or levels.get("auto").layer_norm(...)
    layer = levels.nn.LayerNorm(1024, level="auto")
    levels.auto.choice("layer_norm", x, w, b)    # which level that call runs, and why

Not a rung of the ladder: a chooser on top of it, with the same five functions. A call
is classed by component, variant (causal, training), dtype, device and shape class (each
dimension of the main input rounded up to a power of two); the first call of a class
checks every level on its arguments against the float64 reference and times the ones
that pass (one line on stderr says so; seconds, a compile included), and the decision is
kept on disk per user (`equivalence.select`). Never chosen: a level unavailable here, one
that fails the check, and Triton in its CPU interpreter (an emulation: its time says
nothing about the kernel). Levels within 5% of the fastest count as equally fast, and
then the lowest rung wins: less code, no compile, nothing gained by the rest.

Choosing needs the harness (a check against the float64 reference, then timing), and
`levels` never imports the harness that checks it: dependencies point one way. So the
harness hands its chooser to this module instead: importing `equivalence.select` registers
it (`use_chooser`), and a call made before that finds it through the entry point the
installed package declares in the group "levels.auto" (pyproject.toml). `import levels`
imports nothing of the harness either way.
"""

from __future__ import annotations

import importlib.metadata

import torch

from . import contract, get
from .contract import autocasts

ENTRY_POINT_GROUP = "levels.auto"
_chooser = None


def use_chooser(chooser) -> None:
    """Make `chooser(component, args, kwargs) -> decision` (a `.level` to run) the one every
    level="auto" call asks; equivalence.select registers its own when imported."""
    global _chooser
    _chooser = chooser


def _choose():
    if _chooser is None:
        for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            use_chooser(entry.load())
            break
        else:
            raise RuntimeError("level='auto' needs the harness to choose with, and none is "
                               "registered: install the levels package (`pip install -e .` "
                               "declares equivalence.select's chooser), or import "
                               "equivalence.select first")
    return _chooser


def choice(component: str, *args, **kwargs):
    """The `equivalence.select.Decision` a call with these arguments gets (measured if new)."""
    getattr(contract, f"validate_{component}")(*args, **kwargs)
    return _choose()(component, args, kwargs)


def _call(component: str, *args, **kwargs):
    decision = choice(component, *args, **kwargs)
    return getattr(get(decision.level), component)(*args, **kwargs)


def unavailable_reason(device: torch.device, component: str | None = None) -> str | None:
    return None  # native always runs, so there is always something to choose


@autocasts("attention")
def attention(q, k, v, causal=False, scale=None, causal_alignment="top_left", kv_lens=None,
              rope=None):
    extra = {} if rope is None else {"rope": rope}  # a level written before rope= still runs
    return _call("attention", q, k, v, causal=causal, scale=scale,
                 causal_alignment=causal_alignment, kv_lens=kv_lens, **extra)


@autocasts("layer_norm")
def layer_norm(x, weight, bias, eps=1e-5):
    return _call("layer_norm", x, weight, bias, eps=eps)


@autocasts("rms_norm")
def rms_norm(x, weight, eps=1e-6):
    return _call("rms_norm", x, weight, eps=eps)


@autocasts("mlp")
def mlp(x, w1, b1, w2, b2):
    return _call("mlp", x, w1, b1, w2, b2)


@autocasts("swiglu_mlp")
def swiglu_mlp(x, w_gate, w_up, w_down):
    return _call("swiglu_mlp", x, w_gate, w_up, w_down)


@autocasts("lstm")
def lstm(x, h0, c0, w_ih, w_hh, b_ih, b_hh):
    return _call("lstm", x, h0, c0, w_ih, w_hh, b_ih, b_hh)


@autocasts("conv_bn")
def conv_bn(x, conv_weight, conv_bias, bn_weight, bn_bias, running_mean, running_var,
            stride=1, padding=0, eps=1e-5, momentum=0.1, training=False):
    return _call("conv_bn", x, conv_weight, conv_bias, bn_weight, bn_bias, running_mean,
                 running_var, stride=stride, padding=padding, eps=eps, momentum=momentum,
                 training=training)


@autocasts("rope")
def rope(x, cos, sin, interleaved=False):
    return _call("rope", x, cos, sin, interleaved=interleaved)


@autocasts("newton_schulz")
def newton_schulz(G, steps=5, coefficients=(3.4445, -4.7750, 2.0315), eps=1e-7):
    return _call("newton_schulz", G, steps=steps, coefficients=coefficients, eps=eps)
