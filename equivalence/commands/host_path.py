"""`levels explain --level triton|cuda`: the host path before and after, as recorded on an H100
(Level 4's C++ replay, the third stage, on an H200).

What one small call cost the host at Levels 4 and 5 before the host-path work and after it
(`levels bench --overhead`, both runs committed), and what the whole GPT's training step does
eagerly and replayed as one CUDA graph (`levels train --cuda-graph`): the lesson that a kernel
win the host path eats is no win, with the numbers that taught it. Recorded numbers only: they
need no GPU, and they say which files they come from.
"""

from __future__ import annotations

import json
from pathlib import Path

from .. import cards

ROOT = Path(__file__).resolve().parents[2]
BEFORE = ROOT / "reports" / "h100-overhead-before-host-path.json"
AFTER = ROOT / "reports" / "h100-overhead.json"
# Level 4's launches replayed from C++ (triton_kernels/replay.py), on an H200 host
REPLAYED = ROOT / "reports" / "host-path-replay" / "overhead-replay.json"
TRAINED = ROOT / "reports" / "train" / "host-path"
# the training-table matrix (eager / --cuda-graph / --compile, with and without --amp), H200
MATRIX = ROOT / "reports" / "training-tables-2026-11-26"
# the GPT's step, host clock against GPU clock, and its eager table after the QKV GEMM, GEMM
# tiles by waves and layer norm's narrow-row backward (scripts/probe_step_timeline.py), H200s
TIMELINE = ROOT / "reports" / "host-path-timeline"
# issue #26's tables on one H100, after Inductor launched Level 4's kernels statically
H100_MATRIX = ROOT / "reports" / "training-tables-h100-2026-11-26"
# the same GPT table with the runs stepped in turn (levels train, the fifth session of 11-26)
INTERLEAVED = ROOT / "reports" / "training-interleaved" / "3-train-gpt-gpu.json"
TITLE = "The host path, before and after (recorded on an H100; Level 4's replay on an H200)"

WHAT_CHANGED = {
    "triton": ("The contract's validation runs once per argument signature (levels.contract.Plans: "
               "a dictionary lookup after that); each Triton kernel is launched through its "
               "compiled launcher once its specialization is known (@fast_launch, written "
               "kernel[grid](...)); no statistics or log-sum-exp are stored when no backward will "
               "read them. What was left after that was the Python autograd.Function: its "
               "backward allocates and launches 2 to 8 kernels at ~10 us of Triton's own "
               "launcher each. Then the replay: the first call of a signature records its "
               "launches in a dry pass, and later calls replay them from C++ with a C++ "
               "autograd node (triton_kernels/replay.py; the 'replayed' column, measured on an "
               "H200 host against eager there)."),
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
    replayed = _replayed(level)
    lines = [f"{component} at the tiny size, {after['settings']['dtype']}, host time per call, "
             f"calls back to back (in brackets: minus eager PyTorch's in the same run).",
             f"{'':18}{'before':>22}{'after':>22}" + (f"{'replayed':>22}" if replayed else "")
             + f"{'eager (after)':>16}"]
    eager = _row(after, component, "eager")
    for key, label in (("host_fwd", "forward"), ("host_fwd_bwd", "forward+backward")):
        lines.append(f"{label:18}{_cell(_row(before, component, level), key):>22}"
                     f"{_cell(_row(after, component, level), key):>22}"
                     + (f"{_cell(_row(replayed, component, level), key):>22}" if replayed else "")
                     + f"{_cell(eager, key).split(' (')[0]:>16}")
    lines += ["", WHAT_CHANGED.get(level, "")]
    gpt = _gpt_steps(level)
    if gpt:
        lines += ["", gpt]
    model = cards.get(component).host_path_note(level)  # a model of the component's own
    if model:
        lines += ["", model]
    files = [BEFORE, AFTER] + ([REPLAYED] if replayed else [])
    lines += ["", f"files: {', '.join(str(f.relative_to(ROOT)) for f in files)}, "
                  f"{TRAINED.relative_to(ROOT)}/ (levels bench --overhead; levels train --cuda-graph)"]
    return TITLE, "\n".join(lines)


def _replayed(level: str) -> dict | None:
    """The replay's `levels bench --overhead` run, for Level 4 (None elsewhere or unreadable)."""
    if level != "triton":
        return None
    try:
        return json.loads(REPLAYED.read_text())
    except (OSError, ValueError):
        return None


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
            f"its kernels does not." + _gpt_replayed(level) + _gpt_matrix(level)
            + _gpt_timeline(level) + _gpt_h100(level))


