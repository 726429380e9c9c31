"""What `levels assignment build` writes besides the blanked sources: the student copy's
ASSIGNMENT.md and visible tests, and the instructor's bundle.

The bundle (never handed out):

    grading.json        the parts as built, their points and credit shares, the files a
                        student may change: what `levels grade --config` grades, nothing else
    hidden-tests.md     every hidden-test region the build cut, for the instructor to read
    INSTRUCTORS.md      the guide (left out of the student copy)
    gradescope/         setup.sh, run_autograder, prepare_submission.py, grading.json, and
                        autograder.zip of them with the grading repo in repo/: upload the zip
                        as the assignment's autograder

On Gradescope, `run_autograder` starts from a fresh copy of the handout (handout/ in the zip)
and takes from the submission only the files the student was to write (grading.json's
"student_files", found wherever the upload put them: a whole directory, one folder deep, or
the files alone), then runs `levels grade` with the grading repo's harness and writes
/autograder/results/results.json. Whatever goes wrong, it writes a results.json that says
so, because Gradescope shows nothing else.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import zipfile
from pathlib import Path

from .grade_credit import DEFAULT_CREDIT

STUDENT_TESTS = "tests/assignment/test_assignment.py"
# Numba's simulator runs a CUDA thread as an OS thread: its parts are checked in float32
# only (the twins compute in float32 anyway: 16-bit inputs are upcast, binding.py).
_PART_DTYPES = {"numba": ["float32"]}


def _parts(copy) -> list:
    return [(p.component, p.level) for p in copy.assigned]


def _torch_version() -> str:
    import torch
    return torch.__version__.split("+")[0]


def write_student_files(copy) -> None:
    """ASSIGNMENT.md and the visible tests, in the student copy."""
    from .parts import LEVEL_TITLES

    parts = _parts(copy)
    lines = ["# Your assignment", ""]
    if parts:
        lines += ["Write the parts below: each `# TODO` (in CUDA, `// TODO`) in these files is "
                  "yours.", ""]
        for p in copy.assigned:
            lines.append(f"- **{p.component}, {LEVEL_TITLES[p.level]}**: "
                         + ", ".join(f"`{rel}`" for rel in p.regions))
        hidden = [p for p in copy.parts if p.gives_away]
        if hidden:
            lines += ["", "Cut as well, because they would show the answer another way (not "
                      "yours to write, and not graded): "
                      + ", ".join(f"{p.component} at {p.level}" for p in hidden) + "."]
    else:
        lines.append("The exercises are in the notebooks: each `# YOUR CODE HERE` is yours.")
    lines += ["", "## Set up", "", "Install *this* copy, so that `levels`, the notebooks and the "
              "tests run your code and not another copy's:", "", "```bash",
              "python -m venv .venv && . .venv/bin/activate",
              f"pip install torch=={_torch_version()}  # first, alone: pip then keeps this build",
              "pip install -e \".[test]\"", "```", "", "## Check your work", "", "```bash"]
    for component, level in parts:
        lines.append(f"levels check --component {component} --level {level}")
    if parts:
        lines.append(f"python -m pytest -q {STUDENT_TESTS}")
    lines += ["```", "", "`levels check` compares your code with a float64 reference on fresh "
              "random inputs, forward and backward, in float32 and bfloat16, in two memory "
              "layouts. The visible tests check what can be checked without the answer: shapes, "
              "dtypes, finite values, a backward that runs, inputs left alone. The grader runs "
              "the harness with hidden tests besides, and gives partial credit: the forward and "
              "the backward, each dtype and each layout count separately. At a kernel level "
              "only what your own kernels compute counts.", ""]
    if any(level == "cuda" for _, level in parts):
        lines += ["Level 5 runs only on an NVIDIA GPU (`levels check` says so elsewhere). "
                  "Without one, the grader compiles your `.cu` file with nvcc and checks that "
                  "every kernel in it stores its result: that earns a share of the part; the "
                  "rest is graded where there is a GPU. Compile it yourself with `python -c "
                  "\"from cuda_kernels import build; build.compile_ptx('cuda_kernels/FILE.cu', "
                  "'90a', include_dirs=['cuda_kernels'])\"` (nvcc's errors name the file and "
                  "line).", ""]
    (copy.out / "ASSIGNMENT.md").write_text("\n".join(lines))
    if parts:
        target = copy.out / STUDENT_TESTS
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(_VISIBLE_TESTS.replace("PARTS = []", f"PARTS = {parts!r}"))


_VISIBLE_TESTS = '''"""Visible tests of your assignment: they run your code and check what can be checked
without giving the answer away: output shapes and dtypes, finite values, a backward that runs
and gives gradients of the inputs' shapes, inputs left unchanged. They compare no value: the
grader does, against a float64 reference on fresh random inputs (run `levels check` to see
how your values fare)."""

import pytest
import torch

import levels
from equivalence import cards

PARTS = []


def _level(level):
    if level == "numba":
        import numba_kernels.level
        levels.register("numba", numba_kernels.level)
    return levels.get(level)


def _flat(value):
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _flat(v)]
    return [value]


@pytest.mark.parametrize("component, level", PARTS)
def test_runs_with_the_right_shapes_forward_and_backward(component, level):
    card = cards.get(component)
    for variant in card.variants:
        case = card.case("tiny", variant, torch.float32, "cpu", seed=0)
        args = {k: v.detach().clone().requires_grad_(k in case.differentiable)
                if isinstance(v, torch.Tensor) else v for k, v in case.args.items()}
        kept = {k: v.detach().clone() for k, v in args.items()
                if isinstance(v, torch.Tensor) and k not in case.mutated}
        with torch.no_grad():  # shapes only: the reference's values are not looked at
            wanted = card.reference({k: v.detach().double() if isinstance(v, torch.Tensor)
                                     else v for k, v in case.args.items()})
        outs = _flat(getattr(_level(level), component)(**args))
        for got, want in zip(outs, wanted):
            assert isinstance(got, torch.Tensor), f"{component}: an output is {type(got)}"
            assert got.shape == want.shape, f"{component}: output shape {tuple(got.shape)}"
            assert got.dtype == torch.float32, f"{component}: output dtype {got.dtype}"
            assert torch.isfinite(got).all(), f"{component}: non-finite values in an output"
        inputs = [args[n] for n in case.differentiable]
        grads = torch.autograd.grad([o for o in outs if o.requires_grad], inputs,
                                    [torch.ones_like(o) for o in outs if o.requires_grad],
                                    allow_unused=True)
        for name, x, g in zip(case.differentiable, inputs, grads):
            assert g is not None, f"{component}: no gradient for {name}"
            assert g.shape == x.shape, f"{component}: grad {name} has shape {tuple(g.shape)}"
            assert torch.isfinite(g).all(), f"{component}: non-finite values in grad {name}"
        for name, before in kept.items():
            assert torch.equal(args[name].detach(), before), f"{component}: {name} was modified"
'''


def write_bundle(copy, repo: Path, out: Path, points: float) -> Path:
    """The instructor's bundle for `copy` (see the module doc) into `out`."""
    from .parts import INSTRUCTOR_ONLY, part_files, repo_files
    from .grade import DEFAULT_TIMEOUT_S, DTYPES

    out.mkdir(parents=True, exist_ok=True)
    student_files = sorted({f for c, level in _parts(copy) for f in part_files(c, level)})
    student_files += sorted(nb.path for nb in copy.notebooks if nb.solutions)
    config = {
        "assignment": {"components": sorted({c for c, _ in _parts(copy)}),
                       "levels": sorted({lv for _, lv in _parts(copy)}),
                       "built_from": _commit(repo), "student_files": student_files},
        "parts": [{"component": c, "level": level, "points": points}
                  | ({"dtypes": _PART_DTYPES[level]} if level in _PART_DTYPES else {})
                  for c, level in _parts(copy)],
        "credit": dict(DEFAULT_CREDIT), "timeout_s": DEFAULT_TIMEOUT_S, "dtypes": list(DTYPES),
        "notebooks": False,
    }
    (out / "grading.json").write_text(json.dumps(config, indent=2) + "\n")
    hidden = ["# Hidden tests cut from the student copy", ""]
    for rel, regions in copy.hidden_text.items():
        hidden += [f"## {rel}", ""] + [f"```python\n{text}\n```\n" for text in regions]
    for nb in copy.notebooks:
        if nb.hidden_tests:
            hidden += [f"## {nb.path}", "", "The grader runs the reference's grade cells, these "
                       "regions included.", ""]
            hidden += [f"Cell {index}:\n\n```python\n{text}\n```\n"
                       for index, text in _notebook_hidden_tests(repo / nb.path, nb.path)]
    (out / "hidden-tests.md").write_text("\n".join(hidden) + "\n")
    for rel in INSTRUCTOR_ONLY:
        if (repo / rel).is_file():
            shutil.copy2(repo / rel, out / Path(rel).name)
    _gradescope(out / "gradescope", repo, copy.out, config, repo_files(repo))
    return out


