"""`levels assignment build`: a student copy of the repo with solution regions cut out.

Solution regions are marked as nbgrader marks them, in the sources themselves:

    ### BEGIN SOLUTION            (Python: levels/native.py, triton_kernels/<component>.py)
    ...the reference code...
    ### END SOLUTION

    // ### BEGIN SOLUTION         (CUDA: cuda_kernels/<component>.cu)
    ...
    // ### END SOLUTION

and in the notebooks' exercise cells (notebooks/*.ipynb, the same Python markers). The
markers are comments: the reference repo runs, and is tested, with them in place. In a .py
file only a comment line is a marker (a docstring that shows them, like this one, is not);
in a .cu file and a notebook cell, every line whose text starts with one is (nbgrader's rule).

`build(components, levels, out_dir)` copies the repo's tracked files (`git ls-files`; a
directory that is no git checkout is walked, skipping .git, virtual environments and
caches) and makes three cuts.

1. Sources: in the files of each chosen component x level, every region becomes

    # TODO: layer_norm, Level 1 (native): write this part.
    raise NotImplementedError("TODO: layer_norm, Level 1 (native) (levels/native.py:70)")

at the region's indentation, so the student copy imports and every other part still runs,
and the blanked part fails the harness with a message that says where to work.

Which files belong to which part:

    native   levels/native.py, only the regions inside the component's functions
             (`layer_norm`, `layer_norm_math`, ...: the function's name starts with the
             component's); Level 3 compiles these same `*_math` functions, so a blanked
             native part fails at Level 3 too, by design: it is the student's code
    triton   triton_kernels/<component>.py
    cuda     cuda_kernels/<component>.cu (the MLP's kernels live in gemm.cu)

A CUDA region becomes only a `// TODO` comment. No one statement compiles everywhere a
region can be: `return LEVELS_UNSUPPORTED;` only in an `int` launcher, `__trap()` only in
device code (and it leaves the CUDA context unusable for the rest of the process). An
empty region compiles wherever a Python region would run: it declares nothing used after
it. At run time the kernel then writes nothing, the harness's NaN-poisoned outputs stay NaN,
and the check fails ("non-finite values"): a clean zero, no crash.

2. Notebooks: EVERY tracked notebook, whatever --components and --levels say. A notebook's
exercises belong to its lesson, not to one component x level (04's layernorm kernel is an
exercise of its own, not triton_kernels/layer_norm.py; 00's and 06's are about the recorded
H100 numbers), and a copy that kept any of them would hand out the answers. As nbgrader's
`generate_assignment` does, each region becomes

    # YOUR CODE HERE
    raise NotImplementedError()

at the region's indentation (in a Markdown answer cell: YOUR ANSWER HERE), and the outputs
and execution counts of the solution cells and of their grade cells are cleared: what the
reference answer printed would give it away. Every other cell keeps its outputs (the
lessons' tables and pictures), every cell keeps its metadata (nbgrader's included), and a
notebook is written back as nbformat writes it (indent 1, sorted keys, UTF-8, a final
newline), so it differs from the reference only where an answer was. A lesson cell whose
output shows a marker (04 prints the source of triton_kernels/layer_norm.py's forward kernel,
solution and all) loses its output too: it showed an answer. A cell that nbgrader's
metadata marks as a solution but that holds no region, a line that looks like a marker but
is not one (`## BEGIN SOLUTION`, `### begin solution`), or a cell that no longer parses
once cut, stops the build, naming the notebook and the cell: a typo must not leave an
answer in the copy.

3. Hidden tests: `### BEGIN HIDDEN TESTS` ... `### END HIDDEN TESTS` regions are removed,
markers and all, from every tracked .py file and every notebook cell, whatever the parts.

`levels grade --notebooks` (equivalence/grading.py) scores the returned notebooks' grade
cells. Locked cells are not checksummed as nbgrader does, so a student may edit a grade cell
of their copy; the grader runs its own, the reference's, in its place (as nbgrader's
autograde does), so the edit changes what the student sees, never the score.
"""

from __future__ import annotations

import ast
import io
import itertools
import json
import os
import re
import shutil
import subprocess
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

from levels.contract import COMPONENTS

from ..settings import REPOSITORY

