"""MLP (linear -> exact GELU -> linear) on Level 5's GEMM ladder (cuda_kernels/gemm.cu).

    mlp(x, w1, b1, w2, b2, version=None)          the entry levels/cuda.py calls, after the
                                                  contract's validation; differentiable
    mlp_forward(x, w1, b1, w2, b2, version=None, tile=0)
                                                  the forward alone, no autograd; `tile` pins
                                                  version 4's tile shape (V4_TILES)
    gemm(a, b, bias=None, epilogue="none", aux=None, out_dtype=None, version=None)
                                                  epilogue(a @ b) for any component: "none"
                                                  (+bias), "gelu", "gelu_save" -> (act, pre),
                                                  "gelu_grad" -> (a @ b) * GELU'(aux)
    gemm_accumulate(c, a, b, bias=None, version=None)   c += a @ b (+ bias), in place
    column_sum(x, out_dtype=None, version=None)   x.sum(0) in fp32 (bias gradients)

The same design as Level 4 (triton_kernels/mlp.py): bias + GELU ride in the first GEMM's
epilogue, which also stores the pre-activation H for backward; backward is five GEMMs of
this level — dH = (dY W2) * GELU'(H) with the derivative in the epilogue, dX = dH W1,
dW1 = dH^T X, dW2 = dY^T G — and two column sums. No torch matmul anywhere.

Versions (LEVELS_CUDA_VERSION_MLP=n, or version=n): see VERSIONS and the top of gemm.cu.
Versions 1-3 take every operand with its strides as it comes (transposed views, slices: no
copies). Versions 4-8 (tensor cores) read 16-byte chunks along K, so they need each operand
as a K-major matrix with 16-byte aligned rows: A (M, K) and B as the (N, K) matrix, i.e.
nn.Linear's weight itself for X W^T. `_k_major` makes that layout when an operand does not
have it, with one copy: free for the forward of a contiguous input with K % 8 == 0, but
backward's dgrad/wgrad GEMMs read W, dY, G, dH and X along their *other* dimension, so
versions 4, 5, 7 and 8 transpose them: 6 copies, ~450M elements read and written at the
bench shape (M=8192, 4096 -> 16384 -> 4096), ~1.8 GB of traffic, ~0.6 ms at 3 TB/s next to
~10 ms of GEMMs — and more in practice: torch's transposing copy runs well below the copy
rate (a GPT-2-small step at Level 5 spent 6.2 ms of 33 in copies on an H200, bf16 autocast,
scripts/probe_model_host.py). Version 6, the sm_90 default, reads a transposed operand as it
lies instead: the TMA loads it in 64-column boxes ("MN-major" tiles, the same bytes in
another order) and wgmma reads them with its transpose flag (gemm.cu, version 6), so the
MLP's and SwiGLU's backward make no copy there.

fp32 inputs: every version computes exact fp32 FMAs (versions 4-8 run version 3's kernel for
fp32), so uses_tf32 is False and the fp32 bound (1e-5) applies.
"""

from __future__ import annotations

import torch

from . import versions
import torch.nn.functional as F

VERSIONS = {
    1: "naive: one thread per output, operands straight from global memory",
    2: "shared-memory tiles (32x32): each global element read once per tile",
    3: "register tiling: 8x8 outputs per thread from a 128x128 tile (exact fp32 FMAs)",
    4: "tensor cores: mma.sync + ldmatrix on swizzled shared memory, cp.async 3-stage "
       "pipeline (fp32 runs version 3)",
    5: "Hopper wgmma: warpgroup MMAs read swizzled shared memory through descriptors, "
       "asynchronously (sm_90 only; fp32 runs version 3)",
    6: "Hopper TMA + warp specialization: one producer warpgroup issues TMA tile loads, two "
       "consumer warpgroups run wgmma, an mbarrier ring between them (sm_90 only; fp32 runs "
       "version 3)",
    7: "Hopper persistent + warp specialized: one block per SM walks the tiles, the producer "
       "runs ahead across tiles, each tile's epilogue (own shared memory) under the next "
       "tile's TMA loads (sm_90 only; fp32 runs version 3)",
    8: "Hopper ping-pong consumers: version 7's persistent producer, each consumer warpgroup "
       "owns whole 128x128 tiles and their mainloops alternate (a math-order barrier), so one "
       "tile's epilogue runs under the other tile's MMAs (sm_90 only; fp32 runs version 3)",
}
DEFAULT_VERSION = 4  # every GPU with mma.sync (sm_80 on)
# Version 4's tile shapes (gemm.cu launch_v4), for `tile=` of mlp_forward: 0 picks from the
# size (the big tile when its tiles fill every SM); the others pin one, so `levels bench`
# can time each beside the automatic choice.
V4_TILES = {0: "auto", 1: "128x256 s3", 2: "128x256 s4", 3: "128x128 s3 (64x32 warps)"}
HOPPER_VERSION = 6   # the default where wgmma and TMA exist (sm_90: H100, H200)
TENSOR_CORE_VERSIONS = (4, 5, 6, 7, 8)  # the versions with version 4's operand layout rules
ENV_VERSION = "LEVELS_CUDA_VERSION_MLP"
_registered = False  # set by _register(), once the library is loaded
TENSOR_CORE_DTYPES = (torch.float16, torch.bfloat16)
EPILOGUES = ("none", "gelu", "gelu_save", "gelu_grad")


