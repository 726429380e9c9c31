"""A tiled matrix product in Triton, with a fused epilogue: the workhorse of Level 4.

    gemm(a, b, bias=None, activation=None, out=None, out_dtype=None, accumulate=False,
         preact_out=None) -> out
        out = act( a @ b  [+ out if accumulate]  [+ bias[None, :]] )
        a: (M, K), b: (K, N), any strides (pass `w.t()` views, never copies);
        bias: (N,) or None; activation: None or "gelu" (exact, erf);
        preact_out: (M, N) or None: with activation="gelu", also stores the value before
        the GELU (what the MLP backward needs), in the same pass;
        out: (M, N) tensor to write (any strides), else a new one of dtype
        out_dtype (default a.dtype); accumulate=True adds the old contents of `out`.

    gemm_gelu_backward(a, b, preact, out=None) -> (a @ b) * gelu'(preact)
        the MLP backward's dH = (dY @ W2) * GELU'(H) in one pass: the (M, N) product
        never goes to memory before being multiplied by the derivative.

    column_sum(x, out_dtype=None) -> x.sum(0), fp32 accumulation: bias gradients.

Plain launchers, no autograd here (triton_kernels/mlp.py and lstm.py build on them).

What a tiled GEMM teaches: each program owns one BLOCK_M x BLOCK_N tile of the output,
walks K in BLOCK_K steps and keeps the running sum in fp32 registers; `tl.dot` maps the
(BLOCK_M x BLOCK_K) @ (BLOCK_K x BLOCK_N) step onto the tensor cores (wgmma on H100)
and `num_stages` lets the compiler prefetch the next tiles while this one multiplies.
The *epilogue* — whatever happens to the tile between the last dot and the store — is
where fusion is free: bias, GELU, or the GELU derivative cost a few instructions on data
already in registers, instead of another full read and write of an (M, N) tensor.
Programs are visited in "grouped" order (GROUP_M rows of tiles at a time), so tiles
that share rows of A and columns of B run close together and hit in L2.

Precision: fp32 inputs use input_precision="ieee" (true fp32 FMAs, no TF32 rounding,
so the fp32 tolerance applies; slow on tensor-core GPUs, and declared so). 16-bit inputs
run on the tensor cores with fp32 accumulation. Under TRITON_INTERPRET=1 tiles are
upcast to fp32 before the dot, because the interpreter's bf16 arithmetic is wrong.

Small M (decode: a handful of tokens) changes the problem: the GEMM is bound by reading
B, and (M/128) x (N/128) tiles do not fill the GPU. The tile then has as few rows as the
tensor cores take (small_m_tile), and split-K (split_k_for) gives slices of K their own
programs; a second kernel adds the fp32 partial sums in a fixed order and runs the
epilogue. Both are chosen from (M, N, K) and the SM count, never per benchmark shape.

Limits: element offsets are 32-bit (the launcher refuses operands spanning >= 2**31
elements instead of silently wrapping around).
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from . import tuning
from .launch import autotuning, cdiv, fast_launch, next_power_of_2

INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"

# Epilogue codes (constexpr ints: cheap to branch on at compile time).
EPI_NONE, EPI_GELU, EPI_GELU_SAVE, EPI_GELU_GRAD = 0, 1, 2, 3


@triton.jit
def gelu(x):
    """Exact GELU, x * Phi(x), with Phi from erf (tl.erf: no libdevice import needed)."""
    ### BEGIN SOLUTION
    return 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))
    ### END SOLUTION


@triton.jit
def gelu_grad(x):
    """d/dx [x * Phi(x)] = Phi(x) + x * phi(x), phi(x) = exp(-x^2/2) / sqrt(2 pi)."""
    ### BEGIN SOLUTION
    cdf = 0.5 * (1.0 + tl.erf(x * 0.7071067811865476))
    pdf = tl.exp(-0.5 * x * x) * 0.3989422804014327
    return cdf + x * pdf
    ### END SOLUTION


@triton.jit
def grouped_tile(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(pid_m, pid_n): this program's output tile, in grouped order. Walk GROUP_M tile-rows
    down a column of tiles before moving right, so the B columns just loaded are reused by
    the next programs (L2 hits). Shared by every tiled GEMM of Level 4 (conv_bn too)."""
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    group_size = GROUP_M * num_pid_n
    first_m = (pid // group_size) * GROUP_M
    rows_in_group = min(num_pid_m - first_m, GROUP_M)
    return first_m + (pid % group_size) % rows_in_group, (pid % group_size) // rows_in_group


@triton.jit
def _epilogue(acc, offs_m, offs_n, c_ptr, bias_ptr, aux_ptr, M, N,
              stride_cm, stride_cn, stride_xm, stride_xn,
              HAS_BIAS: tl.constexpr, EPILOGUE: tl.constexpr, ACCUMULATE: tl.constexpr):
    """Finish a (rows offs_m, columns offs_n) piece of the output tile and store it."""
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    if ACCUMULATE:
        acc += tl.load(c_ptrs, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    aux_ptrs = aux_ptr + offs_m[:, None] * stride_xm + offs_n[None, :] * stride_xn
    if EPILOGUE == 2:  # gelu, keeping the pre-activation for the backward pass
        tl.store(aux_ptrs, acc.to(aux_ptr.dtype.element_ty), mask=mask)
    if EPILOGUE == 1 or EPILOGUE == 2:
        acc = gelu(acc)
    if EPILOGUE == 3:  # chain rule through GELU: dH = dG * GELU'(H)
        pre = tl.load(aux_ptrs, mask=mask, other=0.0).to(tl.float32)
        acc = acc * gelu_grad(pre)
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)


@fast_launch
@triton.jit
def gemm_kernel(a_ptr, b_ptr, c_ptr, bias_ptr, aux_ptr, ws_ptr,
                M, N, K, K_PER_SPLIT,
                stride_am, stride_ak, stride_bk, stride_bn,
                stride_cm, stride_cn, stride_xm, stride_xn,
                HAS_BIAS: tl.constexpr, EPILOGUE: tl.constexpr, ACCUMULATE: tl.constexpr,
                UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr, EVEN_K: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                GROUP_M: tl.constexpr, SPLIT_N: tl.constexpr = 1, PARTIAL: tl.constexpr = False):
    pid_m, pid_n = grouped_tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    # Split-K: program (tile, pid_k) sums only K_PER_SPLIT (a multiple of BLOCK_K) of the
    # K dimension and, PARTIAL, stores that partial sum; unsplit, K_PER_SPLIT == K.
    pid_k = tl.program_id(1)
    k_first = pid_k * K_PER_SPLIT

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    # Out-of-range rows/columns are wrapped (not masked) for the loads: they read valid
    # memory that only feeds output elements the store masks away. Unmasked loads keep
    # the K loop lean; only K itself must be masked, since it is summed over.
    a_rows = offs_m % M
    b_cols = offs_n % N
    a_ptrs = a_ptr + a_rows[:, None] * stride_am + (k_first + offs_k)[None, :] * stride_ak
    b_ptrs = b_ptr + (k_first + offs_k)[:, None] * stride_bk + b_cols[None, :] * stride_bn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(tl.minimum(K - k_first, K_PER_SPLIT), BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_left = K - k_first - k * BLOCK_K
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    # ---- epilogue: everything below touches registers only, until the final store ----
    if PARTIAL:
        # Only a partial sum: to the fp32 workspace (splits, M, N), contiguous, for
        # splitk_reduce_kernel to add up in a fixed order and finish with the epilogue.
        ws = ws_ptr + pid_k * M * N + offs_m[:, None] * N + offs_n[None, :]
        tl.store(ws, acc, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))
    elif SPLIT_N == 2:
        # Epilogue subtiling: hand the tile to the epilogue in two (BLOCK_M, BLOCK_N/2)
        # halves. A 128x256 fp32 accumulator is already 128 registers per thread; the GELU
        # temporaries of the whole tile on top of it spill (measured: 42 and 292 spilled
        # registers), half a tile at a time they fit. The reshape/permute/split only
        # relabels registers, no data moves.
        halves = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
        acc_lo, acc_hi = tl.split(halves)
        offs_lo = pid_n * BLOCK_N + tl.arange(0, BLOCK_N // 2)
        _epilogue(acc_lo, offs_m, offs_lo, c_ptr, bias_ptr, aux_ptr, M, N,
                  stride_cm, stride_cn, stride_xm, stride_xn, HAS_BIAS, EPILOGUE, ACCUMULATE)
        _epilogue(acc_hi, offs_m, offs_lo + BLOCK_N // 2, c_ptr, bias_ptr, aux_ptr, M, N,
                  stride_cm, stride_cn, stride_xm, stride_xn, HAS_BIAS, EPILOGUE, ACCUMULATE)
    else:
        _epilogue(acc, offs_m, offs_n, c_ptr, bias_ptr, aux_ptr, M, N,
                  stride_cm, stride_cn, stride_xm, stride_xn, HAS_BIAS, EPILOGUE, ACCUMULATE)


@fast_launch
@triton.jit
def splitk_reduce_kernel(ws_ptr, c_ptr, bias_ptr, aux_ptr, M, N, SPLITS,
                         stride_cm, stride_cn, stride_xm, stride_xn,
                         HAS_BIAS: tl.constexpr, EPILOGUE: tl.constexpr, ACCUMULATE: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """out = epilogue(sum over the splits of the workspace): split-K's second pass. The
    splits are added in the same order every run (no atomics): deterministic results."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    ws = ws_ptr + offs_m[:, None] * N + offs_n[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for s in range(0, SPLITS):
        acc += tl.load(ws + s * M * N, mask=mask, other=0.0)
    _epilogue(acc, offs_m, offs_n, c_ptr, bias_ptr, aux_ptr, M, N,
              stride_cm, stride_cn, stride_xm, stride_xn, HAS_BIAS, EPILOGUE, ACCUMULATE)


def _configs():
    # Measured on an H100 (MLP bench "forward sweep", reports/h100-bench.json, two runs):
    # 128x256 tiles with the subtiled epilogue (SPLIT_N=2) won, 565-578 TFLOP/s at 3 or 4
    # stages, vs 460-506 unsplit (spilling) and 488-504 for 128x128. Few candidates: each
    # is a compile per new shape.
    return [BIG_TILE, BIG_TILE_3_STAGES, MID_TILE]


BIG_TILE = triton.Config({"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "SPLIT_N": 2},
                         num_stages=4, num_warps=8)
BIG_TILE_3_STAGES = triton.Config({"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8,
                                   "SPLIT_N": 2}, num_stages=3, num_warps=8)
MID_TILE = triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "SPLIT_N": 1},
                         num_stages=4, num_warps=8)
# Half as wide again, for GEMMs whose 128 x 128 tiles do not fill the SMs (GPT-2 prefill's
# second GEMM, M = 1000, N = 768: 48 tiles): twice the programs. H100 kernel time 14.2 us
# against 17.5 us for 128 x 128 (reports/h100-small-shapes.json).
NARROW_TILE = triton.Config({"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8,
                             "SPLIT_N": 1}, num_stages=4, num_warps=8)


def sm_count(device) -> int:
    """SMs of a CUDA device (1 for any other): what every Level 4 launcher sizes its grid by.
    Cached per GPU: the property query costs microseconds on every launch otherwise."""
    if device.__class__ is not torch.device:
        device = torch.device(device)
    if device.type != "cuda":
        return 1
    return _sm_count(torch.cuda.current_device() if device.index is None else device.index)


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def l2_bytes(device) -> int:
    """L2 bytes of a CUDA device (an H100's 50 MB for any other, so that a rule reads the same
    in the interpreter), cached per GPU as sm_count."""
    if device.__class__ is not torch.device:
        device = torch.device(device)
    if device.type != "cuda":
        return 50 * 2 ** 20
    return _l2_bytes(torch.cuda.current_device() if device.index is None else device.index)


@functools.lru_cache(maxsize=None)
def _l2_bytes(index: int) -> int:
    return int(getattr(torch.cuda.get_device_properties(index), "L2_cache_size", 50 * 2 ** 20))


# How fast each tile computes per SM, relative to the big one, at the same number of
# rounds (waves) of programs: measured at GPT-2 small's six MLP GEMMs on an H200
# (scripts/sweep_gemm_tiles.py, reports/gemm-tiles-and-layer-norm-backward/): 128x128 ran
# at 0.81-0.92 of 128x256's rate, 128x64 at 0.64-0.87 (the lower figures at long K).
_TILE_RATES = ((BIG_TILE, 1.0), (MID_TILE, 0.85), (NARROW_TILE, 0.65))


@functools.lru_cache(maxsize=4096)
def tile_for(M: int, N: int, sms: int) -> triton.Config:
    """The 16-bit tile for an (M, N) output, chosen from the problem's size (no benchmark).

    Programs run in rounds of one per SM (a 128x256 or 128x128 program's four pipeline stages
    fill most of an SM's shared memory; two 128x64 ones fit, which their measured rate
    absorbs), so a kernel takes about (rounds) x (the time of one tile), and the last round
    is whole even when few tiles are left in it: *wave quantization*. The rule weighs each tile's rounds by its
    size over its rate (_TILE_RATES) and takes the cheapest, the biggest on a tie. The big
    tile is the fastest per element (it reuses each loaded A and B block 256 and 128 times),
    and wins when its tiles fill whole rounds (the MLP bench's 8192 x 16384: 4096 tiles, 32
    rounds on 132 SMs) or fit in one (GPT-2 small's weight gradients, 768 x 3072: 72 tiles;
    128x128's 144 would take two rounds, 16% slower measured). A count just past a round
    goes to a smaller tile: GPT-2 small's fc2, 8192 x 768, has 192 big tiles = 2 rounds,
    half idle, and 384 128x128 tiles = 3 full ones (66.5 us against 71.4 on the H200);
    outputs smaller than the GPU (prefill, M = 1000, N = 768) take the 128x64 tile, four
    programs for every big one. Autotuning (LEVELS_TRITON_AUTOTUNE=1) instead compiles and
    times this rule's pick and the fixed tiles once per shape bucket, and remembers the
    winner on disk (_tuned, tuning.py): several times the compile work of a first call
    (Triton's own autotuner, keyed on exact sizes, made the MLP's cold first
    forward+backward at the bench shape take 19 s on the H100)."""
    best, best_cost = BIG_TILE, None
    for tile, rate in _TILE_RATES:
        bm, bn = tile.kwargs["BLOCK_M"], tile.kwargs["BLOCK_N"]
        cost = cdiv(cdiv(M, bm) * cdiv(N, bn), sms) * bm * bn / rate
        if best_cost is None or cost < best_cost:
            best, best_cost = tile, cost
    return best


# A GEMM with at most this many rows (decode: a few tokens) is limited by reading B, not
# by the tensor cores: a 128-row tile would compute 16x more rows than exist at M = 8.
SMALL_M = 64


def small_m_tile(M: int, K: int) -> dict:
    """The tile for M <= SMALL_M: as few rows as tl.dot allows (16) or M rounded up to a
    power of two, 64 columns (twice the programs of 128: this GEMM needs every SM pulling
    B from memory), and long K steps (each streams a 64 x BLOCK_K slab of B, the bytes
    this GEMM is made of). Measured on the H100 at Llama-2 7B's and GPT-2's decode GEMMs
    (scripts/probe_small_shapes.py, kernel times in reports/h100-small-shapes.json), with
    split_k_for's slices: within 1-6% of the fastest tile and split tried and of cuBLAS
    (Llama W1 34.0 vs 33.6 us, W2 35.5 vs 35.3 us; GPT-2 W1 4.0 vs 3.4, W2 6.3 vs 6.1)."""
    return _SMALL_M_TILES[(max(16, next_power_of_2(M)), 128 if K >= 512 else 64)]


# small_m_tile's answers, built once (it runs on every launch: host time per call)
_SMALL_M_TILES = {(bm, bk): dict(BLOCK_M=bm, BLOCK_N=64, BLOCK_K=bk, GROUP_M=1, num_warps=4,
                                 num_stages=4 if bm <= 32 else 3)
                  for bm in (16, 32, 64) for bk in (64, 128)}


# Every slice of a split K is at least this long: shorter slices cost more in the partial
# sums' round trip and the second launch than the extra programs gain (measured: GPT-2's
# decode W1, K = 768, was fastest unsplit).
MIN_K_PER_SPLIT = 1024


def split_k_for(M: int, N: int, K: int, cfg: dict, sms: int) -> int:
    """How many slices of K to give separate programs (1: no split), from the size.

    A GEMM whose output has fewer tiles than the GPU has SMs leaves SMs idle for the whole
    kernel; with a long K (decode: M = 8, K = 4096-11008) each of those few programs also
    runs for a long time. Split-K gives each (tile, K slice) its own program and adds the
    fp32 partial sums in a second, small kernel (splitk_reduce_kernel), which also runs the
    epilogue. The cost is that round trip (splits x M x N fp32 written and read back) and
    one more launch, so it splits only as far as it takes to give every SM a program, and
    never below MIN_K_PER_SPLIT of K per slice. Only light tiles (M <= SMALL_M) split:
    with 128-row tiles the round trip cost more than the idle SMs (H100 kernel times,
    reports/h100-small-shapes.json: GPT-2 prefill's 768-wide GEMM 14.2 us unsplit, 18.3 us
    in 2 slices; Llama-2 decode's W2 35.5 us in 3 slices, 40.4 unsplit, cuBLAS 35.3)."""
    tiles = cdiv(M, cfg["BLOCK_M"]) * cdiv(N, cfg["BLOCK_N"])
    if tiles == 0 or tiles >= sms or cfg["BLOCK_M"] > SMALL_M:  # (an empty output: no split)
        return 1
    split = max(1, min(cdiv(sms, tiles), K // MIN_K_PER_SPLIT))
    if split > 1 and split * M * N >= 2 ** 31:  # the workspace's 32-bit offsets
        return 1
    return split


def _as_dict(config: triton.Config) -> dict:
    return dict(config.kwargs, num_warps=config.num_warps, num_stages=config.num_stages)


# One config under the interpreter (it cannot time candidates) and for non-idempotent
# launches (accumulate=True: re-running a candidate config would add twice, which is why
# those never autotune; the size rule could serve them too, untried).
_FIXED_INTERPRETED = dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, GROUP_M=4, num_warps=4, num_stages=1)
_FIXED_GPU = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3)
_FIXED_GPU_FP32 = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=8, num_warps=4, num_stages=3)
# tile_for's answers as launch arguments, built once: {id(config): arguments}
_TILE_ARGS = {id(t): _as_dict(t) for t in (BIG_TILE, MID_TILE, NARROW_TILE)}

KERNELS = [gemm_kernel, splitk_reduce_kernel]


def _check_matrix(name: str, t: torch.Tensor, shape: tuple) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"gemm: argument '{name}' must be a torch.Tensor; got {type(t).__name__}")
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"gemm: argument '{name}' must be of shape {tuple(shape)}; "
                         f"got {tuple(t.shape)}")
    span = sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride())) if t.numel() else 0
    if span >= 2 ** 31:
        raise ValueError(f"gemm: argument '{name}' spans {span} elements; the kernel uses 32-bit "
                         f"offsets and needs < 2**31")


