"""`levels bench --suite models`: each level against the best library call, at the shapes
real models use (equivalence/shapes.py).

For every shape of the suite and each of its directions (forward for inference; forward and
forward+backward for training; conv_bn: eval forward and train forward+backward), in one
process:

  levels     Level 4 (Triton) and Level 5 (CUDA C++) on a GPU; each only where
             `levels.status(level, device, component)` is None, else recorded as skipped
             with that reason (never replaced by something else)
  libraries  the best call PyTorch offers for the component, the baseline a user would
             otherwise run (its card's `libraries`):
               attention   F.scaled_dot_product_attention with each fused backend pinned
                           (FLASH, EFFICIENT, CUDNN): each is timed where it runs, the
                           fastest is the baseline
               layer_norm  F.layer_norm, eager (one fused ATen kernel; torch.compile is a
                           level of ours, not the library baseline)
               mlp         F.linear -> F.gelu -> F.linear, eager (cuBLAS GEMMs with the bias,
                           GELU its own kernel)
               lstm        nn.LSTM (cuDNN's fused RNN on a GPU), weights copied in
               conv_bn     F.conv2d (cuDNN) then F.batch_norm, eval or train

Each side is timed as every bench figure is (equivalence/timing.py): its first call on its
own (for a level: JIT, autotuning, build at this new shape; with whether it found a warm
on-disk cache, as `levels profile` says it), then warm-up, then CUDA events around each
call with the L2 cache flushed, median and p20/p80. The ratio is best library median /
level median: above 1 the level is faster. Rates come from the card's FLOPs and minimum
bytes (TFLOP/s; TB/s where the card's RATE says so: layer_norm moves bytes rather than
computing).

That is end-to-end time: at a small shape, a call whose Python enqueues its kernels more
slowly than the GPU runs them is timed at the CPU's pace, which is what a user of the
function gets, and what the goals are judged on. On a GPU every side is also timed for
its kernels alone (`kernel_*`, time_fn(prime=True): the queue is held full so no call
waits for the CPU), and `kernel_ratio` compares those: where the two ratios differ, the
difference is host time per call, which CUDA graphs (levels.nn.cuda_graph) remove.

A level's forward output is compared with the library's at every shape: the harness checks
the levels at its presets, and a kernel that is fast but wrong at a new shape must not
count. Both are within their dtype's bound of the exact result if both are right, so they
must agree within the sum of the two bounds; a level that does not is marked `wrong`,
left out of every mean, and fails the run (exit 1).

The goals, per level, over the suite's ratios (each card's SUITE_GOAL): the geometric mean
per component >= 1.0 for attention, layer_norm, lstm and conv_bn eval, >= 0.9 for the mlp,
and no shape of those below 0.7 (conv_bn train is reported, without a goal: its card sets
conv_bn's on eval).

On a CPU there is nothing to measure that the goals speak of, so `--device cpu` is a smoke
run: the tiny twins of every shape, Levels 1 and 2 (and 3 with `--level compile`, minutes:
see CPU_LEVELS), against the same library calls on the CPU, in float32. It says so, and
where the recorded H100 report is.

Budget on an H100: 37 shapes, 63 shape x direction entries, at most 215 sides to time
(fewer where Level 5 has no kernels for a component). A side is timed for at least 10 and
at most MAX_RUNS calls, about MIN_TIME_S (0.1 s), after its first call and 2 warm-up
calls, twice on a GPU (end to end, then kernels): about two minutes. What dominates is the levels' first calls at each new shape (Triton's
autotuning and compiling: 2-18 s per component at the bench size on a cold cache in
reports/h100/compare.json): the report records each. The JSON is rewritten after every
shape, so a run cut short leaves every shape it finished, and `--resume` times only the
rest.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

import levels

from ... import cards, shapes
from ...calls import Impl, level_impl, own_args, upstream
from ...settings import RECORDED as RECORDED_REPORTS, CompileMode, compile_mode as level3_mode
from ...timing import time_fn
from ...tolerances import tolerance
from .reports import report_environment, write_report

SUITE = "models"
GPU_LEVELS = ("triton", "cuda")
# Level 3 is not in the CPU smoke run by default: it compiles anew at every shape, seconds
# to a minute each on a CPU (measured on 2 cores: 43 of the suite's entries took 686 s,
# each LSTM shape 20-80 s when Dynamo unrolled its whole time loop; it now compiles graphs
# of LSTM_CHUNK steps, fewer seconds, still one compile per shape). `--level compile` asks for it.
CPU_LEVELS = ("native", "torchscript")
CPU_DTYPE = "float32"  # what CPU users run, and what `levels compare` uses on a CPU

# The goals: the geometric mean of a group's ratios (each card's SUITE_GOAL), and the floor
# under every shape of a group that has a goal.
FLOOR = 0.7


def goals() -> dict[str, float]:
    """{group: goal} of every card that sets one: 'attention', ..., 'conv_bn eval'."""
    found = {}
    for component in cards.names():
        card = cards.get(component)
        for variant in card.variants:
            if card.goal(variant) is not None:
                found[card.goal_group(variant)] = card.goal(variant)
    return found

# Steady-state timing per side: the first call and WARMUP calls untimed, then batches of 10
# until MIN_TIME_S has passed, between 10 and MAX_RUNS calls. Medians settle within a few
# percent after 10 calls of a kernel; more buys little and the suite has ~200 sides to time.
MIN_TIME_S = {"cuda": 0.1, "cpu": 0.02}
WARMUP = 2
MAX_RUNS = 100

RECORDED = RECORDED_REPORTS / "h100-suite-models.json"


# ---------------------------------------------------------------------------------------
# What is timed: a level, or a library call, prepared on its own copy of the arguments
# ---------------------------------------------------------------------------------------

def library_impls(component: str, device, dtype) -> list[Impl]:
    """The library calls a level is measured against: the card's (see the module doc)."""
    return cards.get(component).libraries(device, dtype)


