"""Level 5 attention: the Python side of `attention.cu` (kernels), `attention_binding.cpp` (the
two kernel ops) and `autograd_binding.cpp` (`levels_cuda::attention`, the op a call is: the
layout copies, the forward op and one C++ autograd node whose backward calls the backward op).

The math, the online softmax and the FlashAttention-2 backward are Level 4's
(triton_kernels/attention.py: read its docstring for why each piece is there). What Level 5
adds is what Triton decided for us, written out one rung at a time, each selectable so that
`levels bench` times them side by side:

    v1  one thread per query row, scores in global memory   (B*H*Nq*Nk*4 bytes of scratch)
    v2  FlashAttention tiling on the CUDA cores, online      (exact fp32: also the fp32 path
        softmax in fp32 registers                             of v3, v4 and v5)
    v3  tensor cores: mma.sync + ldmatrix, Q fragments in     (the FlashAttention-2 register
        registers, P re-packed from the S accumulators        trick, by hand: which lane holds
                                                              which element)
    v4  v3 + cp.async double buffering + causal block
        skipping
    v5  v4 with 32 query rows a warp (two m16 tiles): each    (FlashAttention-2's 4 warps x
        K/V fragment read from shared memory feeds two        32 rows; Q re-read from shared
        MMAs; 2 blocks an SM. Backward: v4's. The default     memory: no room in registers)

Backward (recomputes P from the stored log-sum-exp; preprocess delta = rowsum(dO * O), a
dK/dV kernel over key blocks, a dQ kernel over query blocks; no atomics: deterministic):
forward v1 and v2 pair with the CUDA-core backward (exact fp32), v3 with the mma.sync
backward, v4 and v5 (same lse, same outputs) with the mma.sync backward that also
double-buffers and skips causal blocks.
fp32 inputs take the declared exact path at v3, v4 and v5: v2's forward and the CUDA-core
backward (no TF32: uses_tf32 is False and the fp32 bound 1e-5 applies).

The log-sum-exp the forward returns is in base 2: lse = log2 sum_j 2^(scale log2(e) q.k_j)
(natural lse times log2(e)), so the backward's P is one FMA and one exp2 per element.

Head dims D in HEAD_DIMS (one register tile spans D, templated per D); any Nq, Nk (masked
edges); causal needs Nq == Nk (the contract's rule). Layouts: see the note on operands below.

Measured on the H100 (bf16, B=4 H=16 N=4096 D=128, forward, against SDPA's FLASH backend in
the same run; reports/h100-level5-attention-lstm.json): v2 12 TFLOP/s, v3 189 (0.55x), v4 231 (0.67x),
v5 253 (0.73x; causal 217, 0.71x; goal 0.9x). Backward (v4/v5's) 172 TFLOP/s = 0.59x FLASH's:
the dQ kernel recomputes S and dP, 7 matrix products where the FLOP count has 5. Level 4's
Triton kernel reaches 488 on the same GPU: the distance is what the next rungs (fewer
registers per row, a 3-stage K/V pipeline, Hopper's wgmma with the tile in shared memory) are for.

Version: the `version` argument, else $LEVELS_CUDA_VERSION_ATTENTION, else DEFAULT_VERSION.
"""

from __future__ import annotations

import torch

from . import versions

