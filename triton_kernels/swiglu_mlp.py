"""SwiGLU MLP (Llama's: down(silu(x W_gate^T) * (x W_up^T))) on the tiled GEMM of gemm.py.

What it adds over torch.compile: the gate and up projections are ONE GEMM, x [W_gate; W_up]^T,
with the SiLU-multiply in its epilogue. Each program owns a tile of G = x W_gate^T and the
same tile of U = x W_up^T, as two fp32 accumulators fed by the same tile of x: x is read
once for both products, and silu(G) * U is computed while both tiles are still in registers.
Eager PyTorch writes G and U (two (M, hidden) tensors), reads G back for the SiLU, writes
it, then reads both for the product: four extra passes over the widest tensors of the
block. In backward the SiLU-mul derivative rides in the epilogue of dA = dY W_down, which
writes dG = dA * U * silu'(G) and dU = dA * silu(G) in one pass; dX = dG W_gate + dU W_up
is again one kernel (two products summed into one accumulator), and the weight gradients
are gemm.py's GEMM fed transposed views.

Why two accumulators and not a literal concatenation [W_gate; W_up]: the weights arrive as
two tensors (two nn.Linear, or two views of anything), so a concatenation would copy both
every call (270 MB at Llama 2 7B's sizes, about 0.1 ms on an H100 next to the GEMM's
1.3 ms at 4096 tokens, and three times the traffic of a decoding step), and it would put an
element's gate and up values in two different tiles, 11008 columns apart, where no epilogue
sees both. Two accumulators are the concatenation done tile by tile: the program's B tile
is [gate columns | up columns] of the same hidden units, loaded from the two tensors with
their own strides. Register budget: two 128 x 128 accumulators are exactly gemm.py's
128 x 256 big tile (128 fp32 registers a thread), so the same tile rules apply, halved.

What it costs: three GEMM kernels of our own instead of cuBLAS's; the forward of a training
step stores G and U beside A = silu(G) * U (three (M, hidden) tensors, as eager autograd
keeps); no split-K in the fused kernel (its output is hidden-wide: at decode sizes, 172
tiles of 64 columns for Llama 2 7B already outnumber an H100's 132 SMs; the down GEMM,
gemm.py's, splits K where it pays).

Shapes: x (..., K) is viewed as (M, K) (a copy only if its strides do not allow it),
w_gate and w_up (hidden, K), w_down (N, hidden), as nn.Linear stores them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .gemm import (_FIXED_GPU_FP32, _FIXED_INTERPRETED, _TILE_ARGS, INTERPRETED, SMALL_M, gemm,
                   grouped_tile, sm_count, small_m_tile, tile_for)
from .gemm import KERNELS as _GEMM_KERNELS
from .launch import apply_ahead, cdiv, fast_launch, forward_ahead, needs_grad

# What the fused kernel computes (constexpr: one compiled kernel per mode).
GATE_UP, SWIGLU_GRAD, SUM_OF_TWO = 0, 1, 2


@triton.jit
def silu(g):
    """g * sigmoid(g); for g -> -inf, exp(-g) overflows to inf and the quotient is -0."""
    ### BEGIN SOLUTION
    return g / (1.0 + tl.exp(-g))
    ### END SOLUTION


@triton.jit
def silu_grad(g):
    """d/dg [g sigmoid(g)] = s (1 + g (1 - s)), s = sigmoid(g)."""
    ### BEGIN SOLUTION
    s = 1.0 / (1.0 + tl.exp(-g))
    return s * (1.0 + g * (1.0 - s))
    ### END SOLUTION


@triton.jit
def _finish(acc, acc2, offs_m, offs_n, c_ptr, c2_ptr, g_ptr, u_ptr, M, N, stride_cm, stride_cn,
            MODE: tl.constexpr, SAVE: tl.constexpr):
    """The epilogue of a (offs_m, offs_n) piece. Every (M, N) tensor it touches (c, c2, g, u)
    is one the launcher allocated alike, so they share (stride_cm, stride_cn)."""
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    offs = offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    if MODE == 0:  # acc = G, acc2 = U: A = silu(G) * U (and G, U for the backward)
        if SAVE:
            tl.store(g_ptr + offs, acc.to(g_ptr.dtype.element_ty), mask=mask)
            tl.store(u_ptr + offs, acc2.to(u_ptr.dtype.element_ty), mask=mask)
        ### BEGIN SOLUTION
        acc = silu(acc) * acc2
        ### END SOLUTION
    if MODE == 1:  # acc = dA: dG = dA * U * silu'(G) into c, dU = dA * silu(G) into c2
        g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(u_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        ### BEGIN SOLUTION
        tl.store(c2_ptr + offs, (acc * silu(g)).to(c2_ptr.dtype.element_ty), mask=mask)
        acc = acc * u * silu_grad(g)
        ### END SOLUTION
    tl.store(c_ptr + offs, acc.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _load_k(ptrs, offs_k, k_left, EVEN_K: tl.constexpr, UPCAST: tl.constexpr):
    """One K step's tile; offs_k shaped along the tile's K axis. Only K is masked (rows and
    columns past the edge are wrapped by the caller)."""
    if EVEN_K:
        t = tl.load(ptrs)
    else:
        t = tl.load(ptrs, mask=offs_k < k_left, other=0.0)
    if UPCAST:
        t = t.to(tl.float32)
    return t


@triton.jit
def _k_loop(acc, a_ptrs, b_ptrs, stride_ak, stride_bk, offs_k, K, EVEN_K: tl.constexpr,
            UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr, BLOCK_K: tl.constexpr):
    """acc += A B over all of K, one (A, B) pair of tiles a step."""
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = _load_k(a_ptrs, offs_k[None, :], K - k * BLOCK_K, EVEN_K, UPCAST)
        b = _load_k(b_ptrs, offs_k[:, None], K - k * BLOCK_K, EVEN_K, UPCAST)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        a_ptrs += BLOCK_K * stride_ak  # pointers step on: no k * stride product to overflow
        b_ptrs += BLOCK_K * stride_bk
    return acc


@triton.jit
def _halves(acc, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(left, right) column halves of a tile: a relabelling of registers (gemm.py SPLIT_N)."""
    return tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1)))