ROOT = REPOSITORY

PY_BEGIN, PY_END = "### BEGIN SOLUTION", "### END SOLUTION"
CU_BEGIN, CU_END = "// ### BEGIN SOLUTION", "// ### END SOLUTION"
HIDDEN_BEGIN, HIDDEN_END = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"
_MARKERS = (PY_BEGIN, PY_END, CU_BEGIN, CU_END, HIDDEN_BEGIN, HIDDEN_END)
# A comment that names a marker without being one: a typo, a slip of case, a hash too few.
# Left alone it would be no region at all, and the answer under it would reach the students.
_MARKER_LIKE = re.compile(r"(//|#)[#/\s]*(begin|end)[\s_]+(solution|hidden[\s_]+tests?)\b",
                          re.IGNORECASE)
_MENTIONS_HIDDEN = re.compile(r"(begin|end)[\s_]+hidden", re.IGNORECASE)
_SHOWS_MARKER = re.compile(r"(BEGIN|END) SOLUTION|(BEGIN|END) HIDDEN TESTS")
_CUDA_SUFFIXES = (".cu", ".cuh")
# nbgrader's stubs (ClearSolutions.code_stub and text_stub), so a student who has met
# nbgrader sees what they expect
NOTEBOOK_CODE_STUB = ("# YOUR CODE HERE", "raise NotImplementedError()")
NOTEBOOK_TEXT_STUB = ("YOUR ANSWER HERE",)

ASSIGNABLE_LEVELS = ("native", "triton", "cuda")
_LEVEL_NUMBER = {"native": 1, "triton": 4, "cuda": 5}
_SKIP_DIRS = {".git", ".venv", "venv", "__pycache__", ".pytest_cache", ".ipynb_checkpoints",
              ".mypy_cache", ".ruff_cache", "build", "dist", "levels-reports"}


@dataclass
class Region:
    start: int  # 0-based line index of the BEGIN marker
    end: int  # 0-based line index of the END marker
    indent: str


@dataclass
class BuiltPart:
    component: str
    level: str
    regions: dict[str, int] = field(default_factory=dict)  # file -> regions blanked


@dataclass
class BuiltNotebook:
    path: str
    solutions: int = 0  # solution regions replaced by nbgrader's stub
    hidden_tests: int = 0  # hidden-test regions removed
    cleared: list[int] = field(default_factory=list)  # cells whose outputs were cleared
    showed_markers: list[int] = field(default_factory=list)  # ...of them, lesson cells


@dataclass
class StudentCopy:
    """What `build` cut: the parts' sources, the notebooks, the hidden tests of .py files."""
    out: Path
    parts: list[BuiltPart] = field(default_factory=list)
    notebooks: list[BuiltNotebook] = field(default_factory=list)  # those with anything cut
    hidden_tests: dict[str, int] = field(default_factory=dict)  # .py file -> regions removed


# Where a rung keeps a component's solution, unless the component's card says otherwise
# (SOLUTION_FILES: the MLP's Level 5 is its GEMM, cuda_kernels/gemm.cu).
USUAL_FILES = {"native": "levels/native.py", "triton": "triton_kernels/{component}.py",
               "cuda": "cuda_kernels/{component}.cu"}


def part_files(component: str, level: str) -> list[str]:
    """The files (relative to the repo) that hold a component's solution at a level."""
    from .. import cards

    if level not in USUAL_FILES:
        raise ValueError(f"argument 'levels' must name levels with solution files "
                         f"({', '.join(ASSIGNABLE_LEVELS)}); got {level!r}")
    own = cards.get(component).solution_files.get(level)
    return [own or USUAL_FILES[level].format(component=component)]