def uses_tf32(device, dtype) -> bool:
    return False  # fp32 is exact fp32 FMAs at every version


def default_version() -> int:
    """The best version this GPU has: HOPPER_VERSION on sm_90, else DEFAULT_VERSION."""
    return HOPPER_VERSION if versions.on_hopper() else DEFAULT_VERSION


def resolve_version(version=None) -> int:
    """version=None: $LEVELS_CUDA_VERSION_MLP if set, else default_version() (cuda_kernels/versions.py)."""
    return versions.resolve("mlp", VERSIONS, default_version(), version)


def _ops():
    """torch.ops.levels_cuda, building the library on first use. Once _register() has run
    (build.load() calls it), a plain attribute read: torch.compile traces through it."""
    if _registered:
        return torch.ops.levels_cuda
    from . import build

    return build.ops()


# ---------------------------------------------------------------------------------------
# Operand layouts
# ---------------------------------------------------------------------------------------

def is_k_major(t: torch.Tensor) -> bool:
    """What version 4's launcher accepts for an (R, K) operand: contiguous along K, rows 16
    bytes apart a whole number of times, first row 16-byte aligned (torch's allocator
    aligns storages to far more than 16 bytes, so the storage offset decides)."""
    if not (t.stride(1) == 1 and t.stride(0) % 8 == 0):
        return False
    if torch.compiler.is_compiling():
        # Dynamo cannot trace storage_offset() (an int, not a tensor). Inside a compiled
        # graph the launcher's own pointer check is the guard: a misaligned view there is
        # refused with an error naming the op, never read wrongly.
        return True
    return (t.storage_offset() * t.element_size()) % 16 == 0


def _k_major(t: torch.Tensor) -> torch.Tensor:
    """t (R, K) itself if is_k_major, else one copy (R*K elements read and written) into a
    buffer with rows padded to a multiple of 8 elements, returned as its (R, K) view. The
    pad is never read: the kernel's cp.async reads only the K valid elements of a row. A
    differentiable copy, so autograd routes the gradient back to `t` through it."""
    if is_k_major(t):
        return t
    K = t.shape[1]
    pad = -K % 8
    if pad == 0:
        return t.clone(memory_format=torch.contiguous_format)
    return F.pad(t, (0, pad))[:, :K]


def _operands(a, b, version):
    """(a, b) as the kernel of `version` takes them; b is the (K, N) matrix of a @ b."""
    if version in TENSOR_CORE_VERSIONS and a.dtype in TENSOR_CORE_DTYPES:
        return _k_major(a), _k_major(b.t()).t()
    return a, b


def _out_fp32(a, out_dtype) -> bool:
    if out_dtype is None or out_dtype == a.dtype:
        return False
    if out_dtype == torch.float32:
        return True
    raise ValueError(f"gemm: argument 'out_dtype' must be None, {a.dtype} or torch.float32; got {out_dtype}")


# ---------------------------------------------------------------------------------------
# Reusable launchers (no autograd): GEMM with epilogue, in-place accumulate, column sums
# ---------------------------------------------------------------------------------------

def gemm(a, b, bias=None, epilogue="none", aux=None, out_dtype=None, version=None):
    """epilogue(a @ b [+ bias]) for a (M, K), b (K, N) (any strides; pass `w.t()` for an
    nn.Linear weight w), bias (N,) or None; see the module docstring for `epilogue`.
    Returns a new (M, N) tensor of out_dtype (default a.dtype; torch.float32 allowed),
    or (act, pre) for "gelu_save"."""
    v = resolve_version(version)
    if epilogue not in EPILOGUES:
        raise ValueError(f"gemm: argument 'epilogue' must be one of {EPILOGUES}; got {epilogue!r}")
    if (aux is not None) != (epilogue == "gelu_grad"):
        raise ValueError("gemm: argument 'aux' (the pre-activation) is given with epilogue='gelu_grad' "
                         "and only then")
    out_fp32 = _out_fp32(a, out_dtype)
    a, b = _operands(a, b, v)
    bias = bias.contiguous() if bias is not None else None  # 1-D: cheap
    ops = _ops()
    if epilogue in ("none", "gelu"):
        return ops.gemm_matmul(a, b, bias, epilogue == "gelu", out_fp32, v)
    if out_fp32:
        raise ValueError(f"gemm: epilogue {epilogue!r} writes the input dtype; out_dtype must be None")
    if epilogue == "gelu_save":
        return ops.gemm_matmul_gelu_save(a, b, bias, v)
    if bias is not None:
        raise ValueError("gemm: epilogue 'gelu_grad' takes no bias")
    return ops.gemm_matmul_gelu_grad(a, b, aux, v)


