"""Where a small Level 4 call's microseconds go, piece by piece.

    from equivalence.commands.host_probe import host_breakdown, recorded_breakdown
    host_breakdown("layer_norm")        # measured now: needs a CUDA GPU
    recorded_breakdown("layer_norm")    # the same table from reports/h100-host-probe.json

At a tiny shape a GPU runs a Level 4 kernel in a few microseconds; the call takes ten times
longer, and the difference is the host's: Python, the contract's validation, allocations,
autograd.Function.apply, and Triton's launch path. This module times each of those pieces
on its own, calls back to back, at the shapes `scripts/probe_host.py` always used (a
bfloat16 layer_norm of 148 rows of 64; an MLP 64 -> 256 -> 64 on 148 rows), so a live
breakdown and the recorded one can be read side by side.

What is measured, and how the pieces add up, is each component's own knowledge: its card's
HOST_PROBE["measure"] (functions that time the pieces into a Recorder) and
HOST_PROBE["layout"] (plain data); this module is the generic part: the timers, the
recorder, the JSON and the breakdown. Rows timed with every launch through kernel[grid]
("direct launches off") are measured in a child process started with
LEVELS_TRITON_FAST_LAUNCH=0 in its environment (the variable is read once, at import).

Two layers:

  probe(device)                 every raw measurement, keyed as in the recorded JSON
                                (what scripts/probe_host.py writes);
  host_breakdown(component)     the pieces of one call that add up to it (the remainder
                                named as such), the alternatives next to them, and the GPU's
                                own time for the call, each with what it is;
  recorded_breakdown(component) the same dict built from the recorded JSON.

Units: microseconds per call, medians. GPU rows: wall clock over batches of 50 calls with
one synchronize per batch (so a GPU that finishes each call before the CPU issues the next
adds nothing); CPU-only rows (validation, allocations, attribute reads): wall clock over
batches of calls, no synchronize. Timing needs a CUDA GPU without TRITON_INTERPRET: in
Triton's CPU interpreter a "launch" emulates the kernel in numpy, which says nothing about
a GPU's host path. Without one, `host_breakdown` raises HostProbeUnavailable with the
reason (`unavailable_reason` returns it without raising).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

import levels  # noqa: F401 - first: it switches Triton's interpreter on where there is no GPU

from .. import cards
from ..settings import REPOSITORY

ROOT = REPOSITORY
RECORDED = ROOT / "reports" / "h100-host-probe.json"
COMMAND = "PYTHONPATH=. python3 scripts/probe_host.py [OUTPUT.json]"
UNITS = ("microseconds per call: host time, calls back to back (GPU rows: one synchronize per "
         "batch of 50)")

# What turns "the host needs T us per call" into "the kernel needs longer above this size":
# each card's kernel rate at a large problem, measured on an H100 (an estimate: a kernel
# reaches that rate only at large sizes).
RATES_SOURCE = "reports/h100-bench.json, H100, bfloat16"


class HostProbeUnavailable(RuntimeError):
    """No CUDA GPU (or Triton's interpreter is on): there is no GPU host path to time."""


def unavailable_reason(device="cuda") -> str | None:
    """Why a live breakdown cannot be measured on `device` here, or None if it can."""
    device = torch.device(device)
    if not torch.cuda.is_available():
        return "no CUDA GPU here: torch.cuda.is_available() is False"
    if device.type != "cuda":
        return (f"the host probe times Level 4's CUDA launches, so it needs a CUDA device; "
                f"got {device}")
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        return ("TRITON_INTERPRET=1 in this process: Level 4 runs in Triton's CPU interpreter, "
                "whose launches are no GPU's")
    try:
        import triton  # noqa: F401
    except ImportError as exc:
        return f"triton is not installed ({exc})"
    return None


# ---------------------------------------------------------------------------------------
# Timers (medians)
# ---------------------------------------------------------------------------------------

def _host_us(fn, batch: int = 50, reps: int = 40) -> float:
    """Median us per call of fn(), calls back to back, one synchronize per batch. A fixed
    2000 calls rather than timing.time_host's 0.2 s budget: the pieces are subtracted from
    the whole call ("the rest"), and with time_host's fewer calls the H100 run put that
    difference at -10 us of a 39 us call (noise)."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    per = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(batch):
            fn()
        torch.cuda.synchronize()
        per.append((time.perf_counter() - t) * 1e6 / batch)
    return round(statistics.median(per), 2)


def _cpu_us(fn, batch: int = 100, reps: int = 20) -> float:
    """Median us per call of a host-only fn() (no GPU work to wait for)."""
    for _ in range(50):
        fn()
    per = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(batch):
            fn()
        per.append((time.perf_counter() - t) * 1e6 / batch)
    return round(statistics.median(per), 2)


def _kernel_us(fn, dev) -> float:
    """The GPU's own time for one call (the queue held by a GPU-side sleep while Python
    enqueues, equivalence.timing), so the host's pace is not in it."""
    from ..timing import time_fn

    return round(time_fn(fn, dev, min_time_s=0.2, prime=True).median_ms * 1e3, 2)