@fast_launch
@triton.jit
def swiglu_gemm_kernel(a_ptr, b_ptr, a2_ptr, b2_ptr,  # operands: (M, K), (K, N), (M, K), (K, N)
                       c_ptr, c2_ptr, g_ptr, u_ptr,  # (M, N) outputs / saved G and U
                       M, N, K,
                       stride_am, stride_ak, stride_bk, stride_bn,
                       stride_a2m, stride_a2k, stride_b2k, stride_b2n,
                       stride_cm, stride_cn,
                       MODE: tl.constexpr, SAVE: tl.constexpr,
                       UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr, EVEN_K: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       GROUP_M: tl.constexpr, SPLIT_N: tl.constexpr):
    """MODE GATE_UP:    acc = A B, acc2 = A B2 (two accumulators, A read once)  -> silu-mul
       MODE SWIGLU_GRAD: acc = A B                                               -> dG, dU
       MODE SUM_OF_TWO:  acc = A B, then acc += A2 B2 (one accumulator, two K loops) -> c"""
    pid_m, pid_n = grouped_tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    # Rows and columns past the edge are wrapped for the loads (as gemm.py): they read valid
    # memory that only feeds outputs the store masks away; only K is masked.
    rows = offs_m % M
    cols = offs_n % N
    a_ptrs = a_ptr + rows[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + cols[None, :] * stride_bn
    a2_ptrs = a2_ptr + rows[:, None] * stride_a2m + offs_k[None, :] * stride_a2k
    b2_ptrs = b2_ptr + offs_k[:, None] * stride_b2k + cols[None, :] * stride_b2n

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)  # GATE_UP only (dead code otherwise)
    if MODE == 0:
        # one tile of A, two of B a step: the gate and up accumulators share A's loads
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            a = _load_k(a_ptrs, offs_k[None, :], K - k * BLOCK_K, EVEN_K, UPCAST)
            b = _load_k(b_ptrs, offs_k[:, None], K - k * BLOCK_K, EVEN_K, UPCAST)
            b2 = _load_k(b2_ptrs, offs_k[:, None], K - k * BLOCK_K, EVEN_K, UPCAST)
            acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
            acc2 = tl.dot(a, b2, acc2, input_precision=DOT_PRECISION)
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk
            b2_ptrs += BLOCK_K * stride_b2k
    else:
        acc = _k_loop(acc, a_ptrs, b_ptrs, stride_ak, stride_bk, offs_k, K, EVEN_K, UPCAST,
                      DOT_PRECISION, BLOCK_K)
        if MODE == 2:
            # the second product after the first, into the same accumulator: each loop
            # streams one pair of tiles a step, so its pipeline holds gemm.py's stages. One
            # loop loading both pairs a step needed twice the shared memory a stage and ran
            # with half the stages: ~1.8 ms of the 6.7 ms forward+backward at Llama 3 8B on
            # the H100, 1.22 ms as two loops (reports/level5-gemm-users-and-norms-2026-11-27/).
            acc = _k_loop(acc, a2_ptrs, b2_ptrs, stride_a2k, stride_b2k, offs_k, K, EVEN_K, UPCAST,
                          DOT_PRECISION, BLOCK_K)

    # ---- epilogue: registers only until the stores ----
    if SPLIT_N == 2:
        # Half a tile at a time (gemm.py's subtiling): the SiLU temporaries of two whole
        # 128 x 128 accumulators on top of them would spill.
        g_lo, g_hi = _halves(acc, BLOCK_M, BLOCK_N)
        u_lo, u_hi = _halves(acc2, BLOCK_M, BLOCK_N)
        offs_lo = pid_n * BLOCK_N + tl.arange(0, BLOCK_N // 2)
        _finish(g_lo, u_lo, offs_m, offs_lo, c_ptr, c2_ptr, g_ptr, u_ptr, M, N,
                stride_cm, stride_cn, MODE, SAVE)
        _finish(g_hi, u_hi, offs_m, offs_lo + BLOCK_N // 2, c_ptr, c2_ptr, g_ptr, u_ptr, M, N,
                stride_cm, stride_cn, MODE, SAVE)
    else:
        _finish(acc, acc2, offs_m, offs_n, c_ptr, c2_ptr, g_ptr, u_ptr, M, N,
                stride_cm, stride_cn, MODE, SAVE)


KERNELS = [swiglu_gemm_kernel] + list(_GEMM_KERNELS)


def uses_tf32(device, dtype) -> bool:
    return False  # fp32 dots are "ieee", as gemm.py's


def tile(M: int, N: int, K: int, dtype: torch.dtype, device, mode: int) -> dict:
    """The tile of one fused launch, from the problem's size (gemm.py's rules). GATE_UP has
    two accumulators: its tile is the one gemm.py would give the (M, 2N) product of
    x [W_gate; W_up]^T, each accumulator taking half its columns."""
    if INTERPRETED:
        return _FIXED_INTERPRETED
    if dtype == torch.float32:  # "ieee" dots on CUDA cores: one small tile (gemm.py)
        return _FIXED_GPU_FP32
    return size_rule(M, N, K, mode, sm_count(device))


def size_rule(M: int, N: int, K: int, mode: int, sms: int) -> dict:
    """The 16-bit tile on a GPU with `sms` SMs (tile's rule, testable without one)."""
    if M <= SMALL_M:  # decode: bound by reading the weights; 64 columns per accumulator
        return small_m_tile(M, K)
    width = 2 * N if mode == GATE_UP else N
    cfg = _TILE_ARGS[id(tile_for(M, width, sms))]
    # GATE_UP: two accumulators of half the width. SUM_OF_TWO streams one operand pair a
    # step (its two products one after the other), so gemm.py's tile and stages fit as they are.
    return dict(cfg, BLOCK_N=cfg["BLOCK_N"] // 2) if mode == GATE_UP else cfg


def _launch(mode, a, b, c, a2=None, b2=None, c2=None, g=None, u=None, save=False, config=None):
    """One fused launch; c, c2, g, u: (M, N) tensors of one layout (the launcher's own)."""
    M, K = a.shape
    N = b.shape[1]
    for t in (c2, g, u):
        assert t is None or t.stride() == c.stride(), "c, c2, g, u share one layout"
    if M == 0 or N == 0:
        return c  # empty outputs (a batch of 0 rows): nothing to compute, nothing launched
    cfg = config or tile(M, N, K, a.dtype, a.device, mode)
    a2 = a if a2 is None else a2
    b2 = b if b2 is None else b2
    c2, g, u = (c if t is None else t for t in (c2, g, u))
    precision = "ieee" if a.dtype == torch.float32 else "tf32"  # "tf32" is a no-op for 16-bit
    swiglu_gemm_kernel[(cdiv(M, cfg["BLOCK_M"]) * cdiv(N, cfg["BLOCK_N"]),)](
        a, b, a2, b2, c, c2, g, u, M, N, K,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1),
        a2.stride(0), a2.stride(1), b2.stride(0), b2.stride(1), c.stride(0), c.stride(1),
        MODE=mode, SAVE=save, UPCAST=INTERPRETED, DOT_PRECISION=precision,
        EVEN_K=K % cfg["BLOCK_K"] == 0, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"],
        BLOCK_K=cfg["BLOCK_K"], GROUP_M=cfg["GROUP_M"], SPLIT_N=cfg.get("SPLIT_N", 1),
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return c


# ---------------------------------------------------------------------------------------
# Launchers (no autograd): what the Function below is made of, each testable alone
# ---------------------------------------------------------------------------------------

def gate_up(x2, w_gate, w_up, save=False, config=None):
    """A = silu(x2 W_gate^T) * (x2 W_up^T), one launch; with save, also (G, U). x2 (M, K)."""
    M, hidden = x2.shape[0], w_gate.shape[0]
    act = x2.new_empty((M, hidden))
    g = x2.new_empty((M, hidden)) if save else None
    u = x2.new_empty((M, hidden)) if save else None
    _launch(GATE_UP, x2, w_gate.t(), act, b2=w_up.t(), g=g, u=u, save=save, config=config)
    return act, g, u


def swiglu_backward(dy, w_down, g, u, config=None):
    """(dG, dU) from dY (M, N): dA = dY W_down, then the SiLU-mul derivative in its epilogue."""
    dg, du = torch.empty_like(g), torch.empty_like(u)
    _launch(SWIGLU_GRAD, dy, w_down, dg, c2=du, g=g, u=u, config=config)
    return dg, du


def sum_of_products(a, b, a2, b2, config=None):
    """a @ b + a2 @ b2 in one kernel (dX = dG W_gate + dU W_up): one accumulator, no
    intermediate (M, N) tensor written and read back."""
    c = a.new_empty((a.shape[0], b.shape[1]))
    return _launch(SUM_OF_TWO, a, b, c, a2=a2, b2=b2, config=config)


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1])  # a view whenever the strides allow it


