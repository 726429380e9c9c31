"""`levels grade`, inside: each part (and each notebook) runs in a Python process of its own,
the submission first on its path; this module starts such a process, kills it with its
children at the timeout, and is what runs in a part's process: the check, and the rules that
give a kernel level credit only for its own kernels (equivalence/commands/grade.py says
what they are and why).

Nothing of `levels` (or of anything that imports it) is imported here at the top: the graded
process imports this module before the submission is on its path, and the `levels` it
imports afterwards must be the submission's.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..settings import REPOSITORY as ROOT

KERNEL_LEVELS = ("triton", "cuda")
# Each rung's own code, relative to the submission: its module, and at a kernel level the
# directory of its kernels. A kernel level may run its own and nothing of the others'.
LEVEL_CODE = {
    "native": ("levels/native.py",),
    "torchscript": ("levels/torchscript.py",),
    "compile": ("levels/compiled.py",),
    "triton": ("levels/triton.py", "triton_kernels"),
    "cuda": ("levels/cuda.py", "cuda_kernels"),
}
# Code of no rung that computes the components all the same: the chooser runs whichever
# level it picks, and the numba twins are Level 5's kernels written in Python (numba runs
# them on a GPU as well as in its simulator): neither is the submission's Triton or CUDA C++.
NO_RUNG_CODE = ("levels/auto.py", "numba_kernels")
# The package of a kernel level's kernels, and at Level 5 the namespace of its torch ops:
# cuda_kernels/build.py's OP_NAMESPACE, the TORCH_LIBRARY of every cuda_kernels/*_binding.cpp.
KERNEL_PACKAGE = {"triton": "triton_kernels", "cuda": "cuda_kernels"}
CUDA_OP_NAMESPACE = "levels_cuda"
_RESULT = "levels-grade-result.json"
_EVENTS = "levels-grade-events.jsonl"


def other_level_code(level: str) -> tuple[str, ...]:
    """What a kernel `level` must not run (relative to the submission): every other rung's
    module and kernel directory (a path without `.py`: every `*.py` in it), and the code of
    no rung (NO_RUNG_CODE). Its own module and kernels are not in it."""
    if level not in LEVEL_CODE:
        raise ValueError(f"argument 'level' must be one of {', '.join(LEVEL_CODE)}; got {level!r}")
    others = [path for name, paths in LEVEL_CODE.items() if name != level for path in paths]
    return tuple(others) + NO_RUNG_CODE


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


def _inside(path, root: Path) -> bool:
    return path is not None and Path(path).resolve().is_relative_to(root)


def _child(spec_json: str) -> None:
    """Run in the part's own process, with the grader's `equivalence` already imported and
    the submission first on sys.path: check the part, write the verdict as JSON."""
    spec = json.loads(spec_json)
    repo, grader = Path(spec["repo"]), Path(spec["grader"])
    component, level = spec["component"], spec["level"]
    if sys.path[0] != str(repo):
        sys.path.insert(0, str(repo))
    problems, notes = [], []

    import torch

    import equivalence  # the grader's: imported before the submission was put on the path
    import levels  # the submission's (it switches Triton's interpreter on where there is no GPU)
    if not _inside(levels.__file__, repo):
        raise SystemExit(f"grader: imported levels from {levels.__file__}, not from the "
                         f"submission {repo}: refusing to grade the wrong code")
    if not _inside(equivalence.__file__, grader):
        raise SystemExit(f"grader: the harness came from {equivalence.__file__}, not {grader}")
    from equivalence import check as harness

    kernel_level = level in KERNEL_LEVELS
    launches = {"forward": {}, "backward": {}}
    other_calls: dict[str, int] = {}
    fused: dict[str, int] = {}
    interpreted: dict[str, str] = {}
    if kernel_level:
        import importlib
        package = KERNEL_PACKAGE[level]
        modules = [f"{package}.{component}"] + ([f"{package}.build"] if level == "cuda" else [])
        for name in modules:  # Level 5's build must be the submission's: it builds its .cu files
            module = importlib.import_module(name)
            if not _inside(module.__file__, repo):
                raise SystemExit(f"grader: imported {name} from {module.__file__}, "
                                 f"not from the submission {repo}")
        extension = None
        if level == "triton":
            _count_launches(repo / package, launches)
        else:
            key = "CUDA" if _device_type(spec["device"]) == "cuda" else "CPU"
            extension = OpCounter(CUDA_OP_NAMESPACE, key, launches, interpreted)
        run_case = harness.run_case
        watch = _watcher(repo, grader, component, level, other_calls, fused, extension)
        harness.run_case = lambda *a, **k: watch(run_case, *a, **k)

    checks = []
    for dtype in spec["dtypes"]:
        for r in harness.check(component, level, dtype=dtype, device=spec["device"],
                               size=spec["size"]):
            checks.append({"summary": r.summary(), "status": r.status, "dtype": r.dtype,
                           "variant": r.variant, "layout": r.layout, "seed": r.seed})
    if kernel_level:
        problems += _kernel_verdicts(level, launches, other_calls, fused, interpreted, notes)
    Path(spec["result"]).write_text(json.dumps({"checks": checks, "problems": problems,
                                                "notes": notes, "torch": torch.__version__}))


def _kernel_verdicts(level: str, launches: dict, other_calls: dict, fused: dict,
                     interpreted: dict, notes: list) -> list[str]:
    """The kernel rules' problems (appending what ran to `notes`)."""
    problems = []
    if level == "triton":
        ran_what, none_ran = "your kernels ran", "no kernel of your triton_kernels/ ran"
    else:
        ran_what = "your CUDA ops ran"
        none_ran = (f"no op of your compiled cuda_kernels/ (torch.ops.{CUDA_OP_NAMESPACE}, built "
                    f"from your .cu files) ran")
    for phase in ("forward", "backward"):
        ran = launches[phase]
        if ran:
            notes.append(f"{phase}: {ran_what}: "
                         + ", ".join(f"{k} x{n}" for k, n in sorted(ran.items())))
        else:
            problems.append(f"{none_ran} in the {phase} pass: at a kernel level the answer must "
                            f"come from your own kernel, not from PyTorch ops or another level")
    if interpreted:
        problems.append("not compiled from your cuda_kernels/: "
                        + ", ".join(f"{op} is Python (registered at {where})"
                                    for op, where in sorted(interpreted.items()))
                        + ": no credit for ops written in Python at Level 5")
    if other_calls:
        problems.append("another level's code ran inside yours ("
                        + ", ".join(sorted(other_calls)) + "): no credit for its answer")
    if fused:
        problems.append("PyTorch computed the component for you (ATen "
                        + ", ".join(sorted(fused)) + "): no credit at a kernel level")
    return problems