def _gpt_matrix(level: str) -> str:
    """This level against the torch-modules GPT in the training-table matrix, eager and as one
    CUDA graph (the GPU's time alone), one H200 host."""
    def ratio(name: str) -> float:
        runs = {r["name"]: r for r in json.loads((MATRIX / name).read_text())["runs"]}
        return runs[level]["timing"]["items_per_s"] / runs["torch"]["timing"]["items_per_s"]
    try:
        eager, graph = ratio("train-gpt-gpu.json"), ratio("train-gpt-gpu-cuda-graph.json")
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    replay = ", the replay on" if level == "triton" else ""
    return (f" In the training-table matrix ({MATRIX.relative_to(ROOT)}/, another H200 host"
            f"{replay}): this level {eager:.2f}x the torch-modules model eagerly, {graph:.2f}x "
            f"as CUDA graphs, where the host costs nothing and only the kernels count. Eager "
            f"ratios move with the host; the graphed one is the kernels' verdict.")


def _gpt_timeline(level: str) -> str:
    """Where this level's eager GPT step waits (the host's clock against the GPU's at the end
    of the backward) and its eager ratio to the torch-modules model, after the last changes."""
    try:
        rows = {r["run"]: r for r in json.loads(
            (TIMELINE / "timeline-gpt-3-qkv-tiles.json").read_text())["rows"]}
        bwd = rows[level]["marks_median"]["backward"]
        runs = {r["name"]: r for r in json.loads((TIMELINE / "train-gpt-gpu.json").read_text())["runs"]}
        ratio = runs[level]["timing"]["items_per_s"] / runs["torch"]["timing"]["items_per_s"]
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    bound = "GPU-bound" if bwd["gpu_ms"] > 1.2 * bwd["host_ms"] else "host-bound"
    return (f" After one QKV GEMM per layer, GEMM tiles chosen by waves and layer norm's "
            f"narrow-row backward ({TIMELINE.relative_to(ROOT)}/, scripts/probe_step_timeline.py, "
            f"no profiler on): the host had issued this level's backward {bwd['host_ms']:.1f} ms "
            f"into the step, the GPU finished it at {bwd['gpu_ms']:.1f} ms ({bound}); eagerly "
            f"{ratio:.2f}x the torch-modules model in that session's table.")


def _gpt_h100(level: str) -> str:
    """This level's GPT on one H100: eagerly against the torch-modules model, and compiled
    whole against the native level compiled whole."""
    def rate(name: str, run: str) -> float:
        runs = {r["name"]: r for r in json.loads((H100_MATRIX / name).read_text())["runs"]}
        return runs[run]["timing"]["items_per_s"]
    try:
        eager = rate("train-gpt-gpu.json", level) / rate("train-gpt-gpu.json", "torch")
        compiled = (rate("train-gpt-gpu-compile.json", level)
                    / rate("train-gpt-gpu-compile.json", "native"))
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    why = (" Inductor launched Level 4's kernels through Triton's Python launcher until "
           "triton_kernels/launch.py switched it to its static one (reports/compiled-static-"
           "launch/: 23.5 -> 14.3 ms of host time a compiled step)." if level == "triton" else "")
    return (f" On one H100 ({H100_MATRIX.relative_to(ROOT)}/): {eager:.2f}x the torch-modules "
            f"model eagerly, and compiled whole {compiled:.2f}x the native level compiled "
            f"whole.{why}" + _gpt_interleaved(level))


def _gpt_interleaved(level: str) -> str:
    """This level's eager GPT against the torch-modules model with the runs stepped in turn."""
    try:
        report = json.loads(INTERLEAVED.read_text())
        runs = {r["name"]: r for r in report["runs"]}
        ratio = runs[level]["timing"]["items_per_s"] / runs["torch"]["timing"]["items_per_s"]
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    return (f" With every run's step i taken before any run's step i + 1 (levels train steps "
            f"its runs in turn, so a drifting host drifts under all of them; "
            f"{INTERLEAVED.relative_to(ROOT)}): {ratio:.2f}x the torch-modules model eagerly.")


def _gpt_replayed(level: str) -> str:
    """The GPT eagerly with Level 4's replay (an H200 run of its own), for Level 4."""
    if level != "triton":
        return ""
    try:
        runs = {r["name"]: r for r in json.loads(
            (REPLAYED.parent / "train-gpt-gpu.json").read_text())["runs"]}
        mine, torch_ = (runs[n]["timing"]["items_per_s"] / 1e3 for n in ("triton", "torch"))
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    return (f" With the replay, eagerly (an H200 run of its own, "
            f"{REPLAYED.parent.relative_to(ROOT)}/train-gpt-gpu.json): this level {mine:.0f}k, the "
            f"torch-modules model {torch_:.0f}k tokens/s, {mine / torch_:.2f}x: no graph needed.")
