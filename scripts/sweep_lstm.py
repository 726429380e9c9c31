"""Which tiles should Level 4's LSTM recurrence run, and where do Levels 4 and 5 lose to cuDNN?

    python scripts/sweep_lstm.py OUT.json [--shapes gpu,bench,...] [--budget-s 420]

For each shape (B batch rows, I inputs, H hidden units, T steps; bf16):
1. the persistent recurrence of Level 4 (`triton_kernels.lstm._forward` with the activations
   saved, and `_backward`) at candidate tiles, searched one axis after another: the program's
   block (BLOCK_B batch rows x BLOCK_H units), then the reduction step BLOCK_K and the warps,
   then the pipeline depth (num_stages), then (forward) the four gates as one dot
   (`fused_gates`) at every block width. Every candidate's result is compared with the
   current rule's before it is timed;
2. Level 4 under its rule and under the rule before this sweep (`old_rule`), Level 5
   (versions 1 and 2) and cuDNN's `nn.LSTM`, forward (no gradient) and forward+backward,
   through the same calls a model makes;
3. at the first shape, a profile of one forward+backward of each: the GPU time per kernel.

Why: in `levels train --model lstm --preset gpu` (B64, I = H = 1024, T64, two layers) Level 4
is 1.5-1.7x `nn.LSTM` and Level 5 0.7x, against a goal of 2x (issue #26); the recurrence takes
most of Level 4's step (reports/training-interleaved/). Kernel time by CUDA events
(triton.testing.do_bench, median); a candidate runs only where all its programs fit the GPU at
once (the persistent barrier needs them resident).
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

import triton_kernels.lstm as LS  # noqa: E402
from triton_kernels.launch import cdiv, next_power_of_2  # noqa: E402

SHAPES = {  # name: (B, I, H, T)
    "gpu": (64, 1024, 1024, 64),       # levels train --model lstm --preset gpu, either layer
    "bench": (8, 256, 512, 64),        # levels bench's lstm shape
    "b64-h512": (64, 512, 512, 100),
    "small": (16, 64, 256, 64),        # --preset small
    "b128-h1024": (128, 512, 1024, 32),
}

RULE = LS._plan


def old_rule(B, H, device, mode=None, num_warps=None, kernel="fwd", itemsize=2):
    """The tiles before this sweep (up to 2026-11-26): 16 units x up to 32 rows, BLOCK_K 64,
    four gate dots, 4 warps, Triton's default 3 stages; the same for both directions."""
    bb = min(max(16, next_power_of_2(B)), 32)
    fits = cdiv(B, bb) * cdiv(H, 16) <= LS._sm_count(device)
    return dict(BLOCK_B=bb, BLOCK_H=16, BLOCK_K=64, mode="persistent" if fits else "step",
                num_warps=4 if num_warps is None else num_warps, num_stages=3, fused_gates=False)


def _args(B, I, H, T, dev, dt, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)

    def r(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(device=dev, dtype=dt)

    k = H ** -0.5
    return dict(x=r(B, T, I), h0=r(1, B, H), c0=r(1, B, H), w_ih=r(4 * H, I, scale=k),
                w_hh=r(4 * H, H, scale=k), b_ih=r(4 * H, scale=k), b_hh=r(4 * H, scale=k))


def _fits(cfg, B, H, sms):
    return cdiv(B, cfg["BLOCK_B"]) * cdiv(H, cfg["BLOCK_H"]) <= sms


def _with(cfg):
    """LS._plan replaced by one that returns cfg (persistent)."""
    LS._plan = lambda B, H, device, mode=None, num_warps=None, *_: dict(cfg, mode="persistent")


def _rel(a, b):
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-6))