def _notebook_hidden_tests(path: Path, rel: str) -> list[tuple[int, str]]:
    """(cell index, text) of every hidden-test region of a notebook."""
    from .assignment_regions import HIDDEN_BEGIN, HIDDEN_END, find_regions

    found = []
    for index, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else source
        lines = source.splitlines()
        for r in find_regions(source, f"{rel}, cell {index}", (HIDDEN_BEGIN, HIDDEN_END)):
            found.append((index, "\n".join(lines[r.start:r.end + 1])))
    return found


def _commit(repo: Path) -> str | None:
    proc = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True,
                          check=False)
    return proc.stdout.strip() or None if proc.returncode == 0 else None


def _gradescope(out: Path, repo: Path, handout: Path, config: dict, files: list[str]) -> Path:
    """setup.sh, run_autograder, prepare_submission.py, grading.json and autograder.zip."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "setup.sh").write_text(_SETUP.replace("TORCH_VERSION", _torch_version()))
    (out / "run_autograder").write_text(_RUN)
    (out / "prepare_submission.py").write_text(_PREPARE)
    (out / "grading.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in ("setup.sh", "run_autograder"):
        (out / name).chmod(0o755)
    with zipfile.ZipFile(out / "autograder.zip", "w", zipfile.ZIP_DEFLATED) as z:
        for name in ("setup.sh", "run_autograder", "prepare_submission.py", "grading.json"):
            z.write(out / name, name)
        for rel in files:
            z.write(repo / rel, f"repo/{rel}")
        for path in sorted(handout.rglob("*")):
            if path.is_file():
                z.write(path, f"handout/{path.relative_to(handout)}")
    return out


_SETUP = """#!/usr/bin/env bash
# Gradescope runs this once, as root, in /autograder/source (the zip's contents), to build the
# autograder's image. The grader's Python lives in /autograder/venv: torch first (the CPU
# wheel, the version the bundle was built with), then the grading repo with what `levels
# grade` needs (nbclient & co. for --notebooks; Gradescope's machines have no GPU).
set -euo pipefail
cd "$(dirname "$0")"
if ! command -v python3 >/dev/null || ! python3 -m venv --help >/dev/null 2>&1; then
  apt-get update && apt-get install -y python3 python3-venv python3-pip g++
