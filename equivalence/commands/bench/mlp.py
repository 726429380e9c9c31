"""mlp speed goals: bf16, linear -> GELU -> linear against eager PyTorch (cuBLAS addmm with
the bias, GELU as a kernel of its own, addmm), forward and forward+backward:

- Level 4 (Triton) >= 1.0x eager at the bench shape, M=8192, 4096 -> 16384 -> 4096;
- Level 5 (CUDA C++), its default version (cuda_kernels.mlp.default_version(): v6 on an
  H100, else v4), issue #28: forward >= 0.95x eager at the bench shape and >= 0.85x at a
  GPT-2-small-like M=1000, 768 -> 3072 -> 768; forward+backward >= 0.9x at both. Every other
  version of cuda_kernels/gemm.cu is timed beside it (the ladder side by side, no goal).

Each comparison (Level 4 and eager; at each Level 5 shape, eager and every version) is timed
in rounds (goals.figures_in_rounds): every side once a round, the order rotated. GEMMs this
long lower an H100's clock within seconds, so timed one after the other, eager first, the
baseline ran on a cooler GPU. A version whose single call takes over 1 s at a shape (v1,
perhaps v2, at the bench shape) is left out of the rounds (they would take minutes): its
figure is that one call, marked so, against the eager median of the rounds. Each version is
called as cuda_kernels.mlp.mlp(..., version=v), and version 4's tile shapes as
mlp_forward(..., version=4, tile=t): arguments, never the environment.

Sweeps, no goal, each against the eager forward's median from the rounds: Level 4's forward
over GEMM tile configs, each passed to the launcher as its `config` argument
(triton_kernels/mlp.py; figures named "forward sweep"), so the choice of autotune candidates
rests on measurements (SPLIT_N=2: the epilogue works on half a tile at a time, fewer
registers); and Level 5's version 4 with each of its tile shapes pinned."""

from __future__ import annotations

import sys

import torch

import levels
from ... import cards

from .goals import Figure, figure, figures_in_rounds, one_call_ms

BASELINE = "eager PyTorch (cuBLAS + GELU)"
LEVEL4_GOAL = 1.0  # Level 4 over eager, forward and forward+backward, at the bench shape
# Level 5's default version over eager (issue #28), by (what, shape label of LEVEL5_SHAPES)
LEVEL5_GOALS = {("forward", "bench"): 0.95, ("forward", "gpt2-small"): 0.85,
                ("forward+backward", "bench"): 0.9, ("forward+backward", "gpt2-small"): 0.9}

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
                               baseline=BASELINE, baseline_ms=eager_ms,
                               extra={"rel_diff_vs_autotuned": err}))
        except Exception as exc:  # e.g. out of shared memory: a measured "does not fit"
            print(f"mlp sweep {bm}x{bn} stages={stages} split={split} failed: "
                  f"{type(exc).__name__}: {str(exc)[:300]}", file=sys.stderr)
    return figs


def _eager_ms(figs, name) -> float | None:
    """The eager side's median from its rounds (None where it failed: no level has a ratio)."""
    return next((f.ms for f in figs if f.name == name and f.level == "native"), None)


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
    tensors = [args[n] for n in names]
    leaves = [t.detach().requires_grad_(True) for t in tensors]
    dy = torch.randn((shp["M"], shp["N"]), device=device, dtype=dtype)

    def forward(fn):
        return lambda: fn(*tensors)

    def step(fn):
        def go():
            out = fn(*leaves)
            torch.autograd.grad(out, leaves, dy)
        return go

    figs = []
    for what, wrap, fl, grad, notes in (
            ("forward", forward, flops["fwd"], False, "eager: cuBLAS addmm + GELU kernel + addmm"),
            ("forward+backward", step, flops["fwd"] + flops["bwd"], True,
             "eager: cuBLAS + GELU, autograd")):
        specs = [dict(component="mlp", name=what, level="native", dtype=dtype, shape=shp,
                      fn=wrap(native.mlp), flops=fl, notes=notes),
                 dict(component="mlp", name=what, level="triton", dtype=dtype, shape=shp,
                      fn=wrap(triton_level.mlp), flops=fl, baseline=BASELINE, against=0,
                      goal=LEVEL4_GOAL)]
        with torch.set_grad_enabled(grad):
            figs += figures_in_rounds(specs, device)
    with torch.no_grad():
        figs += _sweep(triton_level.mlp(*tensors), tensors, flops["fwd"], dtype, shp, device,
                       _eager_ms(figs, "forward"))
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

        def forward(fn):
            return lambda: fn(*tensors)

        def step(fn):
            def go():
                torch.autograd.grad(fn(*leaves), leaves, dy)
            return go

        for what, wrap, fl, grad, notes in (
                ("forward", forward, flops["fwd"], False,
                 "eager: cuBLAS addmm + GELU kernel + addmm"),
                ("forward+backward", step, flops["fwd"] + flops["bwd"], True,
                 "eager: cuBLAS + GELU, autograd")):
            with torch.set_grad_enabled(grad):
                figs += _level5_rounds(k5, f"{what} {label}", wrap, fl, notes,
                                       LEVEL5_GOALS[what, label], dtype, shp, device)
        figs += _v4_tile_sweep(k5, label, shp, tensors, flops["fwd"],
                               _eager_ms(figs, f"forward {label}"), device, dtype)
    return figs