def _check(a, b, c, bias, aux):
    """The public entry points' argument checks (mlp and lstm pass check=False: their
    operands come from the validated contract and their own allocations)."""
    M, K = a.shape
    N = b.shape[1]
    if a.dtype != b.dtype:
        raise TypeError(f"gemm: arguments 'a' and 'b' must share a dtype; got {a.dtype} and {b.dtype}")
    if a.device != b.device or c.device != a.device:
        raise ValueError(f"gemm: all tensors must be on one device; got a on {a.device}, "
                         f"b on {b.device}, out on {c.device}")
    for name, t, shape in (("a", a, (M, K)), ("b", b, (K, N)), ("out", c, (M, N))):
        _check_matrix(name, t, shape)
    if bias is not None:
        _check_matrix("bias", bias, (N,))
    if aux is not None:
        _check_matrix("preact", aux, (M, N))


def _launch(a, b, c, bias, aux, epilogue, accumulate, check=True, config=None):
    if check:
        _check(a, b, c, bias, aux)
    M, K = a.shape
    N = b.shape[1]
    if M == 0 or N == 0:
        return c  # an empty output (a batch of 0 rows): nothing to compute, nothing launched
    if K == 0 and bias is None and epilogue == EPI_NONE:
        # A sum over no terms (a weight gradient dY^T X over a batch of 0 rows) is 0: filled
        # here rather than by a kernel whose K loop would run no step. Epilogues that make
        # something of the 0 (a bias, an activation) still run in the kernel.
        return c if accumulate else c.zero_()
    if bias is not None:
        # The epilogue reads bias_ptr + offs_n (unit stride): a strided bias view is copied,
        # N elements, which costs nothing next to the GEMM.
        bias = bias.contiguous()
    precision = "ieee" if a.dtype == torch.float32 else "tf32"  # "tf32" is a no-op for 16-bit
    ops = (a, b, c, bias if bias is not None else c, aux if aux is not None else c)
    flags = (bias is not None, epilogue, accumulate, precision)
    split = 1
    if config is not None:  # pinned by the caller (see gemm's docstring)
        cfg = config
        split = cfg.get("SPLIT_K", 1)
    elif INTERPRETED:
        cfg = _FIXED_INTERPRETED
    elif a.dtype == torch.float32:  # "ieee" dots run on CUDA cores: big tiles only waste SMEM
        cfg = _FIXED_GPU_FP32
    elif accumulate:  # one config, as before: see _FIXED_GPU
        cfg = _FIXED_GPU
    else:
        sms = sm_count(a.device)
        cfg = small_m_tile(M, K) if M <= SMALL_M else _TILE_ARGS[id(tile_for(M, N, sms))]
        split = split_k_for(M, N, K, cfg, sms)
        if autotuning():
            cfg = _tuned(ops, flags, dict(cfg, SPLIT_K=split))
            split = cfg["SPLIT_K"]
    _run(ops, flags, cfg, split)
    return c


