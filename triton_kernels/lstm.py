"""LSTM in Triton: one GEMM for all input projections, then one kernel for the whole recurrence.

What it adds over Levels 1-3: the recurrence stops being ~10 kernel launches per time step.
    1. x_t W_ih^T + b_ih does not depend on h, so all T steps are one GEMM (gemm.py) up front.
    2. The recurrence is a *persistent* kernel: launched once, it loops over time. Each
       program owns BLOCK_H hidden units (their 4 gate columns of W_hh, their slice of c,
       which never leaves registers) for a block of batch rows. A step is
           z = h_{t-1} W_hh[cols]^T + xproj_t + b_hh      (one dot for the 4 gates, fp32 acc.)
           i, f, g, o = sigma(z_i), sigma(z_f), tanh(z_g), sigma(z_o)
           c = f c + i g ;  h = o tanh(c)                 -> store h_t
       and since h_t needs *all* of h_{t-1}, the programs of one batch block meet at a
       grid-wide barrier after each step (each posts its step number with a release store
       and spins on the others' flags with acquire loads). W_hh stays hot in L1/L2.
    3. Backward through time is the same machine run backwards: per step the programs
       compute dZ_t for their columns (needs dh = dout_t + dZ_{t+1} W_hh), meet at the
       barrier, and continue; dW_ih, dW_hh, dx are three GEMMs over all steps afterwards,
       the bias gradient a column sum.

A spin barrier is only safe when every program is resident at once, so the persistent
path is used only when the grid fits the GPU's multiprocessors; otherwise the same kernel
is launched once per time step (the "fused step kernel": one kernel per step instead of
ten, c passed between launches through memory). Fitting is judged on an idle GPU: other
work on the same GPU (another stream, another process, an MPS share) can keep some of our
programs from starting while the others spin on them, and two persistent launches that
each fit can deadlock each other. So the barrier never waits forever: after SPIN_LIMIT
polls (about a second) a program gives up, raises an error flag that stops every other
program's wait at once, and from then on every program stores NaN instead of h and c, so
the result is never silently wrong; the next call of `lstm` but one (or, at once,
`check_barrier(wait=True)`) raises a RuntimeError that says what happened and how to avoid it
(LSTM_TRITON_MODE=step; _sticky says how the report travels without a synchronization);
replayed from a CUDA graph, by the next eager call; under torch.compile the NaN stays
unreported (the traced call's word is its own). Under
the CPU interpreter, which runs programs one after another, a single program per batch block
owns every hidden unit and needs no barrier.

Measured on an H100, B=8, input 256, hidden 512, T=64, forward (reports/h100-bench.json;
step mode in reports/h100-triton-attention-lstm.json): bf16 0.49 ms persistent (7.6 us/step),
3.5x cuDNN's nn.LSTM (1.69 ms), vs 1.9 ms in step mode (30 us/step, mostly launch
overhead). fp32 with exact dots (input_precision="ieee") takes 2.50 ms, 0.44x nn.LSTM:
Triton lowers fp32 "ieee" dots to CUDA-core FMAs through shared-memory layout shuffles,
39 us/step. So fp32 uses the 3xTF32 trick (FP32_DOT below): the tensor cores do the work,
the split keeps fp32-level accuracy, and the harness checks it at the fp32 bound, not
TF32's: 1.56 ms, 24 us/step, 0.71x nn.LSTM (goal 1.0x missed). Three MMAs per product
plus the hi/lo splits put 255 registers and 60 spills in the step loop (`levels explain`),
and W_hh is re-read from L2 each step in fp32, twice bf16's bytes. With the tiles of the
sweep below (`levels bench --component lstm`, reports/lstm-recurrence/5-bench-lstm/): bf16
0.31 ms (4.9x nn.LSTM), fp32 0.66 ms (1.13x: the goal met).

At a training size the step is a question of bytes, not launches. With B=64, hidden 1024
(`levels train --model lstm --preset gpu`), every program pulls its slice of W_hh and its rows
of h_{t-1} from L2 at every step, and 128 programs do so at once: the tiles decide those
bytes (_plan says how they are chosen). `scripts/sweep_lstm.py` on an H100
(reports/lstm-recurrence/): 16 batch rows a program instead of 32, the four gates as one dot
of N = 4 BLOCK_H instead of four N = 16 dots, a 128-wide K step instead of 64, took the forward
from 1.26 to 0.85 ms (kernel 0.74 ms, 11.5 us/step) and forward+backward from 2.45 to
1.92 ms; cuDNN's nn.LSTM took 2.0 and 3.3 ms there, its kernels alone about 1.5 ms (the rest
is launching ~5 kernels per step from the host). The whole LSTM LM's step: 628k -> 715k
tokens/s, 1.71x nn.LSTM's model (goal 2x).

What it costs: the barrier (a round trip through L2 per step), a kernel whose correctness
depends on co-residency, and saved activations (gates and c for every step, fp32) for the
backward pass.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .gemm import KERNELS as _GEMM_KERNELS
from .gemm import column_sum, gemm, sm_count
from .launch import apply_ahead, cdiv, fast_launch, forward_ahead, needs_grad, next_power_of_2

INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"


def uses_tf32(device, dtype) -> bool:
    # fp32 dots are "ieee" (gemm.py) or 3xTF32 (the recurrence, ~fp32 accurate): both are
    # checked at the fp32 bound, so nothing is declared as TF32 to the harness.
    return False


@triton.jit
def _sigmoid(z):
    return 1.0 / (1.0 + tl.exp(-z))


@triton.jit
def _tanh(z):
    # Through exp(-2|z|) <= 1: no overflow, and no cancellation near 0 beyond fp32 rounding.
    e = tl.exp(-2.0 * tl.abs(z))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(z < 0, -t, t)


# Polls of the barrier before a program gives up on the others (a poll is an acquire read
# through L2, ~0.5-1 us): about a second, thousands of times a normal step's wait.
SPIN_LIMIT = 2 ** 20


@triton.jit
def _grid_barrier(flags, err, sticky, pid_h, n_h, step, N_H_POW2: tl.constexpr,
                  SPIN_LIMIT: tl.constexpr):
    """Wait until all n_h programs of this batch block have posted `step`; 1 if they did,
    0 if this program gave up (SPIN_LIMIT polls, or another program raised `err`).

    Each program owns one flag: posting is an idempotent release exchange (so it does not
    matter how many threads execute it), waiting an acquire read of all flags."""
    tl.debug_barrier()  # every thread of this program has issued its stores of h_t
    tl.atomic_xchg(flags + pid_h, step, sem="release", scope="gpu")
    offs = tl.arange(0, N_H_POW2)
    mask = offs < n_h
    # The loop carries scalars only (the slowest program's step, the poll count, the error
    # flag): a tensor carried through scf.while crashes Triton 3.6's layout pass.
    slowest = tl.min(tl.where(mask, tl.atomic_add(flags + offs, 0, mask=mask, sem="acquire",
                                                  scope="gpu"), step))
    polls = tl.full([], 0, tl.int32)
    failed = tl.atomic_add(err, 0, sem="relaxed", scope="gpu")
    while (slowest < step) & (polls < SPIN_LIMIT) & (failed == 0):
        slowest = tl.min(tl.where(mask, tl.atomic_add(flags + offs, 0, mask=mask, sem="acquire",
                                                      scope="gpu"), step))
        polls += 1
        failed = tl.atomic_add(err, 0, sem="relaxed", scope="gpu")
    arrived = slowest >= step
    # Gave up: tell every other program, so none of them waits out its own limit, and leave
    # the device's sticky word set for the host to report (check_barrier).
    tl.atomic_xchg(err, 1, mask=arrived == 0, sem="relaxed", scope="gpu")
    tl.atomic_xchg(sticky, 1, mask=arrived == 0, sem="relaxed", scope="gpu")
    tl.debug_barrier()
    return arrived.to(tl.int32)


@triton.jit
def _gates_four_dots(h_base, h_stride, W, offs_b, b_ok, offs_j, j_ok, HID, stride_wr, stride_wc,
                     offs_k0, w_cols, BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr,
                     BLOCK_K: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    """h_{t-1} W_hh^T for this program's units, one (BLOCK_B, BLOCK_H) dot per gate: the
    first form, kept to compare (scripts/sweep_lstm.py times both); the plan runs
    _gates_one_dot."""
    acc_i = tl.zeros([BLOCK_B, BLOCK_H], tl.float32)
    acc_f = tl.zeros([BLOCK_B, BLOCK_H], tl.float32)
    acc_g = tl.zeros([BLOCK_B, BLOCK_H], tl.float32)
    acc_o = tl.zeros([BLOCK_B, BLOCK_H], tl.float32)
    for k0 in range(0, HID, BLOCK_K):
        offs_k = k0 + offs_k0
        k_ok = offs_k < HID
        # .cg: h_{t-1} was written by other programs; read it from L2, not a stale L1.
        h = tl.load(h_base + offs_b[:, None] * h_stride + offs_k[None, :],
                    mask=b_ok[:, None] & k_ok[None, :], other=0.0, cache_modifier=".cg")
        w_ptrs = W + offs_k[:, None] * stride_wc + w_cols
        w_mask = k_ok[:, None] & j_ok[None, :]
        w_i = tl.load(w_ptrs + (0 * HID) * stride_wr, mask=w_mask, other=0.0)
        w_f = tl.load(w_ptrs + (1 * HID) * stride_wr, mask=w_mask, other=0.0)
        w_g = tl.load(w_ptrs + (2 * HID) * stride_wr, mask=w_mask, other=0.0)
        w_o = tl.load(w_ptrs + (3 * HID) * stride_wr, mask=w_mask, other=0.0)
        if UPCAST:
            h = h.to(tl.float32)
            w_i = w_i.to(tl.float32)
            w_f = w_f.to(tl.float32)
            w_g = w_g.to(tl.float32)
            w_o = w_o.to(tl.float32)
        acc_i = tl.dot(h, w_i, acc_i, input_precision=PRECISION)
        acc_f = tl.dot(h, w_f, acc_f, input_precision=PRECISION)
        acc_g = tl.dot(h, w_g, acc_g, input_precision=PRECISION)
        acc_o = tl.dot(h, w_o, acc_o, input_precision=PRECISION)
    return acc_i, acc_f, acc_g, acc_o


@triton.jit
def _gates_one_dot(h_base, h_stride, W, offs_b, b_ok, offs_j, j_ok, pid_h, HID, stride_wr,
                   stride_wc, offs_k0, BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr,
                   BLOCK_K: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    """The same product as ONE (BLOCK_B, 4 BLOCK_H) dot: the four gates' columns side by side
    (column q * BLOCK_H + u is gate q of unit u), so the tensor cores see N = 4 BLOCK_H instead
    of four products of N = BLOCK_H sharing an operand; the accumulator is then taken apart
    into the four gates in registers (a reshape and two splits)."""
    offs_c = tl.arange(0, 4 * BLOCK_H)
    unit = pid_h * BLOCK_H + offs_c % BLOCK_H
    c_ok = unit < HID
    w_cols = ((offs_c // BLOCK_H) * HID + unit) * stride_wr
    acc = tl.zeros([BLOCK_B, 4 * BLOCK_H], tl.float32)
    for k0 in range(0, HID, BLOCK_K):
        offs_k = k0 + offs_k0
        k_ok = offs_k < HID
        h = tl.load(h_base + offs_b[:, None] * h_stride + offs_k[None, :],
                    mask=b_ok[:, None] & k_ok[None, :], other=0.0, cache_modifier=".cg")
        w = tl.load(W + offs_k[:, None] * stride_wc + w_cols[None, :],
                    mask=k_ok[:, None] & c_ok[None, :], other=0.0)
        if UPCAST:
            h = h.to(tl.float32)
            w = w.to(tl.float32)
        acc = tl.dot(h, w, acc, input_precision=PRECISION)
    # (B, 4, U) -> (B, U, 4) -> (B, U, 2, 2), q = 2 q1 + q0: the first split takes q0 apart
    # (gates 0 and 2 | 1 and 3), the second q1.
    acc = tl.reshape(tl.permute(tl.reshape(acc, [BLOCK_B, 4, BLOCK_H]), [0, 2, 1]),
                     [BLOCK_B, BLOCK_H, 2, 2])
    even, odd = tl.split(acc)
    acc_i, acc_g = tl.split(even)
    acc_f, acc_o = tl.split(odd)
    return acc_i, acc_f, acc_g, acc_o


# The two h_{t-1} sources are picked at run time; an argument equal to 1 would otherwise be
# specialized into a compile-time constant and the two branches would disagree in type.
@fast_launch
@triton.jit(do_not_specialize=["stride_h0b", "stride_ob"])
def _lstm_fwd(XP, H0, CIN, W, BHH, OUT, CT, GATES, CS, FLAGS, ERR, STICKY,
              B, T, HID, t_begin, t_end,
              stride_xpb, stride_xpt, stride_h0b, stride_cinb, stride_wr, stride_wc,
              stride_ob, stride_ot,
              BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr,
              SYNC: tl.constexpr, N_H_POW2: tl.constexpr, SAVE: tl.constexpr,
              UPCAST: tl.constexpr, PRECISION: tl.constexpr, SPIN_LIMIT: tl.constexpr,
              FUSED_GATES: tl.constexpr = False):
    """Steps t_begin..t_end-1 for batch rows of pid 0 and hidden units of pid 1.

    XP: (B, T, 4H) fp32, x W_ih^T + b_ih. c enters from CIN and leaves through CT.
    GATES (B, T, 4H) and CS (B, T, H), fp32, contiguous: saved for backward when SAVE.
    H0 and CIN have a unit stride along H (the launcher makes them so), BHH is contiguous."""
    pid_b = tl.program_id(0)
    pid_h = tl.program_id(1)
    n_h = tl.num_programs(1)
    # 64-bit batch offsets: B * T * 4H can pass 2**31 (B=128, T=1000, H=4096).
    offs_b = (pid_b * BLOCK_B + tl.arange(0, BLOCK_B)).to(tl.int64)
    offs_j = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    b_ok = offs_b < B
    j_ok = offs_j < HID
    bj_ok = b_ok[:, None] & j_ok[None, :]
    offs_k0 = tl.arange(0, BLOCK_K)
    flags = FLAGS + pid_b * N_H_POW2

    c = tl.load(CIN + offs_b[:, None] * stride_cinb + offs_j[None, :], mask=bj_ok, other=0.0)
    c = c.to(tl.float32)
    bias_i = tl.load(BHH + 0 * HID + offs_j, mask=j_ok, other=0.0).to(tl.float32)[None, :]
    bias_f = tl.load(BHH + 1 * HID + offs_j, mask=j_ok, other=0.0).to(tl.float32)[None, :]
    bias_g = tl.load(BHH + 2 * HID + offs_j, mask=j_ok, other=0.0).to(tl.float32)[None, :]
    bias_o = tl.load(BHH + 3 * HID + offs_j, mask=j_ok, other=0.0).to(tl.float32)[None, :]
    # W_hh^T tiles (BLOCK_K, BLOCK_H) of the four gates: row k, column gate*H + j.
    w_cols = offs_j[None, :] * stride_wr
    # 0 once a barrier gave up: h_{t-1} may be incomplete, so store NaN from then on. A
    # tensor from the start: a loop-carried value must keep one type.
    alive = tl.full([], 1, tl.int32)
    for t in range(t_begin, t_end):
        if t == 0:
            h_base = H0
            h_stride = stride_h0b
        else:
            h_base = OUT + (t - 1) * stride_ot
            h_stride = stride_ob
        if FUSED_GATES:
            acc_i, acc_f, acc_g, acc_o = _gates_one_dot(
                h_base, h_stride, W, offs_b, b_ok, offs_j, j_ok, pid_h, HID, stride_wr, stride_wc,
                offs_k0, BLOCK_B, BLOCK_H, BLOCK_K, UPCAST, PRECISION)
        else:
            acc_i, acc_f, acc_g, acc_o = _gates_four_dots(
                h_base, h_stride, W, offs_b, b_ok, offs_j, j_ok, HID, stride_wr, stride_wc,
                offs_k0, w_cols, BLOCK_B, BLOCK_H, BLOCK_K, UPCAST, PRECISION)
        xp = XP + offs_b[:, None] * stride_xpb + t * stride_xpt + offs_j[None, :]
        ### BEGIN SOLUTION
        gate_i = _sigmoid(acc_i + tl.load(xp + 0 * HID, mask=bj_ok, other=0.0) + bias_i)
        gate_f = _sigmoid(acc_f + tl.load(xp + 1 * HID, mask=bj_ok, other=0.0) + bias_f)
        gate_g = _tanh(acc_g + tl.load(xp + 2 * HID, mask=bj_ok, other=0.0) + bias_g)
        gate_o = _sigmoid(acc_o + tl.load(xp + 3 * HID, mask=bj_ok, other=0.0) + bias_o)
        c = gate_f * c + gate_i * gate_g
        if SYNC:
            c = tl.where(alive != 0, c, float("nan"))
        h_new = gate_o * _tanh(c)
        ### END SOLUTION
        tl.store(OUT + offs_b[:, None] * stride_ob + t * stride_ot + offs_j[None, :],
                 h_new.to(OUT.dtype.element_ty), mask=bj_ok)
        if SAVE:
            # Same layout as XP (B, T, 4H) and (B, T, H), contiguous.
            g_ptrs = GATES + offs_b[:, None] * stride_xpb + t * stride_xpt + offs_j[None, :]
            tl.store(g_ptrs + 0 * HID, gate_i, mask=bj_ok)
            tl.store(g_ptrs + 1 * HID, gate_f, mask=bj_ok)
            tl.store(g_ptrs + 2 * HID, gate_g, mask=bj_ok)
            tl.store(g_ptrs + 3 * HID, gate_o, mask=bj_ok)
            tl.store(CS + offs_b[:, None] * (T * HID) + t * HID + offs_j[None, :], c, mask=bj_ok)
        if SYNC:
            if alive != 0:
                alive = _grid_barrier(flags, ERR, STICKY, pid_h, n_h, t - t_begin + 1, N_H_POW2,
                                      SPIN_LIMIT)
        else:  # h_t goes back in through memory: this program's threads must see all of it
            tl.debug_barrier()
    tl.store(CT + offs_b[:, None] * HID + offs_j[None, :], c.to(CT.dtype.element_ty), mask=bj_ok)


@fast_launch
@triton.jit
def _lstm_bwd(DOUT, DHT, DCIN, W, GATES, CS, C0, DZ, DH0, DC0, FLAGS, ERR, STICKY,
              B, HID, t_hi, t_lo, T,
              stride_dob, stride_dot, stride_wr, stride_wc,
              BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr,
              SYNC: tl.constexpr, N_H_POW2: tl.constexpr, FINAL: tl.constexpr,
              UPCAST: tl.constexpr, PRECISION: tl.constexpr, SPIN_LIMIT: tl.constexpr):
    """Steps t = t_hi-1 down to t_lo of backward through time; FINAL adds dh0 = dZ_0 W_hh.

    dc is carried in registers; it enters through DCIN (dc_T, or DC0 between step
    launches) and leaves through DC0. DZ (B, T, 4H) in the input dtype feeds the GEMMs.
    DHT, DCIN, C0, DH0, DC0 are (B, H) contiguous; GATES, CS, DZ contiguous."""
    pid_b = tl.program_id(0)
    pid_h = tl.program_id(1)
    n_h = tl.num_programs(1)
    offs_b = (pid_b * BLOCK_B + tl.arange(0, BLOCK_B)).to(tl.int64)  # as in the forward
    offs_j = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    b_ok = offs_b < B
    j_ok = offs_j < HID
    bj_ok = b_ok[:, None] & j_ok[None, :]
    bj = offs_b[:, None] * HID + offs_j[None, :]  # index into a (B, H) tensor
    offs_k0 = tl.arange(0, BLOCK_K)
    flags = FLAGS + pid_b * N_H_POW2
    G4 = 4 * HID

    dc = tl.load(DCIN + bj, mask=bj_ok, other=0.0).to(tl.float32)
    alive = tl.full([], 1, tl.int32)  # as in the forward: NaN once a barrier gave up
    for s in range(0, t_hi - t_lo):
        t = t_hi - 1 - s
        if t == T - 1:
            dh = tl.load(DHT + bj, mask=bj_ok, other=0.0).to(tl.float32)
        else:
            dh = _recurrent_grad(DZ + (t + 1) * G4, W, offs_b, offs_j, b_ok, j_ok, HID, T,
                                 stride_wr, stride_wc, offs_k0, BLOCK_B, BLOCK_H, BLOCK_K,
                                 UPCAST, PRECISION)
        dh += tl.load(DOUT + offs_b[:, None] * stride_dob + t * stride_dot + offs_j[None, :],
                      mask=bj_ok, other=0.0).to(tl.float32)
        if SYNC:  # dZ_{t+1} of the other programs may be incomplete: poison all that follows
            dh = tl.where(alive != 0, dh, float("nan"))
        g_ptrs = GATES + offs_b[:, None] * (T * G4) + t * G4 + offs_j[None, :]
        gate_i = tl.load(g_ptrs + 0 * HID, mask=bj_ok, other=0.0)
        gate_f = tl.load(g_ptrs + 1 * HID, mask=bj_ok, other=0.0)
        gate_g = tl.load(g_ptrs + 2 * HID, mask=bj_ok, other=0.0)
        gate_o = tl.load(g_ptrs + 3 * HID, mask=bj_ok, other=0.0)
        c_ptrs = CS + offs_b[:, None] * (T * HID) + offs_j[None, :]
        tanh_c = _tanh(tl.load(c_ptrs + t * HID, mask=bj_ok, other=0.0))
        if t == 0:
            c_prev = tl.load(C0 + bj, mask=bj_ok, other=0.0).to(tl.float32)
        else:
            c_prev = tl.load(c_ptrs + (t - 1) * HID, mask=bj_ok, other=0.0)
        ### BEGIN SOLUTION
        dc += dh * gate_o * (1.0 - tanh_c * tanh_c)
        dz_i = dc * gate_g * gate_i * (1.0 - gate_i)
        dz_f = dc * c_prev * gate_f * (1.0 - gate_f)
        dz_g = dc * gate_i * (1.0 - gate_g * gate_g)
        dz_o = dh * tanh_c * gate_o * (1.0 - gate_o)
        dc = dc * gate_f
        ### END SOLUTION
        z_ptrs = DZ + offs_b[:, None] * (T * G4) + t * G4 + offs_j[None, :]
        tl.store(z_ptrs + 0 * HID, dz_i.to(DZ.dtype.element_ty), mask=bj_ok)
        tl.store(z_ptrs + 1 * HID, dz_f.to(DZ.dtype.element_ty), mask=bj_ok)
        tl.store(z_ptrs + 2 * HID, dz_g.to(DZ.dtype.element_ty), mask=bj_ok)
        tl.store(z_ptrs + 3 * HID, dz_o.to(DZ.dtype.element_ty), mask=bj_ok)
        if SYNC:
            if alive != 0:
                alive = _grid_barrier(flags, ERR, STICKY, pid_h, n_h, s + 1, N_H_POW2, SPIN_LIMIT)
        else:
            tl.debug_barrier()
    tl.store(DC0 + bj, dc.to(DC0.dtype.element_ty), mask=bj_ok)
    if FINAL:
        dh0 = _recurrent_grad(DZ, W, offs_b, offs_j, b_ok, j_ok, HID, T, stride_wr, stride_wc,
                              offs_k0, BLOCK_B, BLOCK_H, BLOCK_K, UPCAST, PRECISION)
        tl.store(DH0 + bj, dh0.to(DH0.dtype.element_ty), mask=bj_ok)


@triton.jit
def _recurrent_grad(dz_t, W, offs_b, offs_j, b_ok, j_ok, HID, T, stride_wr, stride_wc, offs_k0,
                    BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr,
                    UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    """dh_{t-1}[:, cols] = dZ_t (B, 4H) @ W_hh[:, cols] (4H, BLOCK_H): K runs over all 4H."""
    acc = tl.zeros([BLOCK_B, BLOCK_H], tl.float32)
    for k0 in range(0, 4 * HID, BLOCK_K):
        offs_k = k0 + offs_k0
        k_ok = offs_k < 4 * HID
        dz = tl.load(dz_t + offs_b[:, None] * (T * 4 * HID) + offs_k[None, :],
                     mask=b_ok[:, None] & k_ok[None, :], other=0.0, cache_modifier=".cg")
        w = tl.load(W + offs_k[:, None] * stride_wr + offs_j[None, :] * stride_wc,
                    mask=k_ok[:, None] & j_ok[None, :], other=0.0)
        if UPCAST:
            dz = dz.to(tl.float32)
            w = w.to(tl.float32)
        acc = tl.dot(dz.to(w.dtype), w, acc, input_precision=PRECISION)
    return acc


KERNELS = [_lstm_fwd, _lstm_bwd, _recurrent_grad, _gates_four_dots, _gates_one_dot, _grid_barrier,
           _sigmoid, _tanh] + list(_GEMM_KERNELS)


# ---------------------------------------------------------------------------------------
# Launch plan
# ---------------------------------------------------------------------------------------

_sm_count = sm_count  # the plan below and its tests name it so


# The recurrence's launch strategy: "persistent" (one launch, grid barrier), "step" (one
# launch per time step), or "auto" (persistent when every program can be resident). A
# user's choice, read once from the environment (LSTM_TRITON_MODE); a call may pass its
# own (lstm's `mode`: how the device script times the alternatives side by side). Anything
# else is refused: a mode the launcher does not know would run the multi-program grid
# without its barrier.
MODES = ("auto", "persistent", "step")
MODE = os.environ.get("LSTM_TRITON_MODE", "auto")


def _plan(B: int, H: int, device: torch.device, mode=None, num_warps=None, kernel="fwd",
          itemsize=2, sms=None) -> dict:
    """Tiles and mode of the forward (kernel="fwd") or backward ("bwd") recurrence, for
    operands of `itemsize` bytes. mode, num_warps: the call's own (None: MODE, the rule);
    sms: the multiprocessors to plan for (None: the device's).

    The rule, from `scripts/sweep_lstm.py` on an H100 (reports/lstm-recurrence/, five shapes
    from B8 H256 to B128 H1024, bf16):
    - BLOCK_B = 16 batch rows (tl.dot's least M), more only when the grid would not fit:
      every batch block is an independent group of programs with its own barrier, and a
      program that owns fewer rows loads a smaller tile of h_{t-1} per step. 16 rows beat 32
      at every shape swept (1.2-1.6x at B64).
    - BLOCK_H: the forward's four gates run as ONE dot (`fused_gates`) of N = 4 BLOCK_H, so
      8 units already make a 32-wide tensor-core tile; the narrowest block whose grid fits
      the GPU spreads W_hh over the most SMs (each pulls the least of it from L2 per step).
      The backward's dot is already one (K = 4H), 32 units at least (narrower was slower).
    - BLOCK_K = 128 forward, 256 backward (128 past 32 units): a step's K loop is a chain of
      L2 round trips, fewer and larger loads shorten it (64 was 1.3-1.6x slower); halved for
      fp32 operands, whose tiles are twice the bytes in shared memory.
    - num_stages 2 forward, 3 backward; 8 warps from 2048 accumulators a program (16 x 128
      at B64 H1024: 0.78 ms against 0.84 with 4)."""
    source = "argument 'mode'"
    if mode is None:
        mode, source = MODE, "LSTM_TRITON_MODE"
    if mode not in MODES:
        raise ValueError(f"lstm: {source} must be one of {', '.join(MODES)}; got {mode!r}")
    fwd = kernel == "fwd"
    if INTERPRETED:
        # Programs run one after another here: one program must own every hidden unit.
        bh = next_power_of_2(H)
        return dict(BLOCK_B=16, BLOCK_H=bh, BLOCK_K=min(bh, 32), mode="single", num_warps=4,
                    num_stages=1, fused_gates=fwd)
    sms = _sm_count(device) if sms is None else sms
    widths = (8, 16, 32, 64) if fwd else (32, 64)
    blocks = [(bb, bh) for bb in (16, 32, 64) for bh in widths]
    fitting = [(bb, bh) for bb, bh in blocks if cdiv(B, bb) * cdiv(H, bh) <= sms]
    fits = bool(fitting)
    # Beyond what fits at once (step mode, a launch per step): 32 x 32 blocks.
    block_b, block_h = fitting[0] if fits else (min(max(16, next_power_of_2(B)), 32), 32)
    if mode == "auto":
        mode = "persistent" if fits else "step"
    if mode == "persistent" and not fits:
        mode = "step"  # never spin on programs that may not be resident
    k_span = H if fwd else 4 * H
    block_k = (128 if fwd or block_h > 32 else 256) * 2 // max(itemsize, 2)
    block_k = min(block_k, max(16, next_power_of_2(k_span)))
    columns = 4 * block_h if fwd else block_h
    warps = 8 if block_b * columns >= 2048 else 4
    return dict(BLOCK_B=block_b, BLOCK_H=block_h, BLOCK_K=block_k, mode=mode,
                num_warps=warps if num_warps is None else num_warps,
                num_stages=2 if fwd else 3, fused_gates=fwd)


# How fp32 recurrence dots run on a GPU: "tf32x3" (default: three TF32 tensor-core dots on
# a hi/lo split of each operand, hi*hi + hi*lo + lo*hi, about 22 of fp32's 24 mantissa bits,
# checked at the fp32 bound) or "ieee" (exact fp32 FMAs on the CUDA cores). The interpreter
# always computes exact fp32. LSTM_TRITON_FP32_DOT=ieee (read once) picks the other for the
# process, lstm's `fp32_dot` for one call (what `levels bench` times the exact variant with).
FP32_DOTS = ("tf32x3", "ieee")
FP32_DOT = os.environ.get("LSTM_TRITON_FP32_DOT", "tf32x3")


def _precision(dtype, fp32_dot=None) -> str:
    source = "argument 'fp32_dot'"
    if fp32_dot is None:
        fp32_dot, source = FP32_DOT, "LSTM_TRITON_FP32_DOT"
    if fp32_dot not in FP32_DOTS:
        raise ValueError(f"lstm: {source} must be 'tf32x3' or 'ieee'; got {fp32_dot!r}")
    if INTERPRETED:
        return "ieee"
    if dtype != torch.float32:
        return "tf32"  # ignored for 16-bit operands
    return fp32_dot


BARRIER_GAVE_UP = (
    "lstm (Level 4, Triton): the persistent recurrence gave up waiting at its grid barrier: "
    "not all of its programs could run at the same time (other work on this GPU: another "
    "stream or process, an MPS share, or a second persistent LSTM running concurrently). That "
    "call returned NaN, not a wrong number. Run the LSTM with the GPU to itself, or set "
    "LSTM_TRITON_MODE=step (one launch per time step, no barrier).")


def _barrier_words(n_b: int, n_h_pow2: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Zeroed flags (one per program, a row per batch block) and the call's error word."""
    words = torch.zeros(n_b * n_h_pow2 + 1, device=device, dtype=torch.int32)
    return words[:-1].view(n_b, n_h_pow2), words[-1:]


# How a barrier that gave up is reported without the host waiting for the GPU. The call's
# error word (above) stops the other programs' waits; a program that gives up also sets its
# device's STICKY word, allocated once and passed to every call as one of its inputs, so
# that the C++ replay (replay.py: it patches the pointers of a call's own tensors and runs
# no Python between launches) replays these calls like any other. The Python prologue of
# every call (`lstm`, outside the replayed Function) reads a pinned host copy of the word,
# raises if it is set, and queues a fresh copy behind the work already on the stream: a
# give-up is reported by the next call but one at the latest, by check_barrier(wait=True) at
# once. (Before: an event and a copy queued per call, host work inside the Function that
# kept every LSTM call on the Python path, ~200 us of host time each.)
_STICKY: dict = {}  # device -> (its sticky word, a pinned host copy of it)


def _sticky(device: torch.device) -> torch.Tensor:
    """The device's sticky word, for this call's kernels; first raises RuntimeError
    (BARRIER_GAVE_UP) if the last copy of it shows a give-up, then queues the next copy.
    While a CUDA graph is captured nothing is read or queued: the graph's kernels get the
    device's word, so a replay's give-up is reported by a later eager call. While
    torch.compile traces, the call gets a word of its own (no global state in a trace): a
    give-up there leaves NaN in its outputs, unreported."""
    if torch.compiler.is_compiling():
        return torch.zeros(1, device=device, dtype=torch.int32)  # no global state in a trace
    entry = _STICKY.get(device)
    if entry is None:
        host = torch.zeros(1, dtype=torch.int32, pin_memory=device.type == "cuda")
        entry = _STICKY[device] = (torch.zeros(1, device=device, dtype=torch.int32), host)
    word, host = entry
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return word
    if device.type != "cuda":
        host.copy_(word)  # the interpreter ran the launches already
    if host.item():  # a CPU read of pinned memory: no synchronization
        word.zero_()
        host.zero_()
        raise RuntimeError(BARRIER_GAVE_UP)
    if device.type == "cuda":
        host.copy_(word, non_blocking=True)
    return word


def check_barrier(wait: bool = False) -> None:
    """Raise RuntimeError(BARRIER_GAVE_UP) if a persistent launch whose report has arrived
    gave up at its barrier; wait=True first waits for every launch queued so far and fetches
    the reports. Not while torch.compile traces or a CUDA graph is captured (see _sticky)."""
    if torch.compiler.is_compiling():
        return
    for device, (word, host) in list(_STICKY.items()):
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            continue
        if wait or device.type != "cuda":
            host.copy_(word)  # waits for the device's queued work (a blocking copy)
        if host.item():
            word.zero_()
            host.zero_()
            raise RuntimeError(BARRIER_GAVE_UP)


def _forward(x, h0, c0, w_ih, w_hh, b_ih, b_hh, save: bool, sticky, mode=None, fp32_dot=None,
             num_warps=None):
    B, T, I = x.shape
    H = w_hh.shape[1]
    x2 = x.reshape(B * T, I)
    # 1. All input projections at once, kept in fp32 (the recurrence adds to it).
    xp = gemm(x2, w_ih.t(), bias=b_ih, out_dtype=torch.float32, check=False)  # (B*T, 4H)
    out = torch.empty((B, T, H), device=x.device, dtype=x.dtype)
    c_t = torch.empty((B, H), device=x.device, dtype=x.dtype)
    if save:
        gates = torch.empty((B, T, 4 * H), device=x.device, dtype=torch.float32)
        cs = torch.empty((B, T, H), device=x.device, dtype=torch.float32)
    else:
        gates, cs = xp, xp  # never touched (SAVE=False); any pointer will do
    h0_, c0_ = h0[0], c0[0]
    if B == 0:
        return out, c_t, gates, cs  # no sequences: the recurrence has no row to run
    p = _plan(B, H, x.device, mode, num_warps, "fwd", x.element_size())
    n_b, n_h = cdiv(B, p["BLOCK_B"]), cdiv(H, p["BLOCK_H"])
    n_h_pow2 = next_power_of_2(n_h)
    flags, err = _barrier_words(n_b, n_h_pow2, x.device)
    w = w_hh
    common = dict(BLOCK_B=p["BLOCK_B"], BLOCK_H=p["BLOCK_H"], BLOCK_K=p["BLOCK_K"], N_H_POW2=n_h_pow2,
                  SAVE=save, UPCAST=INTERPRETED, PRECISION=_precision(x.dtype, fp32_dot),
                  FUSED_GATES=p["fused_gates"], num_warps=p["num_warps"],
                  num_stages=p["num_stages"], SPIN_LIMIT=SPIN_LIMIT)

    def run(t0, t1, c_in, sync):
        _lstm_fwd[(n_b, n_h)](
            xp, h0_, c_in, w, b_hh, out, c_t, gates, cs, flags, err, sticky, B, T, H, t0, t1,
            T * 4 * H, 4 * H, h0_.stride(0), c_in.stride(0), w.stride(0), w.stride(1),
            out.stride(0), out.stride(1), SYNC=sync, **common)

    # 2. The recurrence.
    if p["mode"] == "step":
        for t in range(T):  # c travels through c_t between launches
            run(t, t + 1, c0_ if t == 0 else c_t, False)
    else:
        run(0, T, c0_, p["mode"] == "persistent")
    return out, c_t, gates, cs


def _backward(x, h0, c0, w_ih, w_hh, out, gates, cs, d_out, d_hT, d_cT, sticky, mode=None,
              fp32_dot=None, num_warps=None):
    B, T, I = x.shape
    H = w_hh.shape[1]
    dz = torch.empty((B, T, 4 * H), device=x.device, dtype=x.dtype)
    dh0 = torch.empty((B, H), device=x.device, dtype=x.dtype)
    dc0 = torch.empty((B, H), device=x.device, dtype=x.dtype)
    if B == 0:
        # No sequences: nothing recurs, dx, dh0 and dc0 are empty, and the weight and bias
        # gradients, sums over no rows, are zeros (gemm and column_sum launch nothing)
        return _gradient_gemms(x, h0, w_ih, out, dz, dh0, dc0)
    p = _plan(B, H, x.device, mode, num_warps, "bwd", x.element_size())
    n_b, n_h = cdiv(B, p["BLOCK_B"]), cdiv(H, p["BLOCK_H"])
    n_h_pow2 = next_power_of_2(n_h)
    flags, err = _barrier_words(n_b, n_h_pow2, x.device)
    d_out = d_out if d_out.stride(-1) == 1 else d_out.contiguous()
    d_hT, d_cT = d_hT[0].contiguous(), d_cT[0].contiguous()
    c0_ = c0[0].contiguous()
    common = dict(BLOCK_B=p["BLOCK_B"], BLOCK_H=p["BLOCK_H"], BLOCK_K=p["BLOCK_K"], N_H_POW2=n_h_pow2,
                  UPCAST=INTERPRETED, PRECISION=_precision(x.dtype, fp32_dot), num_warps=p["num_warps"],
                  num_stages=p["num_stages"], SPIN_LIMIT=SPIN_LIMIT)

    def run(t_hi, t_lo, dc_in, sync, final):
        _lstm_bwd[(n_b, n_h)](d_out, d_hT, dc_in, w_hh, gates, cs, c0_, dz, dh0, dc0, flags,
                              err, sticky, B, H, t_hi, t_lo, T, d_out.stride(0), d_out.stride(1),
                              w_hh.stride(0), w_hh.stride(1), SYNC=sync, FINAL=final, **common)

    if p["mode"] == "step":
        for t in range(T - 1, -1, -1):
            run(t + 1, t, d_cT if t == T - 1 else dc0, False, False)
        run(0, 0, dc0, False, True)  # dh0 needs all of dZ_0: one more launch
    elif p["mode"] == "persistent":
        run(T, 0, d_cT, True, True)
    else:  # single program per batch block: its own dZ_0 is complete, no barrier needed
        run(T, 0, d_cT, False, True)

    return _gradient_gemms(x, h0, w_ih, out, dz, dh0, dc0)


def _gradient_gemms(x, h0, w_ih, out, dz, dh0, dc0):
    """Everything that does not recur is a GEMM over all B*T rows at once."""
    B, T, I = x.shape
    H = out.shape[-1]
    dz2 = dz.reshape(B * T, 4 * H)
    hprev = torch.empty((B, T, H), device=x.device, dtype=x.dtype)  # h_{t-1} for step t
    hprev[:, 0] = h0[0]
    hprev[:, 1:] = out[:, :-1]
    dx = gemm(dz2, w_ih, check=False).reshape(B, T, I)
    dw_ih = gemm(dz2.t(), x.reshape(B * T, I), check=False)
    dw_hh = gemm(dz2.t(), hprev.reshape(B * T, H), check=False)
    db = column_sum(dz2, out_dtype=x.dtype)
    return dx, dh0[None], dc0[None], dw_ih, dw_hh, db, db.clone()


class _LSTM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, save, x, h0, c0, w_ih, w_hh, b_ih, b_hh, knobs, sticky):
        # knobs: (mode, fp32_dot, num_warps) of the call, the backward's too; sticky: the
        # device's barrier report word (_sticky), an input so that a replay patches it too
        out, c_t, gates, cs = _forward(x, h0, c0, w_ih, w_hh, b_ih, b_hh, save, sticky, *knobs)
        h_t = out[:, -1].unsqueeze(0).clone()
        if save:
            ctx.save_for_backward(x, h0, c0, w_ih, w_hh, out, gates, cs, sticky)
            ctx.knobs = knobs
        return out, h_t, c_t.unsqueeze(0)

    @staticmethod
    def backward(ctx, d_out, d_hT, d_cT):
        x, h0, c0, w_ih, w_hh, out, gates, cs, sticky = ctx.saved_tensors
        return ((None,) + _backward(x, h0, c0, w_ih, w_hh, out, gates, cs, d_out, d_hT, d_cT,
                                    sticky, *ctx.knobs) + (None, None))


def lstm(x, h0, c0, w_ih, w_hh, b_ih, b_hh, mode=None, fp32_dot=None, num_warps=None):
    """One-layer batch_first LSTM, gates i, f, g, o; inputs already validated.

    mode, fp32_dot, num_warps: this call's recurrence strategy (MODES), float32 dot
    arithmetic (FP32_DOTS) and warps per program; None: the process's (MODE and FP32_DOT,
    from the environment) and the plan's warps (_plan). Benches and sweeps pass them to time the
    alternatives side by side.

    Layouts: x may have any strides (its (B*T, I) view is a copy only when reshape needs
    one); w_ih, w_hh go to the kernels with their strides (transposed storage is fine);
    b_ih goes to gemm's epilogue (made contiguous there). The recurrence indexes h0, c0 and
    b_hh with a unit stride along H, so they are made contiguous here: B*H and 4H elements,
    nothing next to the recurrence, and autograd carries their gradients back through the
    copies to the caller's views."""
    # A previous persistent launch that gave up at its barrier is reported, not forgotten
    sticky = _sticky(x.device)
    h0, c0, b_hh = h0.contiguous(), c0.contiguous(), b_hh.contiguous()
    inputs = (x, h0, c0, w_ih, w_hh, b_ih, b_hh)
    # Inside Function.forward grad mode is always off, so decide out here whether the
    # activations for backward (gates, c) must be saved at all (not under no_grad).
    if needs_grad(*inputs):
        out, h_t, c_t = apply_ahead(_LSTM, True, *inputs, (mode, fp32_dot, num_warps), sticky)
        return out, (h_t, c_t)
    # Nothing to differentiate: no activations saved, and no autograd.Function.apply
    out, h_t, c_t = forward_ahead(_inference, *inputs, mode, fp32_dot, num_warps, sticky)
    return out, (h_t, c_t)


def _inference(x, h0, c0, w_ih, w_hh, b_ih, b_hh, mode, fp32_dot, num_warps, sticky):
    """The forward of a call that computes no gradient (launch.forward_ahead replays it)."""
    out, c_t, _, _ = _forward(x, h0, c0, w_ih, w_hh, b_ih, b_hh, save=False, sticky=sticky,
                              mode=mode, fp32_dot=fp32_dot, num_warps=num_warps)
    return out, out[:, -1].unsqueeze(0).clone(), c_t.unsqueeze(0)
