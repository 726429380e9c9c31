"""`levels assignment build`: a student copy of the repo with the answers cut out, and an
instructor's bundle with what grades it.

    levels assignment build --components layer_norm --levels native,triton --out ../ln-student

`build(components, levels, out_dir)` copies the repo's tracked files (`git ls-files`; a
directory that is no git checkout is walked, skipping .git, virtual environments and
caches) and makes these cuts (assignment_regions.py says how a region is found and cut):

1. The parts: every solution region of each chosen component x level becomes a TODO that
   raises (in CUDA, a TODO comment), so the copy imports, every other part still runs, and
   the blanked part fails the harness with a message that says where to work. Which files
   hold a part (`part_files`; a card's SOLUTION_FILES says where it differs):

       native, compile  levels/native.py, the regions inside the component's functions
                        (Level 3 compiles Level 1's `*_math`: one code, two parts)
       torchscript      levels/torchscript.py, the regions inside the component's functions
       triton           triton_kernels/<component>.py (the MLP: triton_kernels/gemm.py)
       cuda             cuda_kernels/<component>.cu (the MLP: gemm.cu)
       numba            numba_kernels/<component>.py (the MLP: gemm.py), the CPU-runnable
                        CUDA exercise: Level 5's kernels in numba, run by its simulator

2. What would give the answer away (GIVES_AWAY): the same component's code at the levels
   that write the same thing another way (Levels 1-3 are one math, written for TorchScript
   at Level 2; Level 4, Level 5 and the numba twins are one algorithm in three languages).
   Their regions are blanked too, with a TODO that says why; one without regions is named
   in the build's report ("still shows ...: mark it to hide it"). So are the regions of the
   components whose solutions are the same algorithm (a card's SAME_ALGORITHM_AS: rms_norm
   and layer_norm), at the same levels.
3. Every notebook's exercises (nbgrader's stub) and the outputs of their cells, whatever the
   parts: a notebook's exercises belong to its lesson, and a copy that kept any would hand
   out its answers. Every hidden-test region, from every .py file and notebook.
4. Instructor-only files (INSTRUCTOR_ONLY: the guide to grading) stay out.
5. No answer anywhere else: each blanked region's distinctive lines (code lines of
   ANSWER_MIN_CHARS or more that the repo shows nowhere outside a region) are looked for in
   every file of the copy, sources, docs, tests and notebooks (their sources and outputs). A
   file that is not code the copy runs (docs, tests, scripts, reports, Markdown) and shows
   one is left out, and the report says so; a module or a notebook that shows one stops the
   build, naming it: mark its region, or change it.

The copy gets ASSIGNMENT.md (what to write, where, `pip install -e .` in the copy, how to
check) and tests/assignment/test_assignment.py: visible tests that run the student's code
and check shapes, dtypes, finite values, a backward that runs and inputs left alone,
never a value. The instructor's bundle (assignment_bundle.py) gets grading.json (the parts,
their points and credit shares: what `levels grade --config` grades, and nothing else), the
hidden tests that were cut, and a Gradescope autograder.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from levels.contract import COMPONENTS

from ..settings import REPOSITORY
from .assignment_regions import (CU_BEGIN, CU_END, HIDDEN_BEGIN, HIDDEN_END, NOTEBOOK_CODE_STUB,
                                 PY_BEGIN, PY_END, BuiltNotebook, Region, blank, blank_notebook,
                                 find_regions, regions_of, remove_hidden_tests)
from .parts import (ANSWER_MIN_CHARS, ASSIGNABLE_LEVELS, GIVES_AWAY, INSTRUCTOR_ONLY,
                    LEVEL_TITLES, _NOT_RUN, part_files, repo_files, same_algorithm)

ROOT = REPOSITORY
__all__ = ["CU_BEGIN", "CU_END", "HIDDEN_BEGIN", "HIDDEN_END", "NOTEBOOK_CODE_STUB", "PY_BEGIN",
           "PY_END", "BuiltNotebook", "Region", "blank", "blank_notebook", "build",
           "find_regions", "marked_parts", "part_files", "regions_of", "remove_hidden_tests",
           "repo_files"]


@dataclass
class BuiltPart:
    component: str
    level: str
    regions: dict[str, int] = field(default_factory=dict)  # file -> regions blanked
    gives_away: bool = False  # blanked because it would show an assigned part's answer


@dataclass
class StudentCopy:
    """What `build` cut: the parts' sources, the notebooks, the hidden tests of .py files."""
    out: Path
    parts: list[BuiltPart] = field(default_factory=list)  # assigned, then given away
    notebooks: list[BuiltNotebook] = field(default_factory=list)  # those with anything cut
    hidden_tests: dict[str, int] = field(default_factory=dict)  # .py file -> regions removed
    hidden_text: dict[str, list[str]] = field(default_factory=dict)  # file -> regions' text
    left_out: dict[str, str] = field(default_factory=dict)  # file -> why it is not in the copy
    printed_answers: dict[str, list[int]] = field(default_factory=dict)  # notebook -> cells
    still_shows: list[str] = field(default_factory=list)  # unmarked files of a given-away level
    instructor: Path | None = None  # the bundle (assignment_bundle.write_bundle)

    @property
    def assigned(self) -> list[BuiltPart]:
        return [p for p in self.parts if not p.gives_away]


