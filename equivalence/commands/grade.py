"""`levels grade`: the harness as an autograder, one component x level at a time, and
optionally the notebooks' grade cells.

    grade("submission/")                      # every part with solution markers
    grade("submission/", parts=[("layer_norm", "triton", 10)], timeout_s=60)
    grade("submission/", parts=[], notebooks=True)      # the notebooks' grade cells only

Each part runs in its own Python process, so a submission that hangs, segfaults or
corrupts its process loses that part only: the process is killed (with its children) at
`timeout_s`, and a crash or a nonzero exit scores 0 with the reason. In that process:

- the submission's code is what gets imported: its directory comes first on sys.path (and
  in PYTHONPATH, for any process it starts), ahead of the editable install of the
  reference repo; the process checks `levels.__file__` (and, at a kernel level,
  `triton_kernels/` or `cuda_kernels/`) and refuses to grade if they are not the submission's;
- the harness is the grader's own (`equivalence` is imported from the grading repo before
  the submission is put on the path): a submission cannot change what is checked;
- the part is `equivalence.check.check(component, level, size="tiny")` at float32 and
  bfloat16, every variant, both layouts: fresh random inputs, the float64 reference,
  NaN-poisoned allocations, the memory checks.

A part's level may be named as the harness names it ("triton", 4, "5"); it is graded, and
reported, under its name.

Score: all or nothing per part (this first cut): `max_score` if every check passed, else 0.

No credit for PyTorch at a kernel level. At Level 4 (triton) and Level 5 (cuda) a part also
needs:
1. its own kernels to have run, in the forward pass AND in the backward pass; the pass is
   told apart by autograd's current graph task (-1 outside a backward).
   - Level 4: a kernel defined in the submission's `triton_kernels/` must be launched
     (launches are counted by wrapping Triton's launcher, `JITFunction.run` and the
     interpreter's `run`).
   - Level 5: an op of the submission's compiled extension must be called. The library
     that cuda_kernels/build.py builds from the submission's `cuda_kernels/*.cu` is no
     Python module (`is_python_module=False`): its functions are torch ops that the
     bindings register with TORCH_LIBRARY in the namespace `levels_cuda`
     (CUDA_OP_NAMESPACE), reached as `torch.ops.levels_cuda.layer_norm_fwd`, through
     `build.ops()`, or from the backward that autograd calls. All those paths meet in the
     dispatcher, so the calls are counted there, by the TorchDispatchMode of rule 3. The
     dispatcher also records where each op's kernel was registered: a `.cpp` of the build
     (TORCH_LIBRARY_IMPL) is compiled code; a `.py` file (an op defined from Python with
     torch.library, in the right namespace) is not, and voids the part.
   This is the rule that cannot be dodged by spelling: whether the answer comes from torch
   ops written out, `F.layer_norm`, or another level, no kernel ran.
2. no other level's code to have run (a launch of a token kernel, then
   `levels.native.layer_norm(...)` for the answer): every Python call is watched while the
   level runs (`sys.setprofile`), and a call into another level's files voids the part.
   What is another level's depends on the level graded (`other_level_code`): each level's
   module in levels/ (`native.py`, `torchscript.py`, `compiled.py`, `triton.py`, `cuda.py`)
   and kernel directory (`triton_kernels/`, `cuda_kernels/`) except its own, plus the code
   that belongs to no rung and computes the components all the same: the chooser
   (`levels/auto.py`) and Level 5's numba twins (`numba_kernels/`, CUDA kernels in Python
   that numba would run on the GPU: Level 5's math, not the submission's CUDA C++);
3. none of the component's fused ATen ops (`aten.native_layer_norm`, SDPA, convolution,
   batch norm, LSTM: the reference computation in one call) to have been dispatched,
   recorded by a TorchDispatchMode.
An aten-op deny-list alone would miss the answer written out op by op (mean, sub, rsqrt...),
which a real launcher may also use for small things; a launch count alone would miss the
token kernel. Together they catch what a student would plausibly try; they do not make a
determined cheat impossible (the submission runs in the grader's process). Two holes, known:
a dispatch mode sees the ops called from Python, not the ATen calls a compiled op makes
inside its own C++ (`at::layer_norm` in a binding); and `sys.setprofile` follows the calling
thread and the threads Python starts, not the autograd engine's own CUDA thread, so another
level's code called from a backward on the GPU goes unseen (rules 1 and 3 still hold there).

Level 5 runs only on an NVIDIA GPU. A cuda part graded where there is none (`device` is not
cuda) scores 0 with the reason "needs a CUDA GPU: ...", without starting its process: never
a crash, never full marks for code that did not run. It is reported as failed rather than
left out, because Gradescope's tests are "passed" or "failed" (it has no "skipped"), and a
part left out would silently shrink the maximum: the total shows the points the machine
could not award, and the reason says why.

Notebooks (`notebooks=True`, `levels grade --notebooks`; off by default: a notebook runs for
seconds to minutes, and the instructor chooses whether its exercises count). The grade cells
are nbgrader's autograder tests: code cells whose metadata says `"grade": true` (and not
`"solution": true`: those are answers for a person to grade) with `points` and `grade_id`.
The reference repo (the grading one, `reference=`) defines them: which notebooks, which
cells, how many points, and their sources. As nbgrader's autograde does, each grade cell of
the submission's notebook (matched by `grade_id`) is run with the reference's source, hidden
tests included, so a student who edits a grade cell changes nothing; one whose grade cell is
gone scores 0 for it. Each notebook runs in its own process (nbclient, with the kernel its
metadata names, in the notebook's directory, the submission first on PYTHONPATH; the kernel
is asked where `levels` comes from before any cell runs, and the notebook is refused if it
is not the submission's), top to bottom, errors allowed: an exercise that raises costs its
own grade cell, not the rest. A grade cell scores its points if it ran without an error,
else 0 with the exception's line ("AssertionError: ..."). A notebook's cells get
`notebook_timeout_s` in all, counted from when its kernel is up; when it runs out, or the
kernel dies, the cell running scores 0 and so do the cells not yet run, each with the reason
("not run: the notebook timed out after 600 s in cell 14"), and the next notebook starts
afresh. The kernel (in a session of its own, as jupyter starts it) is shut down by its
client, or, should the notebook's process itself hang, killed with its process group when
that process is.

Performance points (GPU, thresholds in a config): not yet.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_POINTS = 10.0
DEFAULT_TIMEOUT_S = 300.0
DEFAULT_NOTEBOOK_TIMEOUT_S = 600.0
DTYPES = ("float32", "bfloat16")
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
# The reference computation of each component in one ATen op: a kernel level computing
# with it has not written the kernel.
FUSED_ATEN = {
    "layer_norm": ("native_layer_norm", "native_layer_norm_backward", "layer_norm"),
    "attention": ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                  "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_attention_math",
                  "_scaled_dot_product_flash_attention_for_cpu", "scaled_dot_product_attention"),
    "mlp": ("gelu", "gelu_backward"),
    "lstm": ("lstm", "_thnn_fused_lstm_cell", "_thnn_fused_lstm_cell_backward_impl"),
    "conv_bn": ("convolution", "_convolution", "convolution_backward", "mkldnn_convolution",
                "cudnn_convolution", "native_batch_norm", "_native_batch_norm_legit",
                "_native_batch_norm_legit_no_training", "native_batch_norm_backward",
                "cudnn_batch_norm"),
}
NEEDS_GPU = ("needs a CUDA GPU: Level 5 runs only on an NVIDIA GPU, and this grader runs on "
             "{device}; grade this part on a machine with one (0 points here is no verdict on "
             "the code: it did not run)")
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
class Part:
    component: str
    level: str
    max_score: float = DEFAULT_POINTS
    timeout_s: float | None = None  # None: grade()'s

    @property
    def name(self) -> str:
        return f"{self.component} @ {self.level}"


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


def _as_part(p) -> Part:
    if isinstance(p, Part):
        return p
    if isinstance(p, dict):
        points = p.get("points", p.get("max_score", DEFAULT_POINTS))
        return Part(p["component"], p["level"], float(points), p.get("timeout_s"))
    component, level, *rest = p
    return Part(component, level, float(rest[0]) if rest else DEFAULT_POINTS)


def _named(part: Part) -> Part:
    """The part with its level as the harness names it (4 -> "triton", "5" -> "cuda"): the
    kernel rules and the GPU check go by the name, so an alias must not slip past them."""
    import levels

    try:
        name = levels.resolve(part.level).name
    except ValueError as e:
        raise ValueError(f"part {part.component} @ {part.level}: {e}") from None
    return dataclasses.replace(part, level=name)


def load_config(path) -> dict:
    """A grading config (JSON): {"timeout_s": 120, "parts": [{"component": "layer_norm",
    "level": "triton", "points": 10, "timeout_s": 60}, ...], "notebooks": true,
    "notebook_timeout_s": 300}; every key optional. "notebooks": true (every notebook with
    grade cells), false, or a list of paths ("notebooks/01_native.ipynb")."""
    config = json.loads(Path(path).read_text())
    if not isinstance(config, dict):
        raise TypeError(f"grading config {path}: expected a JSON object; "
                        f"got {type(config).__name__}")
    known = {"timeout_s", "parts", "device", "dtypes", "size", "notebooks", "notebook_timeout_s"}
    unknown = set(config) - known
    if unknown:
        raise ValueError(f"grading config {path}: unknown key(s) {', '.join(sorted(unknown))} "
                         f"(expected {', '.join(sorted(known))})")
    return config


def grade(repo_dir, parts=None, timeout_s: float = DEFAULT_TIMEOUT_S, device: str | None = None,
          dtypes=DTYPES, size: str = "tiny", config=None, notebooks=None,
          notebook_timeout_s: float | None = None, reference=None) -> dict:
    """Grade the submission in `repo_dir`. `parts`: Parts, (component, level[, points])
    tuples or config dicts; default: every (component, level) with solution markers in
    the grading repo (this one), 10 points each. `notebooks`: None or False (none), True
    (every notebook of `reference` with grade cells) or a list of notebook paths relative
    to the repo; each gets `notebook_timeout_s` (default DEFAULT_NOTEBOOK_TIMEOUT_S).
    `reference`: the repo whose notebooks define the grade cells (default: the grading
    repo). `config`: a path or dict (see load_config) whose keys fill in what is not
    passed. Returns the totals and one PartResult dict per part, then per grade cell,
    under "tests"."""
    from levels.contract import COMPONENTS

    from .assignment import marked_parts

    if config is not None:
        config = load_config(config) if not isinstance(config, dict) else config
        parts = parts if parts is not None else config.get("parts")
        timeout_s = config.get("timeout_s", timeout_s)
        device = device or config.get("device")
        dtypes = config.get("dtypes", dtypes)
        size = config.get("size", size)
        notebooks = notebooks if notebooks is not None else config.get("notebooks")
        if notebook_timeout_s is None:
            notebook_timeout_s = config.get("notebook_timeout_s")
    repo = Path(repo_dir).resolve()
    if not (repo / "levels" / "__init__.py").is_file():
        raise ValueError(f"argument 'repo_dir': {repo} holds no levels/ package: not a submission")
    parts = [_named(_as_part(p)) for p in (parts if parts is not None else marked_parts(ROOT))]
    for p in parts:
        if p.component not in COMPONENTS:
            raise ValueError(f"part {p.name}: component must be one of {', '.join(COMPONENTS)}")
    cells = _cells_to_grade(Path(reference or ROOT).resolve(), notebooks)
    if device is None:
        import torch
        device = "cuda" if torch.cuda.is_available() else "cpu"
    start = time.perf_counter()
    results = [_grade_part(repo, p, p.timeout_s or timeout_s, device, list(dtypes), size)
               for p in parts]
    for rel, grade_cells in cells.items():
        results += _grade_notebook(repo, rel, grade_cells,
                                   notebook_timeout_s or DEFAULT_NOTEBOOK_TIMEOUT_S)
    return {"score": sum(r.score for r in results), "max_score": sum(r.max_score for r in results),
            "execution_time": round(time.perf_counter() - start, 1), "repo": str(repo),
            "device": device, "tests": [asdict(r) for r in results]}


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
    # The grader's equivalence first, then off the path: the submission's copy of the repo
    # has an `equivalence` too, and must not be the one that grades it.
    return (f"import sys; sys.path.insert(0, {str(ROOT)!r}); import equivalence.grading as g; "
            f"sys.path.remove({str(ROOT)!r}); g.{function}(sys.argv[1])")


def _grade_part(repo: Path, part: Part, timeout_s: float, device: str, dtypes, size) -> PartResult:
    if part.level == "cuda" and _device_type(device) != "cuda":
        # No process: nothing of Level 5 can run here, and the harness would only report
        # every check skipped.
        reason = NEEDS_GPU.format(device=device)
        return PartResult(part.name, part.component, part.level, 0.0, part.max_score, "failed",
                          reason, reason, 0.0)
    spec = {"repo": str(repo), "grader": str(ROOT), "component": part.component,
            "level": part.level, "device": device, "dtypes": dtypes, "size": size}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="levels-grade-") as tmp:
        spec["result"] = str(Path(tmp) / _RESULT)
        log, returncode, timed_out = _run_child(_bootstrap("_child"), spec, repo, timeout_s)
        seconds = time.perf_counter() - start
        result_file = Path(spec["result"])
        child = json.loads(result_file.read_text()) if result_file.is_file() else None

    def failed(reason: str, output: str = "") -> PartResult:
        tail = log.strip()[-3000:]
        shown = tail and f"--- process output (last lines) ---\n{tail}"
        text = "\n".join(x for x in (reason, output, shown) if x)
        return PartResult(part.name, part.component, part.level, 0.0, part.max_score, "failed",
                          reason, text, round(seconds, 1), child["checks"] if child else [])

    if timed_out:
        return failed(f"timed out after {timeout_s:g} s (killed)")
    if returncode < 0:
        name = signal.Signals(-returncode).name
        return failed(f"the process died of signal {name}")
    if returncode != 0 or child is None:
        return failed(f"the process exited with code {returncode} before the checks finished")
    lines = [c["summary"] for c in child["checks"]]
    problems = list(child["problems"])
    not_passed = [c for c in child["checks"] if c["status"] != "pass"]
    if not_passed:
        problems.insert(0, f"{len(not_passed)} of {len(child['checks'])} checks did not pass")
    lines += child["notes"]
    if problems:
        return failed("; ".join(problems), "\n".join(lines))
    return PartResult(part.name, part.component, part.level, part.max_score, part.max_score,
                      "passed", "", "\n".join(lines), round(seconds, 1), child["checks"])


def _device_type(device) -> str:
    return str(device).split(":")[0]


# ---------------------------------------------------------------------------------------
# The graded process
# ---------------------------------------------------------------------------------------

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
    denied = set(FUSED_ATEN.get(component, ()))

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


# ---------------------------------------------------------------------------------------
# Notebooks: their grade cells, each notebook in a process of its own
# ---------------------------------------------------------------------------------------

# Past a notebook's time, before its process is killed: for the kernel to start (jupyter's
# own limit is 60 s, and that time is not the notebook's) and to be stopped at the end.
_NOTEBOOK_GRACE_S = 90.0
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # IPython colours its tracebacks


def _nbgrader(cell: dict) -> dict:
    return cell.get("metadata", {}).get("nbgrader") or {}


def _cell_source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def _read_notebook(path: Path, rel: str) -> dict:
    try:
        notebook = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{rel}: not a notebook ({type(e).__name__}: {e})") from None
    cells = notebook.get("cells") if isinstance(notebook, dict) else None
    if not isinstance(cells, list) or not all(isinstance(cell, dict) for cell in cells):
        raise ValueError(f"{rel}: not a notebook: expected a JSON object with a 'cells' list "
                         f"of objects")
    return notebook


def grade_cells(repo, rel: str) -> list[GradeCell]:
    """The autograder tests of the notebook `rel` of `repo`: the code cells nbgrader's
    metadata marks `grade` and not `solution` (grade and solution together is an answer for
    a person to grade), with their grade_id and points."""
    cells, found = _read_notebook(Path(repo) / rel, rel)["cells"], []
    for index, cell in enumerate(cells):
        meta = _nbgrader(cell)
        if cell.get("cell_type") != "code" or not meta.get("grade") or meta.get("solution"):
            continue
        points = meta.get("points")
        numeric = isinstance(points, (int, float)) and not isinstance(points, bool)
        if not meta.get("grade_id") or not numeric:
            raise ValueError(f"{rel}, cell {index}: nbgrader's metadata marks it a grade cell, so "
                             f"it needs a grade_id and numeric points; got grade_id="
                             f"{meta.get('grade_id')!r}, points={points!r}")
        if any(c.grade_id == meta["grade_id"] for c in found):
            raise ValueError(f"{rel}, cell {index}: grade_id {meta['grade_id']!r} is used twice: "
                             f"a submission's cells are matched to the reference's by it")
        found.append(GradeCell(rel, index, meta["grade_id"], float(points), _cell_source(cell)))
    return found


def notebooks_with_grade_cells(repo=ROOT) -> list[str]:
    """The notebooks of `repo` (its tracked files) that have grade cells."""
    from .assignment import repo_files
    return [rel for rel in sorted(repo_files(Path(repo))) if rel.endswith(".ipynb")
            and grade_cells(repo, rel)]


def _cells_to_grade(reference: Path, notebooks) -> dict[str, list[GradeCell]]:
    if notebooks is None or notebooks is False:
        return {}
    if notebooks is True:
        return {rel: grade_cells(reference, rel) for rel in notebooks_with_grade_cells(reference)}
    if isinstance(notebooks, (str, bytes)) or not all(isinstance(n, str) for n in notebooks):
        raise TypeError(f"argument 'notebooks' must be True, False, None or a list of notebook "
                        f"paths; got {notebooks!r}")
    chosen = {}
    for rel in notebooks:
        if not (reference / rel).is_file():
            raise ValueError(f"argument 'notebooks': {rel} is no notebook of the reference "
                             f"{reference} (its grade cells are what the submission is graded by)")
        chosen[rel] = grade_cells(reference, rel)
        if not chosen[rel]:
            raise ValueError(f"argument 'notebooks': {rel} has no grade cells (nbgrader's "
                             f"\"grade\": true, with points) to score")
    return chosen


def _grade_notebook(repo: Path, rel: str, cells: list[GradeCell],
                    timeout_s: float) -> list[PartResult]:
    """Run the submission's notebook `rel` with the reference's grade cells put back in, in
    its own process; one PartResult per grade cell."""
    def result(cell: GradeCell, reason: str, output: str = "", seconds: float = 0.0) -> PartResult:
        score = 0.0 if reason else cell.points
        return PartResult(f"{Path(rel).name}: {cell.grade_id}", "", "", score, cell.points,
                          "failed" if reason else "passed", reason, output or reason,
                          round(seconds, 1), notebook=rel, grade_id=cell.grade_id)

    if not (repo / rel).is_file():
        return [result(c, f"the submission has no {rel}") for c in cells]
    try:
        notebook = _read_notebook(repo / rel, rel)
    except ValueError as e:
        return [result(c, f"your {e}") for c in cells]
    where = {}  # grade_id -> the cell's index in the submission's notebook
    for index, cell in enumerate(notebook["cells"]):
        grade_id = _nbgrader(cell).get("grade_id")
        if grade_id:
            where.setdefault(grade_id, index)
    for c in cells:
        if c.grade_id in where:  # run what the reference says, as nbgrader's autograde does
            notebook["cells"][where[c.grade_id]].update(cell_type="code", source=c.source,
                                                        outputs=[], execution_count=None)

    with tempfile.TemporaryDirectory(prefix="levels-grade-nb-") as tmp:
        prepared = Path(tmp) / Path(rel).name
        prepared.write_text(json.dumps(notebook), encoding="utf-8")
        events_file = Path(tmp) / _EVENTS
        spec = {"notebook": str(prepared), "cwd": str((repo / rel).parent), "repo": str(repo),
                "events": str(events_file), "timeout_s": timeout_s,
                "cells": sorted(where[c.grade_id] for c in cells if c.grade_id in where)}

        def kernel_group():
            return next((e["pgid"] for e in _events(events_file) if e["event"] == "kernel"), None)

        log, returncode, killed = _run_child(_bootstrap("_notebook_child"), spec, repo,
                                             timeout_s + _NOTEBOOK_GRACE_S, kernel_group)
        events = _events(events_file)

    ran = {e["cell"]: e for e in events if e["event"] == "ran"}
    started = [e["cell"] for e in events if e["event"] == "start"]
    refused = next((e["reason"] for e in events if e["event"] == "refused"), None)
    stopped = next((e for e in events if e["event"] == "stopped"), None)
    if stopped is None and killed:
        stopped = {"why": "timeout", "cell": started[-1] if started else None}
    tail = log.strip()[-3000:]
    shown = tail and f"--- process output (last lines) ---\n{tail}"

    def not_run(index: int) -> str:
        """Why the grade cell at `index` of the submission's notebook has no result."""
        if refused:
            return refused
        if stopped is None:
            return f"not run: the grading process exited with code {returncode} first"
        what = (f"the notebook timed out after {timeout_s:g} s" if stopped["why"] == "timeout"
                else "the notebook's kernel died")
        if stopped["cell"] == index:
            return f"{what} in this cell (cell {index})"
        return f"not run: {what}" + (f" in cell {stopped['cell']}" if stopped["cell"] is not None
                                     else "")

    results = []
    for c in cells:
        index = where.get(c.grade_id)
        if index is None:
            results.append(result(c, f"your {rel} has no grade cell {c.grade_id} (grade cells "
                                     f"must stay in the notebook as handed out)"))
        elif index in ran:
            e = ran[index]
            results.append(result(c, e["error"] or "", e["output"], e["seconds"]))
        else:
            reason = not_run(index)
            results.append(result(c, reason, "\n".join(x for x in (reason, shown) if x)))
    return results


