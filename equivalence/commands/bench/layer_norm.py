"""layer_norm speed goals: Triton forward >= 0.9x copy bandwidth and >= 1.0x
torch.compile, fp32 and bf16 at 16384x4096; backward >= 0.6x copy bandwidth counting the
bytes it must move (read x and dy, write dx).

The forward is also swept over (rows per program, warps) — figures named "forward sweep",
no goal — and the backward over (rows per iteration, warps, programs per SM), "backward
sweep": what the default tiling leaves on the table. Each tiling is an argument of the
launcher (triton_kernels/layer_norm.py `tiling`, `backward_tiling`), not a module setting. (A first bf16 run "missed" 0.9x
copy with bimodal timings; it was the CPU's enqueue time, hence PRIME below.)

Level 5: every version of cuda_kernels/layer_norm.cu side by side, level "cuda",
figures named "vN forward MxN" and "vN backward MxN", each with its TB/s, its ratio to the
copy bandwidth (the figure's baseline) and, in extra, its ratio to torch.compile timed in
the same run. Goals on the default version for the bench's x (v5 at 16384x4096: v3's
forward, its own backward): forward >= 0.9x copy and >= 1.0x torch.compile (a second figure
against compile), backward >= 0.85x copy by bytes moved (issue #28; 0.7x before it). A
version whose single call takes more than a second is not timed; its figure says so in
`notes`."""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

import levels
from ... import cards

from .goals import Figure, copy_tbps, figure


# Kernel time on both sides (equivalence.timing, prime=True): the backward's 0.2-0.4 ms of
# GPU work is shorter than Python + autograd need to enqueue it, so an end-to-end figure
# (kept in extra["end_to_end_ms"]) would time the CPU. The goals are bandwidth goals.
PRIME = True
LEVEL5_BWD_GOAL = 0.85  # Level 5's backward, fraction of copy (issue #28: every width)

SWEEP = ((1, 4), (1, 8), (2, 8), (2, 16), (4, 16))  # (BLOCK_M rows per program, num_warps)


def _sweep(ours, args, dtype, shp, device, nbytes, copy_ms, copy) -> list:
    """The forward at each SWEEP tiling, passed to the launcher (its arguments were
    validated by `ours`, the Level 4 call that makes the reference)."""
    import triton_kernels.layer_norm as kernels

    x, w, b, eps = args["x"], args["weight"], args["bias"], args["eps"]
    reference = ours()
    figs = []
    for block_m, warps in SWEEP:
        def pinned(tiling=(block_m, warps)):
            return kernels.layer_norm(x, w, b, eps, tiling=tiling)
        err = float((pinned().float() - reference.float()).norm() / reference.float().norm())
        figs.append(figure("layer_norm", f"forward sweep BLOCK_M={block_m} warps={warps}",
                           "triton", dtype, shp, pinned, device, nbytes=nbytes,
                           baseline=f"copy {copy:.2f} TB/s", baseline_ms=copy_ms,
                           extra={"rel_diff_vs_default_tiling": err}, prime=PRIME))
    return figs


BACKWARD_SWEEP = ((4, 16, 2), (1, 8, 4), (1, 8, 2), (1, 4, 4), (2, 8, 4), (2, 16, 2))
# (BLOCK_M rows per iteration, num_warps, programs per SM); the first is the default at
# 4096 wide, the second the default before the sweep was measured.


def _backward_sweep(y, leaves, eps, dy, dtype, shp, device, nbytes, copy_ms, copy) -> list:
    """The backward at each BACKWARD_SWEEP tiling: a forward per tiling that records it
    (the launcher's `backward_tiling` argument), then its backward timed as above."""
    import triton_kernels.layer_norm as kernels

    reference = torch.autograd.grad(y, leaves, dy, retain_graph=True)[0].float()
    figs = []
    for block_m, warps, per_sm in BACKWARD_SWEEP:
        y_pinned = kernels.layer_norm(*leaves, eps, backward_tiling=(block_m, warps, per_sm))

        def bwd(y_pinned=y_pinned):
            return torch.autograd.grad(y_pinned, leaves, dy, retain_graph=True)
        err = float((bwd()[0].float() - reference).norm() / reference.norm())
        figs.append(figure("layer_norm", f"backward sweep BLOCK_M={block_m} warps={warps} "
                           f"programs/SM={per_sm}", "triton", dtype, shp, bwd, device,
                           nbytes=nbytes, baseline=f"copy {copy:.2f} TB/s",
                           baseline_ms=copy_ms, extra={"rel_diff_vs_default_tiling": err},
                           prime=PRIME))
        del y_pinned
    return figs