def _tuned(ops, flags, rule: dict) -> dict:
    """LEVELS_TRITON_AUTOTUNE=1: the fastest of the size rule's pick and the fixed tiles,
    measured once per shape bucket (triton_kernels/tuning.py). Never for accumulate=True
    (re-running a candidate would add twice) nor fp32 (one tile)."""
    a, b, c, bias_t, aux_t = ops
    M, K = a.shape
    N = b.shape[1]
    key = (str(a.dtype).removeprefix("torch."), flags[1], flags[0], tuning.bucket(M),
           tuning.bucket(N), tuning.bucket(K), tuning.layout(a), tuning.layout(b))
    candidates = [rule] + [dict(_as_dict(t), SPLIT_K=1) for t in _configs() + [NARROW_TILE]]
    candidates = [cand for i, cand in enumerate(candidates) if cand not in candidates[:i]]
    return tuning.pick("gemm", key, candidates,
                       lambda cand: tuning.benchmark(lambda: _run(ops, flags, cand,
                                                                  cand["SPLIT_K"])), a.device)


def _run(ops, flags, cfg: dict, split: int) -> None:
    """Launch the GEMM (and, split, the reduction of its K slices) with one config."""
    a, b, c, bias_t, aux_t = ops
    has_bias, epilogue, accumulate, precision = flags
    M, K = a.shape
    N = b.shape[1]
    sa, sb, sc, sx = a.stride(), b.stride(), c.stride(), aux_t.stride()
    k_per_split = K
    if split > 1:  # whole BLOCK_K steps per slice; the last slice may be shorter
        k_per_split = cdiv(cdiv(K, split), cfg["BLOCK_K"]) * cfg["BLOCK_K"]
        split = cdiv(K, k_per_split)
    ws = c.new_empty((split, M, N), dtype=torch.float32) if split > 1 else c
    # SPLIT_N given even when 1, its default: Inductor's wrapper for a user kernel, when a
    # model is compiled whole, counts the arguments passed and does not fill in defaults.
    # EVEN_K (no K mask in the main loop) follows this config's BLOCK_K.
    gemm_kernel[(cdiv(M, cfg["BLOCK_M"]) * cdiv(N, cfg["BLOCK_N"]), split)](
        a, b, c, bias_t, aux_t, ws, M, N, K, k_per_split, sa[0], sa[1], sb[0], sb[1], sc[0],
        sc[1], sx[0], sx[1], HAS_BIAS=has_bias, EPILOGUE=epilogue, ACCUMULATE=accumulate,
        UPCAST=INTERPRETED, DOT_PRECISION=precision, EVEN_K=K % cfg["BLOCK_K"] == 0,
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"],
        GROUP_M=cfg["GROUP_M"], SPLIT_N=cfg.get("SPLIT_N", 1), PARTIAL=split > 1,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    if split > 1:
        RB_M = min(32, max(16, next_power_of_2(M)))
        splitk_reduce_kernel[(cdiv(M, RB_M), cdiv(N, 128))](
            ws, c, bias_t, aux_t, M, N, split, sc[0], sc[1], sx[0], sx[1], HAS_BIAS=has_bias,
            EPILOGUE=epilogue, ACCUMULATE=accumulate, BLOCK_M=RB_M, BLOCK_N=128, num_warps=4)


def _output(a, N, out, out_dtype):
    if out is not None:
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"gemm: argument 'out' must be a torch.Tensor; got {type(out).__name__}")
        return out
    return a.new_empty((a.shape[0], N), dtype=out_dtype or a.dtype)


