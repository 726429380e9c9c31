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
    v6  Hopper wgmma (sm_90 only): a warpgroup owns 64      (FlashAttention-3's products;
        rows; S = Q K^T with both operands in swizzled         its TMA, producer warpgroup and
        shared memory, O += P V with P from registers and     ping-pong softmax are the next
        V read N-major (imm-trans-b); cp.async 3-stage ring.  rung). D 64/128, no RoPE.
        Backward: v4's.
    v7  a faster backward (forward: v6's on sm_90 at D 128  (FlashAttention-2's backward:
        without RoPE, else v5's): ONE fused kernel per key    the dQ kernel's recompute of
        block computes dK, dV and its share of dQ = dS K,     S, P, dP and dS is gone; 5
        added into an fp32 workspace with atomics, then        products instead of 7.
        converted to dq. dq is NOT bitwise deterministic        Costs: a workspace of 4 bytes
        (atomic order); dk, dv are. Versions 4-6 keep the      per element of q, Nk/128
        deterministic two-kernel backward.                     atomic adds per dQ element)

Backward (recomputes P from the stored log-sum-exp; preprocess delta = rowsum(dO * O), a
dK/dV kernel over key blocks, a dQ kernel over query blocks; no atomics: deterministic):
forward v1 and v2 pair with the CUDA-core backward (exact fp32), v3 with the mma.sync
backward, v4, v5 and v6 (same lse, same outputs) with the mma.sync backward that also
double-buffers and skips causal blocks; v7 (16-bit) with the fused kernel above, whose dq
is added up with atomics: the one backward whose dq can differ in its last bits between
two runs (ATOMIC_DQ_VERSIONS; choose 4-6 for a bitwise reproducible dq).
fp32 inputs take the declared exact path at v3-v7: v2's forward and the CUDA-core
backward (no TF32: uses_tf32 is False and the fp32 bound 1e-5 applies).

The log-sum-exp the forward returns is in base 2: lse = log2 sum_j 2^(scale log2(e) q.k_j)
(natural lse times log2(e)), so the backward's P is one FMA and one exp2 per element.

Head dims D in HEAD_DIMS at the tensor-core versions (one register tile spans D, templated
per D); any Nq, Nk (masked edges). Layouts: see the note on operands below.