def gemm_accumulate(c, a, b, bias=None, version=None):
    """c += a @ b (+ bias), in place through c's own strides (c: a.dtype or float32)."""
    v = resolve_version(version)
    a, b = _operands(a, b, v)
    _ops().gemm_matmul_accumulate(c, a, b, bias.contiguous() if bias is not None else None, v)
    return c


def column_sum(x, out_dtype=None, version=None):
    """x.sum(0) of a 2-D x (any strides), accumulated in fp32, deterministic."""
    return _ops().gemm_column_sum(x, _out_fp32(x, out_dtype), resolve_version(version))


# ---------------------------------------------------------------------------------------
# The MLP: one op, `levels_cuda::mlp` (autograd_binding.cpp): the forward op (two GEMM
# launches in C++) and one C++ autograd node whose backward is this level's GEMMs
# ---------------------------------------------------------------------------------------

def mlp(x, w1, b1, w2, b2, version=None):
    """Called by levels.cuda.mlp after the shared validation (x float16/bfloat16/float32 on
    CUDA). What each argument is made into, and what it costs:
      * x (..., K) is viewed as (M, K): reshape is a view whenever the strides allow it
        (always for a contiguous x), a copy otherwise;
      * b1, b2: contiguous (1-D, cheap);
      * versions 1-3: x, w1, w2 go in with their strides, no copy;
      * versions 4-8, 16-bit: each GEMM operand that is not K-major with 16-byte aligned
        rows is copied once by the GEMM op itself (mlp_binding.cpp's k_major; none is for
        contiguous inputs with K, hidden multiples of 8), and the (M, hidden) activations are
        stored with rows padded to 8 elements, so the second GEMM reads them in place.
    Backward (in C++): dW2 = dY^T G, db2 = colsum(dY), dH = (dY W2) * GELU'(H) with the
    derivative in the epilogue, dX = dH W1, dW1 = dH^T X, db1 = colsum(dH)."""
    return _ops().mlp.default(x, w1, b1, w2, b2, resolve_version(version))


def mlp_forward(x, w1, b1, w2, b2, version=None, tile=0):
    """The MLP's forward op alone (levels_cuda::mlp_fwd), no autograd node: what `mlp`
    runs under no_grad, with version 4's tile shape as an argument. tile=0 lets each GEMM
    take its tile from its size, as `mlp` always does; 1-3 pin one (V4_TILES): the
    measurements behind that choice (`levels bench`). Other versions have one tile each,
    so a pinned tile is refused there rather than silently ignored."""
    v = resolve_version(version)
    if isinstance(tile, bool) or tile not in V4_TILES:
        raise ValueError(f"mlp_forward: argument 'tile' must be one of {sorted(V4_TILES)} "
                         f"(cuda_kernels/mlp.py V4_TILES); got {tile!r}")
    if tile and v != 4:
        raise ValueError(f"mlp_forward: argument 'tile' pins version 4's tile shape; got "
                         f"tile={tile} with version {v}")
    x2 = x.reshape(-1, x.shape[-1])
    out = _ops().mlp_fwd(x2, w1, b1.contiguous(), w2, b2.contiguous(), v, tile)[0]
    return out.view(*x.shape[:-1], w2.shape[0])


def _register():
    """Fake implementations of every kernel op (shapes/dtypes for torch.compile and opcheck).
    Called by build.load() once the library is loaded."""
    global _registered
    if _registered:
        return
    lib = "levels_cuda::"

    def _new(a, rows, cols, fp32=False):
        return a.new_empty((rows, cols), dtype=torch.float32 if fp32 else a.dtype)

    @torch.library.register_fake(lib + "gemm_matmul")
    def _(a, b, bias, gelu, out_fp32, version):
        return _new(a, a.shape[0], b.shape[1], out_fp32)

    @torch.library.register_fake(lib + "gemm_matmul_gelu_save")
    def _(a, b, bias, version):
        return _new(a, a.shape[0], b.shape[1]), _new(a, a.shape[0], b.shape[1])

    @torch.library.register_fake(lib + "gemm_matmul_gelu_grad")
    def _(a, b, pre, version):
        return _new(a, a.shape[0], b.shape[1])

    @torch.library.register_fake(lib + "gemm_matmul_accumulate")
    def _(c, a, b, bias, version):
        return None

    @torch.library.register_fake(lib + "gemm_column_sum")
    def _(x, out_fp32, version):
        return x.new_empty((x.shape[1],), dtype=torch.float32 if out_fp32 else x.dtype)

    @torch.library.register_fake(lib + "mlp_fwd")
    def _(x, w1, b1, w2, b2, version, tile=0):
        M, hidden, N = x.shape[0], w1.shape[0], w2.shape[0]
        return _new(x, M, N), _new(x, M, hidden), _new(x, M, hidden)

    _registered = True