def _regions(repo: Path, component: str, level: str, text_of=None) -> dict[str, list[Region]]:
    """{file: regions} of a part in `repo` (files without regions left out)."""
    found = {}
    for rel in part_files(component, level):
        path = repo / rel
        if path.is_file():
            text = text_of(rel) if text_of else path.read_text(encoding="utf-8")
            regions = regions_of(text, rel, component)
            if regions:
                found[rel] = regions
    return found


def marked_parts(repo: Path = ROOT) -> list[tuple[str, str]]:
    """Every (component, level) with at least one solution region in `repo`."""
    return [(c, level) for level in ASSIGNABLE_LEVELS for c in COMPONENTS
            if _regions(Path(repo), c, level)]


def _levels(level_names) -> list[str]:
    import levels
    names = []
    for level in level_names:
        key = str(level).strip().lower()
        name = key if key in ASSIGNABLE_LEVELS else levels.resolve(level).name
        if name not in ASSIGNABLE_LEVELS:
            raise ValueError(f"argument 'levels' must name levels with solution files "
                             f"({', '.join(ASSIGNABLE_LEVELS)}); got {level!r}")
        names.append(name)
    return list(dict.fromkeys(names))


def code_line(line: str, cuda: bool = False) -> str:
    """A line as code compares: its comment dropped, whitespace collapsed."""
    mark = "//" if cuda else "#"
    if line.lstrip().startswith(mark):
        return ""
    return " ".join(re.sub(rf"\s+{re.escape(mark)}.*$", "", line).split())


def _joined(value) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def _output_texts(cell: dict) -> list[str]:
    texts = []
    for out in cell.get("outputs", []):
        texts += [_joined(out.get("text", "")), str(out.get("evalue", "")),
                  "\n".join(out.get("traceback", []))]
        texts += [_joined(v) for v in out.get("data", {}).values()]
    return texts


def shown_lines(rel: str, text: str) -> set[str]:
    """The code lines a file shows a reader: a notebook's cell sources and outputs, any other
    file's lines."""
    import json

    cuda = rel.endswith((".cu", ".cuh"))
    if not rel.endswith(".ipynb"):
        return {code_line(line, cuda) for line in text.splitlines()}
    texts = []
    for cell in json.loads(text).get("cells", []):
        texts += [_joined(cell.get("source", ""))] + _output_texts(cell)
    return {code_line(line) for t in texts for line in t.splitlines()}


def _lesson_lines(text: str, rel: str) -> set[str]:
    """The code lines a notebook's lessons give: its code cells' sources outside regions."""
    import json

    given = set()
    for index, cell in enumerate(json.loads(text).get("cells", [])):
        if cell.get("cell_type") != "code":
            continue
        source = _joined(cell.get("source", ""))
        try:
            cut = {i for r in find_regions(source, f"{rel}, cell {index}")
                   for i in range(r.start, r.end + 1)}
        except ValueError:
            cut = set()
        given |= {code_line(line) for i, line in enumerate(source.splitlines()) if i not in cut}
    return given


