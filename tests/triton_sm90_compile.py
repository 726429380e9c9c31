"""Compile Level 4's GPU-only code paths for an sm_90 GPU on a machine without one.

Run as a script by tests/test_triton_compile.py, in a process where TRITON_INTERPRET is off
(triton.jit then makes real JITFunctions): `triton.compile` only needs Triton's bundled
compiler, not a GPU. The CPU tests run the interpreter, which never takes the paths that
exist for the GPU alone (the persistent LSTM's grid barrier, 64-bit offsets in compiled
code); this compiles them, so a Triton error there fails CI instead of a device run.
Prints one line per kernel: name, PTX lines, and the count of instructions that matter."""

from __future__ import annotations

import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


def compile_kernel(fn, pointers: dict, constexprs: dict, num_warps: int = 4, num_stages: int = 3):
    fn = getattr(fn, "jit", fn)  # a @fast_launch kernel: its JITFunction
    signature, constants = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
            constants[(i,)] = constexprs[name]
        else:
            signature[name] = pointers.get(name, "i32")
    compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constants),
                              target=GPUTarget("cuda", 90, 32),
                              options=dict(num_warps=num_warps, num_stages=num_stages))
    return compiled.asm["ptx"], compiled.metadata.shared


SM90_SHARED = 227 * 1024  # an H100 block's most shared memory (opted in)