def eager_impl(component: str, device, dtype) -> Impl:
    """The library call a user writes without thinking about backends (the card's eager)."""
    return cards.get(component).eager(device, dtype)


# ---------------------------------------------------------------------------------------
# Timing one side in one direction
# ---------------------------------------------------------------------------------------

@dataclass
class FirstCall:
    """What `profile._timed_first_call` fills in: the same warm/cold test as `levels profile`."""
    first_call_ms: float | None = None
    first_call_cache: str | None = None
    first_call_cache_detail: str = ""


@dataclass
class Side:
    name: str
    kind: str  # "level" or "library"
    status: str  # "ok"; "skip" (cannot run here: reason); "error" (raised); "wrong" (disagrees)
    reason: str = ""
    median_ms: float | None = None
    p20_ms: float | None = None
    p80_ms: float | None = None
    runs: int | None = None
    method: str = ""
    first_call_ms: float | None = None
    first_call_cache: str | None = None
    tflops: float | None = None
    tbps: float | None = None
    ratio: float | None = None  # best library median / this median (levels only)
    ratio_spread: tuple | None = None  # the same over this side's p80 and p20
    # GPU: kernel time (timing.time_fn(prime=True): the queue is held full, so no call
    # waits for the CPU to enqueue it), and the ratio by it against the library with the
    # best kernel time. Where it differs from the ratio above, the host's time per call
    # is what separates the two sides.
    kernel_median_ms: float | None = None
    kernel_p20_ms: float | None = None
    kernel_p80_ms: float | None = None
    kernel_ratio: float | None = None
    rel_diff: float | None = None  # forward output vs the reference library's
    bound: float | None = None  # what rel_diff must stay within
    outputs: list = field(default_factory=list, repr=False)  # forward outputs, while needed

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "outputs"}


