"""Level 5 newton_schulz: the Python side of `newton_schulz.cu` (kernels) and
`newton_schulz_binding.cpp` (the kernel op, which is the whole call: forward only, no autograd).

The design is Level 4's (triton_kernels/newton_schulz.py): the symmetric products launch the
tiles on and below the diagonal only and mirror each on its store, b*A + c*A^2 and a*X + B X
are GEMMs with the pointwise work in their epilogues, the normalization is a one-element
scale folded into the first step (version 2: into a "prepare" launch that writes X0 = s G
and its transpose), a tall G is read transposed through its strides. One call is one op,
`levels_cuda::newton_schulz`: 2 + 3 * steps launches from C++ (versions 2, 3: 3 + 3 * steps).

    v1  shared-memory tiles on the CUDA cores, fp32 accumulation (the first rung: correct,
        not fast: ~9 TFLOP/s in bf16 on an H100, 0.02x of native)
    v2  the same products on gemm.cu's version-5 main loop (Hopper wgmma, through its
        levels_gemm_batched): every iterate kept as X and X^T so both operands of every
        product are K-major, the symmetric products on the lower-triangle tile schedule with
        the mirror written from the staged tile in 16-byte stores. sm_90 only (elsewhere an
        error naming version 1); fp32 G runs version 1's exact-fp32 kernels at version 2
        (wgmma has no fp32 path). H100, bf16: 0.83-0.95x native (version 5's GEMM is
        ~0.55-0.6x cuBLAS; reports/h100-bench-newton-schulz.json)
    v3  version 2's plan, every product on gemm.cu's version-6 GEMM (TMA loads, a producer
        and two consumer warpgroups on mbarriers: levels_gemm_batched's version argument
        picks the GEMM); the same scratch, launches and epilogues. sm_90 only; fp32 as v2.
        H100, bf16 (reports/h100-gemm6.json): 1.32x native at 4096^2, 1.14x at 4096x11008
        (version 2 in the same run: 0.98x, 0.91x): the default on sm_90 until version 5
    v4  version 2's plan on gemm.cu's version-7 GEMM (persistent blocks walking (matrix, tile)
        pairs, each tile's epilogue under the next tile's TMA loads; 128x128 tiles). sm_90
        only; fp32 as v2. H100, bf16 (reports/h100-gemm7.json): 1.31x native at 4096^2,
        1.16x at 4096x11008 (version 3 in the same run: 1.34x, 1.18x): the GEMM's persistent
        grid bought nothing, so version 3 stays the default
    v5  version 3 with the iterate kept once: X' = B X + a X reads X itself as the MN-major B
        operand (gemm.cu version 6's batched kernel loads a (K, N) matrix with N contiguous
        as it lies, TMA boxes of 64 columns), so no X^T is written, not by the prepare launch
        and not by any update. What it saves: an M x N store per step and half the prepare
        launch's stores. sm_90 only; fp32 as v2. H100, bf16, version 3 in the same run
        (reports/level5-gemm-users-and-norms-2026-11-27/): the same bits; 1.04x / 1.39x /
        1.24x native at 1024^2, 4096^2, 4096x11008 (version 3: 1.02x, 1.37x, 1.20x), the
        update 1049 us a call at 4096^2 against 1115: the default on sm_90

Version: the `version` argument, else $LEVELS_CUDA_VERSION_NEWTON_SCHULZ, else
default_version(): HOPPER_VERSION (5) on an sm_90 GPU, DEFAULT_VERSION (1) elsewhere, the
rule of cuda_kernels/mlp.py. Asking for version 2, 3, 4 or 5 on another GPU is an error, never a
silent run of version 1.
"""

from __future__ import annotations

import functools

import torch

from . import versions

VERSIONS = {
    1: "shared-memory tiles on the CUDA cores: one triangle of X X^T and of A A, mirrored; "
       "fused epilogues; fp32 accumulation",
    2: "Hopper wgmma (gemm.cu's version-5 main loop, batched): X and X^T kept so every "
       "operand is K-major, symmetric tile schedule, mirror stored from the staged tile "
       "(sm_90 only; fp32 runs version 1)",
    3: "version 2's plan on gemm.cu's version-6 GEMM: TMA loads, a producer and two consumer "
       "warpgroups on mbarriers (sm_90 only; fp32 runs version 1)",
    4: "version 2's plan on gemm.cu's version-7 GEMM: persistent blocks, each tile's epilogue "
       "under the next tile's loads (sm_90 only; fp32 runs version 1)",
    5: "version 3 with the iterate kept once: the update reads X as the MN-major B operand, so "
       "no X^T is written (sm_90 only; fp32 runs version 1)",
}
# the GEMM version (gemm.cu, levels_gemm_batched) each wgmma version's products run on
GEMM_VERSION = {2: 5, 3: 6, 4: 7, 5: 6}
DEFAULT_VERSION = 1  # every GPU
HOPPER_VERSION = 5   # the default where wgmma and TMA exist (sm_90: H100, H200)
ENV_VERSION = versions.env_name("newton_schulz")
_registered = False


