"""mlp speed goal: bf16, M=8192, 4096 -> 16384 -> 4096, Triton >= 1.0x eager
PyTorch (cuBLAS GEMMs with the bias, GELU as its own kernel). Forward is the goal; forward
+ backward is reported against the same baseline.

The forward is also swept over GEMM tile configs, each passed to the launcher as its
`config` argument (triton_kernels/mlp.py) — figures named "forward sweep", no goal — so the
choice of autotune candidates rests on measurements (SPLIT_N=2: the epilogue works on half a
tile at a time, fewer registers).

Level 5 (CUDA C++): every version of cuda_kernels/gemm.cu side by side, forward
and forward+backward, each against the same eager baseline timed in this run (goal 0.7x
forward for the best version this GPU has: v5 (wgmma) on an H100, else v4); at the bench shape and at a GPT-2-like M=1000,
768 -> 3072 -> 768. A version whose single call takes over 1 s at a shape (v1, perhaps v2,
at the bench shape) is not timed repeatedly: its figure is that one call, marked so. Each
version is called as cuda_kernels.mlp.mlp(..., version=v), and version 4's tile shapes as
mlp_forward(..., version=4, tile=t): arguments, never the environment."""

from __future__ import annotations

import sys

import torch

import levels
from ... import cards

from .goals import Figure, figure, one_call_ms

SWEEP = (  # (BLOCK_M, BLOCK_N, num_stages, SPLIT_N); BLOCK_K=64, 8 warps, GROUP_M=8
    (128, 128, 3, 1), (128, 128, 4, 1), (128, 256, 3, 1), (128, 256, 3, 2), (256, 128, 3, 2),
    (128, 256, 4, 2))


def _sweep(reference, tensors, flops, dtype, shp, device, eager_ms) -> list:
    """The forward with every GEMM pinned to each SWEEP tile (the launcher's `config`
    argument; the tensors were validated by the Level 4 call that made `reference`)."""
    import triton_kernels.mlp as kernels

    figs = []
    for bm, bn, stages, split in SWEEP:
        config = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=64, GROUP_M=8, SPLIT_N=split, num_warps=8,
                      num_stages=stages)

        def pinned(config=config):
            return kernels.mlp(*tensors, config=config)
        try:
            err = float((pinned().float() - reference.float()).norm() / reference.float().norm())
            figs.append(figure("mlp", f"forward sweep {bm}x{bn}x64 stages={stages} split={split}",
                               "triton", dtype, shp, pinned, device, flops=flops,
                               baseline="eager PyTorch (cuBLAS + GELU)", baseline_ms=eager_ms,
                               extra={"rel_diff_vs_autotuned": err}))
        except Exception as exc:  # e.g. out of shared memory: a measured "does not fit"
            print(f"mlp sweep {bm}x{bn} stages={stages} split={split} failed: "
                  f"{type(exc).__name__}: {str(exc)[:300]}", file=sys.stderr)
    return figs


def run(device) -> list:
    device = torch.device(device)
    card = cards.get("mlp")
    shape = card.sizes["bench"]
    dtype = torch.bfloat16
    args = card.module.make_args(shape, dtype, device, torch.Generator().manual_seed(0))
    flops = card.flops(args)
    names = ("x", "w1", "b1", "w2", "b2")
    shp = {"M": args["x"].shape[0], "K": shape["K"], "hidden": shape["hidden"], "N": shape["N"]}
    triton_level, native = levels.get("triton"), levels.get("native")
    figs = []
    tensors = [args[n] for n in names]
    with torch.no_grad():
        eager = figure("mlp", "forward", "native", dtype, shp, lambda: native.mlp(*tensors), device,
                       flops=flops["fwd"], notes="eager: cuBLAS addmm + GELU kernel + addmm")
        figs.append(figure("mlp", "forward", "triton", dtype, shp,
                           lambda: triton_level.mlp(*tensors), device, flops=flops["fwd"],
                           baseline="eager PyTorch (cuBLAS + GELU)", baseline_ms=eager.ms, goal=1.0))
        figs.append(eager)
        figs += _sweep(triton_level.mlp(*tensors), tensors, flops["fwd"], dtype, shp, device,
                       eager.ms)
    leaves = [t.detach().requires_grad_(True) for t in tensors]
    dy = torch.randn((shp["M"], shp["N"]), device=device, dtype=dtype)

    def step(fn):
        def go():
            out = fn(*leaves)
            torch.autograd.grad(out, leaves, dy)
        return go

    eager_fb = figure("mlp", "forward+backward", "native", dtype, shp, step(native.mlp), device,
                      flops=flops["fwd"] + flops["bwd"], notes="eager: cuBLAS + GELU, autograd")
    figs.append(figure("mlp", "forward+backward", "triton", dtype, shp, step(triton_level.mlp),
                       device, flops=flops["fwd"] + flops["bwd"],
                       baseline="eager PyTorch (cuBLAS + GELU)", baseline_ms=eager_fb.ms, goal=1.0))
    figs.append(eager_fb)
    figs += _level5(device, card, dtype)
    return figs


