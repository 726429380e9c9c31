"""Where the time of a whole call goes, launch by launch: Newton-Schulz (five steps, bf16) and
the SwiGLU MLP's forward+backward at Level 1 (eager), Level 4 and Level 5 (Newton-Schulz: also
Level 5's other Hopper versions), each call profiled with torch.profiler (CUDA activity) after
warm-up. Per call: the GPU time of every kernel
(grouped by name), their sum, and the call's own span on the GPU (first kernel start to last
kernel end): span - sum is time the GPU sat idle inside the call (launch gaps, host work).

    PYTHONPATH=. python3 scripts/probe_kernel_split.py OUT.json [--quick] [--swiglu-only]

Needs a CUDA GPU. The profiler adds a little host time per launch; the kernel durations are
the GPU's own. Timings with do_bench (L2 flushed) are the bench's business, not this probe's.
"""

from __future__ import annotations

import datetime
import json
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _split(fn, reps=3):
    """fn profiled `reps` times after 3 warm-up calls: kernel time by name (per call, µs), the
    sum, the span, the number of launches."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
            torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    kernels.sort(key=lambda e: e.time_range.start)
    # split into calls: a call's kernels come between two synchronizes; cut at the largest gaps
    by_name = defaultdict(float)
    for e in kernels:
        by_name[e.name[:120]] += e.time_range.elapsed_us() / reps
    starts = [e.time_range.start for e in kernels]
    ends = [e.time_range.end for e in kernels]
    gaps = sorted(range(1, len(kernels)), key=lambda i: starts[i] - ends[i - 1], reverse=True)[:reps - 1]
    cuts = [0] + sorted(gaps) + [len(kernels)]
    spans = [ends[b - 1] - starts[a] for a, b in zip(cuts, cuts[1:]) if b > a]
    total = sum(by_name.values())
    # the last call's launches in order: which launch of a kernel that runs several times
    # (a GEMM's forward and backward products) takes the time
    last = kernels[cuts[-2]:] if len(cuts) > 1 else kernels
    return {"kernels_us": dict(sorted(by_name.items(), key=lambda kv: -kv[1])),
            "sum_us": total, "span_us": sorted(spans)[len(spans) // 2] if spans else None,
            "launches_per_call": len(kernels) / reps,
            "last_call": [[e.name[:60], round(e.time_range.elapsed_us(), 1)] for e in last]}


def main():
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    import levels

    out = Path(sys.argv[1])
    quick = "--quick" in sys.argv
    report = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "cases": []}
    dev, dt = torch.device("cuda"), torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(0)
    lv = {name: levels.get(name) for name in ("native", "triton", "cuda")}

    def record(what, level, fn):
        try:
            r = _split(fn)
        except Exception as exc:  # noqa: BLE001 - one failing case is recorded, not fatal
            r = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        r.update({"what": what, "level": level})
        report["cases"].append(r)
        if "error" in r:
            print(f"{what:34s} {level:7s} ERROR {r['error']}", flush=True)
        else:
            print(f"{what:34s} {level:7s} span {r['span_us']:9.1f} us  kernels {r['sum_us']:9.1f} us"
                  f"  launches {r['launches_per_call']:.0f}", flush=True)
            for name, us in list(r["kernels_us"].items())[:8]:
                print(f"      {us:9.1f} us  {name[:100]}", flush=True)
            if r["launches_per_call"] <= 12:
                print("      in order: " + ", ".join(f"{n[:24]} {us:.0f}" for n, us in r["last_call"]), flush=True)
        out.write_text(json.dumps(report, indent=1))

    shapes = ((1024, 1024), (4096, 4096)) + (() if quick else ((4096, 11008),))
    for shape in (() if "--swiglu-only" in sys.argv else shapes):
        G = torch.randn(*shape, device=dev, generator=gen).to(dt)
        for name, mod in lv.items():
            record(f"newton_schulz {shape[0]}x{shape[1]}", name, lambda mod=mod: mod.newton_schulz(G))
        # Level 5's other wgmma versions than its default, by the kernels' entry
        from cuda_kernels import newton_schulz as k5
        for v in sorted(set(k5.GEMM_VERSION) - {k5.default_version()}):
            record(f"newton_schulz {shape[0]}x{shape[1]}", f"cuda v{v}",
                   lambda v=v: k5.newton_schulz(G, 5, 3.4445, -4.7750, 2.0315, 1e-7, version=v))

    M, d, H = 4096, 4096, 14336  # Llama 3 8B's MLP, 4096 tokens
    x = torch.randn(M, d, device=dev, generator=gen).to(dt).requires_grad_()
    wg = (torch.randn(H, d, device=dev, generator=gen) / d ** 0.5).to(dt).requires_grad_()
    wu = (torch.randn(H, d, device=dev, generator=gen) / d ** 0.5).to(dt).requires_grad_()
    wd = (torch.randn(d, H, device=dev, generator=gen) / H ** 0.5).to(dt).requires_grad_()
    dy = torch.randn(M, d, device=dev, generator=gen).to(dt)
    for name, mod in lv.items():
        def step(mod=mod):
            y = mod.swiglu_mlp(x, wg, wu, wd)
            torch.autograd.backward(y, dy)
            x.grad = wg.grad = wu.grad = wd.grad = None
        record("swiglu_mlp fwd+bwd llama3-8b", name, step)
    out.write_text(json.dumps(report, indent=1))
    print(f"wrote {out}", flush=True)


if __name__ == "__main__":
    main()
