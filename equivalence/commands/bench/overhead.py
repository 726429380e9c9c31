"""Where the microseconds go: what one call costs the host, per level and component.

At a tiny problem (each spec's `tiny` size) a GPU finishes a call's kernels long before the
CPU has issued the next call, so the time per call, calls back to back, is the host's work:
Python, the contract's validation, the dispatcher, autograd, and one launch per kernel. That
cost does not shrink with the problem, so it is the floor under every time a level reports,
and at a small shape (a decode step, a batch of one) it is the time. Level 4 once spent ~100 us
per call on a 4096x1023 layer_norm, against eager's ~43 us.

Per component and level, and for the eager library call (the yardstick, a user's default):

  host_fwd        forward under no_grad, calls back to back (timing.time_host)
  host_fwd_bwd    forward + backward, the same way
  kernel_fwd      GPU only: the same forward with the queue primed (timing.time_fn(prime=True)):
                  the GPU's own time, without waiting for the CPU
  gpu_ops_per_call  GPU only: kernels, memsets and copies one forward launches (torch.profiler)
  validate        the contract's validator (levels/contract.py validate_<component>) alone, on
                  the same arguments, measured once per component: every level calls it first,
                  so it is part of each level's host time (eager PyTorch checks in C++ instead)

`host - kernel` is the time per call the GPU sits idle waiting for the CPU. The goal
(the host path): a Level 4 or 5 call costs the host at most eager's + 10 us
forward and + 40 us forward+backward.

Interleaved, paired rounds. A host's speed drifts by more than these goals within seconds:
with each side timed in one block after the other, Level 4's layer_norm forward+backward
measured eager + 46 us in one H100 run and - 44 to + 2 us in four H200 runs of nearly the same
code (reports/training-tables-h100-2026-11-26/, reports/host-path-replay/). So the host times are
taken in ROUNDS rounds: each round times every side of a component (eager and each level)
for min_time_s / ROUNDS, the order rotated from round to round, and a side's `host_fwd` is
the median of its rounds' medians (p20/p80 across rounds). `*_vs_eager_us` is the median over
rounds of (this side's round median - eager's in the same round): a paired difference, so a
drift both sides see cancels. Its p20/p80 across rounds are kept beside it
(`*_vs_eager_p20_us`, `*_vs_eager_p80_us`); a goal reads the median, "unsettled" when it lies
between them (equivalence.timing.settled).

Then the same component at Level 1 and Level 4 replayed as a CUDA graph
(levels.nn.cuda_graph, GPU only), timed the same way: the report's `graph_rows` (the level
rows above stay in `rows`, as they were), each with `capture_fwd_ms`/`capture_fwd_bwd_ms`
(warm-up plus capture) and `host_fwd_vs_level_us` (graph minus the same level's un-graphed
call: negative means the graph saves that much per call). The activations (attention's q, k,
v; the LSTM's x, h0, c0; x elsewhere) are the graph's arguments, copied into it on every
call; the weights are a module's parameters, which the graph reads in place. A row whose
capture fails says so (status "skip", with the reason); on a CPU every graph row is skipped.

On a CPU the call is the host's work (there is no queue to wait on), so kernel_fwd and
gpu_ops_per_call are absent; Level 4 runs in Triton's interpreter there, an emulation whose
time means nothing, and Level 5 needs a GPU: both are listed as skipped with the reason.
"""

from __future__ import annotations

import contextlib
import statistics
import time

import torch

import levels
from levels.contract import COMPONENTS, VALIDATORS

from ... import cards
from ...calls import level_impl, own_args, upstream
from ...check import flatten
from ...timing import Timing, quantile, settled, time_fn, time_host
from ..console import (EXIT_FAILED, EXIT_NOTHING_RAN, EXIT_OK, Column, Sheet, library_output_to,
                       log_note, progress, resolve_device, split_list)
from .reports import output_path, report_environment, write_report
from .suite import compile_mode

