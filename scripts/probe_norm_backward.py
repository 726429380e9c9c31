"""Where Level 5's norm backwards spend their time: rms_norm's and layer_norm's default
backward (the fused row kernel, then sum_partials, the weight gradients' second stage) at a
few shapes, fp32 and bf16. Per case: the bench's figure (kernel time, queue primed, L2
flushed: equivalence.timing, as `levels bench` times it) as a fraction of a copy of the same
bytes (the card's min_bytes, as the bench counts them), and the profiler's time of every
kernel of the call (scripts/probe_kernel_split.py's `_split`).

    PYTHONPATH=. python3 scripts/probe_norm_backward.py OUT.json [--tag NAME]

Run it twice with LEVELS_CUDA_NVCC_FLAGS set to compare two builds in one device call (each
flag set builds its own cache): the tag names the build in the JSON.
Needs a CUDA GPU.
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

SHAPES = ((16384, 4096), (16384, 1024), (8192, 8192), (32768, 768), (4096, 4096))


def main():
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    from probe_kernel_split import _split

    import levels
    from equivalence import cards
    from equivalence.commands.bench.goals import copy_tbps
    from equivalence.timing import time_fn

    out = Path(sys.argv[1])
    tag = sys.argv[sys.argv.index("--tag") + 1] if "--tag" in sys.argv else "default"
    dev = torch.device("cuda")
    cuda = levels.get("cuda")
    report = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "tag": tag,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "cases": []}
    for component in ("rms_norm", "layer_norm"):
        card = cards.get(component)
        fn = getattr(cuda, component)
        for dtype in (torch.bfloat16, torch.float32):
            for M, N in SHAPES:
                args = card.module.make_args(dict(rows=(M,), N=N), dtype, dev,
                                             torch.Generator().manual_seed(0))
                # the card's differentiable arguments, in the call's order (x, weight[, bias])
                leaves = [args[n].detach().requires_grad_(True) for n in card.differentiable]
                eps = args["eps"]
                y = fn(*leaves, eps)
                dy = torch.randn_like(y)

                def bwd():
                    return torch.autograd.grad(y, leaves, dy, retain_graph=True)

                nbytes = card.min_bytes(args)["bwd"]
                x = args["x"]
                copy = copy_tbps(x.numel() * x.element_size(), dev, dtype, prime=True)
                t = time_fn(bwd, dev, prime=True)
                split = _split(bwd)
                ratio = nbytes / (t.median_ms * 1e-3) / 1e12 / copy
                case = {"component": component, "dtype": str(dtype).replace("torch.", ""),
                        "M": M, "N": N, "ms": t.median_ms, "p20_ms": t.p20_ms, "p80_ms": t.p80_ms,
                        "copy_tbps": copy,
                        "ratio_vs_copy": ratio, **split}
                report["cases"].append(case)
                kernels = ", ".join(f"{name[:40]} {us:.1f}" for name, us in
                                    list(split["kernels_us"].items())[:4])
                print(f"[{tag}] {component:10s} {case['dtype']:8s} {M:6d}x{N:<5d} "
                      f"{t.median_ms * 1e3:8.1f} us  {ratio:5.3f}x copy | span "
                      f"{split['span_us']:.1f} us: {kernels}", flush=True)
                out.write_text(json.dumps(report, indent=1))
    print(f"wrote {out}", flush=True)


if __name__ == "__main__":
    main()