def _time_side(impl: Impl, args: dict, component: str, pass_: str, device: torch.device,
               seed: int, keep_outputs: bool) -> Side:
    from ...profile import _timed_first_call

    side = Side(impl.name, impl.kind, "ok")
    own = own_args(args, component, pass_ == shapes.FWD_BWD)
    caught = []
    try:
        with impl.context():
            # A library says why a backend cannot run in a warning before it raises (SDPA):
            # caught around the first call, to go into the reason; re-issued if all went well
            # (`levels bench` sends them to its log). Not around the timed calls: recording
            # a warning per call would be timed too.
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                call, inputs = impl.prepare(own)
                if pass_ == shapes.FWD:
                    def run():
                        with torch.no_grad():
                            return call()
                else:
                    grads = []

                    def run():
                        outs = call()
                        if not grads:
                            grads.extend(upstream(outs, seed))
                        torch.autograd.grad(outs, inputs, grads)
                        return outs
                kept = []
                first = FirstCall()
                # a library's first call has no cache of ours to hit or miss: level name ""
                _timed_first_call(first, impl.name if impl.kind == "level" else "",
                                  lambda: kept.append(run()), device)
            for w in caught:
                warnings.showwarning(w.message, w.category, w.filename, w.lineno)
            side.first_call_ms, side.first_call_cache = first.first_call_ms, first.first_call_cache
            if keep_outputs:
                side.outputs = [o.detach() for o in kept[0]]
            kept.clear()
            t = time_fn(run, device, min_time_s=MIN_TIME_S[device.type], warmup=WARMUP,
                        max_runs=MAX_RUNS)
            k = None
            if device.type == "cuda":
                k = time_fn(run, device, min_time_s=MIN_TIME_S[device.type], warmup=WARMUP,
                            max_runs=MAX_RUNS, prime=True)
    except Exception as exc:  # noqa: BLE001 - recorded with its reason, never hidden
        side.status = "error" if impl.kind == "level" else "skip"
        why = [str(w.message).strip().splitlines()[0] for w in caught][:3]
        side.reason = f"{type(exc).__name__}: {str(exc).strip()[:400]}" + \
            (f" (warnings: {'; '.join(why)})" if why else "")
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return side
    side.median_ms, side.p20_ms, side.p80_ms = t.median_ms, t.p20_ms, t.p80_ms
    side.runs, side.method = t.runs, t.method
    if k is not None:
        side.kernel_median_ms, side.kernel_p20_ms, side.kernel_p80_ms = (
            k.median_ms, k.p20_ms, k.p80_ms)
    return side


def _rel_diff(got: list, ref: list) -> float:
    """The worst relative difference over the outputs (float64, on their device)."""
    if len(got) != len(ref):
        return math.inf
    worst = 0.0
    for a, b in zip(got, ref):
        if tuple(a.shape) != tuple(b.shape):
            return math.inf
        a64, b64 = a.to(torch.float64), b.to(torch.float64)
        diff = float(torch.linalg.vector_norm(a64 - b64))
        scale = float(torch.linalg.vector_norm(b64))
        worst = max(worst, diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf))
    return worst


# ---------------------------------------------------------------------------------------
# One shape, every direction
# ---------------------------------------------------------------------------------------

def direction_label(shape: shapes.Shape, variant: str, pass_: str) -> str:
    """'fwd', 'fwd+bwd', or with the variant where a shape's directions differ in it
    (conv_bn: 'eval fwd', 'train fwd+bwd')."""
    if len({v for v, _ in shape.directions}) > 1:
        return f"{variant} {pass_}"
    return pass_


def group_of(component: str, variant: str) -> str:
    """What a goal is set on: the component, or with a variant where its card sets goals per
    variant ('conv_bn eval')."""
    return cards.get(component).goal_group(variant)


