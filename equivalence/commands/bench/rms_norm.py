"""rms_norm speed goals (issue #30): Levels 4 and 5 at >= 0.9x copy bandwidth, forward and
backward, fp32 and bf16 at the card's bench size (16384x4096, a Llama-7B/8B width), counting
the bytes each direction must move (forward: read x, write y; backward: read x and dy,
write dx; the weight and dweight are noise).

Kernel time (equivalence.timing, prime=True) on every side, as layer_norm's bench does: the
backward's GPU work is shorter than Python + autograd need to enqueue it, so an end-to-end
figure would time the CPU (kept in extra["end_to_end_ms"]). Figures without a goal, for
scale: torch.compile of the Level 1 math and eager F.rms_norm (where torch has it), both
timed in the same run; each goal figure has its ratio to torch.compile in extra.

Level 5: every version of cuda_kernels/rms_norm.cu, named "vN forward MxN" / "vN backward
MxN"; the goals are the default version's. A version whose single call takes more than a
second is described, not timed."""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

import levels
import levels.native
from ... import cards

from .goals import Figure, copy_tbps, figure

PRIME = True
GOAL = 0.9  # of the copy bandwidth, forward and backward (issue #30)
TOO_SLOW_S = 1.0


def _one_call_s(fn, device) -> float:
    fn()  # warm: allocator, first launch, the Level 5 build
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize(device)
    return time.perf_counter() - start


def _grad_fn(y, leaves, dy):
    return lambda: torch.autograd.grad(y, leaves, dy, retain_graph=True)


class _Run:
    """One dtype's inputs, copy bandwidth and baselines; `pair` times one level's forward and
    backward against them."""

    def __init__(self, args, dtype, device, nbytes, copy):
        self.args, self.dtype, self.device = args, dtype, device
        self.nbytes, self.copy = nbytes, copy
        x = args["x"]
        self.shape = {"M": x.numel() // x.shape[-1], "N": x.shape[-1]}
        self.copy_ms = {d: nbytes[d] / (copy * 1e12) * 1e3 for d in ("fwd", "bwd")}
        self.dy = torch.randn_like(x)

    def leaves(self):
        return tuple(self.args[k].detach().requires_grad_(True) for k in ("x", "weight"))

    def one(self, name, level, fn, direction, goal, notes="", compile_ms=None) -> Figure:
        extra = {"copy_tbps": self.copy}
        if compile_ms is not None:
            extra["compile_ms"] = compile_ms
        f = figure("rms_norm", name, level, self.dtype, self.shape, fn, self.device,
                   nbytes=self.nbytes[direction], baseline=f"copy {self.copy:.2f} TB/s",
                   baseline_ms=self.copy_ms[direction], goal=goal, notes=notes, extra=extra,
                   prime=PRIME)
        if compile_ms is not None:
            f.extra["ratio_vs_compile"] = compile_ms / f.ms
        return f

    def untimed(self, name, level, seconds, notes) -> Figure:
        return Figure(component="rms_norm", name=name, level=level,
                      dtype=str(self.dtype).replace("torch.", ""), shape=dict(self.shape),
                      ms=float("nan"), spread_ms=(float("nan"), float("nan")),
                      notes=f"not timed: one call took {seconds:.2f} s (> {TOO_SLOW_S:g} s). "
                            f"{notes}",
                      extra={"one_call_s": seconds})

    def pair(self, level, call, prefix="", goal=GOAL, notes="", compiled=None) -> list:
        """Forward (no_grad) and backward of `call(x, weight, eps)`."""
        M, N, eps = self.shape["M"], self.shape["N"], self.args["eps"]
        x, w = self.args["x"], self.args["weight"]
        figs = []
        with torch.no_grad():
            fwd = lambda: call(x, w, eps)  # noqa: E731
            seconds = _one_call_s(fwd, self.device)
            name = f"{prefix}forward {M}x{N}"
            figs.append(self.untimed(name, level, seconds, notes) if seconds > TOO_SLOW_S else
                        self.one(name, level, fwd, "fwd", goal, notes,
                                 compiled and compiled["fwd"]))
        leaves = self.leaves()
        y = call(*leaves, eps)
        bwd = _grad_fn(y, leaves, self.dy)
        seconds = _one_call_s(bwd, self.device)
        name = f"{prefix}backward {M}x{N}"
        figs.append(self.untimed(name, level, seconds, notes) if seconds > TOO_SLOW_S else
                    self.one(name, level, bwd, "bwd", goal, notes, compiled and compiled["bwd"]))
        return figs


def run(device) -> list:
    device = torch.device(device)
    card = cards.get("rms_norm")
    compiled_math = torch.compile(levels.native.rms_norm_math)
    figs = []
    for dtype in (torch.float32, torch.bfloat16):
        args = card.module.make_args(card.sizes["bench"], dtype, device,
                                     torch.Generator().manual_seed(0))
        x = args["x"]
        r = _Run(args, dtype, device, card.min_bytes(args),
                 copy_tbps(x.numel() * x.element_size(), device, dtype, prime=PRIME))
        # for scale, no goal: what torch.compile and eager torch reach on the same bytes
        comp = r.pair("compile", lambda x, w, eps: compiled_math(x, w, eps), goal=None,
                      notes="torch.compile(levels.native.rms_norm_math)")
        compiled = {"fwd": comp[0].ms, "bwd": comp[1].ms}
        figs += comp
        if hasattr(F, "rms_norm"):
            figs += r.pair("library", lambda x, w, eps: F.rms_norm(x, (x.shape[-1],), w, eps),
                           goal=None, notes="eager F.rms_norm")
        figs += r.pair("triton", levels.get("triton").rms_norm, compiled=compiled)
        if levels.status("cuda", device, "rms_norm") is None:
            import cuda_kernels.rms_norm as cuda_rms

            for v, idea in sorted(cuda_rms.VERSIONS.items()):
                def call(x, w, eps, v=v):
                    return cuda_rms.rms_norm(x, w, eps, version=v)
                best = v == cuda_rms.DEFAULT_VERSION
                figs += r.pair("cuda", call, prefix=f"v{v} ", goal=GOAL if best else None,
                               notes=f"v{v}: {idea}", compiled=compiled)
    return figs
