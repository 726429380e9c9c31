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

import dataclasses
import json
import signal
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from .grade_notebooks import _cells_to_grade, _grade_notebook, notebooks_with_grade_cells
from .grade_process import _RESULT, ROOT, PartResult, _bootstrap, _device_type, _run_child

DEFAULT_POINTS = 10.0
DEFAULT_TIMEOUT_S = 300.0
DEFAULT_NOTEBOOK_TIMEOUT_S = 600.0
DTYPES = ("float32", "bfloat16")
NEEDS_GPU = ("needs a CUDA GPU: Level 5 runs only on an NVIDIA GPU, and this grader runs on "
             "{device}; grade this part on a machine with one (0 points here is no verdict on "
             "the code: it did not run)")

@dataclass
class Part:
    component: str
    level: str
    max_score: float = DEFAULT_POINTS
    timeout_s: float | None = None  # None: grade()'s

    @property
    def name(self) -> str:
        return f"{self.component} @ {self.level}"


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
        log, returncode, timed_out = _run_child(_bootstrap("equivalence.commands.grade_process._child"), spec, repo, timeout_s)
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
    p.set_defaults(run=run_grade)


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
