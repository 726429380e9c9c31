"""`levels grade`: partial credit inside a part, and the message that says why a part lost
points, led by its first real cause.

A part's points are split into cells: each pass (forward, backward) is worth its share, and
within a pass each dtype and each layout theirs:

    cell weight = share[pass] x share of its dtype x share of its layout

with the shares from the assignment's config ("credit", every key optional):

    {"forward": 0.5, "backward": 0.5,   # the passes (normalized to sum to 1)
     "bfloat16": 0.25,                  # of a pass, its bfloat16 checks (the rest: float32)
     "strided": 0.25,                   # of a pass, the strided layout (the rest: contiguous)
     "compiles": 0.1,                   # Level 5 only: of the part, its .cu compiling (the rest
                                        # split as above, on a GPU)
     "performance": 0.0,                # of the part, its speed on a GPU (0: not graded) ...
     "performance_target": 1.0,         # ... in full at this speed-up over the reference ...
     "performance_reference": "compile"}  # ... level, in proportion below it

Performance (on a GPU only; `performance_points`): the part's forward+backward is timed
against the reference level's with the project's timing (equivalence/profile.py: median of
many calls, L2 flushed), same inputs. The share is earned in proportion to the speed-up, in
full at `performance_target` (1.0: as fast as the reference), and only when every other cell
passed: a fast wrong answer earns nothing for speed. Without a GPU nothing can be timed
that means anything (the interpreter and the simulator are emulations): the share is "not
scored: needs a CUDA GPU", and the part's other cells count for all its points, which the
report says. (Level 5 without a GPU is the exception: nothing of it runs, and the share is
part of the rest that needs a GPU.)

A cell earns its weight when every check of that dtype and layout (every variant) passed
that pass's comparisons (the forward: the outputs, with gradients and without; the backward:
every gradient; both: the memory checks), and, at a kernel level, when the pass broke none
of the kernel rules (grade_rules.py). So a correct forward with its backward left blank
earns exactly the forward's share, and a bfloat16 mistake costs the bfloat16 cells only.

The message leads with the first real cause of each pass that lost points: a blanked
region still raising ("the backward is not implemented yet: the TODO at
triton_kernels/layer_norm.py:100 still raises"), then the kernel rules, then wrong values
(with the first wrong element).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PASSES = ("forward", "backward")
DEFAULT_CREDIT = {"forward": 0.5, "backward": 0.5, "bfloat16": 0.25, "strided": 0.25,
                  "compiles": 0.1, "performance": 0.0, "performance_target": 1.0,
                  "performance_reference": "compile"}
_NOT_SHARES = ("performance_target", "performance_reference")
# a blanked region's raise, as the harness reports it (TorchScript and torch.compile quote it)
# (numba's simulator puts the raising thread before the message: "tid=[1, 0, 0] ctaid=[0, 0, 0]: ")
_TODO = re.compile(r"NotImplementedError(: |\(')(tid=\[[\d, ]*\] ctaid=\[[\d, ]*\]: )?TODO: "
                   r"(?P<what>.+?) \((?P<where>[^()]+:\d+)\)")


def credit_shares(config: dict | None) -> dict:
    """The config's "credit" over the defaults, checked: every share in [0, 1], the passes
    not both zero, the shares of the part outside its passes below 1, a positive speed-up
    target and a reference level's name."""
    shares = dict(DEFAULT_CREDIT)
    for key, value in (config or {}).items():
        if key not in DEFAULT_CREDIT:
            raise ValueError(f"credit: unknown key {key!r} (expected {', '.join(DEFAULT_CREDIT)})")
        if key == "performance_reference":
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"credit: 'performance_reference' must name a level (e.g. "
                                 f"\"compile\"); got {value!r}")
            shares[key] = value.strip()
            continue
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if key == "performance_target":
            if not number or not 0 < value < 1000:
                raise ValueError(f"credit: 'performance_target' must be a speed-up above 0 "
                                 f"(1.0: as fast as the reference); got {value!r}")
            shares[key] = float(value)
            continue
        if not number or not 0 <= value <= 1:
            raise ValueError(f"credit: {key!r} must be a number from 0 to 1; got {value!r}")
        shares[key] = float(value)
    if shares["forward"] + shares["backward"] <= 0:
        raise ValueError("credit: 'forward' and 'backward' cannot both be 0")
    if shares["compiles"] + shares["performance"] >= 1:
        raise ValueError("credit: 'compiles' and 'performance' together must leave the "
                         "correctness checks a share (their sum must be below 1)")
    return shares


