"""Where a Level 4 forward+backward's host time goes, beyond eager's (diagnostic, GPU).

`levels bench --overhead` measured Level 4 at +297 us (layer_norm) to +430 us (conv_bn) of
host time per forward+backward over eager's, though its forward alone costs +6 to +33 us and
an empty autograd.Function costs ~8 us more than an aten op's node. This probe takes one
small layer_norm call apart, each variant timed the same way (calls back to back, a sync per
batch of 50, the median batch), so the difference between two rows is one piece's cost:

  eager                      F.layer_norm, the bar
  python node, aten body     an autograd.Function doing eager's aten ops: the node's cost
  L4 public                  levels.triton.layer_norm (validation cache, contiguous, apply)
  L4 Function                _LayerNorm.apply directly
  L4 forward, free backward  the real forward, a backward returning stored gradients
  backward body alone        the backward's two launches and allocations, no autograd
  ... single-threaded        the same under torch.autograd.set_multithreading_enabled(False):
                             the backward runs in the calling thread, no hand-off to the
                             device thread and back
  launch                     one layer_norm_fwd_kernel launch (direct path), alone

plus the timestamps of one call: grad() entered -> backward entered -> left -> grad() returned.

    PYTHONPATH=. python3 scripts/probe_backward_host.py     # JSON to $OUT/probe_backward_host.json
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import levels  # noqa: E402  first: Triton's interpreter switch
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

OUT = os.environ.get("OUT", "/tmp")
DEV = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.bfloat16 if DEV == "cuda" else torch.float32


def us(fn, min_s=0.3):
    """Median over batches of 50 back-to-back calls, one sync per batch (microseconds)."""
    for _ in range(3):
        fn()
    if DEV == "cuda":
        torch.cuda.synchronize()
    per, t_end = [], time.perf_counter() + min_s
    while time.perf_counter() < t_end or len(per) < 7:
        t0 = time.perf_counter()
        for _ in range(50):
            fn()
        if DEV == "cuda":
            torch.cuda.synchronize()
        per.append((time.perf_counter() - t0) / 50 * 1e6)
    per.sort()
    return {"median": round(per[len(per) // 2], 1), "p20": round(per[len(per) // 5], 1),
            "p80": round(per[(4 * len(per)) // 5], 1)}


def main():
    from triton_kernels import layer_norm as tln
    l4 = levels.get("triton")

    shape = (4, 37, 64)  # the tiny size's order: the host decides, not the GPU
    x = torch.randn(shape, device=DEV, dtype=DTYPE, requires_grad=True)
    w = torch.randn(shape[-1], device=DEV, dtype=DTYPE, requires_grad=True)
    b = torch.randn(shape[-1], device=DEV, dtype=DTYPE, requires_grad=True)
    g = torch.randn(shape, device=DEV, dtype=DTYPE)
    ins = [x, w, b]
    stored = [torch.randn_like(t) for t in ins]

    class AtenBody(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, b):
            y, mean, rstd = torch.ops.aten.native_layer_norm(x, [x.shape[-1]], w, b, 1e-5)
            ctx.save_for_backward(x, w, b, mean, rstd)
            return y

        @staticmethod
        def backward(ctx, dy):
            x, w, b, mean, rstd = ctx.saved_tensors
            return torch.ops.aten.native_layer_norm_backward(
                dy, x, [x.shape[-1]], mean, rstd, w, b, [True, True, True])

    class FreeBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, b):
            return tln._forward(x, w, b, 1e-5, save=True)[0]

        @staticmethod
        def backward(ctx, dy):
            return tuple(stored)

    def fb(f):
        return lambda: torch.autograd.grad([f()], ins, [g])

    rows = {
        "eager F.layer_norm": fb(lambda: F.layer_norm(x, (shape[-1],), w, b)),
        "python node, aten body": fb(lambda: AtenBody.apply(x, w, b)),
        "L4 public (levels.triton.layer_norm)": fb(lambda: l4.layer_norm(x, w, b)),
        "L4 Function (_LayerNorm.apply)": fb(lambda: tln._LayerNorm.apply(x, w, b, 1e-5, None, None)),
        "L4 forward, free backward": fb(lambda: FreeBackward.apply(x, w, b)),
        "L4 Function forward only (no grad call)": lambda: tln._LayerNorm.apply(x, w, b, 1e-5, None, None),
        "L4 no_grad forward (_forward)": lambda: tln._forward(x, w, b, 1e-5, save=False),
    }
    if DEV == "cuda":
        rows["L5 public (levels.cuda.layer_norm)"] = fb(lambda: levels.get("cuda").layer_norm(x, w, b))
    result = {"date": time.strftime("%Y-%m-%d %H:%M"), "torch": torch.__version__,
              "device": torch.cuda.get_device_name() if DEV == "cuda" else "cpu",
              "shape": list(shape), "dtype": str(DTYPE), "multithreaded": {}, "single_threaded": {}}
    for name, fn in rows.items():
        result["multithreaded"][name] = us(fn)
    with torch.autograd.set_multithreading_enabled(False):
        for name, fn in rows.items():
            result["single_threaded"][name] = us(fn)

    # One launch alone, and the backward body's pieces alone (no autograd around them).
    x2 = x.detach()
    y, _, stats = tln._forward(x2, w.detach(), b.detach(), 1e-5, save=True)

    class Ctx:
        saved_tensors = (x2, w.detach(), stats)
        x_shape = x.shape
        backward_tiling = None
    result["pieces"] = {
        "one forward launch (_forward, no_grad)": us(lambda: tln._forward(x2, w, b, 1e-5, save=False)),
        "backward body alone (2 launches, 3 allocations)": us(lambda: tln._LayerNorm.backward(Ctx, g)),
        "torch.empty_like": us(lambda: torch.empty_like(x2)),
    }

    # Timestamps of single calls: where the wall time of one fwd+bwd sits.
    marks = []

    class Marked(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, b):
            return tln._LayerNorm.forward(ctx, x, w, b, 1e-5)

        @staticmethod
        def backward(ctx, dy):
            t1 = time.perf_counter()
            out = tln._LayerNorm.backward(ctx, dy)
            marks.append((t1, time.perf_counter()))
            return out[:3]

    for threaded in (True, False):
        spans = []
        with torch.autograd.set_multithreading_enabled(threaded):
            for _ in range(300):
                t0 = time.perf_counter()
                yy = Marked.apply(x, w, b)
                ta = time.perf_counter()
                torch.autograd.grad([yy], ins, [g])
                t3 = time.perf_counter()
                t1, t2 = marks[-1]
                spans.append((ta - t0, t1 - ta, t2 - t1, t3 - t2))
        if DEV == "cuda":
            torch.cuda.synchronize()
        spans = spans[50:]
        med = [sorted(s[i] for s in spans)[len(spans) // 2] * 1e6 for i in range(4)]
        result["timeline_" + ("multithreaded" if threaded else "single_threaded")] = {
            "forward (apply)": round(med[0], 1), "grad() entered -> backward entered": round(med[1], 1),
            "backward body": round(med[2], 1), "backward left -> grad() returned": round(med[3], 1)}
    print(json.dumps(result, indent=1))
    with open(os.path.join(OUT, "probe_backward_host.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