def _phase() -> str:
    import torch
    return "backward" if torch._C._current_graph_task_id() != -1 else "forward"


def _count_launches(kernel_dir: Path, launches: dict) -> None:
    """Count launches of the @triton.jit kernels defined under `kernel_dir`, per pass."""
    from triton.runtime import interpreter, jit

    def wrap(cls):
        original = cls.run

        def run(self, *args, **kwargs):
            fn = getattr(self, "fn", None)
            code = getattr(fn, "__code__", None)
            ours = code is not None and _inside(code.co_filename, kernel_dir)
            if ours and not kwargs.get("warmup"):
                phase = _phase()
                key = f"{Path(code.co_filename).stem}.{fn.__name__}"
                launches[phase][key] = launches[phase].get(key, 0) + 1
            return original(self, *args, **kwargs)
        cls.run = run

    wrap(jit.JITFunction)
    wrap(interpreter.InterpretedFunction)


# "CUDA: registered at /path/binding_all.cpp:112 :: (...) [ boxed unboxed ]", one line per
# dispatch key in torch._C._dispatch_dump; an alias key reads "CompositeExplicitAutograd[alias]".
_REGISTERED_AT = re.compile(r"^(?P<key>\w+)(?:\[alias\])?: registered at (?P<where>.+?:\d+)"
                            r"(?: :: .*)?$", re.MULTILINE)


