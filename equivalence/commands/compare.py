"""`levels compare`: every component x every level, timed, then checked, in one report.

For each (component, level) the report holds the check results (every variant, at the
check size) and a profile (cold first call, steady-state forward and forward+backward,
peak GPU memory, achieved TFLOP/s and TB/s, and the break-even call count against
Level 1: how many calls before a compiler's start-up cost has paid for itself, "never"
for a level that is not faster in steady state). Each first call says whether it found
a warm on-disk cache: a second run of the same report is not a cold start.
A level that cannot run here is a row marked skipped, with its reason.

On a GPU, Level 5's library builds in a background thread from the start (`Level5Build`):
its nvcc work overlaps the rows before Level 5's first one, and that row's first call is
charged the build's seconds. Each row records where its wall time went (`wall_s`).

Every row is timed first, alone, one after the other; then every row is checked. On a GPU
Level 4's checks run in a few threads while the other levels' checks run in the main one
(`_check_rows`): they are Triton compiles (the checks use shapes the timing did not, so
each is a new specialization), which overlap well in threads, and nothing is timed
while they run. Level 3's checks stay in the main thread: Dynamo compiles one at a time,
and in processes of their own they were slower (measured on the H100: a fresh process
compiled the LSTM's check graphs in 31 s against 11 s in this warm one; 110 s in all
against 104 s).

Registered levels (`levels.register`) are rows after the five; your own functions are rows
too, for one component: `compare(["layer_norm"], fns={"mine": my_layer_norm})`.

Defaults are what a user of that device runs: bfloat16 on a GPU, float32 on a CPU (whose
bf16 GEMMs are emulated on most chips), and torch.compile's "default" mode: max-autotune
benchmarks dozens of GEMM/conv candidates per shape, minutes on a GPU, and is an option
(`compile_mode=`, `levels compare --compile-mode`) for "how fast can Inductor get?".
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch

import levels
from levels.contract import COMPONENTS

from .. import cards, environment
from ..check import (CheckResult, check_case, dtype_name, fresh_seed, own_targets,
                     poisoned_allocations, resolve_dtype)
from ..profile import Profile, break_even_calls, profile, speedup_spread
from ..settings import CompileMode, compile_mode as resolve_compile_mode, default_dtype, default_size
from .console import (BREAK_EVEN_SAME, COMPILE_MODE_HELP, EXIT_FAILED, EXIT_OK, HELP_FORMAT, Column,
                      Sheet, add_filters, fmt_break_even, fmt_first_call, fmt_ms, library_output_to,
                      log_note, progress, resolve_device, split_list)

# Seconds of timed calls per median (at least 10 calls whatever it takes): compare is the
# overview of 25 rows, `levels profile` (0.3 s) the closer look at one component. Measured
# on the H100, compare's 50 medians took 21 s of its cold run at 0.3 s each.
TIMING_S = 0.15


@dataclass
class Row:
    profile: Profile
    checks: list[CheckResult] = field(default_factory=list)
    break_even_calls: int | str | None = None
    speedup: tuple | None = None  # (p20-end, median, p80-end) of fwd+bwd against native
    # where this row's wall time went: the profile (first call and timing) and the checks
    seconds: dict = field(default_factory=dict)

    @property
    def checked(self) -> str:
        statuses = {c.status for c in self.checks}
        if not statuses or statuses == {"skip"}:
            return "skip"
        return "pass" if statuses <= {"pass"} else "FAIL"

    def to_dict(self) -> dict:
        return {**self.profile.to_dict(), "check": self.checked,
                "checks": [c.to_dict() for c in self.checks],
                "break_even_calls_vs_native": self.break_even_calls,
                "speedup_vs_native": self.speedup,
                "wall_s": {**{k: round(v, 2) for k, v in self.seconds.items()},
                           "profile_phases": self.profile.wall_s}}


def compare(components=None, level_names=None, dtype=None, device=None, size=None,
            check_size="small", seed=None, on_step=None, compile_mode: str | None = None, *,
            fns: dict | None = None) -> dict:
    """Run the comparison; `on_step(description)` is called before each unit of work.
    dtype None: bfloat16 on a GPU, float32 on a CPU. compile_mode: Level 3's mode for this
    run (default: the level's own, see settings.compile_mode); the level's own settings are restored afterwards.
    level_names None: the five levels, then the registered ones. fns: your functions
    ({name: function}) as rows after them, for one component (name it in `components`)."""
    device = torch.device(device) if device else environment.default_device()
    size = size or default_size(device)
    dtype = resolve_dtype(dtype or default_dtype(device))
    seed = fresh_seed() if seed is None else seed
    components = list(components or COMPONENTS)
    names = [levels.resolve(name).name for name in (level_names or levels.names())]
    own = []
    if fns is not None:
        if len(components) != 1:
            raise ValueError(f"fns= are functions of one component: pass components=[that one] "
                             f"(to compare code of several components, register a module of them "
                             f"with levels.register and name it in level_names); got components="
                             f"{components}")
        own = own_targets(components[0], fns)
    mode = resolve_compile_mode(compile_mode, device)
    prebuild = Level5Build.start(device) if "cuda" in names else None
    with CompileMode(mode if "compile" in names else None, device):
        rows = _rows(components, names + own, dtype, device, size, check_size, seed, on_step,
                     prebuild)
    return {"environment": environment.describe(device),
            "settings": {"components": components, "levels": names + [t.name for t in own],
                         "dtype": dtype_name(dtype),
                         "device": str(device), "size": size, "check_size": check_size,
                         "seed": seed, "compile_mode": mode},
            "rows": [r.to_dict() for r in rows]}


class Level5Build:
    """Level 5's library, built in a background thread from the moment compare starts.

    Its build is nvcc and ninja in subprocesses (~25 s cold on the H100's 16 cores): run
    first, it would hold up every row; run in a thread, it overlaps the rows before
    Level 5's first one, which are Python, Inductor's worker processes and the GPU. The
    cost is not hidden from the report: the first Level 5 row waits for the build to end
    before its first call, and that call's cost is the build's seconds plus the call's.
    Started only where Level 5 can run (a GPU, nvcc, ninja) and not yet loaded."""

    def __init__(self, device):
        from cuda_kernels import build

        self.build, self.charged = build, False
        self.thread = threading.Thread(target=self._run, args=(device,), daemon=True,
                                       name="levels-level5-build")
        self.thread.start()

    @classmethod
    def start(cls, device) -> Level5Build | None:
        device = torch.device(device)
        if device.type != "cuda" or levels.status("cuda", device) is not None:
            return None
        from cuda_kernels import build
        return None if build.loaded() else cls(device)

    def _run(self, device) -> None:
        try:
            self.build.load(device)
        except Exception:  # noqa: BLE001 - the build remembers its failure: Level 5's rows say it
            pass

    def charge(self, p: Profile) -> None:
        """Put the build into the first Level 5 row's first call (once)."""
        info = self.build.last_build()
        if self.charged or p.status != "ok" or not info:
            return
        self.charged = True
        p.first_call_ms += info["seconds"] * 1000
        p.first_call_cache = "warm" if info["cached"] else "cold"
        how = "loaded from" if info["cached"] else "compiled into"
        p.first_call_cache_detail = (f"built in the background while the rows before it ran: "
                                     f"{info['seconds']:.1f} s ({how} {info['dir']}); the first "
                                     f"call's time is that plus the call's own")


def _rows(components, targets, dtype, device, size, check_size, seed, on_step,
          prebuild: Level5Build | None = None) -> list[Row]:
    """One row per component and target: a level's name, or an OwnLevel (your function)."""
    rows: list[tuple[Row, str, object]] = []
    cases: dict = {}  # one draw of inputs for every level of a component (profile._case)
    for comp in components:
        native = None
        for target in targets:
            name = getattr(target, "name", target)
            if on_step:
                on_step(f"{comp} · {name}")
            start = time.perf_counter()
            if name == "cuda" and prebuild is not None:
                prebuild.thread.join()  # the build ends before the first call is timed
            row = Row(profile(comp, target, dtype, device, size, seed=seed, min_time_s=TIMING_S,
                              case_cache=cases))
            if name == "cuda" and prebuild is not None:
                prebuild.charge(row.profile)
            row.seconds["profile"] = time.perf_counter() - start
            if name == "native":
                native = row.profile
            elif native is not None:
                row.break_even_calls = break_even_calls(row.profile, native)
                row.speedup = speedup_spread(row.profile, native)
            rows.append((row, comp, target))
    _check_rows(rows, dtype, device, check_size, seed, on_step)
    return [row for row, _, _ in rows]


CHECK_THREADS = 4


def _threaded_checks(device) -> bool:
    from levels.triton import INTERPRETED

    return torch.device(device).type == "cuda" and not INTERPRETED


def _check_rows(rows, dtype, device, check_size, seed, on_step) -> None:
    """Every row's checks (each variant of the component), after all the timing.

    On a GPU, Level 4's run in CHECK_THREADS threads while the main thread runs the
    others' (see the module docstring). Threads share process-wide switches, so
    the poisoning (deterministic mode + fill_uninitialized_memory) is switched on once,
    around all of them: a check's own switch inside then finds it on and leaves it on,
    where one thread finishing would otherwise switch it off under another. Under Triton's
    CPU interpreter they stay sequential: it patches triton.language while a kernel runs."""
    threaded = _threaded_checks(device)

    def at(row):
        # an emulated level (Triton's interpreter) is checked at the size it can afford
        if row.profile.status == "untimed":
            row.profile.reason = f"checked at 'tiny', not timed: {row.profile.reason}"
            return "tiny"
        return check_size

    def run(comp, target, size, variant):
        start = time.perf_counter()
        return check_case(comp, target, dtype, device, size, variant, seed), \
            time.perf_counter() - start

    pending = []
    with poisoned_allocations(), ThreadPoolExecutor(CHECK_THREADS) as pool:
        for row, comp, target in rows:
            name = getattr(target, "name", target)
            if row.profile.status == "skip":
                continue
            size, variants = at(row), cards.get(comp).variants
            if threaded and name == "triton":  # one task per variant
                pending.append((row, comp, name, [pool.submit(run, comp, target, size, v)
                                                   for v in variants]))
                continue
            if on_step:
                on_step(f"check · {comp} · {name}")
            done = [run(comp, target, size, v) for v in variants]
            row.checks, row.seconds["check"] = [c for c, _ in done], sum(t for _, t in done)
        for row, comp, name, futures in pending:
            if on_step:
                on_step(f"check · {comp} · {name}")
            done = [f.result() for f in futures]
            # the threads' own seconds: they overlapped the other rows' checks
            row.checks, row.seconds["check"] = [c for c, _ in done], sum(t for _, t in done)


def save(report: dict, out_dir) -> tuple[Path, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path, png_path = out / "compare.json", out / "compare.png"
    json_path.write_text(json.dumps(report, indent=2))
    plot(report, png_path)
    return json_path, png_path


def plot(report: dict, path) -> Path:
    """compare.png: steady-state speed-up over native above first-call cost and break-even."""
    from ..plots import levels_figure
    return levels_figure(report["rows"], report["settings"], report["environment"], path)


# ---------------------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------------------

def print_report(report: dict, console) -> bool:
    """The table of a compare report (and what its columns mean); True if a row failed."""
    s = report["settings"]
    on_gpu = s["device"].startswith("cuda")
    # a CPU's achieved TFLOP/s and TB/s are in the JSON; `levels profile` puts them against
    # this CPU's own roofs, where they mean something
    rates = [Column("fwd\nTFLOP/s", "right"), Column("fwd\nTB/s", "right", under="fwd\nTFLOP/s")] \
        if on_gpu else []
    table = Sheet(f"levels compare — {s['dtype']}, time at '{s['size']}', check at "
                  f"'{s['check_size']}', {report['environment'].get('gpu') or 'CPU'}, "
                  f"torch.compile mode '{s['compile_mode']}'",
                  [Column("component"), Column("level"), Column("check", under="level"),
                   Column("first call"), Column("fwd ms", "right"),
                   Column("fwd+bwd ms", "right", under="fwd ms"), *rates,
                   Column("break-even\ncalls", "right")])
    failed = False
    for r in report["rows"]:
        check_style = {"pass": "green", "FAIL": "bold red", "skip": "yellow"}[r["check"]]
        failed |= r["check"] == "FAIL" or r["status"] == "error"
        tp = r["throughput"]["fwd"]
        cells = [r["component"], r["level"], f"[{check_style}]{r['check']}[/]",
                 fmt_first_call(r), fmt_ms(r["fwd"]), fmt_ms(r["fwd_bwd"])]
        if on_gpu:
            cells += [f"{tp['tflops']:.3g}" if tp else "—", f"{tp['tbps']:.3g}" if tp else "—"]
        table.add_row(*cells, fmt_break_even(r), note=r["reason"] or r["notes"])
    table.print(console)
    console.print("first call: cold = it compiled (its cache gained files), warm = it found its "
                  "work in the on-disk cache. break-even: calls until a level's first call is paid "
                  f"back by its faster steady state against native; never = slower; {BREAK_EVEN_SAME}")
    return failed


# ---------------------------------------------------------------------------------------

def add_parser(sub) -> None:
    p = sub.add_parser("compare", formatter_class=HELP_FORMAT,
                       help="check and time every component x level; writes compare.json/png/log",
                       description="For every component and level: time it (at --size): first call "
                                   "(compile/build, and whether it found a warm cache) separately from "
                                   "steady state, forward and forward+backward, peak GPU memory, "
                                   "break-even against native; then, every row timed, check it (at "
                                   "--check-size).\n"
                                   "Prints only a progress bar and the table; what libraries print "
                                   "(compiler logs, warnings) goes to compare.log next to the report.")
    add_filters(p, None, "timing size preset (default: small on CPU, bench on GPU)",
                "float32/fp32, float16/fp16, bfloat16/bf16 (default: bfloat16 on a GPU, float32 on a CPU)")
    p.add_argument("--check-size", default="small", help="size preset of the checks (default: small)")
    p.add_argument("--compile-mode", choices=("default", "max-autotune-no-cudagraphs"),
                   help=COMPILE_MODE_HELP)
    p.add_argument("--out", default="levels-reports",
                   help="directory for compare.json, compare.png and compare.log")
    p.set_defaults(run=run)


def run(args, console) -> int:
    comps = split_list(args.component, COMPONENTS, "component") or list(COMPONENTS)
    names = [levels.resolve(n).name for n in split_list(args.level) or levels.LEVEL_NAMES]
    device = resolve_device(args.device)
    dtype = (split_list(args.dtype) or [default_dtype(device)])[0]
    out = Path(args.out)
    log_path = out / "compare.log"
    with library_output_to(log_path, console) as quiet:
        steps = 2 * len(comps) * len(names)  # each row is timed, then (all timed) checked
        with progress(quiet, steps) as bar:
            task = bar.add_task("comparing", total=steps)
            first = [True]

            def step(description):
                if not first[0]:
                    bar.advance(task)
                first[0] = False
                bar.update(task, description=description)

            report = compare(comps, names, dtype, device, args.size, args.check_size,
                             args.seed, on_step=step, compile_mode=args.compile_mode)
            bar.advance(task)
        json_path, png_path = save(report, out)

    failed = print_report(report, console)
    console.print(f"wrote {json_path} and {png_path}; {log_note(log_path)}")
    return EXIT_FAILED if failed else EXIT_OK