def gemm(a, b, bias=None, activation=None, out=None, out_dtype=None, accumulate=False,
         preact_out=None, check=True, config=None):
    """act(a @ b [+ out] [+ bias]); see the module docstring. check=False skips the
    operand checks (callers whose operands are validated already: host time per call).

    config=None: the tile follows from the problem's size (tile_for, small_m_tile,
    split_k_for). A dict pins this launch to one tile instead: the keys of _FIXED_GPU
    (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages), optionally SPLIT_N (the
    subtiled epilogue, 1 or 2) and SPLIT_K (how many K slices, 1 if absent). It is what
    the benchmark's tile sweep and the tests of split-K and of the subtiled epilogue pass,
    as an argument: no setting of the module changes what other calls run."""
    if activation not in (None, "gelu"):
        raise ValueError(f"gemm: argument 'activation' must be None or 'gelu'; got {activation!r}")
    if accumulate and out is None:
        raise ValueError("gemm: argument 'out' must be given when accumulate=True")
    if preact_out is not None and activation != "gelu":
        raise ValueError("gemm: argument 'preact_out' is only meaningful with activation='gelu'")
    c = _output(a, b.shape[1], out, out_dtype)
    if activation is None:
        epilogue = EPI_NONE
    else:
        epilogue = EPI_GELU if preact_out is None else EPI_GELU_SAVE
    return _launch(a, b, c, bias, preact_out, epilogue, bool(accumulate), check, config)