# The host-path goals: a Level 4 or Level 5 call costs the host at most eager's + 10 us
# forward, + 40 us forward+backward (eager's own C++ autograd is the bar)
GOAL_EXTRA_US = 10.0
GOAL_EXTRA_FWD_BWD_US = 40.0
GOAL_LEVELS = ("triton", "cuda")
GRAPH_LEVELS = ("native", "triton")  # levels also timed replayed as a CUDA graph
GRAPH_NEEDS_CUDA = "CUDA graphs need a CUDA device"
GRAPH_SUFFIX = " + CUDA graph"
SIZE = "tiny"
EAGER = "eager"
MIN_TIME_S = 0.2  # per measurement: a tiny call is ~10-100 us, so thousands of calls
ROUNDS = 8  # interleaved rounds per measurement (see the module doc)


def _passes(impl, args: dict, component: str, seed: int):
    """(forward under no_grad, forward+backward) closures of one side (equivalence.calls.Impl) on
    its own copy of the arguments."""
    plain = own_args(args, component, training=False)
    call, _ = impl.prepare(plain)

    def forward():
        with torch.no_grad():
            return call()

    leaves = own_args(args, component, training=True)
    call_g, inputs = impl.prepare(leaves)
    if not cards.get(component).differentiable:  # forward only: its step is the forward
        return forward, forward
    grads = []

    def forward_backward():
        outs = call_g()
        if not grads:
            grads.extend(upstream(outs, seed))
        torch.autograd.grad(outs, inputs, grads)

    return forward, forward_backward


