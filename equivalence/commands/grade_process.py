"""`levels grade`, inside: each part (and each notebook) runs in a Python process of its own,
the submission first on its path; this module starts such a process, kills it with its
children at the timeout, and is what runs in a part's process: the check, watched by the
rules that give a kernel level credit only for its own kernels (grade_rules.py says what
they are and why, grade_watch.py how they are watched).

Nothing of `levels` (or of anything that imports it) is imported here at the top: the graded
process imports this module before the submission is on its path, and the `levels` it
imports afterwards must be the submission's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..settings import REPOSITORY as ROOT

from .grade_rules import KERNEL_LEVELS, KERNEL_PACKAGE, _inside  # noqa: F401 (KERNEL_LEVELS: grade.py)

_RESULT = "levels-grade-result.json"
_EVENTS = "levels-grade-events.jsonl"


@dataclass
class PartResult:
    """One line of the table and one test of Gradescope's results.json: a part (component,
    level) or a notebook's grade cell (notebook, grade_id; component and level empty)."""
    name: str
    component: str
    level: str
    score: float
    max_score: float
    status: str  # "passed" or "failed" (Gradescope's words)
    reason: str  # why it failed, one line ("" when passed)
    output: str  # every check's summary and the kernel rules' verdicts, or the cell's output
    seconds: float
    checks: list = field(default_factory=list)
    notebook: str = ""  # a grade cell's notebook, relative to the repo
    grade_id: str = ""  # ...and its nbgrader grade_id


@dataclass
class GradeCell:
    """An nbgrader autograder-test cell of a reference notebook."""
    notebook: str  # relative to the repo
    index: int  # in the reference notebook
    grade_id: str
    points: float
    source: str  # the reference's, hidden tests included: what the submission is graded by


def _kill_group(pgid: int | None) -> None:
    if pgid is None:
        return
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # already gone (a notebook's kernel shut down by its client)