def kernel_registration(op: str, dispatch_key: str) -> str | None:
    """Where the kernel that runs the op `op` ("ns::name" or "ns::name.overload") for
    `dispatch_key` ("CUDA", "CPU") was registered, "file:line", as the dispatcher recorded
    it: a C++ TORCH_LIBRARY_IMPL names its source file, torch.library called from Python
    the .py file that called it. A composite kernel (every device) if the key has none;
    None if there is neither."""
    import torch

    found = {m["key"]: m["where"] for m in _REGISTERED_AT.finditer(torch._C._dispatch_dump(op))}
    for key in (dispatch_key, "CompositeExplicitAutograd", "CompositeImplicitAutograd"):
        if key in found:
            return found[key]
    return None


class OpCounter:
    """Level 5's rule 1, fed by the dispatch mode of `_watcher`: calls of the torch ops of
    `namespace` (the extension's), per pass, into `launches` ({"forward": {op: n},
    "backward": {...}}), and into `interpreted` ({op: "file.py:line"}) every op whose kernel
    for `dispatch_key` was registered from Python rather than compiled."""

    def __init__(self, namespace: str, dispatch_key: str, launches: dict, interpreted: dict):
        self.namespace, self.dispatch_key = namespace, dispatch_key
        self.launches, self.interpreted = launches, interpreted
        self._seen: set[str] = set()

    def __call__(self, func) -> None:
        if func.namespace != self.namespace:
            return
        schema = func._schema
        op = schema.name + (f".{schema.overload_name}" if schema.overload_name else "")
        if op not in self._seen:  # the dispatcher's record does not change: read it once
            self._seen.add(op)
            where = kernel_registration(op, self.dispatch_key)
            if where is not None and where.rsplit(":", 1)[0].endswith(".py"):
                self.interpreted[op] = where
        ran = self.launches[_phase()]
        ran[schema.name] = ran.get(schema.name, 0) + 1


def _forbidden_files(roots, level: str) -> set[str]:
    forbidden = set()
    for root in roots:
        for rel in other_level_code(level):
            path = Path(root).resolve() / rel
            forbidden |= {str(path)} if rel.endswith(".py") else {str(p) for p in path.glob("*.py")}
    return forbidden


def _watcher(repo: Path, grader: Path, component: str, level: str, other_calls: dict,
             fused: dict, extension=None):
    """A function running the harness's run_case with every Python call into another
    level's files recorded (sys.setprofile), and the component's fused ATen ops too; with
    `extension` (an OpCounter), every op dispatched is shown to it as well."""
    import threading

    from torch.utils._python_dispatch import TorchDispatchMode

    forbidden = _forbidden_files({repo, grader}, level)
    from .. import cards  # here, not at the top: the submission's levels is imported by now

    # the component's reference computation in one ATen op: a kernel level computing with
    # one has not written the kernel
    denied = set(cards.get(component).fused_aten)

    def profile(frame, event, arg):
        if event == "call":
            filename = frame.f_code.co_filename
            # a module body running is an import (levels.get imports lazily), not a call
            if filename in forbidden and frame.f_code.co_name != "<module>":
                where = f"{Path(filename).parent.name}/{Path(filename).name}:{frame.f_code.co_name}"
                other_calls[where] = other_calls.get(where, 0) + 1

    class Dispatched(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            # by namespace too: an op of the submission's own may share an ATen op's name
            if func.namespace == "aten" and name in denied:
                fused[name] = fused.get(name, 0) + 1
            if extension is not None:
                extension(func)
            return func(*args, **(kwargs or {}))

    def watch(run_case, *args, **kwargs):
        old = sys.getprofile()
        sys.setprofile(profile)
        threading.setprofile(profile)
        try:
            with Dispatched():
                return run_case(*args, **kwargs)
        finally:
            sys.setprofile(old)
            threading.setprofile(None)

    return watch