def _level5_rounds(k5, name, wrap, flops, notes, goal, dtype, shp, device) -> list:
    """One comparison at one shape: eager and every version of gemm.cu, timed in rounds, the
    goal on the default version's figure. A version whose single call (its second: the first
    builds) takes over SLOW_CALL_S is left out of the rounds; that call is its figure."""
    default = k5.default_version()
    specs = [dict(component="mlp", name=name, level="native", dtype=dtype, shape=shp,
                  fn=wrap(levels.get("native").mlp), flops=flops, notes=notes)]
    slow, version_of = {}, {}  # version -> its one call's ms; figure name -> version
    for version in sorted(k5.VERSIONS):
        def ours(*t, version=version):  # the kernels' entry, this version (card's tensors: valid)
            return k5.mlp(*t, version=version)
        fn, version_of[f"{name} cuda v{version}"] = wrap(ours), version
        try:
            one_call_ms(fn, device)  # the build / first call
            single_ms = one_call_ms(fn, device)
        except Exception as exc:  # noqa: BLE001 - one failing version must not hide the others
            print(f"mlp bench: {name} cuda v{version} failed: "
                  f"{type(exc).__name__}: {str(exc)[:300]}", file=sys.stderr)
            continue
        if single_ms > SLOW_CALL_S * 1e3:
            slow[version] = single_ms
            continue
        specs.append(dict(component="mlp", name=f"{name} cuda v{version}", level="cuda",
                          dtype=dtype, shape=shp, fn=fn, flops=flops, baseline=BASELINE, against=0,
                          goal=goal if version == default else None))
    figs = figures_in_rounds(specs, device)
    base_ms = _eager_ms(figs, name)
    for version, ms in slow.items():
        g = goal if version == default else None
        ratio = base_ms / ms if base_ms else None
        figs.append(Figure(
            component="mlp", name=f"{name} cuda v{version}", level="cuda",
            dtype=str(dtype).replace("torch.", ""), shape=dict(shp), ms=ms, spread_ms=(ms, ms),
            tflops=flops / (ms * 1e-3) / 1e12, baseline=BASELINE, baseline_ms=base_ms,
            ratio=ratio, goal=g,
            met=(ratio >= g) if (g is not None and ratio is not None) else None,
            notes=f"one call > {SLOW_CALL_S:g} s: not timed repeatedly"))
    for fig in figs:
        if fig.name in version_of:
            v = version_of[fig.name]
            fig.extra |= {"version": v, "idea": k5.VERSIONS[v]}
    return sorted(figs, key=lambda f: f.extra.get("version", 0))  # eager, then the ladder in order


def _v4_tile_sweep(k5, label, shp, tensors, flops, eager_ms, device, dtype) -> list:
    """Version 4's forward with each tile shape pinned (mlp_forward's `tile` argument,
    gemm.cu's launch_v4): no goal, the measurements behind the automatic choice; against
    the eager forward's median from the rounds."""
    figs = []
    for tile, what in k5.V4_TILES.items():
        if tile == 0:
            continue  # "auto": the v4 forward figure above
        try:
            with torch.no_grad():
                figs.append(figure("mlp", f"forward {label} cuda v4 sweep tile={tile} {what}", "cuda",
                                   dtype, shp, lambda tile=tile: k5.mlp_forward(*tensors, version=4, tile=tile),
                                   device, flops=flops, baseline=BASELINE,
                                   baseline_ms=eager_ms, extra={"version": 4, "tile": tile}))
        except Exception as exc:  # noqa: BLE001 - e.g. a tile that does not fit: measured, reported
            print(f"mlp bench: v4 tile {tile} failed: {type(exc).__name__}: {str(exc)[:300]}",
                  file=sys.stderr)
    return figs
