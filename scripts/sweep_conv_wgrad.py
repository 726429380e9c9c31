"""Which tile and split should Level 4's conv weight gradient run? conv_wgrad_kernel (and
wgrad_finish_kernel when the pixels are split) at every candidate, cuDNN's weight gradient
beside it, at each convolution of the CNN's `gpu` preset (a ResNet of basic blocks, widths
64/128/256, 128 images of 64x64, channels_last, bf16).

    python scripts/sweep_conv_wgrad.py OUT.json [--batch 128] [--image 64] [--rule-only] [--flat]

--rule-only: the rule's choice (with row steps where they apply, and with flat steps:
ROW_STEPS off) and cuDNN alone, no candidates. --flat: every candidate tile with flat steps
as well as row steps.

Why: in the CNN's training step on an H100 the weight gradient was Level 4's largest kernel
(1.0 ms a step, of 5.4), and _wgrad_plan's tile and split were set from a few shapes. The
sweep times the rule's choice, each tile at each split target, and
torch.ops.aten.convolution_backward (weight only) on the same operands. Kernel time only
(triton.testing.do_bench, median). Each candidate's split count comes from
conv_bn.wgrad_splits at its own target of programs (at least 2048 pixels a split; the
committed runs of 2026-11-26 drew their candidates at 512).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from triton_kernels import conv_bn as C  # noqa: E402
from triton_kernels.launch import cdiv  # noqa: E402

TILES = {  # name: (BLOCK_M over C_out, BLOCK_N over kH*kW*C_in, BLOCK_K over pixels, warps, stages)
    "64x64x64 w4 s3": (64, 64, 64, 4, 3),
    "64x128x64 w4 s3": (64, 128, 64, 4, 3),
    "64x128x64 w4 s4": (64, 128, 64, 4, 4),
    "64x128x128 w4 s3": (64, 128, 128, 4, 3),
    "64x256x64 w8 s3": (64, 256, 64, 8, 3),
    "64x256x64 w8 s2": (64, 256, 64, 8, 2),
    "64x256x32 w8 s4": (64, 256, 32, 8, 4),
    "128x64x64 w4 s3": (128, 64, 64, 4, 3),
    "128x128x64 w8 s3": (128, 128, 64, 8, 3),
    "128x128x64 w8 s4": (128, 128, 64, 8, 4),
    "128x128x128 w8 s3": (128, 128, 128, 8, 3),
    "128x256x64 w8 s3": (128, 256, 64, 8, 3),
}
WAVES = (1, 2, 4)  # programs per SM the split aims at


def convs(batch: int, image: int):
    """(name, C_in, C_out, H, k, stride) of the CNN's convolutions (levels/models/cnn.py)."""
    h1, h2 = image // 2, image // 4
    return [("stem 3->64", 3, 64, image, 3, 1),
            ("block1 3x3 64->64", 64, 64, image, 3, 1),
            ("block2 3x3/2 64->128", 64, 128, image, 3, 2),
            ("block2 3x3 128->128", 128, 128, h1, 3, 1),
            ("block2 1x1/2 64->128", 64, 128, image, 1, 2),
            ("block3 3x3/2 128->256", 128, 256, h1, 3, 2),
            ("block3 3x3 256->256", 256, 256, h2, 3, 1),
            ("block3 1x1/2 128->256", 128, 256, h1, 1, 2)]


def warm_up(dev, seconds: float = 2.0) -> None:
    """Matmuls for `seconds`, so the GPU's clocks are up before the first timing: the first
    convolution's first candidate was once timed at 134 us in a run where the same tile took
    80 us a few candidates later."""
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        a @ a
    torch.cuda.synchronize(dev)