KERNEL_KEY = "GPU time of the call (queue primed)"


class Recorder:
    """What a card's measurements (its HOST_PROBE["measure"] functions) write into: only
    the keys asked for are measured, and a piece that fails is recorded as its error.

    A row measured with jit_launches=True times the call with every Level 4 launch through
    kernel[grid]. The direct launches are switched off by LEVELS_TRITON_FAST_LAUNCH=0, read
    once when triton_kernels.launch is imported, so such rows are measured in a process of
    their own started with it in its environment (`deferred` collects them; `in_jit_process`:
    this is that process, or one started so by the user, and they are measured here)."""

    def __init__(self, want: Callable[[str], bool], in_jit_process: bool = False):
        self.want, self.in_jit_process = want, in_jit_process
        self.r: dict = {}
        self.deferred: list[str] = []

    def wants(self, *keys) -> bool:
        return any(self.want(k) for k in keys)

    def host(self, key, fn, batch=50, jit_launches=False):
        if not self.want(key):
            return
        if jit_launches and not self.in_jit_process:
            self.deferred.append(key)
        else:
            self._do(key, lambda: _host_us(fn, batch=batch))

    def cpu(self, key, fn):
        if self.want(key):
            self._do(key, lambda: _cpu_us(fn))

    def gpu_time(self, fn, key=KERNEL_KEY):
        """The GPU's own time for the whole call (the breakdown's "kernel_us")."""
        if self.want(key):
            self._do(key, lambda: _kernel_us(fn, torch.device("cuda", torch.cuda.current_device())))

    def put(self, key, value):
        self.r[key] = value

    def failed(self, key, exc):
        self.r[f"{key} error"] = repr(exc)[:300]

    def _do(self, key, measure):
        try:
            self.r[key] = measure()
        except Exception as exc:  # noqa: BLE001 - one piece's failure must not hide the rest
            self.failed(key, exc)


# ---------------------------------------------------------------------------------------
# The measurements: each card's HOST_PROBE["measure"] {group: fn(rec, device)}, grouped by
# the recorded file's groups ("layer_norm", "mlp", "layer_norm_bwd")
# ---------------------------------------------------------------------------------------

def _measures() -> dict:
    """group -> the cards' functions that measure into it, in the cards' order; the groups
    named after a component first (the recorded file's order)."""
    groups: dict = {}
    for name in cards.names():
        for group, fn in cards.get(name).host_probe.get("measure", {}).items():
            groups.setdefault(group, []).append(fn)
    return dict(sorted(groups.items(), key=lambda item: item[0] not in cards.names()))


def _fast_launch_on() -> bool:
    from triton_kernels import launch

    return launch.ENABLED


def _measure(wanted: dict, dev) -> tuple[dict, dict]:
    """({group: {key: us}}, {group: [deferred keys]}) for the keys `wanted` ({group: set of
    keys, or None for all}); the rows timed through kernel[grid] are deferred where direct
    launches are on."""
    in_jit_process = not _fast_launch_on()
    raw, deferred = {}, {}
    measures = _measures()
    with torch.cuda.device(dev):
        for group, keys in wanted.items():
            rec = Recorder((lambda k: True) if keys is None else keys.__contains__, in_jit_process)
            for fn in measures.get(group, ()):
                fn(rec, dev)
            raw[group] = rec.r
            if rec.deferred:
                deferred[group] = rec.deferred
    return raw, deferred


JIT_PROCESS_TIMEOUT_S = 600


