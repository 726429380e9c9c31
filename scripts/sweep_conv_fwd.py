"""Which tile should Level 4's training convolution run, forward and input gradient?
conv_fwd_kernel (with the BatchNorm tile statistics of training mode) and conv_dgrad_kernel at
every candidate tile, cuDNN's forward and input gradient beside them, at each convolution of
the CNN's `gpu` preset (a ResNet of basic blocks, widths 64/128/256, 128 images of 64x64,
channels_last, bf16).

    python scripts/sweep_conv_fwd.py OUT.json [--batch 128] [--image 64] [--rule-only]

--rule-only: the rule's tile and cuDNN alone (no candidates), e.g. to time an older kernel:
copy this script (and sweep_conv_wgrad.py, whose shapes it reads) into an older tree and run
it there.

Why: in the CNN's training step on an H100 the forward convolutions took 0.86 ms of Level 4's
5.0 and the input gradients 0.68 ms (reports/training-tables-h100-2026-11-26/), about twice
cuDNN's, and _fwd_tile (which both read) was set from ResNet-50's eval shapes. Kernel time only
(triton.testing.do_bench, median); each candidate's output is checked against cuDNN's first.
The weights are channels_last (OHWI) as the model's are; `--weight-layout contiguous` times
torch's default OIHW weights, which the kernels read with a stride of kH*kW along C_in.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sweep_conv_wgrad import convs, warm_up  # noqa: E402 (same directory)
from triton_kernels import conv_bn as C  # noqa: E402

TILES = {  # name: (BLOCK_M over pixels, BLOCK_N over output channels, BLOCK_K, warps, stages)
    "64x64x64 w4 s3": (64, 64, 64, 4, 3),
    "64x64x64 w4 s4": (64, 64, 64, 4, 4),
    "128x64x64 w4 s3": (128, 64, 64, 4, 3),
    "128x64x64 w4 s4": (128, 64, 64, 4, 4),
    "128x64x64 w8 s3": (128, 64, 64, 8, 3),
    "128x64x32 w4 s4": (128, 64, 32, 4, 4),
    "256x64x64 w8 s3": (256, 64, 64, 8, 3),
    "128x128x64 w8 s3": (128, 128, 64, 8, 3),
    "128x128x64 w8 s4": (128, 128, 64, 8, 4),
    "128x128x64 w4 s3": (128, 128, 64, 4, 3),
    "128x128x32 w4 s4": (128, 128, 32, 4, 4),
    "256x128x64 w8 s3": (256, 128, 64, 8, 3),
    "64x128x64 w4 s3": (64, 128, 64, 4, 3),
    "128x256x64 w8 s3": (128, 256, 64, 8, 3),
}


def _time(fn) -> float:
    fn()
    return triton.testing.do_bench(fn)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--image", type=int, default=64)
    ap.add_argument("--weight-layout", choices=("channels_last", "contiguous"),
                    default="channels_last", help="the conv weights' memory format: the CNN's "
                    "levels.nn model is channels_last, parameters included (default)")
    ap.add_argument("--rule-only", action="store_true", help="time the rule and cuDNN only")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("sweep_conv_fwd.py: needs a CUDA GPU (it times Level 4's compiled kernels "
                 "against cuDNN); the committed runs are under reports/")
    dev, dt = torch.device("cuda"), torch.bfloat16
    rule = C._fwd_tile
    rows = []
    warm_up(dev)
    for name, c_in, c_out, h, k, stride in convs(a.batch, a.image):
        x = torch.randn(a.batch, c_in, h, h, device=dev, dtype=dt).contiguous(
            memory_format=torch.channels_last)
        w = (torch.randn(c_out, c_in, k, k, device=dev, dtype=dt) * 0.05).contiguous(
            memory_format={"channels_last": torch.channels_last,
                           "contiguous": torch.contiguous_format}[a.weight_layout])
        pad = (k // 2, k // 2)
        s = C._dims(x, w, (stride, stride), pad)
        P = a.batch * s["H_out"] * s["W_out"]
        want = F.conv2d(x, w, None, stride, k // 2)
        want2d = C._as_rows(want).float()
        dy4 = torch.randn_like(want)
        dyc = C._as_rows(dy4.contiguous(memory_format=torch.channels_last))
        want_dx = torch.ops.aten.convolution_backward(
            dy4, x, w, None, (stride, stride), pad, (1, 1), False, (0, 0), 1,
            (True, False, False))[0].float()
        ms_cudnn = _time(lambda: F.conv2d(x, w, None, stride, k // 2))
        ms_cudnn_dx = _time(lambda: torch.ops.aten.convolution_backward(
            dy4, x, w, None, (stride, stride), pad, (1, 1), False, (0, 0), 1,
            (True, False, False)))
        flop = 2 * P * c_out * c_in * k * k
        y = torch.empty((P, c_out), device=dev, dtype=dt)

        def fwd():
            return C._conv_fwd(x, w, C._w_strides(w), None, y, s, k, k, tile_stats=True)

        def dgrad():
            return C._conv_dgrad(dyc, w, C._w_strides(w), x, s, k, k)

        row = {"conv": name, "P": P, "C_in": c_in, "C_out": c_out, "cudnn_fwd_ms": ms_cudnn,
               "cudnn_dgrad_ms": ms_cudnn_dx, "weight_layout": a.weight_layout, "rule": {}, "candidates": []}
        for label in ["rule"] + ([] if a.rule_only else list(TILES)):
            if label == "rule":
                C._fwd_tile = rule
            else:
                bm, bn, bk, warps, stages = TILES[label]
                C._fwd_tile = lambda *_, c=dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8,
                                                num_warps=warps, num_stages=stages): dict(c)
            entry = {"tile": label}
            for what, fn, ref, ms_lib in (("fwd", fwd, want2d, ms_cudnn),
                                          ("dgrad", dgrad, want_dx, ms_cudnn_dx)):
                try:
                    y.fill_(float("nan"))
                    got = fn()
                    got = y.float() if what == "fwd" else got.float()
                    err = ((got - ref).norm() / ref.norm()).item()
                    ms = _time(fn)
                except Exception as e:  # a tile that does not fit: recorded, not fatal
                    entry[what] = {"error": f"{type(e).__name__}: {e}"[:200]}
                    continue
                entry[what] = {"ms": ms, "rel_err": err, "tflops": flop / ms / 1e9,
                               "vs_cudnn": ms_lib / ms}
            C._fwd_tile = rule
            if label == "rule":
                row["rule"] = entry
            else:
                row["candidates"].append(entry)
        for what in ("fwd", "dgrad"):
            ok = [c for c in row["candidates"] if "ms" in c.get(what, {})
                  and c[what]["rel_err"] < 2e-2]
            best = min(ok, key=lambda c: c[what]["ms"]) if ok else None
            row[f"best_{what}"] = best and {"tile": best["tile"], **best[what]}
            r = row["rule"].get(what, {})
            print(f"{name:24s} {what:5s} P {P:7d} cuDNN {row[f'cudnn_{what}_ms'] * 1e3:7.1f} us | "
                  f"rule {r.get('ms', float('nan')) * 1e3:7.1f} us (err {r.get('rel_err', float('nan')):.1e})"
                  f" | best {best['tile'] if best else '-':18s} "
                  f"{best[what]['ms'] * 1e3 if best else float('nan'):7.1f} us", flush=True)
        rows.append(row)
    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": triton.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    Path(a.out).write_text(json.dumps({"environment": env, "command": " ".join(sys.argv),
                                       "rows": rows}, indent=1))
    for what in ("fwd", "dgrad"):
        rule_ms = sum(r["rule"].get(what, {}).get("ms", 0) for r in rows)
        best_ms = sum((r[f"best_{what}"] or {}).get("ms", 0) for r in rows)
        lib_ms = sum(r[f"cudnn_{what}_ms"] for r in rows)
        print(f"{what}: sum over the CNN's convs: rule {rule_ms:.3f} ms, best {best_ms:.3f} ms, "
              f"cuDNN {lib_ms:.3f} ms")


if __name__ == "__main__":
    main()