def gemm_gelu_backward(a, b, preact, out=None, out_dtype=None, check=True, config=None):
    """(a @ b) * GELU'(preact), in one pass (the derivative is applied in the epilogue);
    config as for gemm."""
    c = _output(a, b.shape[1], out, out_dtype)
    return _launch(a, b, c, None, preact, EPI_GELU_GRAD, False, check, config)


# ---------------------------------------------------------------------------------------
# Column sums (bias gradients): partial sums per block of rows, then a second pass over
# the partials. Each program owns distinct output cells, so no atomics and no races, and
# the result is the same on every run (deterministic order).
# ---------------------------------------------------------------------------------------

@fast_launch
@triton.jit
def column_sum_kernel(x_ptr, part_ptr, M, N, stride_xm, stride_xn, rows_per_program,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    row0 = pid_m * rows_per_program
    for r in range(0, rows_per_program, BLOCK_M):
        offs_m = row0 + r + tl.arange(0, BLOCK_M)
        mask = (offs_m[:, None] < M) & (offs_m[:, None] < row0 + rows_per_program) \
            & (offs_n[None, :] < N)
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_n[None, :] * stride_xn,
                    mask=mask, other=0.0)
        acc += x.to(tl.float32)
    tl.store(part_ptr + pid_m * N + offs_n, tl.sum(acc, axis=0), mask=offs_n < N)