def _comment_lines(text: str, path: str) -> set[int]:
    """0-based indexes of the lines of Python source `text` that hold a comment and nothing
    else: the only lines of a .py file where a marker counts."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError) as e:
        raise ValueError(f"{path}: cannot tell its comments from its strings, it does not "
                         f"tokenize as Python ({e})") from e
    return {t.start[0] - 1 for t in tokens
            if t.type == tokenize.COMMENT and not t.line[:t.start[1]].strip()}


def _at(path: str, i: int) -> str:
    """Where 0-based line `i` of `path` is, for a message: `file:line`, or for a notebook's
    cell (`path` is then "notebook, cell N") `notebook, cell N, line L`."""
    return f"{path}, line {i + 1}" if ", cell " in path else f"{path}:{i + 1}"


def find_regions(text: str, path: str = "<text>", markers: tuple[str, str] | None = None
                 ) -> list[Region]:
    """Every region of `text` between `markers` (default: the solution markers of the
    language of `path`). A marker without its partner, a region inside another, or a line
    that looks like a marker but is not one, is a ValueError naming `path` and the line."""
    if markers is None:
        markers = (CU_BEGIN, CU_END) if path.endswith(_CUDA_SUFFIXES) else (PY_BEGIN, PY_END)
    begin, end = markers
    lines = text.splitlines()
    candidates = _comment_lines(text, path) if path.endswith(".py") else range(len(lines))
    regions, open_at = [], None
    for i in sorted(candidates):
        stripped = lines[i].strip()
        if stripped.startswith(begin):
            if open_at is not None:
                raise ValueError(f"{_at(path, i)}: '{begin}' inside the region opened at line "
                                 f"{open_at + 1}")
            open_at = i
        elif stripped.startswith(end):
            if open_at is None:
                raise ValueError(f"{_at(path, i)}: '{end}' without a '{begin}' before it")
            opener = lines[open_at]
            regions.append(Region(open_at, i, opener[:len(opener) - len(opener.lstrip())]))
            open_at = None
        elif _MARKER_LIKE.match(stripped) and not stripped.startswith(_MARKERS):
            raise ValueError(f"{_at(path, i)}: {stripped!r} looks like a marker but is none of "
                             f"{', '.join(repr(m) for m in _MARKERS)}: as it is, what it marks "
                             f"would stay in the student copy")
    if open_at is not None:
        raise ValueError(f"{_at(path, open_at)}: '{begin}' is never closed by '{end}'")
    return regions


def _function_at(tree: ast.Module, line: int) -> str | None:
    """Name of the top-level function whose source holds 1-based `line`."""
    for node in tree.body:
        functions = (ast.FunctionDef, ast.AsyncFunctionDef)
        if isinstance(node, functions) and node.lineno <= line <= node.end_lineno:
            return node.name
    return None


def _owner(name: str | None) -> str | None:
    for component in COMPONENTS:
        if name is not None and name.startswith(component):
            return component
    return None


def regions_of(text: str, path: str, component: str, level: str) -> list[Region]:
    """The regions of `text` (the file `path`) that belong to `component` at `level`."""
    regions = find_regions(text, path)
    if level != "native":
        return regions
    tree = ast.parse(text, path)
    return [r for r in regions if _owner(_function_at(tree, r.start + 1)) == component]


def blank(text: str, path: str, regions: list[Region], what: str) -> str:
    """`text` with each region replaced by a TODO (and, in Python, a NotImplementedError)."""
    lines = text.splitlines(keepends=True)
    out, done = [], 0
    for r in sorted(regions, key=lambda r: r.start):
        out += lines[done:r.start]
        line = len(out) + 2  # the student copy's line of the raise, named in its message
        if path.endswith(_CUDA_SUFFIXES):
            out.append(f"{r.indent}// TODO: {what}: write this part (the kernel writes nothing "
                       f"until you do, so the check fails on NaN outputs).\n")
        else:
            out.append(f"{r.indent}# TODO: {what}: write this part.\n")
            out.append(f'{r.indent}raise NotImplementedError("TODO: {what} ({path}:{line})")\n')
        done = r.end + 1
    return "".join(out + lines[done:])


def _replace(text: str, cuts: list[tuple[Region, tuple[str, ...]]]) -> str:
    """`text` with each region, markers included, replaced by its stub's lines at the
    region's indentation (an empty stub: the region is removed)."""
    lines = text.splitlines(keepends=True)
    out, done = [], 0
    for r, stub in sorted(cuts, key=lambda cut: cut[0].start):
        out += lines[done:r.start] + [f"{r.indent}{s}\n" for s in stub]
        done = r.end + 1
    new = "".join(out + lines[done:])
    # a cell's source has no final newline; a stub put last must not add one
    return new if text.endswith("\n") else new.removesuffix("\n")


