"""SwiGLU MLP (Llama's: down(silu(x W_gate^T) * (x W_up^T))) on Level 5's GEMM ladder.

    swiglu_mlp(x, w_gate, w_up, w_down, version=None)   the entry levels/cuda.py calls, after
                                                        the contract's validation; differentiable
    gate_up(x2, w_gate, w_up, save=False, version=None) -> (act, g, u)   the fused GEMM alone

The same design as Level 4 (triton_kernels/swiglu_mlp.py), on gemm.cu: the gate and up
projections are ONE GEMM with a SiLU-multiply epilogue (`levels_cuda::swiglu_mlp_gate_up`:
each block's B tile is half W_gate's columns and the same half of W_up's, side by side in
shared memory, so the tensor cores compute x [W_gate; W_up]^T tile by tile and the epilogue
pairs column j with j + BN/2; versions 1 and 2 keep two accumulators per thread instead),
then the down GEMM (mlp's `gemm_matmul`). Backward: dA = dY W_down with the SiLU-mul
derivative in its epilogue, writing dG and dU (`levels_cuda::swiglu_mlp_grad`); dX = dG W_gate
+ dU W_up (a GEMM and an accumulating GEMM into the same output); dW_gate = dG^T X,
dW_up = dU^T X, dW_down = dY^T A, each only if its input needs it. No torch matmul anywhere.

A call is one op, `levels_cuda::swiglu_mlp` (swiglu_mlp_autograd.cpp): the forward's two
kernel ops and one C++ autograd node whose backward runs the GEMMs above in C++. It used to
be a Python torch.autograd.Function around the same ops; on an H200's host (`levels bench
--overhead`, tiny size) that cost 120 us forward and 841 us forward+backward against eager
PyTorch's 74 / 668 us (Python frames per call, a Python node, a backward that re-entered
Python for every GEMM), while the components with C++ nodes were near eager.

Versions (LEVELS_CUDA_VERSION_SWIGLU_MLP=n, or version=n): gemm.cu's ladder, the MLP's
(cuda_kernels/mlp.py VERSIONS); the same layout rules and copies for versions 4-8 (the
backward's operands read along their other dimension are transposed once each, as the
MLP's are). fp32 runs version 3's exact FMAs at every version >= 3: uses_tf32 is False.
"""

from __future__ import annotations

import torch

from . import mlp as _mlp
from . import versions

KERNEL_FILES = ("gemm.cu",)
VERSIONS = dict(_mlp.VERSIONS)
ENV_VERSION = versions.env_name("swiglu_mlp")
_registered = False


def uses_tf32(device, dtype) -> bool:
    return False  # fp32 is exact fp32 FMAs at every version


def resolve_version(version=None) -> int:
    """version=None: $LEVELS_CUDA_VERSION_SWIGLU_MLP if set, else the MLP's default for this
    GPU (5 on an H100, 4 elsewhere)."""
    return versions.resolve("swiglu_mlp", VERSIONS, _mlp.default_version(), version)


def _ops():
    if _registered:
        return torch.ops.levels_cuda
    from . import build

    return build.ops()


def gate_up(x2, w_gate, w_up, save=False, version=None):
    """(act, g, u): act = silu(x2 W_gate^T) * (x2 W_up^T) in one GEMM; g, u the two products
    when save, else empty tensors (nothing written that no backward reads)."""
    return _ops().swiglu_mlp_gate_up(x2, w_gate, w_up, save, resolve_version(version))


def swiglu_mlp(x, w_gate, w_up, w_down, version=None):
    """Called by levels.cuda.swiglu_mlp after the shared validation (x float16/bfloat16/float32
    on CUDA): one op, `levels_cuda::swiglu_mlp` (swiglu_mlp_autograd.cpp). x (..., K) is viewed
    as (M, K) there (a copy only if its strides do not allow it); what versions 4-8 copy is
    said in swiglu_mlp_binding.cpp and cuda_kernels/mlp.py. Without autograd (no_grad,
    inference mode, nothing requiring grad) no node is recorded and G, U are not written."""
    return _ops().swiglu_mlp.default(x, w_gate, w_up, w_down, resolve_version(version))


def _register():
    """Fake implementations of the two ops (shapes and dtypes for torch.compile and opcheck),
    allocated as swiglu_mlp_binding.cpp allocates them. Called by build.load()."""
    global _registered
    if _registered:
        return
    lib = "levels_cuda::"

    def _padded(like, rows, cols):
        ld = (cols + 7) // 8 * 8
        return like.new_empty((rows, ld))[:, :cols]

    @torch.library.register_fake(lib + "swiglu_mlp_gate_up")
    def _(x, w_gate, w_up, save, version):
        M, hidden = x.shape[0], w_gate.shape[0]
        act = _padded(x, M, hidden)
        if not save:
            return act, x.new_empty((0,)), x.new_empty((0,))
        return act, _padded(x, M, hidden), _padded(x, M, hidden)

    @torch.library.register_fake(lib + "swiglu_mlp_grad")
    def _(dy, w_down, g, u, version):
        M, hidden = dy.shape[0], w_down.shape[1]
        return _padded(dy, M, hidden), _padded(dy, M, hidden)

    _registered = True