def _run_child(code: str, spec: dict, repo: Path, timeout_s: float, kernel_group=None):
    """Run `code` (with json.dumps(spec) as argv[1]) in its own process group, in `repo`, the
    submission first on PYTHONPATH. Returns (log, returncode, timed_out); at the timeout the
    group is killed, and so is the group `kernel_group()` names then (a notebook's kernel:
    jupyter starts it in a session of its own, out of reach of the first kill)."""
    # LEVELS_TRITON_FAST_LAUNCH=0: every Level 4 launch then goes through JITFunction.run,
    # where the grader counts them (triton_kernels/launch.py calls a compiled kernel's
    # launcher directly after its first launch, which a count there would not see).
    env = dict(os.environ, PYTHONPATH=str(repo), PYTHONDONTWRITEBYTECODE="1",
               LEVELS_TRITON_FAST_LAUNCH="0")
    proc = subprocess.Popen([sys.executable, "-c", code, json.dumps(spec)], cwd=repo, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)  # its own process group: killed whole
    try:
        log, _ = proc.communicate(timeout=timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        if kernel_group is not None:
            _kill_group(kernel_group())
        log, _ = proc.communicate()
        timed_out = True
    return log.decode(errors="replace"), proc.returncode, timed_out


def _bootstrap(function: str) -> str:
    """The code of a graded process that runs `function` ("package.module.name")."""
    # The grader's equivalence first, then off the path: the submission's copy of the repo
    # has an `equivalence` too, and must not be the one that grades it.
    module, name = function.rsplit(".", 1)
    return (f"import sys; sys.path.insert(0, {str(ROOT)!r}); import {module} as g; "
            f"sys.path.remove({str(ROOT)!r}); g.{name}(sys.argv[1])")


# ---------------------------------------------------------------------------------------
# The graded process
# ---------------------------------------------------------------------------------------

def _device_type(device) -> str:
    return str(device).split(":")[0]


def _own_modules(repo: Path, component: str, level: str) -> None:
    """Refuse to grade kernels that are not the submission's (an installed reference found
    first on the path). Level 5's build too: it builds the .cu files of its own directory."""
    import importlib

    package = KERNEL_PACKAGE[level]
    names = {"triton": [f"{package}.{component}"], "cuda": [f"{package}.{component}",
                                                            f"{package}.build"],
             "numba": [f"{package}.level"]}[level]
    for name in names:
        module = importlib.import_module(name)
        if not _inside(module.__file__, repo):
            raise SystemExit(f"grader: imported {name} from {module.__file__}, "
                             f"not from the submission {repo}")


def _child(spec_json: str) -> None:
    """Run in the part's own process, with the grader's `equivalence` already imported and
    the submission first on sys.path: check the part, write the verdict as JSON."""
    spec = json.loads(spec_json)
    repo, grader = Path(spec["repo"]), Path(spec["grader"])
    component, level = spec["component"], spec["level"]
    if sys.path[0] != str(repo):
        sys.path.insert(0, str(repo))

    import torch

    import equivalence  # the grader's: imported before the submission was put on the path
    import levels  # the submission's (it switches Triton's interpreter on where there is no GPU)
    if not _inside(levels.__file__, repo):
        raise SystemExit(f"grader: imported levels from {levels.__file__}, not from the "
                         f"submission {repo}: refusing to grade the wrong code")
    if not _inside(equivalence.__file__, grader):
        raise SystemExit(f"grader: the harness came from {equivalence.__file__}, not {grader}")
    from equivalence import check as harness

    from .grade_rules import (CUDA_OP_NAMESPACE, OpCounter, count_numba_launches,
                              count_triton_launches)
    from .grade_watch import Ledger, watcher

    if level == "numba":  # the twins are a level of their own, registered by name
        import numba_kernels
        import numba_kernels.level
        levels.register("numba", numba_kernels.level)
    ledger, notes = Ledger(), []
    if level in KERNEL_LEVELS:
        _own_modules(repo, component, level)
        extension, stores = None, False
        kernels = repo / KERNEL_PACKAGE[level]
        if level == "triton":
            from equivalence import interpreter
            count_triton_launches(kernels, ledger.launches)
            stores = interpreter.active()
        elif level == "numba":
            count_numba_launches(kernels, ledger.launches)
            stores = numba_kernels.SIMULATED
        else:
            key = "CUDA" if _device_type(spec["device"]) == "cuda" else "CPU"
            extension = OpCounter(CUDA_OP_NAMESPACE, key, ledger.launches, ledger.interpreted)
        run_case = harness.run_case
        watch = watcher(repo, grader, component, level, ledger, extension, stores)
        harness.run_case = lambda *a, **k: watch(run_case, *a, **k)

    checks = []
    for dtype in spec["dtypes"]:
        for r in harness.check(component, level, dtype=dtype, device=spec["device"],
                               size=spec["size"]):
            checks.append({"summary": r.summary(), "status": r.status, "reason": r.reason,
                           "dtype": r.dtype, "variant": r.variant, "layout": r.layout,
                           "seed": r.seed,
                           "comparisons": [{"name": c.name, "ok": c.ok, "problem": c.problem,
                                            "rel_err": c.rel_err, "first_wrong": c.first_wrong}
                                           for c in r.comparisons]})
    problems = (ledger.verdicts(level, notes) if level in KERNEL_LEVELS
                else {"forward": [], "backward": [], "cheats": []})
    performance = None
    if spec.get("performance"):  # after the verdicts: the timing is no graded call
        performance = _timed(component, level, spec["device"], spec["dtypes"][0],
                             **spec["performance"])
    Path(spec["result"]).write_text(json.dumps({"checks": checks, "problems": problems,
                                                "notes": notes, "torch": torch.__version__,
                                                "performance": performance}))


def _timed(component: str, level: str, device: str, dtype: str, reference: str, size: str,
           profile=None) -> dict:
    """The part's forward+backward against the reference level's, timed the project's way
    (equivalence/profile.py) on one draw of inputs: {"level_ms", "reference_ms", "speedup",
    ...}, or {"error": why}. `profile`: the profiler (a test passes a fake one)."""
    if profile is None:
        from ..profile import profile
    shared: dict = {}  # one draw of inputs for both
    found = {}
    for name, which in ((level, "level"), (reference, "reference")):
        p = profile(component, name, dtype=dtype, device=device, size=size, case_cache=shared)
        if p.status != "ok" or not p.fwd_bwd:
            return {"error": f"{which} {name} was not timed ({p.status}: {p.reason})"}
        found[which] = p.fwd_bwd["median_ms"]
    return {"level_ms": found["level"], "reference_ms": found["reference"],
            "speedup": found["reference"] / found["level"], "reference": reference,
            "size": size, "dtype": dtype}