# ---------------------------------------------------------------------------------------
# Level 5: the GEMM ladder
# ---------------------------------------------------------------------------------------

LEVEL5_SHAPES = {"bench": None, "gpt2-small": dict(rows=(1000,), K=768, hidden=3072, N=768)}
SLOW_CALL_S = 1.0


def _level5(device, card, dtype) -> list:
    reason = levels.status("cuda", device, "mlp")
    if reason:
        print(f"mlp bench: Level 5 skipped: {reason}", file=sys.stderr)
        return []
    import cuda_kernels.mlp as k5

    native = levels.get("native")
    figs = []
    for label, shape in LEVEL5_SHAPES.items():
        shape = shape or card.sizes["bench"]
        args = card.module.make_args(shape, dtype, device, torch.Generator().manual_seed(0))
        flops = card.flops(args)
        tensors = [args[n] for n in ("x", "w1", "b1", "w2", "b2")]
        M = args["x"].numel() // shape["K"]
        shp = {"M": M, "K": shape["K"], "hidden": shape["hidden"], "N": shape["N"], "shape": label}
        leaves = [t.detach().requires_grad_(True) for t in tensors]
        dy = torch.randn((M, shape["N"]), device=device, dtype=dtype)

        def step(fn):
            def go():
                torch.autograd.grad(fn(*leaves), leaves, dy)
            return go

        with torch.no_grad():
            base_f = figure("mlp", f"forward {label}", "native", dtype, shp, lambda: native.mlp(*tensors),
                            device, flops=flops["fwd"], notes="eager: cuBLAS addmm + GELU kernel + addmm")
        base_fb = figure("mlp", f"forward+backward {label}", "native", dtype, shp, step(native.mlp), device,
                         flops=flops["fwd"] + flops["bwd"], notes="eager: cuBLAS + GELU, autograd")
        figs += [base_f, base_fb]
        for version in sorted(k5.VERSIONS):
            def ours(*t, version=version):  # the kernels' entry, this version (card's tensors: valid)
                return k5.mlp(*t, version=version)
            for what, fn, fl, base, grad in (
                    ("forward", lambda: ours(*tensors), flops["fwd"], base_f, False),
                    ("forward+backward", step(ours), flops["fwd"] + flops["bwd"], base_fb, True)):
                name = f"{what} {label} cuda v{version}"
                goal = 0.7 if (what == "forward" and label == "bench" and version == k5.default_version()) else None
                try:
                    with torch.set_grad_enabled(grad):
                        single = one_call_ms(fn, device) / 1e3  # also the build / first call
                        single = one_call_ms(fn, device) / 1e3
                        if single > SLOW_CALL_S:
                            figs.append(Figure(
                                component="mlp", name=name, level="cuda", dtype=str(dtype).replace("torch.", ""),
                                shape=dict(shp), ms=single * 1e3, spread_ms=(single * 1e3, single * 1e3),
                                tflops=fl / single / 1e12, baseline="eager PyTorch (cuBLAS + GELU)",
                                baseline_ms=base.ms, ratio=base.ms / (single * 1e3), goal=goal,
                                met=(base.ms / (single * 1e3) >= goal) if goal else None,
                                notes=f"one call > {SLOW_CALL_S:g} s: not timed repeatedly",
                                extra={"version": version, "idea": k5.VERSIONS[version]}))
                            continue
                        figs.append(figure("mlp", name, "cuda", dtype, shp, fn, device, flops=fl,
                                           baseline="eager PyTorch (cuBLAS + GELU)", baseline_ms=base.ms,
                                           goal=goal, extra={"version": version, "idea": k5.VERSIONS[version]}))
                except Exception as exc:  # noqa: BLE001 - one failing version must not hide the others
                    print(f"mlp bench: {name} failed: {type(exc).__name__}: {str(exc)[:300]}", file=sys.stderr)
        figs += _v4_tile_sweep(k5, label, shp, tensors, flops["fwd"], base_f, device, dtype)
    return figs


def _v4_tile_sweep(k5, label, shp, tensors, flops, base, device, dtype) -> list:
    """Version 4's forward with each tile shape pinned (mlp_forward's `tile` argument,
    gemm.cu's launch_v4): no goal, the measurements behind the automatic choice."""
    figs = []
    for tile, what in k5.V4_TILES.items():
        if tile == 0:
            continue  # "auto": the v4 forward figure above
        try:
            with torch.no_grad():
                figs.append(figure("mlp", f"forward {label} cuda v4 sweep tile={tile} {what}", "cuda",
                                   dtype, shp, lambda tile=tile: k5.mlp_forward(*tensors, version=4, tile=tile),
                                   device, flops=flops, baseline="eager PyTorch (cuBLAS + GELU)",
                                   baseline_ms=base.ms, extra={"version": 4, "tile": tile}))
        except Exception as exc:  # noqa: BLE001 - e.g. a tile that does not fit: measured, reported
            print(f"mlp bench: v4 tile {tile} failed: {type(exc).__name__}: {str(exc)[:300]}",
                  file=sys.stderr)
    return figs