def remove_hidden_tests(text: str, path: str) -> tuple[str, int]:
    """`text` without its hidden-test regions, and how many there were."""
    if not _MENTIONS_HIDDEN.search(text):
        return text, 0  # nearly every file: no need to tokenize it
    regions = find_regions(text, path, (HIDDEN_BEGIN, HIDDEN_END))
    return (_replace(text, [(r, ()) for r in regions]), len(regions)) if regions else (text, 0)


def _python_of_cell(source: str) -> str | None:
    """A code cell's source as plain Python: IPython's line magics and shell escapes
    (`%matplotlib inline`, `!pip ...`) become `pass` (keeping the line numbers and any block
    they sit in); a cell magic (`%%bash`) means the cell is not Python: None."""
    if source.lstrip().startswith("%%"):
        return None
    lines = source.splitlines()
    for i, line in enumerate(lines):
        if line.lstrip().startswith(("%", "!")):
            lines[i] = line[:len(line) - len(line.lstrip())] + "pass"
    return "\n".join(lines)


def _source_text(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def _set_source(cell: dict, text: str) -> None:
    # nbformat stores a source as a list of lines (each with its newline) or one string:
    # keep whichever the notebook used, so the diff is the answer and nothing else
    as_lines = isinstance(cell.get("source"), list)
    cell["source"] = text.splitlines(keepends=True) if as_lines else text


def blank_notebook(text: str, path: str) -> tuple[str, BuiltNotebook]:
    """The notebook `text` (the file `path`, for messages) with its solution regions
    replaced by nbgrader's stub, its hidden tests removed, and the outputs of its solution
    and grade cells cleared. Returns the new text (`text` itself if nothing was cut) and
    what was cut."""
    try:
        nb = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not a notebook (invalid JSON: {e})") from e
    cells = nb.get("cells") if isinstance(nb, dict) else None
    if not isinstance(cells, list):
        raise ValueError(f"{path}: not a notebook: expected a JSON object with a 'cells' list")
    report = BuiltNotebook(path)
    for index, cell in enumerate(cells):
        where = f"{path}, cell {index}"
        kind = cell.get("cell_type")
        nbgrader = cell.get("metadata", {}).get("nbgrader", {})
        source = _source_text(cell)
        if kind != "code" and not nbgrader.get("solution"):
            continue  # Markdown may explain the markers; only an answer cell is cut
        solutions = find_regions(source, where, (PY_BEGIN, PY_END))
        hidden = find_regions(source, where, (HIDDEN_BEGIN, HIDDEN_END))
        if nbgrader.get("solution") and not solutions:
            raise ValueError(f"{where}: nbgrader's metadata marks it a solution cell, but it has "
                             f"no '{PY_BEGIN}' ... '{PY_END}' region: mark the answer (a marker "
                             f"with a typo is no marker, and the answer would stay in)")
        spans = sorted(solutions + hidden, key=lambda r: r.start)
        for a, b in itertools.pairwise(spans):
            if b.start <= a.end:
                raise ValueError(f"{where}: the regions at lines {a.start + 1}-{a.end + 1} and "
                                 f"{b.start + 1}-{b.end + 1} overlap")
        if solutions or hidden:
            stub = NOTEBOOK_CODE_STUB if kind == "code" else NOTEBOOK_TEXT_STUB
            new = _replace(source, [(r, stub) for r in solutions] + [(r, ()) for r in hidden])
            if kind == "code":
                _assert_parses(new, where)
            _set_source(cell, new)
            report.solutions += len(solutions)
            report.hidden_tests += len(hidden)
        exercise = solutions or hidden or nbgrader.get("solution") or nbgrader.get("grade")
        # A lesson's cell may print a marked source (04 prints triton_kernels/layer_norm.py's
        # forward kernel): its output shows an answer the copy has cut, markers and all.
        shows = _SHOWS_MARKER.search(json.dumps(cell.get("outputs", []), ensure_ascii=False))
        if kind == "code" and (exercise or shows):
            cell["outputs"] = []
            cell["execution_count"] = None
            report.cleared.append(index)
            if shows and not exercise:
                report.showed_markers.append(index)
    if not (report.solutions or report.hidden_tests or report.cleared):
        return text, report
    # nbformat's own layout (nbformat.writes, and the final newline of nbformat.write)
    return json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n", report


def _assert_parses(source: str, where: str) -> None:
    python = _python_of_cell(source)
    if python is None:
        return
    try:
        ast.parse(python, where)
    except SyntaxError as e:
        raise ValueError(f"{where}: once its regions are cut, the cell is no longer Python "
                         f"(line {e.lineno}: {e.msg}): a region must not be all of a block's "
                         f"body unless it is a solution (its stub is a statement)") from e


def repo_files(repo: Path) -> list[str]:
    """The repo's tracked files (git), or every file outside .git, venvs and caches."""
    repo = Path(repo)
    if (repo / ".git").exists():
        out = subprocess.run(["git", "ls-files", "-z"], cwd=repo, capture_output=True, check=True)
        names = [n for n in out.stdout.decode().split("\0") if n]
        return [n for n in names if (repo / n).is_file()]  # deleted in the worktree: skipped
    found = []
    for dirpath, dirnames, filenames in os.walk(repo):
        dirnames[:] = sorted(d for d in dirnames
                             if d not in _SKIP_DIRS and not d.endswith(".egg-info"))
        for name in sorted(filenames):
            if not name.endswith((".pyc", ".so")):
                found.append(str((Path(dirpath) / name).relative_to(repo)))
    return found


def marked_parts(repo: Path = ROOT) -> list[tuple[str, str]]:
    """Every (component, level) with at least one solution region in `repo`."""
    repo = Path(repo)
    parts = []
    for level in ASSIGNABLE_LEVELS:
        for component in COMPONENTS:
            for rel in part_files(component, level):
                path = repo / rel
                if path.is_file() and regions_of(path.read_text(), rel, component, level):
                    parts.append((component, level))
                    break
    return parts


def _levels(level_names) -> list[str]:
    import levels
    names = []
    for level in level_names:
        name = levels.resolve(level).name
        if name not in ASSIGNABLE_LEVELS:
            raise ValueError(f"argument 'levels' must name levels with solution files "
                             f"({', '.join(ASSIGNABLE_LEVELS)}); got {level!r}")
        names.append(name)
    return names


def build(components, level_names, out_dir, repo=ROOT) -> StudentCopy:
    """Write a student copy of `repo` into `out_dir` (which must not exist, or be empty):
    the solution regions of every chosen component x level blanked, every notebook's
    exercises cleared, every hidden test removed. No components and no levels: the
    notebooks and hidden tests only. A chosen part with no region at all is a ValueError,
    before anything is written: the student copy would otherwise hold its whole solution."""
    repo, out = Path(repo).resolve(), Path(out_dir).resolve()
    components = list(components)
    level_names = list(level_names)
    if bool(components) != bool(level_names):
        raise ValueError(f"arguments 'components' and 'levels' go together (both, for the parts "
                         f"to blank, or neither, for the notebooks only); got components="
                         f"{components} and levels={level_names}")
    for c in components:
        if c not in COMPONENTS:
            raise ValueError(f"argument 'components' must be from {', '.join(COMPONENTS)}; "
                             f"got {c!r}")
    chosen = _levels(level_names)
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"argument 'out_dir': {out} exists and is not empty")
    if out == repo or (repo in out.parents and not (repo / ".git").exists()):
        # (inside a git checkout it is fine: an untracked directory is never copied)
        raise ValueError(f"argument 'out_dir' must lie outside the repo being copied; got {out}")

    files = repo_files(repo)
    copy = StudentCopy(out)
    new_text: dict[str, str] = {}
    # hidden tests first: a part's TODO names the line of its raise in the finished file
    for rel in files:
        if rel.endswith(".py"):
            text, n = remove_hidden_tests((repo / rel).read_text(encoding="utf-8"), rel)
            if n:
                new_text[rel] = text
                copy.hidden_tests[rel] = n

    for level in chosen:
        for component in components:
            part = BuiltPart(component, level)
            what = f"{component}, Level {_LEVEL_NUMBER[level]} ({level})"
            for rel in part_files(component, level):
                if rel not in files:
                    continue  # refused below
                text = new_text.get(rel, (repo / rel).read_text(encoding="utf-8"))
                regions = regions_of(text, rel, component, level)
                if regions:
                    new_text[rel] = blank(text, rel, regions, what)
                    part.regions[rel] = len(regions)
            untracked = [f for f in part_files(component, level) if f not in files]
            if untracked:
                raise ValueError(f"{component} at level {level}: {', '.join(untracked)} is not "
                                 f"among {repo}'s tracked files (git ls-files): commit it first")
            if not part.regions:
                raise ValueError(f"{component} at level {level} has no solution region "
                                 f"(### BEGIN SOLUTION) in {', '.join(part_files(component, level))}: "
                                 f"mark one, or leave it out of the assignment")
            copy.parts.append(part)

    for rel in files:
        if rel.endswith(".ipynb"):
            text, notebook = blank_notebook((repo / rel).read_text(encoding="utf-8"), rel)
            if notebook.solutions or notebook.hidden_tests or notebook.cleared:
                new_text[rel] = text
                copy.notebooks.append(notebook)

    out.mkdir(parents=True, exist_ok=True)
    for rel in files:
        target = out / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if rel in new_text:
            target.write_text(new_text[rel], encoding="utf-8")
            shutil.copymode(repo / rel, target)
        else:
            shutil.copy2(repo / rel, target, follow_symlinks=False)
    return copy