def _gpu_ops_per_call(fn, device: torch.device, calls: int = 5) -> float:
    """GPU operations (kernels, memsets, copies) one call of `fn` puts on the device."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize(device)
    # device-side events: kernels, memsets and copies (a record_function range drawn on the
    # GPU's timeline is an annotation, not work)
    return sum(1 for e in prof.events()
               if e.device_type == DeviceType.CUDA and not e.is_user_annotation) / calls


def _us(timing) -> float | None:
    return timing["median_ms"] * 1e3 if timing else None


def validation(component: str, args: dict, min_time_s: float) -> dict:
    """The contract's validator alone on `args`, calls back to back: the same function at
    every level (each calls it once, first), pure host work whatever the device."""
    return time_host(lambda: VALIDATORS[component](**args), "cpu", min_time_s=min_time_s).to_dict()


def _new_row(component: str, name: str) -> dict:
    return {"component": component, "level": name, "status": "ok", "reason": "",
            "host_fwd": None, "host_fwd_bwd": None, "kernel_fwd": None, "gpu_ops_per_call": None,
            "gpu_ops_note": "", "validate": None}


def _prepared_side(component: str, name: str, impl, args: dict, seed: int) -> dict:
    """A side ready to be timed: its row, its context and its two passes, each called once
    (first calls compile, JIT, build or capture: not what this measures). A side that raises
    here is an error row with the reason, timed no further."""
    side = {"row": _new_row(component, name), "context": impl.context, "passes": None}
    try:
        with impl.context():
            forward, forward_backward = _passes(impl, args, component, seed)
            forward()
            forward_backward()
        side["passes"] = {"host_fwd": forward, "host_fwd_bwd": forward_backward}
    except Exception as exc:  # noqa: BLE001 - recorded, never hidden
        _fail(side, exc)
    return side


def _fail(side: dict, exc: Exception) -> None:
    side["row"]["status"] = "error"
    side["row"]["reason"] = f"{type(exc).__name__}: {str(exc)[:400]}"
    side["passes"] = None


def _time_interleaved(sides: list[dict], device, min_time_s: float, rounds: int) -> None:
    """Host time of both passes of every side, in `rounds` rounds that each time every side
    for min_time_s / rounds, the order rotated each round (see the module doc). Each row gets
    `host_fwd`/`host_fwd_bwd` (the median of its rounds' medians, p20/p80 across rounds) and
    `host_fwd_rounds_ms`/`host_fwd_bwd_rounds_ms` (one median per round, in round order: what
    `_compare_with_eager` pairs)."""
    for key in ("host_fwd", "host_fwd_bwd"):
        medians = {id(s): [] for s in sides}
        calls = {id(s): 0 for s in sides}
        for r in range(rounds):
            shift = r % max(len(sides), 1)
            for side in sides[shift:] + sides[:shift]:
                if side["passes"] is None:
                    continue
                try:
                    with side["context"]():
                        t = time_host(side["passes"][key], device,
                                      min_time_s=min_time_s / rounds, warmup=2)
                except Exception as exc:  # noqa: BLE001 - recorded, never hidden
                    _fail(side, exc)
                    continue
                medians[id(side)].append(t.median_ms)
                calls[id(side)] += t.runs
        for side in sides:
            m = medians[id(side)]
            if side["passes"] is None or not m:
                continue
            side["row"][key] = Timing(
                statistics.median(m), quantile(m, 0.2), quantile(m, 0.8), calls[id(side)],
                f"wall clock, calls back to back; the median of {len(m)} rounds' medians, "
                f"rounds interleaved with the component's other sides").to_dict()
            side["row"][f"{key}_rounds_ms"] = m


def _time_gpu(side: dict, device, min_time_s: float) -> None:
    """On a GPU, the forward's kernel time (queue primed) and its GPU operations per call."""
    if device.type != "cuda" or side["passes"] is None:
        return
    row, forward = side["row"], side["passes"]["host_fwd"]
    try:
        with side["context"]():
            row["kernel_fwd"] = time_fn(forward, device, min_time_s=min_time_s, prime=True).to_dict()
            try:
                row["gpu_ops_per_call"] = _gpu_ops_per_call(forward, device)
            except Exception as exc:  # noqa: BLE001 - the count is extra: say why it is absent
                row["gpu_ops_note"] = f"torch.profiler failed: {type(exc).__name__}: {exc}"
    except Exception as exc:  # noqa: BLE001 - recorded, never hidden
        _fail(side, exc)


def _time_passes(row: dict, forward, forward_backward, device, min_time_s: float) -> None:
    """A CUDA-graph row's timing (one side, its rounds interleaved with nothing): both
    passes' host time and, on a GPU, the forward's kernel time and GPU operations. Raises
    what a pass raised."""
    side = {"row": row, "context": contextlib.nullcontext,
            "passes": {"host_fwd": forward, "host_fwd_bwd": forward_backward}}
    forward()  # first calls (compile, JIT, build, capture) are not what this measures
    forward_backward()
    _time_interleaved([side], device, min_time_s, ROUNDS)
    _time_gpu(side, device, min_time_s)
    if row["status"] != "ok":
        raise RuntimeError(row["reason"])


def _one_call(component: str, level: str, args: dict, training: bool) -> torch.nn.Module:
    """One component's function at `level` as a levels.nn module (what cuda_graph captures):
    its weights as parameters (requiring grad for a training pass), running statistics as
    buffers, constants fixed, the activations (the card's GRAPH_INPUTS) as forward's arguments."""
    from levels.nn import _Leveled

    card = cards.get(component)
    inputs = card.graph_inputs
    wants = set(card.differentiable) if training else set()

    class OneCall(_Leveled):
        def __init__(self):
            super().__init__(level)
            self.names, self.constants = [], {}
            for name, value in args.items():
                if name in inputs:
                    continue
                if not isinstance(value, torch.Tensor):
                    self.constants[name] = value
                elif name in card.buffers:
                    self.register_buffer(name, value.detach().clone())
                else:
                    self.register_parameter(name, torch.nn.Parameter(
                        value.detach().clone(), requires_grad=name in wants))
                if isinstance(value, torch.Tensor):
                    self.names.append(name)

        def forward(self, *tensors):
            kw = dict(zip(inputs, tensors), **self.constants)
            kw.update((name, getattr(self, name)) for name in self.names)
            return self._fn()(**kw)

    OneCall.component = component
    OneCall.__name__ = OneCall.__qualname__ = f"OneCall[{component}]"
    return OneCall()


def _graph_passes(component: str, name: str, args: dict, seed: int):
    """(forward, forward+backward, capture ms of each): the component at level `name` as a
    module, captured by levels.nn.cuda_graph twice (forward only under no_grad; with the
    backward), each on its own copy of the arguments."""
    from levels.nn import cuda_graph

    plain = own_args(args, component, training=False)
    inputs = [plain[n] for n in cards.get(component).graph_inputs]
    start = time.perf_counter()
    with torch.no_grad():
        fwd_graph = cuda_graph(_one_call(component, name, plain, False), *inputs, backward=False)
    capture_fwd_ms = (time.perf_counter() - start) * 1e3

    def forward():
        with torch.no_grad():
            return fwd_graph(*inputs)

    if not cards.get(component).differentiable:  # forward only: its step is the forward
        return forward, forward, capture_fwd_ms, capture_fwd_ms

    leaves = own_args(args, component, training=True)
    inputs_g = [leaves[n] for n in cards.get(component).graph_inputs]
    module = _one_call(component, name, leaves, True)
    start = time.perf_counter()
    bwd_graph = cuda_graph(module, *inputs_g, backward=True)
    capture_fwd_bwd_ms = (time.perf_counter() - start) * 1e3
    wrt = [t for t in inputs_g if t.requires_grad] + [p for p in module.parameters()
                                                      if p.requires_grad]
    grads = []

    def forward_backward():
        outs = flatten(bwd_graph(*inputs_g))
        if not grads:
            grads.extend(upstream(outs, seed))
        torch.autograd.grad(outs, wrt, grads)

    return forward, forward_backward, capture_fwd_ms, capture_fwd_bwd_ms


def measure_graph_row(component: str, name: str, args: dict, device: torch.device, seed: int,
                      min_time_s: float) -> dict:
    """Level `name` of `component` replayed as a CUDA graph (see the module doc)."""
    row = {"component": component, "level": name + GRAPH_SUFFIX, "graphed_level": name,
           "status": "ok", "reason": "", "host_fwd": None, "host_fwd_bwd": None,
           "kernel_fwd": None, "gpu_ops_per_call": None, "gpu_ops_note": "", "validate": None,
           "capture_fwd_ms": None, "capture_fwd_bwd_ms": None}
    if device.type != "cuda":
        return row | {"status": "skip", "reason": GRAPH_NEEDS_CUDA}
    reason = levels.status(name, device, component)
    if reason:
        return row | {"status": "skip", "reason": reason}
    try:
        forward, forward_backward, row["capture_fwd_ms"], row["capture_fwd_bwd_ms"] = \
            _graph_passes(component, name, args, seed)
    except Exception as exc:  # noqa: BLE001 - a level the graph cannot hold: said, not hidden
        return row | {"status": "skip",
                      "reason": f"capture failed: {type(exc).__name__}: {str(exc)[:400]}"}
    try:
        _time_passes(row, forward, forward_backward, device, min_time_s)
    except Exception as exc:  # noqa: BLE001 - recorded, never hidden
        row["status"], row["reason"] = "error", f"{type(exc).__name__}: {str(exc)[:400]}"
    return row


def measure(components=None, level_names=None, device="cpu", dtype=None, seed: int = 0,
            min_time_s: float = MIN_TIME_S, on_step=None) -> dict:
    """Every component x (eager, every level) at the tiny size; see the module doc."""
    device = torch.device(device)
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    names = [levels.resolve(n).name for n in (level_names or levels.LEVEL_NAMES)]
    graphed = [n for n in GRAPH_LEVELS if n in names]
    rows, graph_rows = [], []
    start = time.perf_counter()
    with compile_mode(names, device):
        for component in components or COMPONENTS:
            spec = cards.get(component)
            variant = next(iter(spec.variants))
            args = spec.case(SIZE, variant, dtype, device, seed).args
            shapes = {k: list(v.shape) for k, v in args.items() if isinstance(v, torch.Tensor)}
            validate = validation(component, args, min_time_s / 4)
            sides, own = [], []
            for name in [EAGER] + names:
                if on_step:
                    on_step(f"{component} · {name}")
                if name == EAGER:
                    impl = cards.get(component).eager(device, dtype)
                    side = _prepared_side(component, EAGER, impl, args, seed)
                    side["row"]["library"] = impl.name
                else:
                    reason = levels.status(name, device, component)
                    if reason is None and getattr(levels.get(name), "INTERPRETED", False):
                        reason = "Triton's CPU interpreter is an emulation, not a speed: run on a GPU"
                    if reason:
                        own.append({"component": component, "level": name, "status": "skip",
                                    "reason": reason})
                        continue
                    side = _prepared_side(component, name,
                                          level_impl(name, component, device, dtype), args, seed)
                    side["row"]["validate"] = validate  # part of the level's host time, not extra
                sides.append(side)
                own.append(side["row"])
            _time_interleaved(sides, device, min_time_s, ROUNDS)
            for side in sides:
                _time_gpu(side, device, min_time_s)
            rows += [row | {"variant": variant, "size": SIZE, "shapes": shapes} for row in own]
            for name in graphed:
                if on_step:
                    on_step(f"{component} · {name}{GRAPH_SUFFIX}")
                row = measure_graph_row(component, name, args, device, seed, min_time_s)
                graph_rows.append(row | {"variant": variant, "size": SIZE, "shapes": shapes})
    _compare_with_eager(rows)
    _compare_graphs(graph_rows, rows)
    return {"kind": "overhead", "environment": report_environment(device),
            "settings": {"device": str(device), "dtype": str(dtype).replace("torch.", ""),
                         "size": SIZE, "levels": names, "min_time_s": min_time_s, "seed": seed,
                         "rounds": ROUNDS, "goal_extra_us": GOAL_EXTRA_US,
                         "graph_levels": graphed},
            "rows": rows, "goals": goals(rows, device), "graph_rows": graph_rows,
            "elapsed_s": time.perf_counter() - start}


def _compare_graphs(graph_rows: list[dict], rows: list[dict]) -> None:
    """Each graph row against eager (as the level rows) and against its own level's
    un-graphed call (negative: the graph saves that many microseconds per call)."""
    _compare_with_eager([r for r in rows if r["level"] == EAGER] + graph_rows)
    level = {(r["component"], r["level"]): r for r in rows if r["status"] == "ok"}
    for r in graph_rows:
        base = level.get((r["component"], r["graphed_level"]))
        for key in ("host_fwd", "host_fwd_bwd"):
            ok = r["status"] == "ok" and base is not None and r.get(key) and base.get(key)
            r[f"{key}_vs_level_us"] = _us(r[key]) - _us(base[key]) if ok else None


def _compare_with_eager(rows: list[dict]) -> None:
    """Each row's host time minus eager's (same component), in microseconds: the median of
    the per-round differences where both were timed in the same rounds (the level rows; p20
    and p80 beside it), else the difference of the two medians (the CUDA-graph rows, timed
    on their own)."""
    eager = {r["component"]: r for r in rows if r["level"] == EAGER and r["status"] == "ok"}
    for r in rows:
        base = eager.get(r["component"])
        for key in ("host_fwd", "host_fwd_bwd"):
            ok = r["status"] == "ok" and base is not None and r.get(key) and base.get(key)
            mine, theirs = r.get(f"{key}_rounds_ms"), (base or {}).get(f"{key}_rounds_ms")
            paired = ok and "graphed_level" not in r and mine and theirs and len(mine) == len(theirs)
            if paired:
                diffs = [(a - b) * 1e3 for a, b in zip(mine, theirs)]
                r[f"{key}_vs_eager_us"] = statistics.median(diffs)
                r[f"{key}_vs_eager_p20_us"] = quantile(diffs, 0.2)
                r[f"{key}_vs_eager_p80_us"] = quantile(diffs, 0.8)
            else:
                r[f"{key}_vs_eager_us"] = _us(r[key]) - _us(base[key]) if ok else None
        k = r.get("kernel_fwd")
        r["gpu_idle_us"] = _us(r["host_fwd"]) - _us(k) if k and r.get("host_fwd") else None


def goals(rows: list[dict], device) -> list[dict]:
    """Levels 4 and 5: host time per call <= eager's + GOAL_EXTRA_US forward and
    + GOAL_EXTRA_FWD_BWD_US forward+backward, per component. A GPU goal: on a CPU none is
    evaluated."""
    if torch.device(device).type != "cuda":
        return []
    out = []
    for r in rows:
        if r["level"] not in GOAL_LEVELS:
            continue
        for key, what, goal in (("host_fwd", "fwd", GOAL_EXTRA_US),
                                ("host_fwd_bwd", "fwd+bwd", GOAL_EXTRA_FWD_BWD_US)):
            extra = r.get(f"{key}_vs_eager_us")
            lo, hi = r.get(f"{key}_vs_eager_p20_us"), r.get(f"{key}_vs_eager_p80_us")
            out.append({"component": r["component"], "level": r["level"], "pass": what,
                        "extra_us": extra, "extra_p20_us": lo, "extra_p80_us": hi, "goal_us": goal,
                        "status": ("not evaluated" if extra is None else
                                   "met" if extra <= goal else "missed"),
                        "settled": None if extra is None else settled(goal, lo, hi),
                        "reason": r.get("reason", "") if extra is None else ""})
    return out


# ---------------------------------------------------------------------------------------
# The command line (wired into `levels bench` by equivalence/commands/bench/__init__.py)
# ---------------------------------------------------------------------------------------

def add_overhead_arguments(parser) -> None:
    """`levels bench --overhead [--level L] [--component C] [--device D] [--out PATH]`."""
    parser.add_argument("--overhead", action="store_true",
                        help="per-call host overhead instead: every level and the eager library "
                             "call at the 'tiny' size, calls back to back (host time), the GPU's "
                             "own time, kernels per call and the validation's share, and Levels "
                             "1 and 4 replayed as a CUDA graph (levels.nn.cuda_graph; GPU only); "
                             "runs on a CPU too. --out: a .json path or a directory (default "
                             "reports/<gpu>-overhead.json; on a CPU levels-reports/cpu-overhead.json)")


def _fmt_us(value) -> str:
    return "—" if value is None else f"{value:.3g}"


def print_report(report: dict, console) -> None:
    from rich.markup import escape

    env, s = report["environment"], report["settings"]
    on_gpu = s["device"].startswith("cuda")
    cols = [Column("component"), Column("level"), Column("host fwd\nµs", "right"),
            Column("host\nfwd+bwd µs", "right", under="host fwd\nµs"),
            Column("vs eager\nfwd µs", "right"),
            Column("validation\nµs", "right", under="vs eager\nfwd µs")]
    if on_gpu:
        cols[4:4] = [Column("GPU fwd\nµs", "right"), Column("GPU\nops/call", "right", under="GPU fwd\nµs")]
    table = Sheet(f"levels bench --overhead — {env.get('gpu') or 'CPU'}, {s['dtype']}, size "
                  f"'{s['size']}', microseconds per call ("
                  + (f"median of {s['rounds']} interleaved rounds" if s.get("rounds") else "median")
                  + ", calls back to back)", cols)
    last = None
    for r in _display_order(report):
        if last is not None and r["component"] != last:
            table.add_section()
        last = r["component"]
        name = f"{r['level']} ({r['library']})" if r["level"] == EAGER else r["level"]
        if r["status"] != "ok":
            table.add_row(r["component"], escape(name), *["—"] * (len(cols) - 2),
                          note=f"{r['status']}: {r['reason']}",
                          style="yellow" if r["status"] == "skip" else "red")
            continue
        cells = [_fmt_us(_us(r["host_fwd"])), _fmt_us(_us(r["host_fwd_bwd"]))]
        if on_gpu:
            cells += [_fmt_us(_us(r["kernel_fwd"])),
                      "—" if r["gpu_ops_per_call"] is None else f"{r['gpu_ops_per_call']:.3g}"]
        vs = r.get("host_fwd_vs_eager_us")
        cells += ["" if r["level"] == EAGER else
                  ("—" if vs is None else f"{'+' if vs >= 0 else ''}{vs:.3g}"),
                  _fmt_us(_us(r["validate"]))]
        note = r.get("gpu_ops_note", "")
        if r.get("gpu_idle_us") is not None and r["gpu_idle_us"] > 0:
            note = (f"GPU idle {r['gpu_idle_us']:.3g} µs per call, waiting for the CPU " + note).strip()
        if "graphed_level" in r:
            note = (_graph_note(r) + " " + note).strip()
        table.add_row(r["component"], escape(name), *cells, note=note)
    table.print(console)
    if report["goals"]:
        g = Sheet(f"goal: a Level 4 or 5 call costs the host at most eager's + "
                  f"{GOAL_EXTRA_US:g} µs forward, + {GOAL_EXTRA_FWD_BWD_US:g} µs forward+backward",
                  ["component", "level", "pass", Column("level -\neager µs", "right"),
                   Column("p20 .. p80\nof rounds", "right"), Column("goal µs", "right"), "status"])
        style = {"met": "green", "missed": "bold red", "not evaluated": "yellow"}
        unsettled = 0
        for r in report["goals"]:
            lo, hi = r.get("extra_p20_us"), r.get("extra_p80_us")
            spread = "—" if lo is None or hi is None else f"{lo:+.3g} .. {hi:+.3g}"
            status = f"[{style[r['status']]}]{r['status']}[/]"
            if r.get("settled") is False:  # older reports have no "settled"
                status, unsettled = status + " [yellow](unsettled)[/]", unsettled + 1
            g.add_row(r["component"], r.get("level", "triton"), r["pass"], _fmt_us(r["extra_us"]),
                      spread, f"{r['goal_us']:g}", status)
        g.print(console)
        if unsettled:
            console.print(f"unsettled ({unsettled}): the goal lies between the rounds' p20 and p80, "
                          "so this run does not decide the row: run it again, on another machine "
                          "too, before reading it as met or missed.", markup=False, highlight=False)
    else:
        console.print("On a CPU the call is the host's work: these are the levels' whole costs at "
                      "the tiny size. The goals (Levels 4 and 5 <= eager + 10 µs forward, + 40 µs "
                      "forward+backward) are GPU figures.",
                      markup=False, highlight=False)


def _display_order(report: dict) -> list[dict]:
    """The level rows, each component's CUDA-graph rows right after its own."""
    graphs = report.get("graph_rows", [])
    out = []
    for i, r in enumerate(report["rows"]):
        out.append(r)
        following = report["rows"][i + 1]["component"] if i + 1 < len(report["rows"]) else None
        if following != r["component"]:
            out += [g for g in graphs if g["component"] == r["component"]]
    return out


def _graph_note(r: dict) -> str:
    """What a CUDA-graph row adds: its saving against its own level, and the capture's cost."""
    parts = []
    for key, what in (("host_fwd_vs_level_us", "fwd"), ("host_fwd_bwd_vs_level_us", "fwd+bwd")):
        if r.get(key) is not None:
            parts.append(f"{what} {'+' if r[key] >= 0 else ''}{r[key]:.3g} µs")
    text = f"vs {r['graphed_level']} un-graphed: {', '.join(parts)}." if parts else ""
    if r.get("capture_fwd_ms") is not None:
        text += (f" Capture {r['capture_fwd_ms']:.3g} ms (fwd), "
                 f"{r['capture_fwd_bwd_ms']:.3g} ms (fwd+bwd), warm-up included.")
    return text.strip()


def run_overhead(args, console) -> int:
    """`levels bench --overhead`: 0 when it ran, 1 when a level raised, 3 when nothing ran."""
    if getattr(args, "suite", None):
        raise ValueError("argument '--overhead': --suite and --overhead are two different runs; "
                         "pass one of them")
    device = resolve_device(args.device)
    comps = split_list(args.component, COMPONENTS, "component") or list(COMPONENTS)
    names = [levels.resolve(n).name for n in (split_list(getattr(args, "level", None)) or [])] or None
    json_path = output_path(args.out, device, "overhead")
    log_path = json_path.with_suffix(".log")
    chosen = names or levels.LEVEL_NAMES
    steps = len(comps) * (1 + len(chosen) + sum(n in chosen for n in GRAPH_LEVELS))
    with library_output_to(log_path, console) as quiet:
        with progress(quiet, steps) as bar:
            task = bar.add_task("overhead", total=steps)
            started = [0]

            def on_step(text):  # called as each step starts: the previous one is done
                bar.update(task, description=text, completed=started[0])
                started[0] += 1
            report = measure(comps, names, device, on_step=on_step)
        report["command"] = " ".join(["levels bench --overhead --device", device]
                                     + (["--component", args.component] if args.component else [])
                                     + (["--level", args.level] if getattr(args, "level", None)
                                        else []))
        measured = any(r["status"] == "ok" for r in report["rows"])
        if measured:
            write_report(report, json_path)
    if not measured:
        console.print(f"levels bench --overhead: nothing could be timed here, so nothing was "
                      f"written; {log_note(log_path)}", markup=False, highlight=False)
        return EXIT_NOTHING_RAN
    print_report(report, console)
    console.print(f"wrote {json_path}; {log_note(log_path)}", markup=False, highlight=False)
    return EXIT_FAILED if any(r["status"] == "error" for r in report["rows"]
                              + report["graph_rows"]) else EXIT_OK


__all__ = ["EAGER", "GOAL_EXTRA_FWD_BWD_US", "GOAL_EXTRA_US", "GOAL_LEVELS", "GRAPH_LEVELS", "add_overhead_arguments", "goals", "measure",
           "measure_graph_row", "print_report", "run_overhead"]