def _clear_answer_outputs(rel: str, text: str, answers: set) -> tuple[str, list[int], list[int]]:
    """A notebook without the outputs that show an answer (a lesson that printed a kernel's
    source: running it again in the copy prints the TODO instead): (new text, the cells
    cleared, the cells whose *source* shows one)."""
    import json

    notebook = json.loads(text)
    cleared, sources = [], []
    for index, cell in enumerate(notebook.get("cells", [])):
        if {code_line(line) for line in _joined(cell.get("source", "")).splitlines()} & answers:
            sources.append(index)
        shown = {code_line(line) for t in _output_texts(cell) for line in t.splitlines()}
        if shown & answers:
            cell["outputs"], cell["execution_count"] = [], None
            cleared.append(index)
    if not cleared:
        return text, cleared, sources
    return json.dumps(notebook, indent=1, sort_keys=True, ensure_ascii=False) + "\n", cleared, sources


def answer_lines(repo: Path, files: list[str], blanked: dict[str, list[Region]]) -> dict[str, str]:
    """{distinctive line: the file whose region holds it} of every blanked region: its code
    lines of ANSWER_MIN_CHARS or more that appear nowhere in the repo outside a solution
    region (a line the repo shows elsewhere gives nothing away)."""
    inside: dict[str, str] = {}
    for rel, regions in blanked.items():
        lines = (repo / rel).read_text(encoding="utf-8").splitlines()
        for r in regions:
            for line in lines[r.start + 1:r.end]:
                key = code_line(line, rel.endswith((".cu", ".cuh")))
                if len(key) >= ANSWER_MIN_CHARS:
                    inside.setdefault(key, rel)
    if not inside:
        return {}
    outside: set[str] = set()
    for rel in files:
        if rel.endswith(".ipynb"):
            outside |= _lesson_lines((repo / rel).read_text(encoding="utf-8"), rel)
        if not rel.endswith((".py", ".cu", ".cuh")):
            continue  # given code lives in sources and lessons; elsewhere it is no proof
        text = (repo / rel).read_text(encoding="utf-8")
        try:
            cut = {i for r in find_regions(text, rel) for i in range(r.start, r.end + 1)}
        except ValueError:
            cut = set()
        outside |= {code_line(line, rel.endswith((".cu", ".cuh")))
                    for i, line in enumerate(text.splitlines()) if i not in cut}
    return {line: rel for line, rel in inside.items() if line not in outside}