fi
python3 -m venv /autograder/venv
/autograder/venv/bin/pip install --upgrade pip
/autograder/venv/bin/pip install "torch==TORCH_VERSION" --index-url https://download.pytorch.org/whl/cpu
/autograder/venv/bin/pip install -e "./repo[test]" nbformat nbclient ipykernel
"""

_RUN = """#!/usr/bin/env bash
# Gradescope runs this for each submission. AUTOGRADER_ROOT and LEVELS_PYTHON stand in for
# /autograder and its venv when the package is tried elsewhere (its CI test does).
set -uo pipefail
ROOT="${AUTOGRADER_ROOT:-/autograder}"
SOURCE="$ROOT/source"
PY="${LEVELS_PYTHON:-$ROOT/venv/bin/python}"
WORK="$(mktemp -d)"
mkdir -p "$ROOT/results"
RESULTS="$ROOT/results/results.json"
rm -f "$RESULTS"
"$PY" "$SOURCE/prepare_submission.py" "$SOURCE" "$ROOT/submission" "$WORK/submission" \\
  > "$WORK/prepare.log" 2>&1
prepared=$?
if [ "$prepared" -eq 0 ]; then
  # from the grading repo: `-m equivalence` must find the grader's harness, not the student's
  (cd "$SOURCE/repo" && "$PY" -m equivalence grade --repo "$WORK/submission" \\
     --config "$SOURCE/grading.json" --gradescope "$RESULTS") > "$WORK/grade.log" 2>&1
fi
if [ ! -s "$RESULTS" ]; then
  "$PY" - "$RESULTS" "$WORK" <<'EOF'
import json, pathlib, sys
logs = "".join(p.read_text(errors="replace") for p in sorted(pathlib.Path(sys.argv[2]).glob("*.log")))
json.dump({"score": 0, "execution_time": 0,
           "output": "The autograder could not grade this submission:\\n" + logs[-5000:],
           "visibility": "visible", "tests": []}, open(sys.argv[1], "w"), indent=2)
EOF
fi
cat "$WORK"/*.log
exit 0
"""

_PREPARE = '''"""Gradescope: the submission to grade, made from a fresh copy of the handout and the files
the student was to write (grading.json's assignment.student_files), wherever the upload put
them: the whole directory, the directory one folder deep, or the files alone (by name).
Usage: prepare_submission.py SOURCE UPLOAD OUT"""

import json
import shutil
import sys
from pathlib import Path

source, upload, out = (Path(a) for a in sys.argv[1:4])
config = json.loads((source / "grading.json").read_text())
shutil.copytree(source / "handout", out)
roots = [upload] + [d for d in sorted(upload.iterdir()) if d.is_dir()] if upload.is_dir() else []
taken = []
for rel in config["assignment"]["student_files"]:
    found = next((r / rel for r in roots if (r / rel).is_file()), None)
    if found is None:  # uploaded alone: by its name, if only one upload has it
        named = [p for p in upload.rglob(Path(rel).name) if p.is_file()]
        found = named[0] if len(named) == 1 else None
    if found is not None:
        shutil.copy2(found, out / rel)
        taken.append(rel)
print("taken from the submission:", ", ".join(taken) or "nothing (the handout is graded as is)")
'''