def performance_fraction(speedup, target: float) -> float:
    """The fraction of the performance share a speed-up over the reference earns: in full at
    `target`, in proportion below it, nothing for a speed-up that is no number."""
    if not isinstance(speedup, (int, float)) or speedup != speedup or speedup <= 0:
        return 0.0
    return min(1.0, speedup / target)


def performance_points(measured: dict | None, correct: bool, shares: dict, max_score: float,
                       device: str) -> tuple[float | None, str]:
    """(points, line) of the performance share. `measured`: the part's process's timing,
    {"level_ms", "reference_ms", "speedup", "reference", "size", "dtype"} or {"error": ...};
    None where nothing was timed (no GPU): points None, the share not scored."""
    share = shares["performance"]
    most = max_score * share
    ref, target = shares["performance_reference"], shares["performance_target"]
    if measured is None:
        return None, (f"performance ({share:.0%} of the part) not scored: needs a CUDA GPU "
                      f"(this grader runs on {device}); the part's other checks count for all "
                      f"its points")
    if "error" in measured:
        return 0.0, f"performance 0/{most:.3g}: could not be timed: {measured['error']}"
    what = (f"{measured['level_ms']:.3g} ms against {ref}'s {measured['reference_ms']:.3g} ms "
            f"(forward+backward, {measured['dtype']}, size {measured['size']}): "
            f"{measured['speedup']:.2f}x, full marks at {target:g}x")
    if not correct:
        return 0.0, f"performance 0/{most:.3g}: not scored until every check passes ({what})"
    got = round(most * performance_fraction(measured["speedup"], target), 2)
    return got, f"performance {got:.3g}/{most:.3g}: {what}"


def pass_of(comparison: str) -> str:
    """Which pass a comparison of a check belongs to: "forward", "backward" or "both"."""
    if comparison.startswith("grad ") or comparison == "backward":
        return "backward"
    if comparison.endswith((": unchanged", ": memory around the view")):
        return "both"
    return "forward"


@dataclass
class Cell:
    pass_: str
    dtype: str
    layout: str
    weight: float  # of the part's points, 0..1
    ok: bool
    why: str = ""  # the first cause, when not ok


def _dtype_share(dtype: str, dtypes: list, shares: dict) -> float:
    if len(dtypes) == 1:
        return 1.0
    if dtype == "bfloat16":
        return shares["bfloat16"]
    others = [d for d in dtypes if d != "bfloat16"]
    rest = 1.0 - (shares["bfloat16"] if "bfloat16" in dtypes else 0.0)
    return rest / len(others)


def _layout_share(layout: str, layouts: list, shares: dict) -> float:
    if len(layouts) == 1:
        return 1.0
    return shares["strided"] if layout == "strided" else 1.0 - shares["strided"]


def _cause(check: dict, p: str) -> str | None:
    """Why `check` (a dict of the part's process) fails pass `p`, or None if it does not."""
    if check["status"] == "skip":
        return f"skipped: {check['reason']}"
    comparisons = check.get("comparisons", [])
    if check["status"] == "error" and not comparisons:
        return check["reason"]  # the forward raised: no pass ran
    bad = [c for c in comparisons if not c["ok"] and pass_of(c["name"]) in (p, "both")]
    if check["status"] == "fail" and not comparisons:
        return check["reason"]
    if not bad:
        return None
    first = bad[0]
    what = first["problem"] or f"relative error {first['rel_err']:.3g} above the bound"
    return f"{first['name']}: {what}" + (f", {first['first_wrong']}" if first.get("first_wrong") else "")