def measure_shape(shape: shapes.Shape, level_names, device, *, tiny: bool, dtype=None,
                  seed: int = 0, on_side=None) -> list[dict]:
    """Every direction of one shape: a list of entries (see `run`)."""
    device = torch.device(device)
    dtype = getattr(torch, dtype or shape.dtype)
    card = cards.get(shape.component)
    entries = []
    for variant, pass_ in shape.directions:
        args = shapes.make_args(shape, variant, dtype, device, seed, tiny=tiny)
        fl, by = card.flops(args), card.min_bytes(args)
        work = fl["fwd"] + (fl["bwd"] if pass_ == shapes.FWD_BWD else 0)
        traffic = by["fwd"] + (by["bwd"] if pass_ == shapes.FWD_BWD else 0)
        label = direction_label(shape, variant, pass_)
        entry = {"component": shape.component, "shape": shape.name, "model": shape.model,
                 "source": shape.source, "description": shape.describe(tiny), "direction": label,
                 "variant": variant, "pass": pass_, "group": group_of(shape.component, variant),
                 "dtype": str(dtype).replace("torch.", ""), "tiny": tiny,
                 "sizes": {k: (list(v) if isinstance(v, tuple) else v)
                           for k, v in (shape.tiny() if tiny else shape.sizes).items()},
                 "flops": work, "min_bytes": traffic, "libraries": {}, "levels": {},
                 "best_library": None, "best_library_ms": None}
        keep = pass_ == shapes.FWD  # forward outputs are compared, level against library
        reference, reference_impl = None, None
        for impl in library_impls(shape.component, device, dtype):
            if on_side:
                on_side(f"{shape.component} · {shape.name} · {label} · {impl.name}")
            side = _time_side(impl, args, shape.component, pass_, device, seed + 1, keep)
            if reference is None and side.status == "ok" and keep:
                reference, reference_impl = side, impl
            entry["libraries"][impl.name] = side
        timed = [s for s in entry["libraries"].values() if s.status == "ok"]
        best = min(timed, key=lambda s: s.median_ms, default=None)
        if best is not None:
            entry["best_library"], entry["best_library_ms"] = best.name, best.median_ms
        for name in level_names:
            reason = levels.status(name, device, shape.component)
            if reason is None and getattr(levels.get(name), "INTERPRETED", False):
                reason = "Triton's CPU interpreter is an emulation, not a speed: run on a GPU"
            if reason:
                entry["levels"][name] = Side(name, "level", "skip", reason)
                continue
            if on_side:
                on_side(f"{shape.component} · {shape.name} · {label} · {name}")
            impl = level_impl(name, shape.component, device, dtype)
            side = _time_side(impl, args, shape.component, pass_, device, seed + 1, keep)
            if side.status == "ok" and reference is not None:
                side.rel_diff = _rel_diff(side.outputs, reference.outputs)
                side.bound = tolerance(dtype, impl.tf32) + tolerance(dtype, reference_impl.tf32)
                if not side.rel_diff <= side.bound:
                    side.status = "wrong"
                    side.reason = (f"its forward output differs from {reference.name}'s by "
                                   f"{side.rel_diff:.2e} (relative), more than the two dtype bounds "
                                   f"allow ({side.bound:.2e}): check it at this shape with "
                                   f"equivalence.check.check_args")
            side.outputs = []
            entry["levels"][name] = side
        for side in list(entry["libraries"].values()) + list(entry["levels"].values()):
            side.outputs = []
            if side.median_ms:
                seconds = side.median_ms * 1e-3
                side.tflops, side.tbps = work / seconds / 1e12, traffic / seconds / 1e12
            if side.kind == "level" and side.status == "ok" and best is not None:
                side.ratio = best.median_ms / side.median_ms
                side.ratio_spread = (best.median_ms / side.p80_ms, best.median_ms / side.p20_ms)
            fastest_kernels = min((lib.kernel_median_ms for lib in entry["libraries"].values()
                                   if lib.status == "ok" and lib.kernel_median_ms), default=None)
            if side.kind == "level" and side.status == "ok" and side.kernel_median_ms \
                    and fastest_kernels:
                side.kernel_ratio = fastest_kernels / side.kernel_median_ms
        entry["libraries"] = {k: s.to_dict() for k, s in entry["libraries"].items()}
        entry["levels"] = {k: s.to_dict() for k, s in entry["levels"].items()}
        entries.append(entry)
        del args
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return entries


# ---------------------------------------------------------------------------------------
# The goals: geometric mean and minimum per group and level
# ---------------------------------------------------------------------------------------

def geomean(values) -> float | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