def uses_tf32(device, dtype) -> bool:
    return False  # fp32 FMAs on the CUDA cores


def default_version() -> int:
    """The best version this GPU has: HOPPER_VERSION on sm_90, else DEFAULT_VERSION."""
    return HOPPER_VERSION if versions.on_hopper() else DEFAULT_VERSION


def resolve_version(version=None) -> int:
    """version=None: $LEVELS_CUDA_VERSION_NEWTON_SCHULZ if set, else default_version()."""
    return versions.resolve("newton_schulz", VERSIONS, default_version(), version)


def _fake(G, steps, a, b, c, eps, version):
    return G.new_empty(G.shape)


def _register():
    """The kernel op's fake implementation (its shape and dtype, for torch.compile); called by
    build.load() once the library is loaded."""
    global _registered
    if _registered:
        return
    torch.library.register_fake("levels_cuda::newton_schulz")(_fake)
    _registered = True


def newton_schulz(G, steps, a, b, c, eps, version=None):
    """Called by levels.cuda.newton_schulz after the contract's validation (a 2-D CUDA G of a
    float dtype, no grad). Returns a new contiguous tensor in G's shape and dtype."""
    if not _registered and not torch.compiler.is_compiling():
        from . import build
        build.load()  # a direct call (benches, tests): build on first use
    return torch.ops.levels_cuda.newton_schulz.default(G, int(steps), float(a), float(b), float(c),
                                                       float(eps), resolve_version(version))


_STATUS = {-1: "no such version", -2: "fp16 and bf16 only (wgmma has no fp32 path)",
           -3: "X must be contiguous with cols % 8 == 0 (the K-major rule)",
           -4: "needs an sm_90 GPU (wgmma)"}


@functools.lru_cache(maxsize=None)
def _batched_launcher(library: str):
    """gemm.cu's extern "C" levels_gemm_batched in the loaded library (the same handle: the
    .so is already loaded), typed for ctypes once per library."""
    import ctypes

    fn = ctypes.CDLL(library).levels_gemm_batched
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    fn.argtypes = ([ctypes.c_int, ctypes.c_int, ctypes.c_int, i64, i64, i64, i64] + [ptr, i64, i64, i64] * 5
                   + [ctypes.c_float, ctypes.c_float, ptr])
    fn.restype = ctypes.c_int
    return fn


def gram(X, version=2):
    """X X^T by version 2's symmetric product alone (gemm.cu's levels_gemm_batched with the
    symmetric schedule: one triangle of 128x128 wgmma tiles, each mirrored), called through
    ctypes on the built library: for the bench and the tests against torch.matmul(X, X.T),
    not an op (no autograd, no torch.compile). X: a contiguous (rows, cols) fp16 / bf16 CUDA
    matrix, cols % 8 == 0, on an sm_90 GPU; anything else is the launcher's refusal, raised.
    version: this module's version whose GEMM runs it (GEMM_VERSION: 2 -> gemm.cu's version 5,
    3 -> 6, 4 -> 7)."""
    from . import build
    build.load()
    fn = _batched_launcher(build.last_build()["library"])
    if version not in GEMM_VERSION:
        raise ValueError(f"gram: 'version' must be one of {sorted(GEMM_VERSION)} (the wgmma versions); "
                         f"got {version}")
    if X.dim() != 2 or not X.is_cuda:
        raise ValueError(f"gram: 'X' must be a 2-D CUDA matrix; got {tuple(X.shape)} on {X.device}")
    rows, cols = X.shape
    A = X.new_empty((rows, rows))
    code = {torch.float16: 1, torch.bfloat16: 2}.get(X.dtype, 0)
    with torch.cuda.device(X.device):
        status = fn(code, GEMM_VERSION[version], 1, 1, rows, rows, cols, X.data_ptr(), 0, X.stride(0), X.stride(1),
                    X.data_ptr(), 0, X.stride(0), X.stride(1), A.data_ptr(), 0, rows, 1,
                    None, 0, 0, 0, None, 0, 0, 0, 1.0, 0.0,
                    torch.cuda.current_stream(X.device).cuda_stream)
    if status != 0:
        raise RuntimeError(f"gram: levels_gemm_batched refused: {_STATUS.get(status, f'CUDA error {status}')}")
    return A