# ---------------------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------------------

def add_parser(sub) -> None:
    p = sub.add_parser("assignment", help="build a student copy with solution regions blanked",
                       description="Instructor tools. `levels assignment build` copies the repo's "
                                   "tracked files into --out, replaces every '### BEGIN SOLUTION' "
                                   "... '### END SOLUTION' region of the chosen components x "
                                   "levels by a TODO and a NotImplementedError, clears every "
                                   "notebook's exercises (nbgrader's stub; the outputs of the "
                                   "solution and grade cells) and removes every '### BEGIN "
                                   "HIDDEN TESTS' region.")
    actions = p.add_subparsers(dest="assignment_command", metavar="ACTION", required=True)
    b = actions.add_parser(
        "build", help="write the student copy",
        description="Write the student copy. --components and --levels choose the source parts "
                    "to blank (both, or neither for notebooks only). The notebooks' exercises are "
                    "cleared in EVERY notebook whatever the parts: they belong to a lesson, not to "
                    "a component x level, and a copy that kept any would hand out its answers.")
    b.add_argument("--components", default="",
                   help=f"comma-separated, from: {', '.join(COMPONENTS)} (with --levels)")
    b.add_argument("--levels", default="",
                   help=f"comma-separated, from: {', '.join(ASSIGNABLE_LEVELS)} (or 1, 4, 5; "
                        f"with --components)")
    b.add_argument("--out", required=True, help="directory for the student copy (new or empty)")
    b.add_argument("--repo", default=str(ROOT), help="the reference repo (default: this one)")
    p.set_defaults(run=run_assignment)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def run_assignment(args, console) -> int:
    components = [c.strip() for c in args.components.split(",") if c.strip()]
    level_names = [lv.strip() for lv in args.levels.split(",") if lv.strip()]
    copy = build(components, level_names, args.out, args.repo)
    for part in copy.parts:
        where = ", ".join(f"{f} ({_plural(n, 'region')})" for f, n in part.regions.items())
        console.print(f"blanked {part.component} at {part.level}: {where}", markup=False)
    for nb in copy.notebooks:
        hidden = (f", {_plural(nb.hidden_tests, 'hidden-test region')} removed"
                  if nb.hidden_tests else "")
        cells = ", ".join(f"{i} (printed a marked source)" if i in nb.showed_markers else str(i)
                          for i in nb.cleared)
        console.print(f"cleared {nb.path}: {_plural(nb.solutions, 'solution region')}{hidden}; "
                      f"outputs of cells {cells}", markup=False)
    for rel, n in copy.hidden_tests.items():
        console.print(f"removed hidden tests: {rel} ({_plural(n, 'region')})", markup=False)
    console.print(f"wrote the student copy to {args.out}; grade a submission with "
                  f"`levels grade --repo DIR`", markup=False)
    return 0