def summarize(entries: list[dict], level_names) -> list[dict]:
    """Per level and group: how many entries, the geometric mean and the minimum of the
    ratios, the goal and floor, and a status:
      met            every entry timed and right, geomean >= goal and minimum >= FLOOR
      missed         a goal or the floor not reached, or an entry failed (error, wrong)
      incomplete     the ratios that exist reach the goals but some entries were not
                     timed (skipped here, or no library baseline ran): not a claim
      not evaluated  nothing of this group could be timed (the reason is given)
      no goal        reported only (conv_bn train)"""
    groups = list(dict.fromkeys(e["group"] for e in entries))
    out = []
    for level in level_names:
        for group in groups:
            mine = [e for e in entries if e["group"] == group and level in e["levels"]]
            if not mine:
                continue
            sides = [(e, e["levels"][level]) for e in mine]
            timed = [(e, s) for e, s in sides if s["status"] == "ok" and s["ratio"] is not None]
            failed = [(e, s) for e, s in sides if s["status"] in ("error", "wrong")]
            # skipped here, or timed with no library to compare against
            untimed = [(e, s) for e, s in sides if s["status"] == "skip" or
                       (s["status"] == "ok" and s["ratio"] is None)]
            card = cards.get(mine[0]["component"])
            goal = card.goal(mine[0]["variant"])
            row = {"level": level, "group": group, "entries": len(mine), "timed": len(timed),
                   "failed": [f"{e['shape']} {e['direction']}: {s['status']}" for e, s in failed],
                   "untimed": [f"{e['shape']} {e['direction']}: {s['reason'] or 'no library baseline ran'}"
                               for e, s in untimed],
                   "geomean": geomean(s["ratio"] for _, s in timed), "min": None, "min_at": None,
                   # the same by kernel time (GPU): what the host's time per call costs
                   "kernel_geomean": geomean(s.get("kernel_ratio") for _, s in timed),
                   "kernel_min": min((s["kernel_ratio"] for _, s in timed
                                      if s.get("kernel_ratio")), default=None),
                   "goal": goal, "floor": FLOOR if goal is not None else None,
                   "geomean_met": None, "floor_met": None, "below_floor": [], "note": ""}
            if timed:
                e_min, s_min = min(timed, key=lambda es: es[1]["ratio"])
                row["min"], row["min_at"] = s_min["ratio"], f"{e_min['shape']} {e_min['direction']}"
            if goal is not None and timed:
                row["geomean_met"] = row["geomean"] >= goal
                row["floor_met"] = row["min"] >= FLOOR
                row["below_floor"] = [f"{e['shape']} {e['direction']} {s['ratio']:.2f}×"
                                      for e, s in timed if s["ratio"] < FLOOR]
            if goal is None:
                row["status"], row["note"] = "no goal", card.no_goal(mine[0]["variant"])
            elif not timed and not failed:
                row["status"] = "not evaluated"
                row["note"] = untimed[0][1]["reason"] if untimed else ""
            elif failed or not (row["geomean_met"] and row["floor_met"]):
                row["status"] = "missed"
            elif untimed:
                row["status"] = "incomplete"
            else:
                row["status"] = "met"
            out.append(row)
    return out


# ---------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------

def compile_mode(level_names, device):
    """Level 3, where it is timed, in `levels compare`'s mode (a newcomer's default rather
    than minutes of max-autotune at every shape); `.mode` is None when it is not timed."""
    return CompileMode(level3_mode(None, device) if "compile" in level_names else None, device)


