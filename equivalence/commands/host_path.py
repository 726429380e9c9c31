"""`levels explain --level triton|cuda`: the host path before and after, as recorded on an H100.

What one small call cost the host at Levels 4 and 5 before the host-path work and after it
(`levels bench --overhead`, both runs committed), and what the whole GPT's training step does
eagerly and replayed as one CUDA graph (`levels train --cuda-graph`): the lesson that a kernel
win the host path eats is no win, with the numbers that taught it. Recorded numbers only: they
need no GPU, and they say which files they come from.
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BEFORE = ROOT / "reports" / "h100-overhead-before-host-path.json"
AFTER = ROOT / "reports" / "h100-overhead.json"
TRAINED = ROOT / "reports" / "train" / "host-path"
TITLE = "The host path, before and after (recorded on an H100)"

WHAT_CHANGED = {
    "triton": ("The contract's validation runs once per argument signature (levels.contract.Plans: "
               "a dictionary lookup after that); each Triton kernel is launched through its "
               "compiled launcher once its specialization is known (@fast_launch, written "
               "kernel[grid](...)); no statistics or log-sum-exp are stored when no backward will "
               "read them. What is left is the Python autograd.Function: its backward allocates "
               "and launches 2 to 8 kernels at ~10 us of Triton's own launcher each."),
    "cuda": ("A call is one C++ op (cuda_kernels/autograd.cpp): the layout copies, the kernel ops "
             "and one C++ autograd node, where it used to be Python around the kernels with "
             "autograd through torch.library.register_autograd (a Python autograd.Function per "
             "call) and a toolchain check on every call; validation once per argument signature."),
}


def _row(report: dict, component: str, level: str) -> dict | None:
    return next((r for r in report["rows"]
                 if r["component"] == component and r["level"] == level and r["status"] == "ok"), None)


def _cell(row: dict | None, key: str) -> str:
    if row is None or not row.get(key):
        return "-"
    us = 1e3 * row[key]["median_ms"]
    extra = row.get(f"{key}_vs_eager_us")
    return f"{us:7.1f} us" + (f" ({extra:+.0f})" if extra is not None else "")


def section(component: str, level: str) -> tuple[str, str]:
    """(title, text): the before/after table of one component at Level 4 or 5, and the GPT's
    training step."""
    try:
        before, after = (json.loads(p.read_text()) for p in (BEFORE, AFTER))
    except (OSError, ValueError) as exc:
        return TITLE, f"the recorded runs could not be read ({type(exc).__name__}: {exc})"
    lines = [f"{component} at the tiny size, {after['settings']['dtype']}, host time per call, "
             f"calls back to back (in brackets: minus eager PyTorch's in the same run).",
             f"{'':18}{'before':>22}{'after':>22}{'eager (after)':>16}"]
    eager = _row(after, component, "eager")
    for key, label in (("host_fwd", "forward"), ("host_fwd_bwd", "forward+backward")):
        lines.append(f"{label:18}{_cell(_row(before, component, level), key):>22}"
                     f"{_cell(_row(after, component, level), key):>22}"
                     f"{_cell(eager, key).split(' (')[0]:>16}")
    lines += ["", WHAT_CHANGED.get(level, "")]
    gpt = _gpt_steps(level)
    if gpt:
        lines += ["", gpt]
    lines += ["", f"files: {BEFORE.relative_to(ROOT)}, {AFTER.relative_to(ROOT)}, "
                  f"{TRAINED.relative_to(ROOT)}/ (levels bench --overhead; levels train --cuda-graph)"]
    return TITLE, "\n".join(lines)


def _gpt_steps(level: str) -> str:
    """The GPT's training step at `level` and at native, eager and replayed as a CUDA graph."""
    try:
        runs = {mode: {r["name"]: r for r in json.loads((TRAINED / name).read_text())["runs"]}
                for mode, name in (("eager", "train-gpt-gpu.json"),
                                   ("graph", "train-gpt-gpu-cuda-graph.json"))}
    except (OSError, ValueError):
        return ""

    def rate(mode, name):
        r = runs[mode].get(name)
        return f"{r['timing']['items_per_s'] / 1e3:.0f}k" if r and r["status"] == "ok" else "-"
    return (f"The whole GPT (12 blocks, 8 x 1024 tokens, bf16), tokens/s: this level "
            f"{rate('eager', level)} eager, {rate('graph', level)} with every step replayed as one "
            f"CUDA graph; native {rate('eager', 'native')} / {rate('graph', 'native')}; the same "
            f"model from torch's own modules {rate('eager', 'torch')} / {rate('graph', 'torch')}. "
            f"A step the host cannot feed fast enough gains from the graph; one already bound by "
            f"its kernels does not.")
