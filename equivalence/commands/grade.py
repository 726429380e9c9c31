"""`levels grade`: the harness as an autograder, one component x level at a time, and
optionally the notebooks' grade cells.

    grade("submission/", config="instructor/grading.json")   # the parts the build wrote
    grade("submission/", parts=[("layer_norm", "triton", 10)], timeout_s=60)
    grade("submission/", parts=[], notebooks=True)           # the notebooks' grade cells only

What is graded: exactly the parts named, by the config `levels assignment build` wrote into
the instructor's bundle (its "parts", with their points and credit shares), or by `parts=`
(`--parts layer_norm@triton,...`). Never a default set: a part nobody assigned is the
reference's code, and would score full marks. Before anything runs, `requirements()` checks
that this machine has what the parts and notebooks need (triton, numba, nbclient, nvcc...):
a grader that cannot run a part must refuse to grade (exit 2, saying what to install), not
score the students 0.

How a part is graded: in its own Python process (grade_process.py), the submission first on
its path (its `levels`, `triton_kernels`, ... are imported, never the installed reference;
the harness, `equivalence`, is always the grader's), killed with its children at the
timeout: a hang, a segfault or an exception costs that part only. In it, the harness's
`check(component, level, size="tiny")` runs for each dtype (float32, bfloat16), every
variant, both layouts: fresh random inputs, the float64 reference, NaN-poisoned allocations,
the memory checks. At a kernel level (triton, cuda, numba) every call is watched by the rules
of grade_rules.py: the submission's own kernels must have computed it.

Score: partial credit inside a part (grade_credit.py): forward and backward, each dtype, each
layout, weighted by the config's "credit"; a kernel rule broken in a pass takes that pass's
share. The reason leads with the first real cause of each pass that lost points. A
"performance" share (default 0) is timed on a GPU only, in the part's process after its
checks (grade_process._timed); without a GPU it is not scored, said so, and the other cells
count for the part's points.

Level 5 (cuda) without a GPU: the part's .cu file is compiled with nvcc to PTX (the grader's
own compile, on the submission's source), and every kernel in it must store something (a
blanked kernel writes nothing). That earns the credit's "compiles" share (default 0.1); the
rest needs a GPU, and the reason says so ("needs a CUDA GPU: ..."). It is reported as failed
rather than left out: Gradescope's tests are "passed" or "failed", and a part left out would
silently shrink the maximum. On a GPU the part runs like any other.

Notebooks (`notebooks=True`, `--notebooks`): grade_notebooks.py.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import signal
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from .grade_credit import cells, cheats_that_count, credit_shares, performance_points, verdict
from .grade_notebooks import _cells_to_grade, _grade_notebook, notebooks_with_grade_cells
from .grade_process import _RESULT, ROOT, PartResult, _bootstrap, _device_type, _run_child

DEFAULT_POINTS = 10.0
DEFAULT_TIMEOUT_S = 300.0
DEFAULT_NOTEBOOK_TIMEOUT_S = 600.0
DTYPES = ("float32", "bfloat16")
TWIN_LEVELS = ("numba",)  # gradable levels that are no rung of the ladder
PERFORMANCE_SIZE = "bench"  # the cards' GPU size: where a level's speed means something
NEEDS_GPU = ("needs a CUDA GPU: Level 5 runs only on an NVIDIA GPU, and this grader runs on "
             "{device}; grade this part on a machine with one (what could be done here: "
             "{done})")


class MissingRequirement(RuntimeError):
    """This machine lacks what the parts or notebooks need (the message says what to install):
    the grader refuses to grade rather than score what it cannot run."""


@dataclass
class Part:
    component: str
    level: str
    max_score: float = DEFAULT_POINTS
    timeout_s: float | None = None  # None: grade()'s
    credit: dict | None = None  # the shares of grade_credit (None: the config's, else defaults)
    dtypes: list | None = None  # None: grade()'s

    @property
    def name(self) -> str:
        return f"{self.component} @ {self.level}"


def _as_part(p) -> Part:
    if isinstance(p, Part):
        return p
    if isinstance(p, dict):
        points = p.get("points", p.get("max_score", DEFAULT_POINTS))
        return Part(p["component"], p["level"], float(points), p.get("timeout_s"), p.get("credit"),
                    p.get("dtypes"))
    if isinstance(p, str):  # "layer_norm@triton" (the command line's form)
        component, _, level = p.partition("@")
        return Part(component.strip(), level.strip())
    component, level, *rest = p
    return Part(component, level, float(rest[0]) if rest else DEFAULT_POINTS)


def _named(part: Part) -> Part:
    """The part with its level as the harness names it (4 -> "triton", "5" -> "cuda"): the
    kernel rules and the GPU check go by the name, so an alias must not slip past them."""
    import levels

    if str(part.level).strip().lower() in TWIN_LEVELS:
        return dataclasses.replace(part, level=str(part.level).strip().lower())
    try:
        name = levels.resolve(part.level).name
    except ValueError as e:
        raise ValueError(f"part {part.component} @ {part.level}: {e} (or {', '.join(TWIN_LEVELS)})"
                         ) from None
    return dataclasses.replace(part, level=name)


CONFIG_KEYS = {"timeout_s", "parts", "device", "dtypes", "size", "notebooks",
               "notebook_timeout_s", "credit", "jobs", "assignment"}


def load_config(path) -> dict:
    """A grading config (JSON), as `levels assignment build` writes it: {"parts":
    [{"component": "layer_norm", "level": "triton", "points": 10, "timeout_s": 60, "credit":
    {...}}], "credit": {"forward": 0.5, ...}, "timeout_s": 120, "notebooks": true,
    "notebook_timeout_s": 300, "jobs": 2, "assignment": {what was built}}; every key optional.
    "notebooks": true (every notebook with grade cells), false, or a list of paths."""
    config = json.loads(Path(path).read_text())
    if not isinstance(config, dict):
        raise TypeError(f"grading config {path}: expected a JSON object; "
                        f"got {type(config).__name__}")
    unknown = set(config) - CONFIG_KEYS
    if unknown:
        raise ValueError(f"grading config {path}: unknown key(s) {', '.join(sorted(unknown))} "
                         f"(expected {', '.join(sorted(CONFIG_KEYS))})")
    return config


def requirements(parts, notebooks: bool, device: str) -> list[str]:
    """What this machine lacks to grade `parts` (and notebooks, if `notebooks`), each with
    how to install it; [] when nothing is missing."""
    missing = []

    def need(module: str, why: str, install: str):
        if importlib.util.find_spec(module) is None and not any(why in m for m in missing):
            missing.append(f"{module} (for {why}): {install}")

    for p in parts:
        if p.level == "triton":
            need("triton", "Level 4 parts", "pip install 'triton>=3.6' (Linux)")
        elif p.level == "numba":
            need("numba", "the numba parts", "pip install 'numba>=0.60,<0.69'")
        elif p.level == "cuda" and _device_type(device) != "cuda":
            from cuda_kernels import build

            why = build.nvcc_available()
            if why and not any("nvcc" in m for m in missing):
                missing.append(f"nvcc (for compiling the Level 5 parts without a GPU): {why}")
    if notebooks:
        for module in ("nbformat", "nbclient", "ipykernel"):
            need(module, "--notebooks", "pip install nbformat nbclient ipykernel")
    return missing


def grade(repo_dir, parts=None, timeout_s: float = DEFAULT_TIMEOUT_S, device: str | None = None,
          dtypes=DTYPES, size: str = "tiny", config=None, notebooks=None,
          notebook_timeout_s: float | None = None, reference=None, jobs: int | None = None) -> dict:
    """Grade the submission in `repo_dir`. `parts`: Parts, (component, level[, points])
    tuples, "component@level" strings or config dicts; `config`: a path or dict (see
    load_config) whose keys fill in what is not passed. One of them must name the parts
    (an empty list: notebooks only). `notebooks`: None or False (none), True (every notebook
    of `reference` with grade cells) or a list of notebook paths; each gets
    `notebook_timeout_s`. `reference`: the repo whose notebooks define the grade cells
    (default: the grading repo). `jobs`: parts graded at once (default: 2 or the cores, the
    fewer). Returns the totals and one PartResult dict per part, then per grade cell, under
    "tests". MissingRequirement if this machine cannot grade them."""
    from levels.contract import COMPONENTS

    shares = None
    if config is not None:
        config = load_config(config) if not isinstance(config, dict) else config
        parts = parts if parts is not None else config.get("parts")
        timeout_s = config.get("timeout_s", timeout_s)
        device = device or config.get("device")
        dtypes = config.get("dtypes", dtypes)
        size = config.get("size", size)
        shares = config.get("credit")
        jobs = jobs or config.get("jobs")
        notebooks = notebooks if notebooks is not None else config.get("notebooks")
        if notebook_timeout_s is None:
            notebook_timeout_s = config.get("notebook_timeout_s")
    repo = Path(repo_dir).resolve()
    if not (repo / "levels" / "__init__.py").is_file():
        raise ValueError(f"argument 'repo_dir': {repo} holds no levels/ package: not a submission")
    if parts is None:
        raise ValueError("no parts to grade: pass the config `levels assignment build` wrote "
                         "(--config INSTRUCTOR_DIR/grading.json) or name them (--parts "
                         "layer_norm@triton,...); an empty list grades the notebooks only")
    parts = [_named(_as_part(p)) for p in parts]
    for p in parts:
        if p.component not in COMPONENTS:
            raise ValueError(f"part {p.name}: component must be one of {', '.join(COMPONENTS)}")
        mine = credit_shares({**(shares or {}), **(p.credit or {})})  # refused before anything runs
        if mine["performance"] and _named(Part(p.component, mine["performance_reference"])
                                          ).level == p.level:
            raise ValueError(f"part {p.name}: its performance is timed against "
                             f"{mine['performance_reference']}, its own level: name another "
                             f"(credit 'performance_reference')")
    if device is None:
        import torch
        device = "cuda" if torch.cuda.is_available() else "cpu"
    missing = requirements(parts, bool(notebooks), device)
    if missing:
        raise MissingRequirement("this machine cannot grade what was asked; install:\n  "
                                 + "\n  ".join(missing))
    cells_of = _cells_to_grade(Path(reference or ROOT).resolve(), notebooks)
    start = time.perf_counter()
    jobs = max(1, int(jobs or min(2, os.cpu_count() or 1)))
    with ThreadPoolExecutor(jobs) as pool:  # each part is a process: threads only wait
        results = list(pool.map(
            lambda p: _grade_part(repo, p, p.timeout_s or timeout_s, device,
                                  list(p.dtypes or dtypes), size,
                                  {**(shares or {}), **(p.credit or {})}), parts))
    for rel, grade_cells in cells_of.items():
        results += _grade_notebook(repo, rel, grade_cells,
                                   notebook_timeout_s or DEFAULT_NOTEBOOK_TIMEOUT_S)
    return {"score": round(sum(r.score for r in results), 2),
            "max_score": sum(r.max_score for r in results),
            "execution_time": round(time.perf_counter() - start, 1), "repo": str(repo),
            "device": device, "tests": [asdict(r) for r in results]}


def _compiles(repo: Path, part: Part) -> tuple[bool, str]:
    """Level 5 without a GPU: does the part's .cu compile (nvcc, to PTX), and does every
    kernel in it store something? (ok, what was found)"""
    from cuda_kernels import build

    from .parts import LEVEL_TITLES, part_files

    found = []
    todo = f"// TODO: {part.component}, {LEVEL_TITLES['cuda']}: write this part"
    for rel in part_files(part.component, "cuda"):
        path = repo / rel
        if not path.is_file():
            return False, f"your {rel} is missing"
        left = [i for i, line in enumerate(path.read_text().splitlines(), 1) if todo in line]
        if left:  # a blanked device function may compile and store, from a TODO
            return False, (f"{part.name} is not implemented yet (the TODO at {rel}:{left[0]} is "
                           f"still there)")
        if not rel.endswith(".cu"):
            continue  # a header (rope.cuh) is compiled where a .cu of the part includes it
        try:
            ptx = build.compile_ptx(path, "90a", include_dirs=[path.parent])
        except build.BuildError as e:
            return False, f"{rel} does not compile: {str(e).strip()[:1500]}"
        empty = list(dict.fromkeys(_demangled(name) for name, body in _entries(ptx) if not any(
            op in body for op in ("st.global", "atom.", "red."))))
        if empty:
            return False, (f"{rel} compiles, but these kernels store nothing (a kernel whose "
                           f"body is still a TODO): {', '.join(empty[:5])}")
        found.append(f"{rel} compiles (nvcc, sm_90a PTX) and each of its kernels stores its result")
    return True, "; ".join(found)


def _demangled(name: str) -> str:
    """"levels_layer_norm::fwd_v3_loop" of an Itanium-mangled kernel name
    (_ZN17levels_layer_norm11fwd_v3_loopIfLi4EEEv...), its template arguments dropped; the
    name itself if it is no nested name."""
    nested = name.startswith("_ZN")
    if not name.startswith("_Z"):
        return name
    parts, rest = [], name[3 if nested else 2:]
    while (m := re.match(r"(\d+)", rest)):
        n = int(m[1])
        parts.append(rest[len(m[1]):len(m[1]) + n])
        rest = rest[len(m[1]) + n:]
        if not nested:
            break
    return "::".join(parts) or name


def _entries(ptx: str):
    """(name, body) of each kernel (.entry) of a PTX module."""
    parts = ptx.split(".entry ")[1:]
    for part in parts:
        yield part.split("(", 1)[0].strip(), part


def _grade_part(repo: Path, part: Part, timeout_s: float, device: str, dtypes, size,
                shares: dict) -> PartResult:
    shares = credit_shares(shares)
    compiles_share = shares["compiles"] if part.level == "cuda" else 0.0
    on_gpu = _device_type(device) == "cuda"
    timed_share = shares["performance"] if on_gpu else 0.0  # without a GPU: not scored
    if part.level == "cuda" and _device_type(device) != "cuda":
        # No process: nothing of Level 5 can run here. The compile is the grader's own.
        start = time.perf_counter()
        ok, done = _compiles(repo, part)
        score = round(part.max_score * compiles_share, 2) if ok else 0.0
        reason = NEEDS_GPU.format(device=device, done=done)
        return PartResult(part.name, part.component, part.level, score, part.max_score, "failed",
                          reason, reason, round(time.perf_counter() - start, 1))
    spec = {"repo": str(repo), "grader": str(ROOT), "component": part.component,
            "level": part.level, "device": device, "dtypes": dtypes, "size": size,
            "performance": ({"reference": shares["performance_reference"],
                             "size": PERFORMANCE_SIZE} if timed_share else None)}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="levels-grade-") as tmp:
        spec["result"] = str(Path(tmp) / _RESULT)
        log, returncode, timed_out = _run_child(
            _bootstrap("equivalence.commands.grade_process._child"), spec, repo, timeout_s)
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
        return failed(f"the process died of signal {signal.Signals(-returncode).name}")
    if returncode != 0 or child is None:
        return failed(f"the process exited with code {returncode} before the checks finished")
    from equivalence.cards import LAYOUTS, get

    if not get(part.component).differentiable:  # a forward-only card: the forward is all
        shares = {**shares, "backward": 0.0}
    part_cells = cells(child["checks"], child["problems"], dtypes, list(LAYOUTS), shares)
    points = part.max_score * (1 - compiles_share - timed_share)
    score, reason, lines = verdict(part_cells, points, part.name)
    if compiles_share and not cheats_that_count(child["checks"], child["problems"]):
        # It ran: it compiled. Not for a cheat: a part whose answer its kernels did not
        # compute earns nothing, its compiling .cu included (every planted cheat scores 0).
        score = round(score + part.max_score * compiles_share, 2)
    if shares["performance"]:
        measured = child.get("performance") or {"error": "the part's process timed nothing"}
        earned, line = performance_points(measured if on_gpu else None,
                                          all(c.ok for c in part_cells), shares,
                                          part.max_score, device)
        lines.insert(0, line)
        if earned is not None:
            score = round(score + earned, 2)
            if earned < part.max_score * timed_share:
                reason = "; ".join(x for x in (reason, line) if x)
    lines += [c["summary"] for c in child["checks"]] + child["notes"]
    lines += [f"{p}: {problem}" for p in ("forward", "backward") for problem in child["problems"][p]]
    lines += [c["text"] for c in child["problems"]["cheats"]]
    status = "passed" if score >= part.max_score else "failed"
    return PartResult(part.name, part.component, part.level, score, part.max_score, status,
                      reason, "\n".join(([reason] if reason else []) + lines), round(seconds, 1),
                      child["checks"])


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
        description="Run the harness on a submission, each assigned component x level in its own "
                    "process with a timeout, print the score table and optionally write "
                    "Gradescope's results.json. Partial credit inside a part: forward and "
                    "backward, each dtype and layout; at a kernel level (triton, cuda, numba) "
                    "only for what the submission's own kernels computed. The parts come from "
                    "--config (the grading.json `levels assignment build` wrote) or --parts. "
                    "Exit 0 at full marks, 1 otherwise, 2 if this machine cannot grade them.")
    p.add_argument("--repo", default=".", help="the submission's directory (default: .)")
    p.add_argument("--gradescope", metavar="FILE", help="write Gradescope's results.json here")
    p.add_argument("--config", metavar="FILE",
                   help="grading config (JSON; written by `levels assignment build`: parts, "
                        "points, credit shares, timeouts, notebooks)")
    p.add_argument("--parts", metavar="PARTS",
                   help="comma-separated component@level (layer_norm@triton,mlp@native), 10 "
                        "points each, instead of the config's")
    p.add_argument("--timeout", type=float, help=f"seconds per part (default {DEFAULT_TIMEOUT_S:g})")
    p.add_argument("--jobs", type=int, help="parts graded at once (default: 2, or 1 on one core)")
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

    from .console import EXIT_USAGE

    kwargs = {} if args.timeout is None else {"timeout_s": args.timeout}
    parts = getattr(args, "parts", None)
    if parts is not None:
        kwargs["parts"] = [p for p in parts.split(",") if p.strip()]
    notebooks = _notebooks_arg(getattr(args, "notebooks", None))
    try:
        result = grade(args.repo, device=args.device, config=args.config, notebooks=notebooks,
                       notebook_timeout_s=getattr(args, "notebook_timeout", None),
                       jobs=getattr(args, "jobs", None), **kwargs)
    except MissingRequirement as exc:
        console.print(f"levels grade: {exc}", style="red", markup=False)
        return EXIT_USAGE
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


__all__ = ["DEFAULT_POINTS", "DTYPES", "MissingRequirement", "Part", "grade", "gradescope",
           "load_config", "requirements", "write_gradescope"]