def run(device, level_names=None, components=None, patterns=None, *, tiny: bool | None = None,
        out_path=None, command: str = "", seed: int = 0, on_side=None, on_shape=None,
        resume: dict | None = None) -> dict:
    """Time the suite (see the module doc). Returns the report; with `out_path`, also writes
    it there as JSON after every shape, once something was measured (never an empty one).
    on_side(text) is called before each side is timed, on_shape(shape) after each shape.
    resume: an earlier report of this suite (one cut short): its entries are kept and its
    shapes not timed again, if it was measured on the same device with the same levels."""
    device = torch.device(device)
    on_gpu = device.type == "cuda"
    tiny = (not on_gpu) if tiny is None else tiny
    level_names = [levels.resolve(n).name for n in (level_names or
                                                     (GPU_LEVELS if on_gpu else CPU_LEVELS))]
    chosen = shapes.shapes(components, patterns)
    report = {
        "suite": SUITE, "command": command, "environment": report_environment(device),
        "settings": {"device": str(device), "levels": level_names, "tiny_twins": tiny,
                     "dtype": ("per shape: bfloat16 unless the shape says otherwise" if on_gpu
                               else CPU_DTYPE),
                     "min_time_s": MIN_TIME_S[device.type], "warmup": WARMUP,
                     "max_runs": MAX_RUNS, "seed": seed, "goals": goals(), "floor": FLOOR},
        "smoke": not on_gpu,
        "note": ("" if on_gpu else
                 "CPU smoke run: the tiny twins of the suite's shapes, in float32, against the "
                 "same library calls on this CPU. The suite's goals are GPU figures: run "
                 "`levels bench --suite models` on a GPU."),
        "complete": False, "shapes": [f"{s.component}/{s.name}" for s in chosen],
        "entries": [], "summary": [],
    }
    order = {(s.component, s.name): i for i, s in enumerate(chosen)}
    done = set()
    if resume is not None:
        done = _resumable(resume, report, chosen)
        report["entries"] = [e for e in resume["entries"] if (e["component"], e["shape"]) in done]
        report["resumed"] = {"from": resume["environment"].get("date"),
                             "command": resume.get("command"),
                             "shapes": sorted(f"{c}/{n}" for c, n in done)}
    start = time.perf_counter()
    with compile_mode(level_names, device) as mode:
        report["settings"]["compile_mode"] = mode.mode
        for shape in chosen:
            if (shape.component, shape.name) in done:
                if on_shape:
                    on_shape(shape)
                continue
            report["entries"] += measure_shape(shape, level_names, device, tiny=tiny,
                                               dtype=shape.dtype if on_gpu else CPU_DTYPE,
                                               seed=seed, on_side=on_side)
            report["entries"].sort(key=lambda e: order[(e["component"], e["shape"])])  # stable
            report["elapsed_s"] = time.perf_counter() - start
            if out_path is not None and measured(report):
                write_report(report, Path(out_path))
            if on_shape:
                on_shape(shape)
    report["summary"] = summarize(report["entries"], level_names)
    report["complete"] = True
    report["elapsed_s"] = time.perf_counter() - start
    if out_path is not None and measured(report):
        write_report(report, Path(out_path))
    return report


def _resumable(earlier: dict, report: dict, chosen) -> set:
    """The (component, shape) pairs an earlier report finished, once it is known to be
    comparable: same suite, device model, levels and sizes (else a usage error)."""
    if earlier.get("suite") != SUITE:
        raise ValueError(f"argument '--resume': the file at --out is no `--suite {SUITE}` report")
    mine, theirs = report["environment"], earlier.get("environment", {})
    for key, what in (("gpu", "GPU"), ("device", "device")):
        if mine.get(key) != theirs.get(key):
            raise ValueError(f"argument '--resume': the report at --out was measured on "
                             f"{what} {theirs.get(key)!r}, this run is on {mine.get(key)!r}")
    for key in ("levels", "tiny_twins"):
        if earlier["settings"].get(key) != report["settings"][key]:
            raise ValueError(f"argument '--resume': the report at --out has {key} = "
                             f"{earlier['settings'].get(key)!r}, this run {report['settings'][key]!r}")
    wanted = {(s.component, s.name): len(s.directions) for s in chosen}
    counts: dict = {}
    for e in earlier["entries"]:
        counts[(e["component"], e["shape"])] = counts.get((e["component"], e["shape"]), 0) + 1
    # a shape counts as done only with all of its directions (the file is written per shape)
    return {key for key, n in counts.items() if wanted.get(key) == n}


def measured(report: dict) -> bool:
    """Whether anything was timed: a report without a single figure is never written."""
    return any(s["status"] == "ok" for e in report["entries"]
               for s in list(e["libraries"].values()) + list(e["levels"].values()))


__all__ = ["CPU_LEVELS", "FLOOR", "GPU_LEVELS", "Side", "compile_mode", "eager_impl", "geomean",
           "goals", "group_of", "library_impls", "measure_shape", "measured", "run", "summarize"]
