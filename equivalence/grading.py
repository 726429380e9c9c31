"""`levels grade`: the harness as an autograder, one component x level at a time.

    grade("submission/")                      # every part with solution markers
    grade("submission/", parts=[("layer_norm", "triton", 10)], timeout_s=60)

Each part runs in its own Python process, so a submission that hangs, segfaults or
corrupts its process loses that part only: the process is killed (with its children) at
`timeout_s`, and a crash or a nonzero exit scores 0 with the reason. In that process:

- the submission's code is what gets imported: its directory comes first on sys.path (and
  in PYTHONPATH, for any process it starts), ahead of the editable install of the
  reference repo; the process checks `levels.__file__` (and `triton_kernels.__file__`)
  and refuses to grade if they are not the submission's;
- the harness is the grader's own (`equivalence` is imported from the grading repo before
  the submission is put on the path): a submission cannot change what is checked;
- the part is `equivalence.check.check(component, level, size="tiny")` at float32 and
  bfloat16, every variant, both layouts: fresh random inputs, the float64 reference,
  NaN-poisoned allocations, the memory checks.

Score: all or nothing per part (this first cut): `max_score` if every check passed, else 0.

No credit for PyTorch at a kernel level. At Level 4 (triton) a part also needs:
1. its own kernels to have run: a kernel defined in the submission's `triton_kernels/` must
   be launched in the forward pass AND in the backward pass (launches are counted by
   wrapping Triton's launcher, `JITFunction.run` and the interpreter's `run`; the pass is
   told apart by autograd's current graph task, -1 outside a backward). This is the rule
   that cannot be dodged by spelling: whether the answer comes from torch ops written out,
   `F.layer_norm`, or another level, no kernel ran.
2. no other level's code to have run (a launch of a token kernel, then
   `levels.native.layer_norm(...)` for the answer): every Python call is watched while the
   level runs (`sys.setprofile`), and a call into levels/native.py, torchscript.py,
   compiled.py, cuda.py, auto.py or cuda_kernels/ voids the part;
3. none of the component's fused ATen ops (`aten.native_layer_norm`, SDPA, convolution,
   batch norm, LSTM: the reference computation in one call) to have been dispatched,
   recorded by a TorchDispatchMode.
An aten-op deny-list alone would miss the answer written out op by op (mean, sub, rsqrt...),
which a real launcher may also use for small things; a launch count alone would miss the
token kernel. Together they catch what a student would plausibly try; they do not make a
determined cheat impossible (the submission runs in the grader's process).

Performance points (GPU, thresholds in a config) and Level 5 launch counting: not yet.
"""

from __future__ import annotations

import json
import os
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
DTYPES = ("float32", "bfloat16")
KERNEL_LEVELS = ("triton",)
# Files whose code a kernel level must not run (relative to the submission).
OTHER_LEVEL_FILES = ("levels/native.py", "levels/torchscript.py", "levels/compiled.py",
                     "levels/cuda.py", "levels/auto.py")
OTHER_LEVEL_DIRS = ("cuda_kernels",)
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
_RESULT = "levels-grade-result.json"


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
    name: str
    component: str
    level: str
    score: float
    max_score: float
    status: str  # "passed" or "failed" (Gradescope's words)
    reason: str  # why it failed, one line ("" when passed)
    output: str  # every check's summary and the kernel rules' verdicts
    seconds: float
    checks: list = field(default_factory=list)


def _as_part(p) -> Part:
    if isinstance(p, Part):
        return p
    if isinstance(p, dict):
        points = p.get("points", p.get("max_score", DEFAULT_POINTS))
        return Part(p["component"], p["level"], float(points), p.get("timeout_s"))
    component, level, *rest = p
    return Part(component, level, float(rest[0]) if rest else DEFAULT_POINTS)


def load_config(path) -> dict:
    """A grading config (JSON): {"timeout_s": 120, "parts": [{"component": "layer_norm",
    "level": "triton", "points": 10, "timeout_s": 60}, ...]}; every key optional."""
    config = json.loads(Path(path).read_text())
    if not isinstance(config, dict):
        raise TypeError(f"grading config {path}: expected a JSON object; "
                        f"got {type(config).__name__}")
    unknown = set(config) - {"timeout_s", "parts", "device", "dtypes", "size"}
    if unknown:
        raise ValueError(f"grading config {path}: unknown key(s) {', '.join(sorted(unknown))} "
                         f"(expected timeout_s, parts, device, dtypes, size)")
    return config