def _sweep_kernel(which, a, B, H, sms, ref, saved, deadline):
    """Coordinate search over the tiles of `which` ('fwd' or 'bwd'); rows of every candidate."""
    rows = []

    def run(cfg):
        _with(cfg)
        if which == "fwd":
            return lambda: LS._forward(a["x"], a["h0"], a["c0"], a["w_ih"], a["w_hh"], a["b_ih"],
                                       a["b_hh"], True, LS._sticky(a["x"].device))
        out, gates, cs, dout, dhT, dcT = saved
        return lambda: LS._backward(a["x"], a["h0"], a["c0"], a["w_ih"], a["w_hh"], out, gates, cs,
                                    dout, dhT, dcT, LS._sticky(a["x"].device))

    def trial(cfg):
        if time.time() > deadline:
            return None
        if not _fits(cfg, B, H, sms):
            return None
        row = dict(kernel=which, **{k: v for k, v in cfg.items()})
        try:
            fn = run(cfg)
            got = fn()
            LS.check_barrier(wait=True)
            # forward: h of every step; backward: dx and dW_hh
            errs = ([_rel(got[0], ref[0])] if which == "fwd"
                    else [_rel(got[0], ref[0]), _rel(got[4], ref[4])])
            row["rel_err_vs_rule"] = max(errs)
            if not row["rel_err_vs_rule"] < 2e-2:
                row["status"] = "wrong"
                rows.append(row)
                return None
            row["ms"] = triton.testing.do_bench(fn, warmup=5, rep=40)
            row["status"] = "ok"
        except Exception as e:  # noqa: BLE001 (a candidate that does not compile is a row)
            row["status"] = f"failed: {type(e).__name__}: {str(e)[:160]}"
        finally:
            LS._plan = RULE
        rows.append(row)
        return row.get("ms")

    base = dict(BLOCK_K=64, num_warps=4, num_stages=3, fused_gates=False)
    bb_max = max(16, next_power_of_2(B))
    blocks = [(bb, bh) for bb in (16, 32, 64) for bh in (16, 32, 64)
              if bb <= bb_max and bb * bh <= 2048]
    scored = []
    for bb, bh in blocks:
        t = trial(dict(base, BLOCK_B=bb, BLOCK_H=bh))
        if t is not None:
            scored.append((t, bb, bh))
    if not scored:
        return rows
    scored.sort()
    best = dict(base, BLOCK_B=scored[0][1], BLOCK_H=scored[0][2])
    best_t = scored[0][0]
    kmax = H if which == "fwd" else 4 * H
    for bk in (32, 64, 128, 256):
        for w in (4, 8):
            if bk > max(16, kmax) or (bk == 64 and w == 4):
                continue
            cfg = dict(best, BLOCK_K=bk, num_warps=w)
            t = trial(cfg)
            if t is not None and t < best_t:
                best, best_t = cfg, t
    for st in (1, 2, 4):
        cfg = dict(best, num_stages=st)
        t = trial(cfg)
        if t is not None and t < best_t:
            best, best_t = cfg, t
    if which == "fwd":
        fused = [(bb, bh) for bb in (16, 32, 64) for bh in (8, 16, 32, 64)
                 if bb <= bb_max and bb * bh <= 2048]
        for bb, bh in fused:  # one dot of N = 4 BLOCK_H: 8 units are a 32-wide dot
            for w in (4, 8):
                cfg = dict(best, BLOCK_B=bb, BLOCK_H=bh, fused_gates=True, num_warps=w)
                t = trial(cfg)
                if t is not None and t < best_t:
                    best, best_t = cfg, t
    rows.append(dict(kernel=which, best=best, best_ms=best_t))
    return rows


def _fwd_bwd_times(a, dev):
    """Level 4 (rule), Level 5 (v1, v2), cuDNN: forward without grad and forward+backward."""
    from cuda_kernels import lstm as CL

    B, T, I = a["x"].shape
    H = a["w_hh"].shape[1]
    mod = torch.nn.LSTM(I, H, batch_first=True).to(device=dev, dtype=a["x"].dtype)
    with torch.no_grad():
        for n in ("w_ih", "w_hh", "b_ih", "b_hh"):
            getattr(mod, f"{n.replace('w_', 'weight_').replace('b_', 'bias_')}_l0").copy_(a[n])
    def old(**k):
        LS._plan = old_rule
        try:
            return LS.lstm(**k)
        finally:
            LS._plan = RULE

    impls = {
        "level4": lambda **k: LS.lstm(**k),
        "level4-old-rule": old,
        "level5-v1": lambda **k: CL.lstm(**k, version=1),
        "level5-v2": lambda **k: CL.lstm(**k, version=2),
        "cudnn": lambda x, h0, c0, **_: mod(x, (h0, c0)),
    }
    dout = torch.randn_like(a["x"][..., :1].expand(B, T, H).contiguous())
    rows = []
    ref = None
    for name, f in impls.items():
        row = dict(impl=name)
        try:
            with torch.no_grad():
                out = f(**a)[0]
            ref = out if ref is None else ref
            row["rel_err_vs_level4"] = _rel(out, ref)
            with torch.no_grad():
                row["fwd_ms"] = triton.testing.do_bench(lambda: f(**a), warmup=5, rep=40)
            leaves = {k: v.detach().requires_grad_() for k, v in a.items()}

            def step():
                o = f(**leaves)[0]
                o.backward(dout)
            row["fwd_bwd_ms"] = triton.testing.do_bench(step, warmup=3, rep=40)
        except Exception as e:  # noqa: BLE001
            row["status"] = f"failed: {type(e).__name__}: {str(e)[:200]}"
        rows.append(row)
    return rows