def _events(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            break  # the last line, cut off by a kill
    return events


def _error_line(cell) -> str | None:
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            line = f"{out.get('ename', 'Error')}: {out.get('evalue', '')}".strip()
            return (line.splitlines() or [line])[0][:300]
    return None


def _output_text(cell) -> str:
    parts = []
    for out in cell.get("outputs", []):
        kind = out.get("output_type")
        if kind == "stream":
            parts.append(_cell_source({"source": out.get("text", "")}))
        elif kind == "error":
            parts.append("\n".join(_ANSI.sub("", line) for line in out.get("traceback", [])))
        elif kind in ("execute_result", "display_data"):
            parts.append(_cell_source({"source": out.get("data", {}).get("text/plain", "")}))
    return "\n".join(parts).strip()[-3000:]


_ORIGIN_OF_LEVELS = ("import importlib.util as _grade_util\n"
                     "print(repr(getattr(_grade_util.find_spec('levels'), 'origin', None)))\n"
                     "del _grade_util")


def _notebook_child(spec_json: str) -> None:
    """Run in the notebook's own process: execute it cell by cell (errors allowed), and write
    each event as one JSON line as it happens, so that a kill still leaves what was done."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    spec = json.loads(spec_json)
    graded = set(spec["cells"])
    nb = nbformat.read(spec["notebook"], as_version=4)
    kernel = nb.metadata.get("kernelspec", {}).get("name", "python3")
    client = NotebookClient(nb, kernel_name=kernel, allow_errors=True,
                            shutdown_kernel="immediate", timeout=max(1, int(spec["timeout_s"])),
                            resources={"metadata": {"path": spec["cwd"]}})
    with open(spec["events"], "a", buffering=1, encoding="utf-8") as events:
        def emit(**event):
            events.write(json.dumps(event) + "\n")

        index = None
        try:
            with client.setup_kernel():
                provisioner = getattr(client.km, "provisioner", None)
                emit(event="kernel", pgid=getattr(provisioner, "pgid", None))
                # Before any cell: whose `levels` will the notebook import? (PYTHONPATH puts
                # the submission first; an installed reference must not stand in for it.)
                probe = nbformat.v4.new_code_cell(_ORIGIN_OF_LEVELS)
                client.execute_cell(probe, -1, store_history=False)
                printed = _output_text(probe)
                try:
                    origin = ast.literal_eval(printed)
                except (ValueError, SyntaxError):
                    origin = None
                if not isinstance(origin, str) or not _inside(origin, Path(spec["repo"])):
                    emit(event="refused", reason=f"grader: the notebook's kernel imports levels "
                                                 f"from {printed or 'nowhere'}, not from the "
                                                 f"submission: refusing to grade the wrong code")
                    return
                # The notebook's time starts once its kernel is up: a slow start on a busy
                # machine is not the student's.
                deadline = time.monotonic() + spec["timeout_s"]
                for index, cell in enumerate(nb.cells):
                    if cell.cell_type != "code":
                        continue
                    # the notebook's time, not a cell's: what is left of it
                    client.timeout = max(1, int(deadline - time.monotonic()))
                    emit(event="start", cell=index)
                    start = time.perf_counter()
                    client.execute_cell(cell, index)
                    if index in graded:
                        emit(event="ran", cell=index, error=_error_line(cell),
                             output=_output_text(cell), seconds=time.perf_counter() - start)
        except CellTimeoutError:
            emit(event="stopped", cell=index, why="timeout")
        except DeadKernelError:
            emit(event="stopped", cell=index, why="died")
        emit(event="done")


# ---------------------------------------------------------------------------------------
# Reports: the table, Gradescope's results.json
# ---------------------------------------------------------------------------------------

def gradescope(result: dict, visibility: str = "visible") -> dict:
    """Gradescope's results.json: top-level score, execution_time, output, visibility,
    and per test name, score, max_score, status, output, visibility."""
    lines = [f"{t['name']}: {t['score']:g}/{t['max_score']:g}"
             + (f" ({t['reason']})" if t["reason"] else "") for t in result["tests"]]
    return {
        "score": result["score"],
        "execution_time": result["execution_time"],
        "output": f"{result['score']:g} / {result['max_score']:g} points, graded on "
                  f"{result['device']}\n" + "\n".join(lines),
        "visibility": visibility,
        "tests": [{"name": t["name"], "score": t["score"], "max_score": t["max_score"],
                   "status": t["status"], "output": t["output"], "visibility": visibility}
                  for t in result["tests"]],
    }


def write_gradescope(result: dict, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(gradescope(result), indent=2) + "\n")
    return path


def add_parser(sub) -> None:
    p = sub.add_parser(
        "grade", help="grade a submission: the harness per component x level",
        description="Run the harness on a submission, each component x level in its own process "
                    "with a timeout, print the score table and optionally write Gradescope's "
                    "results.json. A part scores its points only if every check passes (float32 "
                    "and bfloat16, both layouts); at a kernel level (triton, cuda), only if the "
                    "submission's own kernels computed it. A cuda part needs a CUDA GPU (0 points, "
                    "with that reason, without one). With --notebooks, also run the submission's "
                    "notebooks, each in its own process, and score their grade cells.")
    p.add_argument("--repo", default=".", help="the submission's directory (default: .)")
    p.add_argument("--gradescope", metavar="FILE", help="write Gradescope's results.json here")
    p.add_argument("--config", metavar="FILE",
                   help="grading config (JSON: timeout_s, parts with component, level, points, "
                        "timeout_s; notebooks, notebook_timeout_s)")
    p.add_argument("--timeout", type=float, help=f"seconds per part (default {DEFAULT_TIMEOUT_S:g})")
    p.add_argument("--device", help="cpu or cuda (default: cuda if there is a GPU)")
    p.add_argument("--notebooks", nargs="?", const="all", metavar="PATHS",
                   help="also score the notebooks' grade cells (nbgrader's, with the reference's "
                        "sources and points): every notebook with grade cells, or the "
                        "comma-separated notebook paths given (notebooks/01_native.ipynb,...)")
    p.add_argument("--notebook-timeout", type=float,
                   help=f"seconds per notebook (default {DEFAULT_NOTEBOOK_TIMEOUT_S:g}); the cells "
                        f"not run by then score 0")


def _notebooks_arg(value):
    if value is None:
        return None
    if value == "all":
        return True
    return [rel.strip() for rel in value.split(",") if rel.strip()]


def run_grade(args, console) -> int:
    from rich.table import Table

    kwargs = {} if args.timeout is None else {"timeout_s": args.timeout}
    notebooks = _notebooks_arg(getattr(args, "notebooks", None))
    result = grade(args.repo, device=args.device, config=args.config, notebooks=notebooks,
                   notebook_timeout_s=getattr(args, "notebook_timeout", None), **kwargs)
    table = Table(title=f"levels grade — {result['repo']} ({result['device']})")
    for col in ("part", "score", "max", "time", "why not full"):
        table.add_column(col, justify="right" if col in ("score", "max", "time") else "left")
    for t in result["tests"]:
        table.add_row(t["name"], f"{t['score']:g}", f"{t['max_score']:g}", f"{t['seconds']:.0f} s",
                      t["reason"])
    console.print(table)
    console.print(f"total {result['score']:g} / {result['max_score']:g}", markup=False)
    if not any(t["notebook"] for t in result["tests"]):
        graded = notebooks_with_grade_cells(ROOT)
        if graded:
            console.print(f"notebooks not graded ({len(graded)} have grade cells): add "
                          f"--notebooks to score them", markup=False)
    if args.gradescope:
        console.print(f"wrote {write_gradescope(result, args.gradescope)}", markup=False)
    return 0 if result["score"] == result["max_score"] else 1


def add_parsers(sub) -> None:
    """Both instructor commands: `levels assignment build` and `levels grade`."""
    from . import assignment
    assignment.add_parser(sub)
    add_parser(sub)


def run_assignment(args, console) -> int:
    from . import assignment
    return assignment.run_assignment(args, console)
