"""rope speed goals: Levels 4 and 5 (its default version) >= 0.9x a device copy's bandwidth,
forward and backward, fp32 and bf16, both layouts, at the card's bench size (4 x 32 heads x
4096 tokens x 128: q of a Llama-2-7B layer, four sequences), counting the bytes a call must
move (forward: read x, write y; backward: read dy, write dx; the tables once).

A rotation moves bytes and computes almost nothing, so the copy is the ceiling. Each figure
says in extra its ratio to the eager formula (HF's apply_rotary_pos_emb, op by op) timed in
the same run, and to torch.compile of Level 1's math. One more figure per dtype times x as q
sliced out of a fused (B, N, 3, H, D) qkv buffer (the layout a model hands over): no goal,
it shows what strided reads cost. Level 5: every version, goals on the default."""

from __future__ import annotations

import torch

import levels

from ... import cards
from .goals import copy_tbps, figure

PRIME = True  # kernel time: a small backward is shorter than its enqueue on the host
GOAL = 0.9


def _eager(card, args):
    """make(x) for the card's library call (the eager formula), its (N, D) tables built
    once per x, outside the timed call, as a model builds them once per step."""
    impl = card.libraries(args["x"].device, args["x"].dtype)[0]

    def make(x):
        call, _ = impl.prepare(args | {"x": x})
        return lambda: call()[0]
    return make


def _both(name, level, make, x, dtype, shp, device, nbytes, copy, others, goal, notes=""):
    """(forward, backward) figures of the call make(x)() against the copy's time for the
    same bytes; `others`: {label: (fwd_ms, bwd_ms)} timed in this run, ratios into extra."""
    copy_ms = nbytes / (copy * 1e12) * 1e3
    figs = []
    with torch.no_grad():
        f = figure("rope", f"{name} forward", level, dtype, shp, make(x), device,
                   nbytes=nbytes, baseline=f"copy {copy:.2f} TB/s", baseline_ms=copy_ms,
                   goal=goal, notes=notes, extra={"copy_tbps": copy}, prime=PRIME)
    figs.append(f)
    xg = x.detach().requires_grad_(True)
    y = make(xg)()
    dy = torch.randn_like(y)
    b = figure("rope", f"{name} backward", level, dtype, shp,
               lambda: torch.autograd.grad(y, xg, dy, retain_graph=True), device, nbytes=nbytes,
               baseline=f"copy {copy:.2f} TB/s", baseline_ms=copy_ms, goal=goal, notes=notes,
               extra={"copy_tbps": copy}, prime=PRIME)
    figs.append(b)
    for label, (fwd_ms, bwd_ms) in others.items():
        f.extra[f"ratio_vs_{label}"] = fwd_ms / f.ms
        b.extra[f"ratio_vs_{label}"] = bwd_ms / b.ms
    return figs


def run(device) -> list:
    device = torch.device(device)
    card = cards.get("rope")
    shape = card.sizes["bench"]
    L3, L4 = levels.get("compile"), levels.get("triton")
    cuda_ok = levels.status("cuda", device, "rope") is None
    figs = []
    for dtype in (torch.float32, torch.bfloat16):
        for variant, flags in card.variants.items():
            args = card.module.make_args(shape, dtype, device, torch.Generator().manual_seed(0))
            args.update(flags)
            cos, sin, inter = args["cos"], args["sin"], args["interleaved"]
            nbytes = card.min_bytes(args)["fwd"]  # the backward moves as much
            copy = copy_tbps(args["x"].numel() * args["x"].element_size(), device, dtype,
                             prime=PRIME)
            shp = dict(shape) | {"variant": variant}
            name = f"{variant} {'x'.join(str(shape[k]) for k in ('B', 'H', 'N', 'D'))}"
            baselines = _both(name, "eager", _eager(card, args), args["x"], dtype, shp, device,
                              nbytes, copy, {}, None,
                              notes="the eager formula (HF's apply_rotary_pos_emb)")
            compiled = _both(name, "compile", lambda x: lambda: L3.rope(x, cos, sin, inter),
                             args["x"], dtype, shp, device, nbytes, copy, {}, None)
            figs += baselines + compiled
            others = {"eager": (baselines[0].ms, baselines[1].ms),
                      "compile": (compiled[0].ms, compiled[1].ms)}
            figs += _both(name, "triton", lambda x: lambda: L4.rope(x, cos, sin, inter),
                          args["x"], dtype, shp, device, nbytes, copy, others, GOAL)
            if cuda_ok:
                import cuda_kernels.rope as kr

                for v, idea in sorted(kr.VERSIONS.items()):
                    figs += _both(f"v{v} {name}", "cuda",
                                  lambda x, v=v: lambda: kr.rope(x, cos, sin, inter, version=v),
                                  args["x"], dtype, shp, device, nbytes, copy, others,
                                  GOAL if v == kr.DEFAULT_VERSION else None, notes=f"v{v}: {idea}")
        # q sliced out of a fused qkv projection: strided reads, no goal
        strided = card.strided(card.module.make_args(shape, dtype, device,
                                                     torch.Generator().manual_seed(1)))
        q, cos, sin = strided["x"], strided["cos"], strided["sin"]
        qname = f"q of fused qkv {'x'.join(str(shape[k]) for k in ('B', 'H', 'N', 'D'))}"
        nbytes = card.min_bytes(strided)["fwd"]
        note = "x a strided view of a (B, N, 3, H, D) buffer"
        figs += _both(qname, "triton", lambda x: lambda: L4.rope(x, cos, sin), q, dtype,
                      dict(shape), device, nbytes, copy, {}, None, notes=note)
        if cuda_ok:
            import cuda_kernels.rope as kr

            figs += _both(qname, "cuda", lambda x: lambda: kr.rope(x, cos, sin), q, dtype,
                          dict(shape), device, nbytes, copy, {}, None, notes=note)
    return figs