def build(components, level_names, out_dir, repo=ROOT, instructor_dir=None, points=10.0
          ) -> StudentCopy:
    """Write a student copy of `repo` into `out_dir` (which must not exist, or be empty):
    the solution regions of every chosen component x level blanked, and those of the levels
    that would give them away, every notebook's exercises cleared, every hidden test removed.
    No components and no levels: the notebooks and hidden tests only. With `instructor_dir`,
    the instructor's bundle there too (grading.json with `points` per part, the hidden tests,
    the Gradescope autograder). A chosen part with no region at all, or an answer left in a
    file the copy runs, is a ValueError before anything is written."""
    repo, out = Path(repo).resolve(), Path(out_dir).resolve()
    components, level_names = list(components), list(level_names)
    if bool(components) != bool(level_names):
        raise ValueError(f"arguments 'components' and 'levels' go together (both, for the parts "
                         f"to blank, or neither, for the notebooks only); got components="
                         f"{components} and levels={level_names}")
    for c in components:
        if c not in COMPONENTS:
            raise ValueError(f"argument 'components' must be from {', '.join(COMPONENTS)}; "
                             f"got {c!r}")
    chosen = _levels(level_names)
    for target in [out] + ([Path(instructor_dir).resolve()] if instructor_dir else []):
        if target.exists() and any(target.iterdir()):
            raise ValueError(f"{target} exists and is not empty (argument 'out_dir' or "
                             f"'instructor_dir')")
        if target == repo or (repo in target.parents and not (repo / ".git").exists()):
            # (inside a git checkout it is fine: an untracked directory is never copied)
            raise ValueError(f"the student copy and the bundle must lie outside the repo being "
                             f"copied; got {target}")

    files = [f for f in repo_files(repo) if f not in INSTRUCTOR_ONLY]
    copy = StudentCopy(out)
    new_text: dict[str, str] = {}

    def text_of(rel: str) -> str:
        return new_text.get(rel) or (repo / rel).read_text(encoding="utf-8")

    # hidden tests first: a part's TODO names the line of its raise in the finished file
    for rel in files:
        if rel.endswith(".py"):
            text = (repo / rel).read_text(encoding="utf-8")
            new, n = remove_hidden_tests(text, rel)
            if n:
                lines = text.splitlines()
                copy.hidden_text[rel] = ["\n".join(lines[r.start:r.end + 1]) for r in
                                         find_regions(text, rel, (HIDDEN_BEGIN, HIDDEN_END))]
                new_text[rel], copy.hidden_tests[rel] = new, n

    blanked: dict[str, list[Region]] = {}  # file -> regions cut (the reference's lines)
    wanted = {(c, level): False for level in chosen for c in components}
    for level in chosen:
        for c in components:
            for other in GIVES_AWAY[level]:
                wanted.setdefault((c, other), True)
    for c, level in list(wanted):
        for kin in same_algorithm(c):
            wanted.setdefault((kin, level), True)
    for (component, level), given_away in wanted.items():
        untracked = [f for f in part_files(component, level) if f not in files
                     and (repo / f).exists()]
        if untracked:
            raise ValueError(f"{component} at level {level}: {', '.join(untracked)} is not among "
                             f"{repo}'s tracked files (git ls-files): commit it first")
        regions = _regions(repo, component, level)
        if not regions and not given_away:
            raise ValueError(f"{component} at level {level} has no solution region (### BEGIN "
                             f"SOLUTION) in {', '.join(part_files(component, level))}: mark one, "
                             f"or leave it out of the assignment")
        if not regions:
            copy.still_shows += [f for f in part_files(component, level) if (repo / f).is_file()
                                 and f not in copy.still_shows]
            continue
        part = BuiltPart(component, level, gives_away=given_away)
        title = f"{component}, {LEVEL_TITLES[level]}"
        hidden = (f"hidden while {component} is assigned at another level, whose answer this "
                  f"code would give away" if given_away else "")
        for rel, found in regions.items():
            current = regions_of(text_of(rel), rel, component)
            if current:  # (none left: the same code as a part blanked already, Levels 1 and 3)
                blanked.setdefault(rel, []).extend(found)
                new_text[rel] = blank(text_of(rel), rel, current, title, hidden)
            part.regions[rel] = len(found)
        copy.parts.append(part)

    for rel in files:
        if rel.endswith(".ipynb"):
            text, notebook = blank_notebook((repo / rel).read_text(encoding="utf-8"), rel)
            if notebook.solutions or notebook.hidden_tests or notebook.cleared:
                new_text[rel] = text
                copy.notebooks.append(notebook)

    _leave_out_answers(repo, files, blanked, text_of, new_text, copy)
    files = [f for f in files if f not in copy.left_out]

    out.mkdir(parents=True, exist_ok=True)
    for rel in files:
        target = out / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if rel in new_text:
            target.write_text(new_text[rel], encoding="utf-8")
            shutil.copymode(repo / rel, target)
        else:
            shutil.copy2(repo / rel, target, follow_symlinks=False)
    from . import assignment_bundle

    assignment_bundle.write_student_files(copy)
    if instructor_dir:
        copy.instructor = assignment_bundle.write_bundle(copy, repo, Path(instructor_dir).resolve(),
                                                         points)
    return copy


def _leave_out_answers(repo: Path, files: list[str], blanked: dict, text_of, new_text: dict,
                       copy) -> None:
    """Find every blanked region's distinctive lines in the copy-to-be: a file the copy does
    not run is left out (copy.left_out), a module or notebook is refused (ValueError)."""
    answers = answer_lines(repo, files, blanked)
    if not answers:
        return
    refused = []
    for rel in files:
        if rel.endswith((".png", ".jpg", ".gz", ".zip", ".so")):
            continue
        if rel.endswith(".ipynb"):
            new, cleared, sources = _clear_answer_outputs(rel, text_of(rel), set(answers))
            if cleared:
                new_text[rel] = new
                copy.printed_answers[rel] = cleared
            if sources:
                refused.append(f"{rel}: cell(s) {', '.join(map(str, sources))} show lines of an "
                               f"answer in their source")
            continue
        try:
            shown = shown_lines(rel, text_of(rel)) & set(answers)
        except (UnicodeDecodeError, ValueError):
            continue
        if not shown:
            continue
        line = sorted(shown)[0]
        why = f"it shows {len(shown)} line(s) of the answer in {answers[line]} (e.g. {line!r})"
        if _NOT_RUN.search(rel):
            copy.left_out[rel] = why
        else:
            refused.append(f"{rel}: {why}")
    if refused:
        raise ValueError("the student copy would still show the answer (mark these regions "
                         "too, or change the files):\n  " + "\n  ".join(refused))