def cheats_that_count(checks: list, rule_problems: dict) -> list[str]:
    """The kernel rules broken that cost the whole part: all of them, except an output not
    written by the kernels whose values were wrong anyway (a kernel that forgot elements:
    the wrong values are the cause to report, and they cost their cells already)."""
    found = []
    for c in rule_problems.get("cheats", []):
        if c["rule"] == "unwritten":
            name = c["output"]
            values = [x for check in checks for x in check.get("comparisons", [])
                      if x["name"] in (name, f"{name} (no grad)", f"{name} (exactly 0)")]
            if not values or not all(x["ok"] for x in values):
                continue
        found.append(c["text"])
    return found


def cells(checks: list, rule_problems: dict, dtypes: list, layouts: list, shares: dict) -> list:
    """Every (pass, dtype, layout) cell with its weight and verdict. A kernel rule broken
    (a cheat: see grade_rules.py) fails every cell: a part earns nothing from a call whose
    answer its kernels did not compute."""
    total = shares["forward"] + shares["backward"]
    cheats = cheats_that_count(checks, rule_problems)
    found = []
    for p in PASSES:
        for dtype in dtypes:
            for layout in layouts:
                weight = (shares[p] / total * _dtype_share(dtype, dtypes, shares)
                          * _layout_share(layout, layouts, shares))
                mine = [c for c in checks if c["dtype"] == dtype and c["layout"] == layout]
                why = f"no credit for this part: {cheats[0]}" if cheats else None
                why = why or (None if mine else "not checked")
                for c in mine:
                    why = why or _cause(c, p)
                if why is None and rule_problems.get(p):
                    why = rule_problems[p][0]
                found.append(Cell(p, dtype, layout, weight, why is None, why or ""))
    return found


def not_implemented(text: str) -> str | None:
    """"not implemented yet (the TODO at file:line still raises)" if `text` shows a blanked
    region's NotImplementedError, else None."""
    found = _TODO.search(text)
    if found is None:
        return None
    return f"not implemented yet (the TODO at {found['where']} still raises)"


def verdict(part_cells: list, points: float, name: str = "this part"
            ) -> tuple[float, str, list[str]]:
    """(score, reason, lines): the points earned, the reason led by each losing pass's first
    real cause ("" at full marks), and one line per pass for the report."""
    score = round(points * sum(c.weight for c in part_cells if c.ok), 2)
    causes, lines = [], []
    for p in PASSES:
        mine = [c for c in part_cells if c.pass_ == p]
        got = points * sum(c.weight for c in mine if c.ok)
        most = points * sum(c.weight for c in mine)
        marks = ", ".join(f"{c.dtype} {c.layout} {'ok' if c.ok else 'lost'}" for c in mine)
        lines.append(f"{p}: {got:.3g}/{most:.3g} ({marks})")
        failing = [c for c in mine if not c.ok]
        if not failing or most == 0:
            continue
        stub = next((s for s in (not_implemented(c.why) for c in failing) if s), None)
        cause = f"{name} is {stub}" if stub else failing[0].why
        where = "" if len(failing) == len(mine) else (
            " [" + ", ".join(f"{c.dtype} {c.layout}" for c in failing) + "]")
        causes.append((f"{p} {got:.3g}/{most:.3g}{where}", cause))
    if len(causes) > 1 and len({cause for _, cause in causes}) == 1:
        # one cause for both passes (a stub that raises in the forward): said once, first
        return score, f"{causes[0][1]} ({', '.join(s for s, _ in causes)})", lines
    return score, "; ".join(f"{s}: {cause}" for s, cause in causes), lines