def _profile(a, dev):
    """GPU time per kernel name for one forward+backward of each implementation."""
    from cuda_kernels import lstm as CL
    from torch.profiler import ProfilerActivity, profile

    B, T, I = a["x"].shape
    H = a["w_hh"].shape[1]
    mod = torch.nn.LSTM(I, H, batch_first=True).to(device=dev, dtype=a["x"].dtype)
    impls = {"level4": lambda **k: LS.lstm(**k), "level5": lambda **k: CL.lstm(**k),
             "cudnn": lambda x, h0, c0, **_: mod(x, (h0, c0))}
    res = {}
    for name, f in impls.items():
        leaves = {k: v.detach().requires_grad_() for k, v in a.items()}
        for _ in range(2):
            f(**leaves)[0].sum().backward()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            f(**leaves)[0].sum().backward()
            torch.cuda.synchronize()
        kernels = {}
        for e in prof.key_averages():
            t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
            if t and e.count:
                kernels[e.key[:90]] = round(t / 1000, 4)
        res[name] = dict(sorted(kernels.items(), key=lambda kv: -kv[1])[:12])
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--budget-s", type=float, default=420.0)
    ap.add_argument("--no-sweep", action="store_true", help="only the levels side by side")
    a_ = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("sweep_lstm.py times the LSTM's kernels on a CUDA GPU, and there is none here "
                 "(torch.cuda.is_available() is False). Its recorded H100 runs are in "
                 "reports/lstm-recurrence/.")
    dev, dt = torch.device("cuda"), torch.bfloat16
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    t0 = time.time()
    report = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                  triton=triton.__version__, date=time.strftime("%Y-%m-%d %H:%M:%S"),
                  command="python scripts/sweep_lstm.py " + " ".join(sys.argv[1:]), shapes={})
    names = a_.shapes.split(",")
    for i, name in enumerate(names):
        B, I, H, T = SHAPES[name]
        a = _args(B, I, H, T, dev, dt)
        entry = dict(B=B, I=I, H=H, T=T, rule_fwd=RULE(B, H, dev, kernel="fwd"),
                     rule_bwd=RULE(B, H, dev, kernel="bwd"), old_rule=old_rule(B, H, dev))
        report["shapes"][name] = entry
        entry["levels"] = _fwd_bwd_times(a, dev)
        print(name, json.dumps(entry["levels"]), flush=True)
        if i == 0:
            entry["profile"] = _profile(a, dev)
            print(json.dumps(entry["profile"], indent=1), flush=True)
        if not a_.no_sweep:
            # Per shape an equal share of what is left of the budget.
            deadline = time.time() + (a_.budget_s - (time.time() - t0)) / (len(names) - i)
            sticky = LS._sticky(dev)
            ref_f = LS._forward(a["x"], a["h0"], a["c0"], a["w_ih"], a["w_hh"], a["b_ih"], a["b_hh"], True,
                                sticky)
            out, c_t, gates, cs = ref_f
            g = torch.Generator(device="cpu").manual_seed(1)
            dout = torch.randn(B, T, H, generator=g).to(dev, dt)
            dhT = torch.randn(1, B, H, generator=g).to(dev, dt)
            dcT = torch.randn(1, B, H, generator=g).to(dev, dt)
            saved = (out, gates, cs, dout, dhT, dcT)
            ref_b = LS._backward(a["x"], a["h0"], a["c0"], a["w_ih"], a["w_hh"], out, gates, cs,
                                 dout, dhT, dcT, sticky)
            rows = _sweep_kernel("fwd", a, B, H, sms, ref_f, saved, deadline - 0.5 * (deadline - time.time()))
            rows += _sweep_kernel("bwd", a, B, H, sms, ref_b, saved, deadline)
            entry["sweep"] = rows
            for r in rows:
                if "best" in r:
                    print(name, r, flush=True)
        Path(a_.out).write_text(json.dumps(report, indent=1))
    report["seconds"] = round(time.time() - t0, 1)
    Path(a_.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