def run(device) -> list:
    device = torch.device(device)
    card = cards.get("layer_norm")
    shape = card.sizes["bench"]
    triton_level = levels.get("triton")
    compiled_ln = torch.compile(F.layer_norm)
    figs = []
    for dtype in (torch.float32, torch.bfloat16):
        gen = torch.Generator().manual_seed(0)
        args = card.module.make_args(shape, dtype, device, gen)
        x, w, b, eps = args["x"], args["weight"], args["bias"], args["eps"]
        N = x.shape[-1]
        nbytes = card.min_bytes(args)
        copy = copy_tbps(x.numel() * x.element_size(), device, dtype, prime=PRIME)
        copy_fwd_ms = nbytes["fwd"] / (copy * 1e12) * 1e3
        copy_bwd_ms = nbytes["bwd"] / (copy * 1e12) * 1e3
        shp = {"M": x.numel() // N, "N": N}
        with torch.no_grad():
            ours = lambda: triton_level.layer_norm(x, w, b, eps)  # noqa: E731
            comp = lambda: compiled_ln(x, (N,), w, b, eps)  # noqa: E731
            f_comp = figure("layer_norm", f"forward {shp['M']}x{N}", "compile", dtype, shp, comp,
                            device, nbytes=nbytes["fwd"], notes="torch.compile(F.layer_norm)",
                            prime=PRIME)
            figs.append(figure("layer_norm", f"forward {shp['M']}x{N}", "triton", dtype, shp, ours,
                               device, nbytes=nbytes["fwd"], baseline=f"copy {copy:.2f} TB/s",
                               baseline_ms=copy_fwd_ms, goal=0.9,
                               extra={"copy_tbps": copy}, prime=PRIME))
            figs.append(figure("layer_norm", f"forward {shp['M']}x{N}", "triton", dtype, shp, ours,
                               device, nbytes=nbytes["fwd"], baseline="torch.compile(F.layer_norm)",
                               baseline_ms=f_comp.ms, goal=1.0, prime=PRIME))
            figs.append(f_comp)
            figs += _sweep(ours, args, dtype, shp, device, nbytes["fwd"], copy_fwd_ms, copy)
        xg, wg, bg = (t.detach().requires_grad_(True) for t in (x, w, b))
        y = triton_level.layer_norm(xg, wg, bg, eps)
        dy = torch.randn_like(y)
        bwd = lambda: torch.autograd.grad(y, (xg, wg, bg), dy, retain_graph=True)  # noqa: E731
        figs.append(figure("layer_norm", f"backward {shp['M']}x{N}", "triton", dtype, shp, bwd,
                           device, nbytes=nbytes["bwd"], baseline=f"copy {copy:.2f} TB/s",
                           baseline_ms=copy_bwd_ms, goal=0.6, extra={"copy_tbps": copy},
                           prime=PRIME))
        figs += _backward_sweep(y, (xg, wg, bg), eps, dy, dtype, shp, device, nbytes["bwd"],
                                copy_bwd_ms, copy)
        yc = compiled_ln(xg, (N,), wg, bg, eps)
        bwd_c = lambda: torch.autograd.grad(yc, (xg, wg, bg), dy, retain_graph=True)  # noqa: E731
        b_comp = figure("layer_norm", f"backward {shp['M']}x{N}", "compile", dtype, shp, bwd_c,
                        device, nbytes=nbytes["bwd"], notes="torch.compile(F.layer_norm)",
                        prime=PRIME)
        figs.append(b_comp)
        del y, yc
        if levels.status("cuda", device, "layer_norm") is None:
            figs += _cuda_figures(args, dy, dtype, shp, device, nbytes, copy, f_comp.ms, b_comp.ms)
        del xg, wg, bg
    return figs


# ------------------------------------------------------------------ Level 5 (CUDA C++) --

TOO_SLOW_S = 1.0  # a version slower than this per call is described, not timed


def _one_call_s(fn, device) -> float:
    fn()  # warm: allocator, first launch
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize(device)
    return time.perf_counter() - start


def _untimed(name, dtype, shp, seconds, notes) -> Figure:
    return Figure(component="layer_norm", name=name, level="cuda",
                  dtype=str(dtype).replace("torch.", ""), shape=dict(shp), ms=float("nan"),
                  spread_ms=(float("nan"), float("nan")),
                  notes=f"not timed: one call took {seconds:.2f} s (> {TOO_SLOW_S:g} s). {notes}",
                  extra={"one_call_s": seconds})


def _cuda_figures(args, dy, dtype, shp, device, nbytes, copy, compile_fwd_ms, compile_bwd_ms):
    """Every version of the Level 5 kernels, forward and backward, against the copy
    bandwidth and torch.compile measured in this run (kernel time, PRIME)."""
    import cuda_kernels.layer_norm as cuda_ln

    x, w, b, eps = args["x"], args["weight"], args["bias"], args["eps"]
    M, N = shp["M"], shp["N"]
    copy_fwd_ms = nbytes["fwd"] / (copy * 1e12) * 1e3
    copy_bwd_ms = nbytes["bwd"] / (copy * 1e12) * 1e3
    figs = []
    for v, idea in sorted(cuda_ln.VERSIONS.items()):
        best = v == cuda_ln.default_version(x)  # the goals are the default version's (for this x)
        notes = f"v{v}: {idea}"
        with torch.no_grad():
            fwd = lambda v=v: cuda_ln.layer_norm(x, w, b, eps, version=v)  # noqa: E731
            seconds = _one_call_s(fwd, device)
            name = f"v{v} forward {M}x{N}"
            if seconds > TOO_SLOW_S:
                figs.append(_untimed(name, dtype, shp, seconds, notes))
            else:
                f = figure("layer_norm", name, "cuda", dtype, shp, fwd, device,
                           nbytes=nbytes["fwd"], baseline=f"copy {copy:.2f} TB/s",
                           baseline_ms=copy_fwd_ms, goal=0.9 if best else None, notes=notes,
                           extra={"copy_tbps": copy, "compile_ms": compile_fwd_ms}, prime=PRIME)
                f.extra["ratio_vs_compile"] = compile_fwd_ms / f.ms
                figs.append(f)
                if best:
                    figs.append(figure("layer_norm", name, "cuda", dtype, shp, fwd, device,
                                       nbytes=nbytes["fwd"],
                                       baseline="torch.compile(F.layer_norm)",
                                       baseline_ms=compile_fwd_ms, goal=1.0, notes=notes,
                                       prime=PRIME))
        xg, wg, bg = (t.detach().requires_grad_(True) for t in (x, w, b))
        y = cuda_ln.layer_norm(xg, wg, bg, eps, version=v)
        bwd = lambda y=y, leaves=(xg, wg, bg): torch.autograd.grad(  # noqa: E731
            y, leaves, dy, retain_graph=True)
        seconds = _one_call_s(bwd, device)
        name = f"v{v} backward {M}x{N}"
        if seconds > TOO_SLOW_S:
            figs.append(_untimed(name, dtype, shp, seconds, notes))
        else:
            f = figure("layer_norm", name, "cuda", dtype, shp, bwd, device, nbytes=nbytes["bwd"],
                       baseline=f"copy {copy:.2f} TB/s", baseline_ms=copy_bwd_ms,
                       goal=LEVEL5_BWD_GOAL if best else None, notes=notes,
                       extra={"copy_tbps": copy, "compile_ms": compile_bwd_ms}, prime=PRIME)
            f.extra["ratio_vs_compile"] = compile_bwd_ms / f.ms
            figs.append(f)
        del y, xg, wg, bg
    return figs