def grade(repo_dir, parts=None, timeout_s: float = DEFAULT_TIMEOUT_S, device: str | None = None,
          dtypes=DTYPES, size: str = "tiny", config=None) -> dict:
    """Grade the submission in `repo_dir`. `parts`: Parts, (component, level[, points])
    tuples or config dicts; default: every (component, level) with solution markers in
    the grading repo (this one), 10 points each. `config`: a path or dict (see
    load_config) whose keys fill in what is not passed. Returns the totals and one
    PartResult dict per part under "tests"."""
    from levels.contract import COMPONENTS

    from .assignment import marked_parts

    if config is not None:
        config = load_config(config) if not isinstance(config, dict) else config
        parts = parts if parts is not None else config.get("parts")
        timeout_s = config.get("timeout_s", timeout_s)
        device = device or config.get("device")
        dtypes = config.get("dtypes", dtypes)
        size = config.get("size", size)
    repo = Path(repo_dir).resolve()
    if not (repo / "levels" / "__init__.py").is_file():
        raise ValueError(f"argument 'repo_dir': {repo} holds no levels/ package: not a submission")
    parts = [_as_part(p) for p in (parts if parts is not None else marked_parts(ROOT))]
    for p in parts:
        if p.component not in COMPONENTS:
            raise ValueError(f"part {p.name}: component must be one of {', '.join(COMPONENTS)}")
    if device is None:
        import torch
        device = "cuda" if torch.cuda.is_available() else "cpu"
    start = time.perf_counter()
    results = [_grade_part(repo, p, p.timeout_s or timeout_s, device, list(dtypes), size)
               for p in parts]
    return {"score": sum(r.score for r in results), "max_score": sum(r.max_score for r in results),
            "execution_time": round(time.perf_counter() - start, 1), "repo": str(repo),
            "device": device, "tests": [asdict(r) for r in results]}