def _in_jit_process(deferred: dict, dev) -> dict:
    """The deferred rows, measured by this module in a child process whose environment has
    LEVELS_TRITON_FAST_LAUNCH=0 (the grader's way of switching direct launches off)."""
    import subprocess
    import sys

    env = dict(os.environ, LEVELS_TRITON_FAST_LAUNCH="0",
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    try:
        done = subprocess.run([sys.executable, "-m", __name__, str(dev), json.dumps(deferred)],
                              capture_output=True, text=True, env=env, cwd=ROOT,
                              timeout=JIT_PROCESS_TIMEOUT_S)
        lines = done.stdout.strip().splitlines()
        if done.returncode == 0 and lines:
            return json.loads(lines[-1])
        why = f"exit {done.returncode}: {(done.stderr or done.stdout).strip()[-300:]}"
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        why = repr(exc)[:300]
    return {group: {f"{key} error": f"the process without direct launches failed ({why})"
                    for key in keys} for group, keys in deferred.items()}


def _collect(wanted: dict, dev) -> dict:
    raw, deferred = _measure(wanted, dev)
    if deferred:
        for group, found in _in_jit_process(deferred, dev).items():
            raw.setdefault(group, {}).update(found)
    return raw


def _require(device) -> torch.device:
    reason = unavailable_reason(device)
    if reason:
        raise HostProbeUnavailable(f"host time of Level 4 cannot be measured here: {reason}. "
                                   f"The recorded breakdown is in {_shown(RECORDED)} "
                                   f"(recorded_breakdown()).")
    device = torch.device(device)
    return device if device.index is not None else torch.device("cuda", torch.cuda.current_device())


def probe(device="cuda") -> dict:
    """Every raw measurement, in the recorded file's shape: metadata, then per group
    ("layer_norm", "mlp", "layer_norm_bwd") {measurement: us}. GPU only."""
    from ..environment import describe

    dev = _require(device)
    env = describe(dev)
    res = {"command": COMMAND, "gpu": env.get("gpu"),
           "versions": f"torch {env['torch']}, triton {env['triton']}, Python {env['python']}",
           "date": env["date"][:10], "units": UNITS}
    res.update(_collect({group: None for group in _measures()}, dev))
    return res


# ---------------------------------------------------------------------------------------
# The breakdown: pieces that add up to one call, with what each one is
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Row:
    name: str
    what: str
    keys: tuple  # raw keys: one value, or (a, b) for a - b, or ("2x", key)
    group: str = ""  # the raw group, if not the component's own

    def value(self, raw: dict) -> float | None:
        src = raw.get(self.group) if self.group else raw.get("_own")
        src = src or {}
        if self.keys[0] == "2x":
            v = src.get(self.keys[1])
            return None if not isinstance(v, (int, float)) else round(2 * v, 2)
        vals = [src.get(k) for k in self.keys]
        if not all(isinstance(v, (int, float)) for v in vals):
            return None
        return round(vals[0] - sum(vals[1:]), 2)


@dataclass(frozen=True)
class _Layout:
    call: str
    shapes: str
    total: _Row
    eager: _Row
    pieces: tuple  # add up to total, with the remainder
    rest: str  # what the remainder is
    alternatives: tuple
    footnote: str = ""


def _row(spec: tuple) -> _Row:
    name, what, keys, *group = spec
    return _Row(name, what, tuple(keys), *group)


def layout(component: str) -> _Layout:
    """The card's HOST_PROBE["layout"] (plain data) as rows."""
    spec = cards.get(component).host_probe["layout"]
    return _Layout(call=spec["call"], shapes=spec["shapes"], total=_row(spec["total"]),
                   eager=_row(spec["eager"]), pieces=tuple(_row(r) for r in spec["pieces"]),
                   rest=spec["rest"], alternatives=tuple(_row(r) for r in spec["alternatives"]),
                   footnote=spec.get("footnote", ""))


# The components broken down piece by piece: those whose card lays a call out.
PROBED = tuple(c for c in cards.names() if "layout" in cards.get(c).host_probe)
LAYOUTS = {c: layout(c) for c in PROBED}


def _shown(path: Path) -> str:
    path = Path(path)
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def _assemble(component: str, raw: dict, meta: dict) -> dict:
    layout = LAYOUTS[component]
    own = {"_own": raw.get(component, {}), **raw}  # a row's keys: the component's own group

    def row(r: _Row) -> dict:
        # derived: a difference of two medians, so noise can make a small one negative
        derived = len(r.keys) > 1 and r.keys[0] != "2x"
        return {"name": r.name, "us": r.value(own), "what": r.what, "derived": derived}

    pieces = [row(r) for r in layout.pieces]
    total = row(layout.total)
    known = [p["us"] for p in pieces]
    rest = None
    if total["us"] is not None and all(v is not None for v in known):
        rest = round(total["us"] - sum(known), 2)
    pieces.append({"name": "the rest (call - the above)", "us": rest, "what": layout.rest,
                   "derived": True})
    errors = {k: v for k, v in raw.get(component, {}).items() if k.endswith(" error")}
    return {**meta, "component": component, "call": layout.call, "shapes": layout.shapes,
            "units": "us per call, medians, calls back to back", "total": total,
            "eager": row(layout.eager), "pieces": pieces,
            "alternatives": [row(r) for r in layout.alternatives],
            "footnote": layout.footnote,
            "kernel_us": raw.get(component, {}).get(KERNEL_KEY),
            "errors": errors, "raw": raw}


def _check_component(component: str) -> None:
    if component not in PROBED:
        raise ValueError(f"the host probe breaks down {', '.join(PROBED)}; got {component!r}")


def host_breakdown(component: str = "layer_norm", device="cuda") -> dict:
    """The host time of one small Level 4 call of `component`, measured now, piece by piece.

    Returns {"status": "measured", "gpu", "versions", "date", "call", "shapes",
    "total": {"name", "us", "what"}, "eager": {...}, "pieces": [{...}, ...] (they add up to
    total; the last is the remainder), "alternatives": [...] (not in the call),
    "kernel_us": the GPU's own time for the call, "errors": pieces that failed, "raw": the
    measurements}. Raises HostProbeUnavailable without a CUDA GPU (see unavailable_reason),
    ValueError for a component it does not cover (PROBED)."""
    _check_component(component)
    dev = _require(device)
    from ..environment import describe

    layout = LAYOUTS[component]
    rows = (layout.total, layout.eager, *layout.pieces, *layout.alternatives)
    wanted: dict[str, set] = {}
    for r in rows:
        keys = r.keys[1:] if r.keys[0] == "2x" else r.keys
        wanted.setdefault(r.group or component, set()).update(keys)
    wanted[component].add(KERNEL_KEY)
    raw = _collect(wanted, dev)
    env = describe(dev)
    meta = {"status": "measured", "source": "measured here, now", "gpu": env.get("gpu"),
            "versions": f"torch {env['torch']}, triton {env['triton']}, Python {env['python']}",
            "date": env["date"][:10], "command": f"host_breakdown({component!r})", "note": None}
    return _assemble(component, raw, meta)


def load_recorded(path=None) -> dict:
    """The recorded probe (reports/h100-host-probe.json); FileNotFoundError if missing."""
    path = Path(path or RECORDED)
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def recorded_breakdown(component: str = "layer_norm", path=None) -> dict:
    """host_breakdown's dict, built from the recorded JSON (status "recorded", its GPU,
    date and versions); FileNotFoundError if the file is missing."""
    _check_component(component)
    path = Path(path or RECORDED)
    raw = load_recorded(path)
    meta = {"status": "recorded", "source": _shown(path), "gpu": raw.get("gpu"),
            "versions": raw.get("versions"), "date": raw.get("date"),
            "command": raw.get("command"), "note": raw.get("note")}
    return _assemble(component, raw, meta)


def kernel_dominates_above(component: str, host_us: float) -> str | None:
    """How big the problem must be before the kernel needs longer than the host's `host_us`
    (at the H100 rate its card gives, RATES_SOURCE; an estimate: small kernels run below it)."""
    if host_us is None or host_us <= 0:
        return None
    estimate = cards.get(component).host_probe.get("kernel_dominates_above")
    return None if estimate is None else estimate(host_us, RATES_SOURCE)


def _main(argv) -> int:
    """python -m equivalence.commands.host_probe DEVICE '{group: [keys]}': measure those keys
    here and print them as JSON (what _in_jit_process starts, with direct launches off)."""
    dev = _require(argv[0])
    wanted = {group: set(keys) for group, keys in json.loads(argv[1]).items()}
    if _fast_launch_on():
        raise SystemExit("direct launches are on in this process: start it with "
                         "LEVELS_TRITON_FAST_LAUNCH=0 in its environment")
    raw, _ = _measure(wanted, dev)
    print(json.dumps(raw))
    return 0


__all__ = ["KERNEL_KEY", "LAYOUTS", "PROBED", "RECORDED", "HostProbeUnavailable", "Recorder",
           "host_breakdown", "kernel_dominates_above", "layout", "load_recorded", "probe",
           "recorded_breakdown", "unavailable_reason"]


if __name__ == "__main__":
    import sys

    sys.exit(_main(sys.argv[1:]))
