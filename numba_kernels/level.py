"""The numba twins with the contract's signatures: what the harness checks.

    import levels, numba_kernels.level
    levels.register("numba", numba_kernels.level)          # a level of your own ...
    check("layer_norm", "numba")                            # ... checked like any level
    check("layer_norm", fn=numba_kernels.level.layer_norm)  # or one function

Five components have twins: layer_norm, mlp, attention, rms_norm and rope (the harness reports the
others as "'numba' has no lstm function"). Each function validates its arguments
with levels.contract first, as every level does, then:

  * dtypes: float32 runs as it is; float16 and bfloat16 are upcast to float32 (one copy per
    tensor, differentiable) and the result rounded back to the input dtype, so gradients
    come back in the input dtype too (binding.float32_inputs says what that changes against
    Level 5); float64 is refused with a TypeError, as at Level 5;
  * devices: CPU tensors under numba's CUDA simulator, CUDA tensors on a GPU without it
    (`unavailable_reason` says which this process can run);
  * attention's rope=: the rope twin, then the attention twin (unfused; see `attention`);
  * layouts: what each twin copies, and what it takes with its strides, is said in its
    entry point (numba_kernels.layer_norm.layer_norm, .gemm.mlp, .attention.attention,
    .rope.rope).

Keyword-only extras, for experiments and the notebook's exercises (the harness never passes
them): layer_norm(..., kernels=numba_kernels.layer_norm.row_kernels(my_block_sum)) and
mlp(..., tile=8) (gemm.cu's version 2 uses 32).
"""

from __future__ import annotations

import torch

from levels.contract import (validate_attention, validate_layer_norm, validate_mlp, validate_rms_norm,
                             validate_rope)

from . import attention as attention_twin
from . import gemm as gemm_twin
from . import layer_norm as layer_norm_twin
from . import rms_norm as rms_norm_twin
from . import rope as rope_twin
from . import unavailable_reason as _device_reason
from .binding import float32_inputs

COMPONENTS = ("attention", "layer_norm", "mlp", "rms_norm", "rope")
uses_tf32 = False  # every product is an fp32 multiply-add; no TF32 anywhere


def unavailable_reason(device, component: str | None = None) -> str | None:
    """None if the twins (or `component`'s twin) can run on `device` in this process."""
    if component is not None and component not in COMPONENTS:
        return f"no numba twin of {component} (twins exist for {', '.join(COMPONENTS)})"
    return _device_reason(device)


def _runnable(component: str, t: torch.Tensor) -> None:
    reason = _device_reason(t.device)
    if reason:
        raise RuntimeError(f"{component} (numba twin): cannot run on {t.device} here: {reason}")


def layer_norm(x, weight, bias, eps=1e-5, *, kernels=None):
    validate_layer_norm(x, weight, bias, eps)
    _runnable("layer_norm", x)
    t = float32_inputs("layer_norm", {"x": x, "weight": weight, "bias": bias})
    y = layer_norm_twin.layer_norm(t["x"], t["weight"], t["bias"], eps,
                                   kernels=kernels or layer_norm_twin.ROW_KERNELS)
    return y.to(x.dtype)


def rms_norm(x, weight, eps=1e-6):
    validate_rms_norm(x, weight, eps)
    _runnable("rms_norm", x)
    t = float32_inputs("rms_norm", {"x": x, "weight": weight})
    return rms_norm_twin.rms_norm(t["x"], t["weight"], eps).to(x.dtype)


def mlp(x, w1, b1, w2, b2, *, tile=None):
    validate_mlp(x, w1, b1, w2, b2)
    _runnable("mlp", x)
    t = float32_inputs("mlp", {"x": x, "w1": w1, "b1": b1, "w2": w2, "b2": b2})
    out = gemm_twin.mlp(t["x"], t["w1"], t["b1"], t["w2"], t["b2"],
                        kernels=gemm_twin.gemm_kernels(gemm_twin.TILE if tile is None else tile))
    return out.to(x.dtype)


def attention(q, k, v, causal=False, scale=None, causal_alignment="top_left", kv_lens=None,
              rope=None):
    sizes = validate_attention(q, k, v, causal, scale, causal_alignment, kv_lens, rope)
    _runnable("attention", q)
    t = float32_inputs("attention", {"q": q, "k": k, "v": v})
    q32, k32 = t["q"], t["k"]
    if rope is not None:
        # Unfused, unlike Level 5: the rope twin turns q and k (its backward turns their
        # gradients back), then the attention twin runs on the turned copies. What it checks
        # is the positions (queries at rope_offset.., keys at 0..) and the layouts; the fused
        # kernels' in-register rotation has no twin here.
        tables = float32_inputs("attention", {"cos": sizes["rope_cos"], "sin": sizes["rope_sin"]})
        cos, sin, off = tables["cos"], tables["sin"], sizes["rope_offset"]
        Nq, Nk, inter = q.shape[2], k.shape[2], sizes["rope_interleaved"]
        q32 = rope_twin.rope(q32, cos[off:off + Nq], sin[off:off + Nq], inter).to(q.dtype).float()
        k32 = rope_twin.rope(k32, cos[:Nk], sin[:Nk], inter).to(k.dtype).float()
    out = attention_twin.attention(q32, k32, t["v"], causal, sizes["scale"],
                                   sizes["bottom_right"], kv_lens)
    return out.to(q.dtype)


def rope(x, cos, sin, interleaved=False):
    validate_rope(x, cos, sin, interleaved)
    _runnable("rope", x)
    t = float32_inputs("rope", {"x": x, "cos": cos, "sin": sin})
    return rope_twin.rope(t["x"], t["cos"], t["sin"], interleaved).to(x.dtype)