def _grade_part(repo: Path, part: Part, timeout_s: float, device: str, dtypes, size) -> PartResult:
    spec = {"repo": str(repo), "grader": str(ROOT), "component": part.component,
            "level": part.level, "device": device, "dtypes": dtypes, "size": size}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="levels-grade-") as tmp:
        spec["result"] = str(Path(tmp) / _RESULT)
        env = dict(os.environ, PYTHONPATH=str(repo), PYTHONDONTWRITEBYTECODE="1")
        code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); import equivalence.grading as g; "
                f"sys.path.remove({str(ROOT)!r}); g._child(sys.argv[1])")
        proc = subprocess.Popen([sys.executable, "-c", code, json.dumps(spec)], cwd=repo, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)  # its own process group: killed whole
        try:
            log, _ = proc.communicate(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            log, _ = proc.communicate()
            timed_out = True
        seconds = time.perf_counter() - start
        log = log.decode(errors="replace")
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
    if proc.returncode < 0:
        name = signal.Signals(-proc.returncode).name
        return failed(f"the process died of signal {name}")
    if proc.returncode != 0 or child is None:
        return failed(f"the process exited with code {proc.returncode} before the checks finished")
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
    if kernel_level:
        import importlib
        kernels = importlib.import_module(f"triton_kernels.{component}")
        if not _inside(kernels.__file__, repo):
            raise SystemExit(f"grader: imported {kernels.__name__} from {kernels.__file__}, "
                             f"not from the submission {repo}")
        _count_launches(repo / "triton_kernels", launches)
        run_case = harness.run_case
        watch = _watcher(repo, grader, component, other_calls, fused)
        harness.run_case = lambda *a, **k: watch(run_case, *a, **k)

    checks = []
    for dtype in spec["dtypes"]:
        for r in harness.check(component, level, dtype=dtype, device=spec["device"],
                               size=spec["size"]):
            checks.append({"summary": r.summary(), "status": r.status, "dtype": r.dtype,
                           "variant": r.variant, "layout": r.layout, "seed": r.seed})
    if kernel_level:
        for phase in ("forward", "backward"):
            ran = launches[phase]
            if ran:
                notes.append(f"{phase}: your kernels ran: "
                             + ", ".join(f"{k} x{n}" for k, n in sorted(ran.items())))
            else:
                problems.append(f"no kernel of your triton_kernels/ ran in the {phase} pass: at a "
                                f"kernel level the answer must come from your own kernel, not from "
                                f"PyTorch ops or another level")
        if other_calls:
            problems.append("another level's code ran inside yours ("
                            + ", ".join(sorted(other_calls)) + "): no credit for its answer")
        if fused:
            problems.append("PyTorch computed the component for you (ATen "
                            + ", ".join(sorted(fused)) + "): no credit at a kernel level")
    Path(spec["result"]).write_text(json.dumps({"checks": checks, "problems": problems,
                                                "notes": notes, "torch": torch.__version__}))


def _count_launches(kernel_dir: Path, launches: dict) -> None:
    """Count launches of the @triton.jit kernels defined under `kernel_dir`, per pass."""
    import torch
    from triton.runtime import interpreter, jit

    def wrap(cls):
        original = cls.run

        def run(self, *args, **kwargs):
            fn = getattr(self, "fn", None)
            code = getattr(fn, "__code__", None)
            ours = code is not None and _inside(code.co_filename, kernel_dir)
            if ours and not kwargs.get("warmup"):
                phase = "backward" if torch._C._current_graph_task_id() != -1 else "forward"
                key = f"{Path(code.co_filename).stem}.{fn.__name__}"
                launches[phase][key] = launches[phase].get(key, 0) + 1
            return original(self, *args, **kwargs)
        cls.run = run

    wrap(jit.JITFunction)
    wrap(interpreter.InterpretedFunction)


def _watcher(repo: Path, grader: Path, component: str, other_calls: dict, fused: dict):
    """A function running the harness's run_case with every Python call into another
    level's files recorded (sys.setprofile), and the component's fused ATen ops too."""
    import threading

    from torch.utils._python_dispatch import TorchDispatchMode

    forbidden = set()
    for root in {repo.resolve(), grader.resolve()}:
        forbidden |= {str(root / f) for f in OTHER_LEVEL_FILES}
        for d in OTHER_LEVEL_DIRS:
            forbidden |= {str(p) for p in (root / d).glob("*.py")}
    denied = set(FUSED_ATEN.get(component, ()))

    def profile(frame, event, arg):
        if event == "call":
            filename = frame.f_code.co_filename
            # a module body running is an import (levels.get imports lazily), not a call
            if filename in forbidden and frame.f_code.co_name != "<module>":
                where = f"{Path(filename).parent.name}/{Path(filename).name}:{frame.f_code.co_name}"
                other_calls[where] = other_calls.get(where, 0) + 1

    class FusedOps(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if name in denied:
                fused[name] = fused.get(name, 0) + 1
            return func(*args, **(kwargs or {}))

    def watch(run_case, *args, **kwargs):
        old = sys.getprofile()
        sys.setprofile(profile)
        threading.setprofile(profile)
        try:
            with FusedOps():
                return run_case(*args, **kwargs)
        finally:
            sys.setprofile(old)
            threading.setprofile(None)

    return watch


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
    p = sub.add_parser("grade", help="grade a submission: the harness per component x level",
                       description="Run the harness on a submission, each component x level in its "
                                   "own process with a timeout, print the score table and optionally "
                                   "write Gradescope's results.json. A part scores its points only if "
                                   "every check passes (float32 and bfloat16, both layouts); at a "
                                   "kernel level, only if the submission's own kernels computed it.")
    p.add_argument("--repo", default=".", help="the submission's directory (default: .)")
    p.add_argument("--gradescope", metavar="FILE", help="write Gradescope's results.json here")
    p.add_argument("--config", metavar="FILE", help="grading config (JSON: timeout_s, parts with "
                                                    "component, level, points, timeout_s)")
    p.add_argument("--timeout", type=float, help=f"seconds per part (default {DEFAULT_TIMEOUT_S:g})")
    p.add_argument("--device", help="cpu or cuda (default: cuda if there is a GPU)")


def run_grade(args, console) -> int:
    from rich.table import Table

    kwargs = {} if args.timeout is None else {"timeout_s": args.timeout}
    result = grade(args.repo, device=args.device, config=args.config, **kwargs)
    table = Table(title=f"levels grade — {result['repo']} ({result['device']})")
    for col in ("part", "score", "max", "time", "why not full"):
        table.add_column(col, justify="right" if col in ("score", "max", "time") else "left")
    for t in result["tests"]:
        table.add_row(t["name"], f"{t['score']:g}", f"{t['max_score']:g}", f"{t['seconds']:.0f} s",
                      t["reason"])
    console.print(table)
    console.print(f"total {result['score']:g} / {result['max_score']:g}", markup=False)
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
