"""Automatic level selection: the fastest level that passes the harness, measured once.

A decision is made per *class* of call:
    component, variant (causal / training), dtype, device (its name) and torch version,
    and the shape class: the main input's dimensions (and the second argument's, when it
    is a matrix or more: MLP width, attention keys, conv filters, LSTM hidden size), each
    rounded up to a power of two.
The first call of a class runs every level on those arguments: the check of
`equivalence.check` (forward and backward against the float64 reference), then, for the
levels that pass, the first call and the steady-state medians of forward and of
forward+backward. What was measured is kept in `<cache>/auto.json` (see
`equivalence.settings`); the decision is made from it on every lookup:

  - candidates: levels that are available here, not interpreted, and passed the check;
  - the pass that matters: forward+backward when grad is on and an input requires it,
    else forward;
  - every candidate within TIE (5%) of the fastest, or whose p20–p80 interval overlaps
    the fastest's, is as fast as the timing can tell, and the lowest rung of those wins
    (less code, no compile to wait for).

`levels select` prints the table behind a decision; `levels.auto` uses it on every call.
"""

from __future__ import annotations

import datetime
import inspect
import json
import os
import sys
from dataclasses import asdict, dataclass, field

import torch

import levels
import levels.auto

from . import cards
from .ceilings import device_name
from .check import check_args, dtype_name, fresh_seed
from .profile import _passes
from .logs import warnings_to
from .settings import Settings, current
from .timing import time_first_call, time_fn

TIE = 0.05
CANDIDATES: tuple[str, ...] = levels.LEVEL_NAMES  # in rung order: the tie-break prefers earlier
_MEMORY: dict[str, dict] = {}  # key -> cache entry, so a hot call never reads the file


@dataclass
class Measurement:
    level: str
    status: str  # "ok", "unavailable", "interpreted", "failed" (the check), "error"
    reason: str = ""
    first_call_ms: float | None = None
    fwd_ms: float | None = None
    fwd_bwd_ms: float | None = None
    # p20 and p80 of each pass: two levels whose intervals overlap are as fast as the timing
    # can tell (None in a decision kept before the spread was: the medians alone decide)
    fwd_spread: list | None = None
    fwd_bwd_spread: list | None = None

    def spread(self, passes: str) -> tuple[float, float]:
        t = getattr(self, f"{passes}_ms")
        return tuple(getattr(self, f"{passes}_spread") or (t, t))


@dataclass
class Decision:
    component: str
    variant: str
    dtype: str
    device: str
    shape_class: str
    passes: str  # "fwd" or "fwd_bwd": which median decided
    level: str
    measurements: list[Measurement] = field(default_factory=list)
    source: str = ""  # "measured now" or the cache file

    def fastest_ms(self) -> float:
        return getattr(self.fastest(), f"{self.passes}_ms")

    def fastest(self) -> Measurement:
        return min((m for m in self.measurements if m.status == "ok"),
                   key=lambda m: getattr(m, f"{self.passes}_ms"))

    def to_dict(self) -> dict:
        return asdict(self)


def shape_class(args: dict) -> str:
    """'x ≤4096×1024' or 'x ≤256×256, w1 ≤1024×256': see the module doc."""
    tensors = [(k, v) for k, v in args.items() if isinstance(v, torch.Tensor)][:2]
    parts = [f"{name} ≤" + "×".join(str(1 << max(0, d - 1).bit_length()) for d in t.shape)
             for i, (name, t) in enumerate(tensors) if i == 0 or t.dim() >= 2]
    return ", ".join(parts)


_DEVICE_NAMES: dict = {}


def _key(component: str, variant: str, dtype: torch.dtype, device: torch.device, cls: str) -> str:
    # naming a CPU reads /proc/cpuinfo: once per process, not once per call
    where = (str(device), torch.get_num_threads())
    if where not in _DEVICE_NAMES:
        _DEVICE_NAMES[where] = device_name(device)
    return " | ".join((component, variant, dtype_name(dtype), _DEVICE_NAMES[where],
                       f"torch {torch.__version__}", cls))


def _load(path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _store(path, key: str, entry: dict) -> None:
    data = _load(path)
    data[key] = entry
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=2))
        tmp.replace(path)  # atomic: another process never reads half a file
    except OSError:
        pass  # a read-only home measures again next time instead of failing


def forget() -> None:
    """Drop the decisions held in memory (the file stays): the next lookup reads the disk."""
    _MEMORY.clear()