Grown (attention.cu's opening comment says how):
  every version: grouped-query / multi-query attention (K/V head h // group, read in place;
      the dK/dV block of a key block loops over the group's query heads itself, at v3-v5
      through one cp.async pipeline across heads: no atomics, deterministic), and RoPE fused
      (ROPE_API.md: `rope_cos`, `rope_sin` (P, D/2) tables of q's dtype with any strides,
      pairs half-split or interleaved; q and k are rotated as the kernels load them, at
      v3-v5 in shared memory right after a tile lands (cp.async cannot rotate in flight),
      and dq, dk are turned back by minus the angle before the store; never written rotated).
      v3-v5 take rope for D in ROPE_HEAD_DIMS (64, 128: what models rotate; the flag
      doubles only those kernels, for build time); other sizes run v2 as below.
      Causal with Nq != Nk in both alignments and per-batch kv_lens: every kernel masks
      with its batch element's key count and diagonal shift and skips the tiles past them
      (v4/v5 as they skip those above the diagonal); a query that sees no key gets out 0
      and lse +inf. Empty inputs: no launch.
  v1, v2 and the CUDA-core backward only: any head size up to 256 (the CUDA-core kernels'
      tile is the next power of two, the padded columns read as 0 and never written).
The tensor-core versions 3-5 take D in HEAD_DIMS (with rope, ROPE_HEAD_DIMS); without rope
and in the common case their kernels do what they did (RoPE is a template flag; the masks
read a per-batch key count and shift that are Nk and 0 there). For any other head size,
version=None (or $LEVELS_CUDA_VERSION_ATTENTION naming 3-5, a default for the process) runs
version 2, which can, and `version=3..5` passed as an argument raises a ValueError that
says what that version cannot do (`supported` below). What it costs: v2 runs on the CUDA
cores (12 TFLOP/s at the bench shape, against 253 for v5): odd head sizes are correct at
Level 5 but not yet fast there. RoPE costs the tensor-core kernels one pass over each Q/K
tile in shared memory and a barrier per tile, and the build more kernels (the flag's).

Measured on the H100 (bf16, B=4 H=16 N=4096 D=128, forward, against SDPA's FLASH backend in
the same run; reports/h100-level5-attention-lstm.json): v2 12 TFLOP/s, v3 189 (0.55x), v4 231 (0.67x),
v5 253 (0.73x; causal 217, 0.71x; goal 0.9x). Backward (v4/v5's) 172 TFLOP/s = 0.59x FLASH's:
the dQ kernel recomputes S and dP, 7 matrix products where the FLOP count has 5. Level 4's
Triton kernel reaches 488 on the same GPU: the distance is what the next rungs (fewer
registers per row, a 3-stage K/V pipeline, Hopper's wgmma with the tile in shared memory) are for.

Version 6 (wgmma) runs on sm_90 (H100, H200) only, with D in HOPPER_HEAD_DIMS and without
RoPE. Asked for by argument it raises where it cannot run: a ValueError naming the head size
or RoPE (`supported`), a RuntimeError from the launcher (LEVELS_BAD_ARCH) on another GPU.
Picked by $LEVELS_CUDA_VERSION_ATTENTION (version=None) it hands such a call to version 5,
or to version 2 where 5 cannot run it either (`pick_version`). Measured on the H100
(reports/h100-attention6.json): see `default_version`.

Version: the `version` argument, else $LEVELS_CUDA_VERSION_ATTENTION, else default_version
(version 6 on sm_90 for 16-bit heads of 128 without RoPE, else DEFAULT_VERSION). Version 7
is not a default: chosen by argument or $LEVELS_CUDA_VERSION_ATTENTION=7. The H100 measured its
backward 4-7% faster than the two-kernel one (reports/h100-attention7.json, forward+backward
0.63x FLASH at B4 H16 N4096 D128 against 0.61x): too little to give up a bitwise reproducible
dq by default.
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
    6: "Hopper wgmma (sm_90 only): a warpgroup of 64 query rows, S = Q K^T from swizzled shared "
       "memory, O += P V with P from registers and V read N-major; cp.async 3-stage ring; D 64 "
       "or 128, no RoPE; backward: version 4's (fp32 runs version 2)",
    7: "faster backward: one fused kernel per key block computes dK, dV and its share of dQ "
       "(added into an fp32 workspace with atomics: dq not bitwise deterministic, dk/dv are; "
       "versions 4-6 are the deterministic backward); forward: version 6's on sm_90 at D 128 "
       "without RoPE, else version 5's (fp32 runs version 2)",
}
DEFAULT_VERSION = 5  # the fastest measured on the H100 (reports/h100-level5-attention-lstm.json)
ENV_VERSION = "LEVELS_CUDA_VERSION_ATTENTION"
HEAD_DIMS = (16, 32, 64, 128)  # the tensor-core versions' templates
ROPE_HEAD_DIMS = (64, 128)  # ... instantiated with RoPE fused (the sizes models rotate: build time)
MAX_HEAD_DIM = 256  # the CUDA-core kernels' widest tile (any D up to it)
GROWN_VERSION = 2  # the version a call the tensor-core versions cannot do runs
TENSOR_CORE_VERSIONS = (3, 4, 5, 6, 7)
ATOMIC_DQ_VERSIONS = (7,)  # 16-bit backward adds dQ with atomics: dq not bitwise reproducible
HOPPER_VERSION = 6  # wgmma: sm_90 only, D in HOPPER_HEAD_DIMS, no RoPE
HOPPER_HEAD_DIMS = (64, 128)  # a 128-byte swizzled row is 64 elements: D is one or two of them
HOPPER_FALLBACK = 5  # what version=None runs where version 6 cannot (else GROWN_VERSION)
TENSOR_CORE_DTYPES = (torch.float16, torch.bfloat16)
KERNEL_FILES = ("attention.cu", "attention_backward.cu")  # the second: the backward's unit

_registered = False


def uses_tf32(device, dtype) -> bool:
    return False  # fp32 is exact fp32 FMAs at every version (v3-v5 run v2 for it)


def default_version(q=None, rope=False) -> int:
    """The version a call runs when nobody chose one: version 6 on sm_90 for 16-bit heads of
    128 without RoPE, else DEFAULT_VERSION. Measured on the H100 (forward, bf16, kernel time,
    reports/h100-attention6.json): at D = 128 version 6 ran 0.86x / 0.96x FLASH (B4 H16 N4096,
    B1 H32 N2048 causal) where version 5 ran 0.70x / 0.71x; at D = 64 it was no faster
    (N1000-1024: 1.25-1.46x FLASH, version 5 1.33-1.46x) and slower at short sequences (N197:
    0.52x, version 5 0.87x; N512: 0.74x against 0.83x): a 64-wide head gives each wgmma too
    little work to hide the per-tile barrier and softmax."""
    if (q is not None and q.shape[-1] == 128 and q.dtype in TENSOR_CORE_DTYPES and not rope
            and q.is_cuda and versions.on_hopper()):
        return HOPPER_VERSION
    return DEFAULT_VERSION


def resolve_version(version=None, q=None, rope=False) -> int:
    """version=None: $LEVELS_CUDA_VERSION_ATTENTION if set, else default_version(q, rope)
    (cuda_kernels/versions.py)."""
    return versions.resolve("attention", VERSIONS, default_version(q, rope), version)


def check_head_dim(q: torch.Tensor) -> None:
    """A head size past the widest tile is refused before any kernel runs."""
    D = q.shape[-1]
    if D > MAX_HEAD_DIM:
        raise ValueError(f"attention: argument 'q' must have a head dimension D <= {MAX_HEAD_DIM} "
                         f"for the Level 5 kernels (one register tile spans D, padded to a power "
                         f"of two); got D={D} in shape {tuple(q.shape)}")


def beyond_tensor_cores(q, k, causal, kv_lens, rope=False) -> str:
    """What of this call versions 3-5 and 7 (the tensor cores) do not do, or "" if they do it."""
    D = q.shape[-1]
    if D not in HEAD_DIMS:
        return f"head dimension D={D} (they take D in {', '.join(map(str, HEAD_DIMS))})"
    if rope and D not in ROPE_HEAD_DIMS:
        return (f"RoPE with head dimension D={D} (they take rope with D in "
                f"{', '.join(map(str, ROPE_HEAD_DIMS))})")
    return ""


def beyond_hopper(q, rope=False) -> str:
    """What of this call version 6 does not do beyond versions 3-5's limits, or ""."""
    D = q.shape[-1]
    if D not in HOPPER_HEAD_DIMS:
        return f"head dimension D={D} (it takes D in {', '.join(map(str, HOPPER_HEAD_DIMS))})"
    if rope:
        return f"RoPE (version {HOPPER_FALLBACK} fuses it)"
    return ""


def supported(version: int, q, k, causal, kv_lens, rope=False) -> str:
    """Why `version` cannot run this call ("" if it can): fp32 and versions 1-2 run the
    CUDA-core kernels, which do everything; 16-bit inputs at 3-7 run the tensor cores. (The
    GPU version 6 needs, sm_90, is the launcher's check: LEVELS_BAD_ARCH. Version 7 takes
    what 3-5 take: its forward is version 5's wherever version 6's cannot run.)"""
    if version <= GROWN_VERSION or q.dtype == torch.float32:
        return ""
    why = beyond_tensor_cores(q, k, causal, kv_lens, rope)
    if why:
        return f"version {version} (tensor cores) cannot run {why}; versions 1 and 2 can"
    why = beyond_hopper(q, rope) if version == HOPPER_VERSION else ""
    return f"version {version} (wgmma) cannot run {why}; versions 1-{HOPPER_FALLBACK} can" if why else ""


def _not_hopper(q) -> bool:
    """A CUDA tensor on a GPU without wgmma (version 6's launcher would refuse it)."""
    return q.is_cuda and not versions.on_hopper()


def pick_version(version, q, k, causal, kv_lens, rope=False) -> int:
    """The version this call runs: `version` if given (a ValueError if it cannot run the
    call), else the process's ($LEVELS_CUDA_VERSION_ATTENTION or DEFAULT_VERSION), or, where
    that one cannot, HOPPER_FALLBACK for version 6 (off sm_90, or a head size or RoPE it does
    not take) if that can, else GROWN_VERSION. rope: whether RoPE is fused into the call."""
    chosen = resolve_version(version, q, rope)
    why = supported(chosen, q, k, causal, kv_lens, rope)
    if why and version is not None:
        raise ValueError(f"attention: argument 'version': {why} (version=None picks one that can)")
    if version is None and chosen == HOPPER_VERSION and (why or _not_hopper(q)):
        return HOPPER_FALLBACK if not supported(HOPPER_FALLBACK, q, k, causal, kv_lens, rope) else GROWN_VERSION
    return GROWN_VERSION if why else chosen


# ---------------------------------------------------------------------------- layouts --

# What the kernels of a version read, and what is copied otherwise, is decided in C++
# (autograd_binding.cpp's attention_operand):
# every version needs stride 1 along D (a transposed q, or an expanded upstream gradient with
# stride 0, is copied); versions 3-7 in 16 bits read rows as 16-byte chunks. The packed qkv
# layout of a fused projection ((B, N, 3, H, D) viewed as three (B, H, N, D) tensors) already
# is; a view starting at an odd element is copied. Batch, head and row strides are otherwise
# free (slices, the packed layout, stride 0 from expand): no copy.


# ------------------------------------------------------------------------ registration --

def _fwd_fake(q, k, v, causal, scale, version, bottom_right=False, kv_lens=None, rope_cos=None,
              rope_sin=None, rope_interleaved=False, rope_offset=0):
    B, H, Nq, D = q.shape
    return q.new_empty((B, H, Nq, D)), q.new_empty((B, H, Nq), dtype=torch.float32)


def _bwd_fake(dout, q, k, v, out, lse, causal, scale, version, bottom_right=False, kv_lens=None,
              rope_cos=None, rope_sin=None, rope_interleaved=False, rope_offset=0):
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

def attention(q, k, v, causal=False, scale=None, version=None, bottom_right=False, kv_lens=None,
              rope_cos=None, rope_sin=None, rope_interleaved=False, rope_offset=0):
    """Called by levels.cuda.attention after the contract's validation
    (CUDA tensors of one float dtype, q (B, H, Nq, D), k and v (B, H_kv, Nk, D), scale a
    positive float, kv_lens None or (B,) int; rope_cos, rope_sin None or (P, D/2) tables of
    q's dtype: q and k rotated in the kernels, query i at table row i + rope_offset).
    Returns out with q's shape and dtype, contiguous. See above for which inputs are copied
    (none in the usual layouts) and which version runs (`pick_version`)."""
    check_head_dim(q)  # before anything is built or launched (a CPU tensor is refused too)
    version = pick_version(version, q, k, causal, kv_lens, rope_cos is not None)
    scale = float(q.shape[-1] ** -0.5 if scale is None else scale)
    return _ops().attention.default(q, k, v, bool(causal), scale, version, bool(bottom_right),
                                    kv_lens, rope_cos, rope_sin, bool(rope_interleaved),
                                    int(rope_offset))