KERNELS.append(column_sum_kernel)


def column_sum(x, out_dtype=None, out=None):
    """x.sum(0) for a 2-D x (any strides), accumulated in fp32. Up to 256 rows (a small
    batch's bias gradient) one program per column block sums them all and writes the result
    itself: one launch; beyond that, partial sums and a second pass over them."""
    M, N = x.shape
    if M == 0 or N == 0:  # no rows (a batch of 0): a sum of nothing, no launch
        return x.new_zeros((N,), dtype=out_dtype or x.dtype) if out is None else out.zero_()
    BLOCK_M, BLOCK_N = (16, 32) if INTERPRETED else (32, 128)
    # Enough row-chunks to fill the GPU, each a whole number of BLOCK_M rows.
    chunks = 1 if INTERPRETED else max(1, min(cdiv(M, 256), 64))
    rows = cdiv(cdiv(M, chunks), BLOCK_M) * BLOCK_M
    chunks = cdiv(M, rows)
    if out is None:
        out = x.new_empty((N,), dtype=out_dtype or x.dtype)
    if chunks <= 1:
        column_sum_kernel[(1, cdiv(N, BLOCK_N))](x, out, M, N, x.stride(0), x.stride(1),
                                                 max(rows, BLOCK_M), BLOCK_M=BLOCK_M,
                                                 BLOCK_N=BLOCK_N)
        return out
    part = x.new_empty((chunks, N), dtype=torch.float32)
    column_sum_kernel[(chunks, cdiv(N, BLOCK_N))](x, part, M, N, x.stride(0), x.stride(1),
                                                  rows, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)
    # Second pass: the same kernel over the (chunks, N) partials, one chunk of all rows.
    total = cdiv(chunks, BLOCK_M) * BLOCK_M
    column_sum_kernel[(1, cdiv(N, BLOCK_N))](part, out, chunks, N, N, 1, total,
                                             BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)
    return out


def uses_tf32(device, dtype) -> bool:
    return False  # fp32 dots are "ieee" on every device