def _forward(x, w_gate, w_up, w_down, save: bool, config=None):
    x2 = _rows(x)
    act, g, u = gate_up(x2, w_gate, w_up, save=save, config=config)
    out = gemm(act, w_down.t(), check=False, config=config)
    return out.view(*x.shape[:-1], w_down.shape[0]), x2, act, g, u


class _SwiGLUMLP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w_gate, w_up, w_down, config=None):
        out, x2, act, g, u = _forward(x, w_gate, w_up, w_down, save=True, config=config)
        ctx.save_for_backward(x2, w_gate, w_up, w_down, act, g, u)
        ctx.x_shape = x.shape
        ctx.config = config
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x2, w_gate, w_up, w_down, act, g, u = ctx.saved_tensors
        dy = grad_out.reshape(-1, grad_out.shape[-1])  # (M, N), any strides
        needs, cfg = ctx.needs_input_grad, ctx.config
        dx = dwg = dwu = dwd = None
        if needs[3]:
            dwd = gemm(dy.t(), act, check=False, config=cfg)  # dW_down = dY^T A
        if needs[0] or needs[1] or needs[2]:
            dg, du = swiglu_backward(dy, w_down, g, u, config=cfg)
            if needs[0]:
                dx = sum_of_products(dg, w_gate, du, w_up, config=cfg).reshape(ctx.x_shape)
            if needs[1]:
                dwg = gemm(dg.t(), x2, check=False, config=cfg)  # dW_gate = dG^T X
            if needs[2]:
                dwu = gemm(du.t(), x2, check=False, config=cfg)  # dW_up = dU^T X
        return dx, dwg, dwu, dwd, None


def check(x) -> None:
    """What only these kernels refuse (levels.triton runs it once per argument signature)."""
    if x.dtype == torch.float64:
        raise TypeError("swiglu_mlp: argument 'x' must be float16, bfloat16 or float32 for the "
                        "Triton kernels (tl.dot has no float64 tensor-core path); got torch.float64")


def swiglu_mlp(x, w_gate, w_up, w_down, config=None):
    """Called by levels.triton.swiglu_mlp after the shared validation and `check`. config:
    None (every launch's tile from its size) or one tile for all of them, as gemm's."""
    if needs_grad(x, w_gate, w_up, w_down):
        return apply_ahead(_SwiGLUMLP, x, w_gate, w_up, w_down, config)
    return forward_ahead(_inference, x, w_gate, w_up, w_down, config)


def _inference(x, w_gate, w_up, w_down, config):
    """The forward of a call that computes no gradient (launch.forward_ahead replays it)."""
    return _forward(x, w_gate, w_up, w_down, save=False, config=config)[0]
