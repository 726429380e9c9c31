"""Level 4 — Triton: hand-written kernels, one file per component in `triton_kernels/`.

What it adds over torch.compile: we decide the tiling, what is fused and what stays in
registers/shared memory (a flash-attention kernel never writes the score matrix; an MLP
GEMM applies bias+GELU before its tile ever leaves the chip), and we write the backward
pass ourselves instead of relying on autograd of many small ops.

What it costs: correctness is ours (masks at every edge, fp32 accumulation, races in
reductions), so is the backward pass, and so is tuning block sizes per GPU.

This module is thin on purpose: it validates with the shared contract, then calls the
launcher in `triton_kernels/<component>.py`, which picks the grid and runs the kernels
through an autograd.Function.

Without a GPU, Level 4 runs in Triton's CPU interpreter (TRITON_INTERPRET=1), set here
before any kernel is defined. It is slow (use the `tiny` sizes) and it does not emulate
bfloat16 arithmetic (the kernels upcast to fp32, as they must on a GPU anyway).
"""

from __future__ import annotations

import importlib
import os

import torch

from .contract import (validate_attention, validate_conv_bn, validate_layer_norm,
                       validate_lstm, validate_mlp)

if not torch.cuda.is_available():
    # Must happen before `import triton`'s @triton.jit decorators run in triton_kernels.
    os.environ.setdefault("TRITON_INTERPRET", "1")

INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"


def _kernels(component: str):
    return importlib.import_module(f"triton_kernels.{component}")


def unavailable_reason(device: torch.device, component: str | None = None) -> str | None:
    try:
        import triton  # noqa: F401
    except ImportError as exc:
        return f"triton is not installed ({exc}); it ships for Linux only"
    if INTERPRETED and device.type != "cpu":
        return "TRITON_INTERPRET=1 is set: Triton kernels run on CPU tensors only in this process"
    if not INTERPRETED and device.type != "cuda":
        return ("Triton kernels need CUDA tensors on this machine (it has a GPU); set "
                "TRITON_INTERPRET=1 before importing levels.triton to run them on the CPU")
    for c in ([component] if component else []):
        try:
            _kernels(c)
        except ModuleNotFoundError as exc:
            if exc.name == f"triton_kernels.{c}":
                return f"Level 4 (Triton) has no {c} kernel yet"
            raise
    return None


def uses_tf32(component: str, device: torch.device, dtype: torch.dtype) -> bool:
    module = _kernels(component)
    return bool(getattr(module, "uses_tf32", lambda device, dtype: False)(device, dtype))


def attention(q, k, v, causal=False, scale=None):
    s = validate_attention(q, k, v, causal, scale)
    return _kernels("attention").attention(q, k, v, causal, s["scale"])


def layer_norm(x, weight, bias, eps=1e-5):
    validate_layer_norm(x, weight, bias, eps)
    return _kernels("layer_norm").layer_norm(x, weight, bias, float(eps))


def mlp(x, w1, b1, w2, b2):
    validate_mlp(x, w1, b1, w2, b2)
    return _kernels("mlp").mlp(x, w1, b1, w2, b2)


def lstm(x, h0, c0, w_ih, w_hh, b_ih, b_hh):
    validate_lstm(x, h0, c0, w_ih, w_hh, b_ih, b_hh)
    return _kernels("lstm").lstm(x, h0, c0, w_ih, w_hh, b_ih, b_hh)


def conv_bn(x, conv_weight, conv_bias, bn_weight, bn_bias, running_mean, running_var,
            stride=1, padding=0, eps=1e-5, momentum=0.1, training=False):
    s = validate_conv_bn(x, conv_weight, conv_bias, bn_weight, bn_bias, running_mean, running_var,
                         stride, padding, eps, momentum, training)
    return _kernels("conv_bn").conv_bn(x, conv_weight, conv_bias, bn_weight, bn_bias, running_mean,
                                       running_var, s["stride"], s["padding"], float(eps),
                                       float(momentum), training)