# ---------------------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------------------

def add_parser(sub) -> None:
    p = sub.add_parser("assignment", help="build a student copy with solution regions blanked",
                       description="Instructor tools. `levels assignment build` copies the repo's "
                                   "tracked files into --out with the chosen parts' solution "
                                   "regions (and those of the levels that would give them away) "
                                   "replaced by TODOs, every notebook's exercises cleared and "
                                   "every hidden test removed; and writes the instructor's "
                                   "bundle (grading.json, the hidden tests, a Gradescope "
                                   "autograder) into --instructor.")
    actions = p.add_subparsers(dest="assignment_command", metavar="ACTION", required=True)
    b = actions.add_parser(
        "build", help="write the student copy and the instructor's bundle",
        description="Write the student copy. --components and --levels choose the source parts "
                    "to blank (both, or neither for notebooks only). The notebooks' exercises are "
                    "cleared in EVERY notebook whatever the parts: they belong to a lesson, not to "
                    "a component x level, and a copy that kept any would hand out its answers.")
    b.add_argument("--components", default="",
                   help=f"comma-separated, from: {', '.join(COMPONENTS)} (with --levels)")
    b.add_argument("--levels", default="",
                   help=f"comma-separated, from: {', '.join(ASSIGNABLE_LEVELS)} (or 1-5; with "
                        f"--components)")
    b.add_argument("--out", required=True, help="directory for the student copy (new or empty)")
    b.add_argument("--instructor", help="directory for the instructor's bundle (new or empty; "
                                        "default: OUT-instructor)")
    b.add_argument("--points", type=float, default=10.0, help="points per part (default 10)")
    b.add_argument("--repo", default=str(ROOT), help="the reference repo (default: this one)")
    p.set_defaults(run=run_assignment)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def run_assignment(args, console) -> int:
    components = [c.strip() for c in args.components.split(",") if c.strip()]
    level_names = [lv.strip() for lv in args.levels.split(",") if lv.strip()]
    instructor = getattr(args, "instructor", None) or f"{str(args.out).rstrip('/')}-instructor"
    copy = build(components, level_names, args.out, args.repo, instructor,
                 getattr(args, "points", 10.0))
    for part in copy.parts:
        where = ", ".join(f"{f} ({_plural(n, 'region')})" for f, n in part.regions.items())
        verb = "hid (it would give the answer away)" if part.gives_away else "blanked"
        console.print(f"{verb} {part.component} at {part.level}: {where}", markup=False)
    for rel in copy.still_shows:
        console.print(f"note: {rel} still shows an assigned component's code another way (no "
                      f"solution markers in it): mark it to hide it", markup=False)
    for nb in copy.notebooks:
        hidden = (f", {_plural(nb.hidden_tests, 'hidden-test region')} removed"
                  if nb.hidden_tests else "")
        cells = ", ".join(f"{i} (printed a marked source)" if i in nb.showed_markers else str(i)
                          for i in nb.cleared)
        console.print(f"cleared {nb.path}: {_plural(nb.solutions, 'solution region')}{hidden}; "
                      f"outputs of cells {cells}", markup=False)
    for rel, n in copy.hidden_tests.items():
        console.print(f"removed hidden tests: {rel} ({_plural(n, 'region')})", markup=False)
    for rel, why in copy.left_out.items():
        console.print(f"left out {rel}: {why}", markup=False)
    for rel, cells in copy.printed_answers.items():
        console.print(f"cleared {rel}: outputs of cells {', '.join(map(str, cells))} (printed an "
                      f"assigned part's answer)", markup=False)
    console.print(f"wrote the student copy to {args.out}", markup=False)
    if copy.instructor:
        console.print(f"wrote the instructor's bundle to {copy.instructor}: grade a submission "
                      f"with `levels grade --repo DIR --config {copy.instructor}/grading.json`",
                      markup=False)
    return 0