def plan_for(tile, waves, P, C_out, K_total, sms, H_out, W_out, rows):
    bm, bn, bk, warps, stages = tile
    splits = C.wgrad_splits(P, cdiv(C_out, bm) * cdiv(K_total, bn), waves * sms)
    cfg = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=stages,
               precision="tf32")
    return C.wgrad_steps(cfg, P, splits, H_out, W_out, rows)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--image", type=int, default=64)
    ap.add_argument("--rule-only", action="store_true", help="time the rule and cuDNN only")
    ap.add_argument("--flat", action="store_true",
                    help="also time every candidate tile with flat steps (rows only by default)")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("sweep_conv_wgrad.py: needs a CUDA GPU (it times Level 4's compiled kernels "
                 "against cuDNN); the committed runs are under reports/")
    dev, dt = torch.device("cuda"), torch.bfloat16
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    rule = C._wgrad_plan
    rows = []
    warm_up(dev)
    for name, c_in, c_out, h, k, stride in convs(a.batch, a.image):
        x = torch.randn(a.batch, c_in, h, h, device=dev, dtype=dt).contiguous(
            memory_format=torch.channels_last)
        w = torch.randn(c_out, c_in, k, k, device=dev, dtype=dt) * 0.05
        s = C._dims(x, w, (stride, stride), (k // 2, k // 2))
        P = a.batch * s["H_out"] * s["W_out"]
        K_total = c_in * k * k
        dyc = torch.randn(P, c_out, device=dev, dtype=dt)
        dy4 = dyc.view(a.batch, s["H_out"], s["W_out"], c_out).permute(0, 3, 1, 2)
        want = torch.ops.aten.convolution_backward(
            dy4, x, w, None, (stride, stride), (k // 2, k // 2), (1, 1), False, (0, 0), 1,
            (False, True, False))[1]
        ms_cudnn = triton.testing.do_bench(lambda: torch.ops.aten.convolution_backward(
            dy4, x, w, None, (stride, stride), (k // 2, k // 2), (1, 1), False, (0, 0), 1,
            (False, True, False)))
        flop = 2 * P * c_out * K_total
        row = {"conv": name, "P": P, "C_out": c_out, "K_total": K_total,
               "cudnn_ms": ms_cudnn, "rule": None, "candidates": []}
        hw = (s["H_out"], s["W_out"])
        cands = [("rule", None), ("rule, flat steps", "flat")] + (
            [] if a.rule_only else [(f"{t} x{wv}{' rows' if by_rows else ''}", (TILES[t], wv, by_rows))
                                    for t in TILES for wv in WAVES for by_rows in (True, False)
                                    if by_rows or a.flat])
        for label, spec in cands:
            if spec is None or spec == "flat":
                C.ROW_STEPS = spec is None
                plan, splits = rule(P, c_in, c_out, K_total, dt, dev, *hw)
                C._wgrad_plan = lambda *_, p=plan, n=splits: (p, n)
            else:
                plan, splits = plan_for(spec[0], spec[1], P, c_out, K_total, sms, *hw, spec[2])
                C._wgrad_plan = lambda *_, p=plan, n=splits: (p, n)
            try:
                got = C.train_wgrad(dyc, x, w, s, k, k)
                err = ((got.float() - want.float()).norm() / want.float().norm()).item()
                ms = triton.testing.do_bench(lambda: C.train_wgrad(dyc, x, w, s, k, k))
            except Exception as e:  # a tile that does not fit: recorded, not fatal
                row["candidates"].append({"tile": label, "error": f"{type(e).__name__}: {e}"[:200]})
                continue
            finally:
                C._wgrad_plan, C.ROW_STEPS = rule, True
            entry = {"tile": label, "splits": splits, "ms": ms, "rel_err": err,
                     "tflops": flop / ms / 1e9, "vs_cudnn": ms_cudnn / ms}
            if spec is None:
                row["rule"] = dict(entry, plan={k2: v for k2, v in plan.items()})
            elif spec == "flat":
                row["rule_flat"] = dict(entry, plan={k2: v for k2, v in plan.items()})
            else:
                row["candidates"].append(entry)
        ok = [c for c in row["candidates"] + ([row["rule"]] if row["rule"] else [])
              if "ms" in c and c["rel_err"] < 2e-2]
        best = min(ok, key=lambda c: c["ms"]) if ok else None
        row["best"] = best
        rows.append(row)
        r = row["rule"]
        f = row["rule_flat"]
        print(f"{name:24s} P {P:7d} cuDNN {ms_cudnn * 1e3:7.1f} us | rule {r['ms'] * 1e3:7.1f} us "
              f"({r['splits']} splits, ROW_W {r['plan']['ROW_W']}, err {r['rel_err']:.1e}; "
              f"flat {f['ms'] * 1e3:7.1f}) | best {best['tile']:22s} "
              f"{best['ms'] * 1e3:7.1f} us ({best['splits']} splits)", flush=True)
    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": triton.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    Path(a.out).write_text(json.dumps({"environment": env, "command": " ".join(sys.argv),
                                       "rows": rows}, indent=1))
    print(f"sum over the CNN's convs: rule {sum(r['rule']['ms'] for r in rows):.3f} ms "
          f"(flat steps {sum(r['rule_flat']['ms'] for r in rows):.3f}), "
          f"best {sum(r['best']['ms'] for r in rows):.3f} ms, "
          f"cuDNN {sum(r['cudnn_ms'] for r in rows):.3f} ms")


if __name__ == "__main__":
    main()