def measure(component: str, args: dict, level_names=None, min_time_s: float = 0.1,
            seed: int | None = None) -> list[Measurement]:
    """Check every level on `args` (the component's keyword arguments), then time those
    that pass. The arguments are never modified."""
    case = cards.get(component).case_from_args(args)
    device = next(iter(case.tensors().values())).device
    seed = fresh_seed() if seed is None else seed
    found = []
    for name in level_names or CANDIDATES:
        name = levels.resolve(name).name
        reason = levels.status(name, device, component)
        if reason:
            found.append(Measurement(name, "unavailable", reason))
            continue
        module = levels.get(name)
        if getattr(module, "INTERPRETED", False):
            found.append(Measurement(name, "interpreted", "Triton's CPU interpreter emulates the "
                                     "GPU: its speed says nothing about the kernel"))
            continue
        with torch.inference_mode(False), torch.enable_grad():
            result = check_args(component, name, args, seed=seed)
            if not result.passed:
                found.append(Measurement(name, "failed" if result.status == "fail" else "error",
                                         result.summary()))
                continue
            forward, forward_backward = _passes(getattr(module, component), case, seed)
            try:
                m = Measurement(name, "ok", first_call_ms=time_first_call(forward_backward, device))
                for passes, fn in (("fwd", forward), ("fwd_bwd", forward_backward)):
                    t = time_fn(fn, device, min_time_s=min_time_s)
                    setattr(m, f"{passes}_ms", t.median_ms)
                    setattr(m, f"{passes}_spread", [t.p20_ms, t.p80_ms])  # as JSON keeps it
            except Exception as exc:  # noqa: BLE001 - a level that raises is never chosen
                m = Measurement(name, "error", f"{type(exc).__name__}: {exc}")
        found.append(m)
    return found


def as_fast(m: Measurement, fastest: Measurement, passes: str) -> bool:
    """Whether `m` is as fast as `fastest` as far as the timing can tell: within TIE of its
    median, or their p20–p80 intervals overlap."""
    t, best = getattr(m, f"{passes}_ms"), getattr(fastest, f"{passes}_ms")
    (lo, _), (_, best_hi) = m.spread(passes), fastest.spread(passes)
    return t <= best * (1 + TIE) or lo <= best_hi


def choose(measurements: list[Measurement], passes: str) -> str:
    """The lowest rung as fast as the fastest candidate (see the module doc)."""
    ok = [m for m in measurements if m.status == "ok"]
    if not ok:
        reasons = "; ".join(f"{m.level}: {m.reason}" for m in measurements)
        raise RuntimeError(f"no level passes the harness for this call, so there is nothing to "
                           f"choose from ({reasons})")
    fastest = min(ok, key=lambda m: getattr(m, f"{passes}_ms"))
    rung = {name: i for i, name in enumerate(levels.LEVEL_NAMES)}
    tied = [m for m in ok if as_fast(m, fastest, passes)]
    # A level of your own (levels.register) ranks above the five rungs: on a tie, a rung wins.
    return min(tied, key=lambda m: rung.get(m.level, len(rung))).level


def decide(component: str, args: dict, passes: str = "fwd_bwd", remeasure: bool = False,
           level_names=None, announce=None, settings: Settings | None = None) -> Decision:
    """The decision for a call with these keyword arguments, from memory, the disk cache
    (in `settings.cache_dir`; default: this process's settings), or measured now (then
    `announce(line)` is called first, if given)."""
    settings = settings or current()
    path = settings.cache_path("auto.json")
    case = cards.get(component).case_from_args(args)
    tensor = next(iter(case.tensors().values()))
    cls = shape_class(case.args)
    key = _key(component, case.variant, tensor.dtype, tensor.device, cls)
    entry = None if remeasure else (_MEMORY.get(key) or _load(path).get(key))
    source = str(path)
    if entry is None:
        if announce:
            announce(f"levels auto: first {component} call of its kind ({dtype_name(tensor.dtype)}, "
                     f"{tensor.device}, {cls}): checking and timing each level once, kept in "
                     f"{path} (libraries' warnings in auto.log beside it)")
        # the levels run here on the caller's behalf: their libraries' warnings go to a
        # log beside the decisions, not to the caller's terminal (equivalence/logs.py)
        with warnings_to(settings.cache_path("auto.log"), f"level='auto' measuring {key}"):
            found = measure(component, case.args, level_names)
        entry = {"measured": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                 "measurements": [asdict(m) for m in found]}
        _store(path, key, entry)
        source = "measured now"
    _MEMORY[key] = entry
    found = [Measurement(**m) for m in entry["measurements"]]
    return Decision(component, case.variant, dtype_name(tensor.dtype), str(tensor.device), cls,
                    passes, choose(found, passes), found, source)


_SIGNATURES: dict = {}


def decide_for_call(component: str, args: tuple, kwargs: dict) -> Decision:
    """What `levels.auto` asks: the decision for one call, as the user made it."""
    if component not in _SIGNATURES:
        _SIGNATURES[component] = inspect.signature(getattr(levels.get("native"), component))
    bound = _SIGNATURES[component].bind(*args, **kwargs)
    bound.apply_defaults()
    named = dict(bound.arguments)
    training = torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in named.values())
    return decide(component, named, "fwd_bwd" if training else "fwd",
                  announce=lambda line: print(line, file=sys.stderr, flush=True))


# level="auto" asks this module: `levels` never imports the harness, the harness registers.
levels.auto.use_chooser(decide_for_call)