def main() -> int:
    import triton_kernels.attention as attention
    import triton_kernels.layer_norm as layer_norm
    import triton_kernels.lstm as lstm

    f32, bf16, i32 = "*fp32", "*bf16", "*i32"
    jobs = []
    for dt, precision, size in ((bf16, "tf32", 2), (f32, "tf32x3", 4)):
        # the plan's tiles at the LSTM LM's training shape (B64, hidden 1024, 132 SMs)
        fwd = lstm._plan(64, 1024, None, "persistent", None, "fwd", size, sms=132)
        bwd = lstm._plan(64, 1024, None, "persistent", None, "bwd", size, sms=132)
        common = dict(SYNC=True, N_H_POW2=32, UPCAST=False, PRECISION=precision,
                      SPIN_LIMIT=lstm.SPIN_LIMIT)
        jobs.append((f"lstm_fwd {dt}", lstm._lstm_fwd,
                     dict(XP=f32, H0=dt, CIN=dt, W=dt, BHH=dt, OUT=dt, CT=dt, GATES=f32, CS=f32,
                          FLAGS=i32, ERR=i32, STICKY=i32),
                     dict(common, SAVE=True, BLOCK_B=fwd["BLOCK_B"], BLOCK_H=fwd["BLOCK_H"],
                          BLOCK_K=fwd["BLOCK_K"], FUSED_GATES=fwd["fused_gates"]), fwd))
        jobs.append((f"lstm_bwd {dt}", lstm._lstm_bwd,
                     dict(DOUT=dt, DHT=dt, DCIN=dt, W=dt, GATES=f32, CS=f32, C0=dt, DZ=dt, DH0=dt,
                          DC0=dt, FLAGS=i32, ERR=i32, STICKY=i32),
                     dict(common, FINAL=True, BLOCK_B=bwd["BLOCK_B"], BLOCK_H=bwd["BLOCK_H"],
                          BLOCK_K=bwd["BLOCK_K"]), bwd))
    jobs.append(("layer_norm_fwd bf16", layer_norm.layer_norm_fwd_kernel,
                 dict(x_ptr=bf16, w_ptr=bf16, b_ptr=bf16, y_ptr=bf16, stats_ptr=f32,
                      eps="fp32"), dict(BLOCK_M=1, BLOCK_N=4096, STATS=True)))
    jobs.append(("layer_norm_bwd bf16", layer_norm.layer_norm_bwd_kernel,
                 dict(x_ptr=bf16, w_ptr=bf16, dy_ptr=bf16, dx_ptr=bf16, stats_ptr=f32,
                      part_ptr=f32), dict(BLOCK_M=4, BLOCK_N=4096)))
    off = dict(PAD_D=False, HAS_LENS=False, BOTTOM_RIGHT=False, ROPE=False, INTERLEAVED=False)
    tables = dict(COS=bf16, SIN=bf16)  # rope's tables (read only where ROPE is on)
    jobs.append(("attention_fwd bf16", attention._attn_fwd,
                 dict(Q=bf16, K=bf16, V=bf16, O=bf16, LSE=f32, KV_LENS=f32, qk_scale="fp32", **tables),
                 dict(HEAD_DIM=128, BLOCK_M=128, BLOCK_N=64, CAUSAL=True, UPCAST=False,
                      PRECISION="tf32", SAVE_LSE=True, **off)))
    grads = dict(Q=bf16, K=bf16, V=bf16, DO=bf16, LSE=f32, DELTA=f32, DK=bf16, DV=bf16, DQ=bf16,
                 KV_LENS=i32, qk_scale="fp32", sm_scale="fp32", **tables)

    def attention_jobs(label, head_dim, fwd, bwd, switches):
        """The forward and both backward kernels with these switches and TUNED's tiles."""
        common = dict(HEAD_DIM=head_dim, CAUSAL=True, UPCAST=False, PRECISION="tf32", **switches)
        return [(f"attention_fwd bf16 {label}", attention._attn_fwd,
                 dict(Q=bf16, K=bf16, V=bf16, O=bf16, LSE=f32, KV_LENS=i32, qk_scale="fp32", **tables),
                 dict(common, BLOCK_M=fwd["BLOCK_M"], BLOCK_N=fwd["BLOCK_N"], SAVE_LSE=True), fwd),
                (f"attention_bwd_dkdv bf16 {label}", attention._attn_bwd_dkdv, grads,
                 dict(common, BLOCK_M=bwd["BLOCK_M"], BLOCK_N=bwd["BLOCK_N"]), bwd),
                (f"attention_bwd_dq bf16 {label}", attention._attn_bwd_dq, grads,
                 dict(common, BLOCK_M=bwd["BLOCK_N"], BLOCK_N=bwd["BLOCK_M"]), bwd)]

    # The grown paths at the largest head (D = 192 padded to 256, grouped, per-batch
    # lengths, bottom-right, rope's half-split pairs) with TUNED's d256 tiles: they must
    # compile and fit sm_90.
    jobs += attention_jobs("D256 grown", 256, attention.TUNED["fwd_d256"], attention.TUNED["bwd_d256"],
                           dict(PAD_D=True, HAS_LENS=True, BOTTOM_RIGHT=True, ROPE=True,
                                INTERLEAVED=False))
    # rope fused at Llama's head (D = 128) with the tiles a rope call gets (_fit_rope:
    # TUNED's, smaller where the tables' rows would not fit), interleaved pairs
    import torch

    jobs += attention_jobs("D128 rope interleaved", 128,
                           attention._fwd_config(128, torch.bfloat16, rope=True),
                           attention._bwd_config(128, torch.bfloat16, rope=True),
                           dict(off, ROPE=True, INTERLEAVED=True))
    # the one-pass backward of short keys at its largest tiles (128 keys, a 64-wide head),
    # plain and with every switch on: its K, V, dK, dV and score tile must fit the registers
    short = attention._short_config(64, attention.SHORT_KEYS, attention.SHORT_HEAD, torch.bfloat16)
    short_grads = dict(grads, O=bf16)
    for label, switches in (("plain", off), ("grown", dict(PAD_D=True, HAS_LENS=True,
                                                            BOTTOM_RIGHT=True, ROPE=True,
                                                            INTERLEAVED=True))):
        jobs.append((f"attention_bwd_short bf16 {label}", attention._attn_bwd_short, short_grads,
                     dict(HEAD_DIM=attention.SHORT_HEAD, BLOCK_M=short["BLOCK_M"],
                          BLOCK_N=short["BLOCK_N"], CAUSAL=True, UPCAST=False, PRECISION="tf32",
                          **switches), short))
    # newton_schulz: the batch axis (a 64-bit offset per matrix) in code the interpreter
    # does not compile, at the GPU's bf16 tiles
    import triton_kernels.newton_schulz as ns

    jobs.append(("newton_schulz sum_squares bf16", ns.sum_squares_kernel,
                 dict(x_ptr=bf16, part_ptr=f32), dict(BLOCK_R=32, BLOCK_C=256)))
    jobs.append(("newton_schulz inverse_norm", ns.inverse_norm_kernel,
                 dict(part_ptr=f32, scale_ptr=f32, eps="fp32"), dict(BLOCK_P=1024)))
    for name, tiles in (("big", ns._SYM_BIG), ("long K", ns._SYM_LONG_K), ("small", ns._SYM_SMALL)):
        tiles = dict(tiles)
        warps = dict(num_warps=tiles.pop("num_warps"), num_stages=tiles.pop("num_stages"))
        jobs.append((f"newton_schulz sym bf16 {name}", ns.sym_kernel,
                     dict(x_ptr=bf16, y_ptr=bf16, out_ptr=bf16, scale_ptr=f32, alpha="fp32",
                          beta="fp32"),
                     dict(tiles, SCALED=True, HAS_Y=True, UPCAST=False, DOT_PRECISION="tf32"),
                     warps))
    for name, tiles in (("wide", ns._UPDATE_WIDE), ("big", ns._UPDATE_BIG),
                        ("small", ns._UPDATE_SMALL)):
        tiles = dict(tiles)
        warps = dict(num_warps=tiles.pop("num_warps"), num_stages=tiles.pop("num_stages"))
        jobs.append((f"newton_schulz update bf16 {name}", ns.update_kernel,
                     dict(b_ptr=bf16, x_ptr=bf16, out_ptr=bf16, scale_ptr=f32, a="fp32"),
                     dict(tiles, SCALED=True, UPCAST=False, DOT_PRECISION="tf32", GROUP_M=8),
                     warps))
    # conv_bn's weight gradient at the GPU's bf16 tile: its pixel loop divides by a
    # multiply-high (_fast_div), with a multiplier of 2**31 or more passed as an i64
    import triton_kernels.conv_bn as conv_bn

    # and its two ways of stepping over the pixels: flat (the old rule's tile) and in whole
    # output rows (the row rule's tile, 64-wide rows)
    for row_w, tile, warps in ((0, (128, 128), 8), (64, (64, 128), 4)):
        jobs.append((f"conv_bn wgrad bf16 ROW_W={row_w}", conv_bn.conv_wgrad_kernel,
                     dict(dy_ptr=bf16, x_ptr=bf16, part_ptr=f32, hw_magic="i64"),
                     dict(KW=3, ROW_W=row_w, UPCAST=False, DOT_PRECISION="tf32",
                          BLOCK_M=tile[0], BLOCK_N=tile[1], BLOCK_K=64, DIRECT=False),
                     dict(num_warps=warps, num_stages=3)))
    failed = 0
    for name, fn, pointers, constexprs, *config in jobs:
        options = {k: config[0][k] for k in ("num_warps", "num_stages")} if config else {}
        try:
            ptx, shared = compile_kernel(fn, pointers, constexprs, **options)
            if shared > SM90_SHARED:
                raise ValueError(f"{shared} bytes of shared memory, more than sm_90's {SM90_SHARED}")
        except Exception as exc:  # noqa: BLE001 - report every kernel, then fail
            failed += 1
            print(f"FAIL {name}: {type(exc).__name__}: {exc}")
            continue
        counts = {ins: ptx.count(ins) for ins in ("atom.", "mul.wide", "mma.", "wgmma")}
        print(f"ok   {name}: {len(ptx.splitlines())} PTX lines, {shared} B shared, {counts}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