VERSIONS = {
    1: "naive: one thread per query row, scores in a global fp32 scratch (B*H*Nq*Nk*4 bytes)",
    2: "FlashAttention tiling on the CUDA cores: K/V tiles in shared memory, online softmax in "
       "fp32 (exact fp32: also the fp32 path of versions 3, 4 and 5)",
    3: "tensor cores: mma.sync m16n8k16 + ldmatrix, Q in registers, P re-packed from the S "
       "accumulators, V via ldmatrix.trans (fp32 runs version 2)",
    4: "version 3 + cp.async double buffering of K/V + causal block skipping "
       "(fp32 runs version 2)",
    5: "version 4 with 32 query rows a warp (two m16 tiles): each K/V fragment from shared "
       "memory feeds two MMAs, Q re-read from shared memory; backward: version 4's "
       "(fp32 runs version 2)",
}
DEFAULT_VERSION = 5  # the fastest measured on the H100 (reports/h100-level5-attention-lstm.json)
ENV_VERSION = "LEVELS_CUDA_VERSION_ATTENTION"
HEAD_DIMS = (16, 32, 64, 128)  # Level 4's (triton_kernels/attention.py)
TENSOR_CORE_VERSIONS = (3, 4, 5)
TENSOR_CORE_DTYPES = (torch.float16, torch.bfloat16)
KERNEL_FILES = ("attention.cu",)

_registered = False


def uses_tf32(device, dtype) -> bool:
    return False  # fp32 is exact fp32 FMAs at every version (v3-v5 run v2 for it)


def resolve_version(version=None) -> int:
    """version=None: $LEVELS_CUDA_VERSION_ATTENTION if set, else DEFAULT_VERSION (cuda_kernels/versions.py)."""
    return versions.resolve("attention", VERSIONS, DEFAULT_VERSION, version)


def check_head_dim(q: torch.Tensor) -> None:
    """The kernels are templated on D: any other head dim is refused before any kernel runs."""
    D = q.shape[-1]
    if D not in HEAD_DIMS:
        raise ValueError(f"attention: argument 'q' must have a head dimension D in "
                         f"{', '.join(map(str, HEAD_DIMS))} for the Level 5 kernels (one register "
                         f"tile spans D); got D={D} in shape {tuple(q.shape)}")


# ---------------------------------------------------------------------------- layouts --

# What the kernels of a version read, and what is copied otherwise, is decided in C++
# (autograd_binding.cpp's attention_operand):
# every version needs stride 1 along D (a transposed q, or an expanded upstream gradient with
# stride 0, is copied); versions 3-5 in 16 bits read rows as 16-byte chunks. The packed qkv
# layout of a fused projection ((B, N, 3, H, D) viewed as three (B, H, N, D) tensors) already
# is; a view starting at an odd element is copied. Batch, head and row strides are otherwise
# free (slices, the packed layout, stride 0 from expand): no copy.


# ------------------------------------------------------------------------ registration --

def _fwd_fake(q, k, v, causal, scale, version):
    B, H, Nq, D = q.shape
    return q.new_empty((B, H, Nq, D)), q.new_empty((B, H, Nq), dtype=torch.float32)


def _bwd_fake(dout, q, k, v, out, lse, causal, scale, version):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _register():
    """Fake implementations of both kernel ops; called by build.load() once the library is
    loaded (the ops must exist to be registered against)."""
    global _registered
    if _registered:
        return
    torch.library.register_fake("levels_cuda::attention_fwd")(_fwd_fake)
    torch.library.register_fake("levels_cuda::attention_bwd")(_bwd_fake)
    _registered = True


def _ops():
    """torch.ops.levels_cuda, building the library on first use. Once _register() has run
    (build.load() calls it), a plain attribute read: torch.compile traces through it."""
    if _registered or torch.compiler.is_compiling():
        return torch.ops.levels_cuda
    from . import build

    return build.ops()


# ----------------------------------------------------------------------- entry point --

def attention(q, k, v, causal=False, scale=None, version=None):
    """Called by levels.cuda.attention after the contract's validation
    (CUDA tensors of one float dtype, q (B, H, Nq, D), k and v (B, H, Nk, D), Nk == Nq when
    causal, scale a positive float). Returns out with q's shape and dtype, contiguous. See
    above for which inputs are copied (none in the usual layouts)."""
    check_head_dim(q)  # before anything is built or launched (a CPU tensor is refused too)
    scale = float(q.shape[-1] ** -0.5 if scale is None else scale)
    return _ops().attention.default(q, k, v, bool(causal), scale, resolve_version(version))
