"""Solution and hidden-test regions: finding them, and cutting them out of a source file or a
notebook (`levels assignment build`, equivalence/commands/assignment.py, decides which).

Solution regions are marked as nbgrader marks them, in the sources themselves:

    ### BEGIN SOLUTION            (Python: levels/*.py, triton_kernels/, numba_kernels/)
    ...the reference code...
    ### END SOLUTION

    // ### BEGIN SOLUTION         (CUDA: cuda_kernels/<component>.cu)
    ...
    // ### END SOLUTION

and in the notebooks' exercise cells (the same Python markers). A kernel file that holds two
components' solutions (gemm.cu: the MLP's GELU and the SwiGLU MLP's SiLU-multiply) names
each region's owner on its opening line, `// ### BEGIN SOLUTION (swiglu_mlp)`: a region that
names one belongs to that component only. The markers are comments:
the reference repo runs, and is tested, with them in place. In a .py file only a comment
line is a marker (a docstring that shows them, like this one, is not); in a .cu file and a
notebook cell, every line whose text starts with one is (nbgrader's rule). A marker typo, a
region never closed, or a line that looks like a marker but is none, is a ValueError naming
the file (or notebook and cell) and line: a typo must not leave an answer in a student copy.

A source region becomes a TODO that raises (Python) or a TODO comment (CUDA: no one
statement compiles everywhere a region can be; an empty kernel writes nothing, and the
harness's NaN-poisoned outputs fail the check). A notebook's region becomes nbgrader's stub
(`# YOUR CODE HERE` / `raise NotImplementedError()`), and the outputs of the solution and
grade cells, and of any lesson cell that printed a marked source, are cleared. Hidden-test
regions (`### BEGIN HIDDEN TESTS` ... `### END HIDDEN TESTS`) are removed, markers and all.
"""

from __future__ import annotations

import ast
import io
import itertools
import json
import re
import tokenize
from dataclasses import dataclass, field

from levels.contract import COMPONENTS

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


@dataclass
class Region:
    start: int  # 0-based line index of the BEGIN marker
    end: int  # 0-based line index of the END marker
    indent: str
    owner: str | None = None  # the component its BEGIN line names, `(swiglu_mlp)`; None: any


@dataclass
class BuiltNotebook:
    path: str
    solutions: int = 0  # solution regions replaced by nbgrader's stub
    hidden_tests: int = 0  # hidden-test regions removed
    cleared: list[int] = field(default_factory=list)  # cells whose outputs were cleared
    showed_markers: list[int] = field(default_factory=list)  # ...of them, lesson cells


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
    regions, open_at, owner = [], None, None
    for i in sorted(candidates):
        stripped = lines[i].strip()
        if stripped.startswith(begin):
            if open_at is not None:
                raise ValueError(f"{_at(path, i)}: '{begin}' inside the region opened at line "
                                 f"{open_at + 1}")
            open_at = i
            owner = (_owner_named(stripped[len(begin):], path, i)
                     if begin in (PY_BEGIN, CU_BEGIN) else None)
        elif stripped.startswith(end):
            if open_at is None:
                raise ValueError(f"{_at(path, i)}: '{end}' without a '{begin}' before it")
            opener = lines[open_at]
            regions.append(Region(open_at, i, opener[:len(opener) - len(opener.lstrip())], owner))
            open_at = None
        elif _MARKER_LIKE.match(stripped) and not stripped.startswith(_MARKERS):
            raise ValueError(f"{_at(path, i)}: {stripped!r} looks like a marker but is none of "
                             f"{', '.join(repr(m) for m in _MARKERS)}: as it is, what it marks "
                             f"would stay in the student copy")
    if open_at is not None:
        raise ValueError(f"{_at(path, open_at)}: '{begin}' is never closed by '{end}'")
    return regions


def _owner_named(rest: str, path: str, i: int) -> str | None:
    """The component a BEGIN line names after its marker (`(swiglu_mlp)`), None if it names
    none; anything else there is a ValueError: a misspelt owner must not leave a region to
    no one (or to every component of the file)."""
    rest = rest.strip()
    if not rest:
        return None
    named = re.fullmatch(r"\((\w+)\)", rest)
    if not named or named[1] not in COMPONENTS:
        raise ValueError(f"{_at(path, i)}: after the marker, expected nothing or a component in "
                         f"parentheses (one of {', '.join(COMPONENTS)}); got {rest!r}")
    return named[1]


def _function_at(tree: ast.Module, line: int) -> str | None:
    """Name of the top-level function whose source holds 1-based `line`."""
    for node in tree.body:
        functions = (ast.FunctionDef, ast.AsyncFunctionDef)
        if isinstance(node, functions) and node.lineno <= line <= node.end_lineno:
            return node.name
    return None


def _owner(name: str | None) -> str | None:
    """The component a function of a module shared by all five belongs to, by its name:
    `layer_norm_math`, `lstm_steps`, TorchScript's `_conv_bn_eval`."""
    name = (name or "").lstrip("_")
    for component in COMPONENTS:
        if name.startswith(component):
            return component
    return None


def shared(path: str) -> bool:
    """Whether the file holds every component's code (levels/native.py, levels/torchscript.py):
    its regions are then told apart by the function they sit in. A kernel file holds one
    component's (triton_kernels/layer_norm.py), or one part's (the MLP's gemm.py)."""
    return path.startswith("levels/")


def regions_of(text: str, path: str, component: str) -> list[Region]:
    """The regions of `text` (the file `path`) that belong to `component`: in a kernel file,
    those that name it or no one; in levels/, those inside its functions."""
    regions = find_regions(text, path)
    if not shared(path):
        return [r for r in regions if r.owner in (None, component)]
    tree = ast.parse(text, path)
    return [r for r in regions if _owner(_function_at(tree, r.start + 1)) == component]


def blank(text: str, path: str, regions: list[Region], what: str, hidden: str = "") -> str:
    """`text` with each region replaced by a TODO (and, in Python, a NotImplementedError).
    `hidden`: why the region is cut though it is not the student's to write (it would give
    an assigned part's answer away): said instead of "write this part"."""
    lines = text.splitlines(keepends=True)
    out, done = [], 0
    for r in sorted(regions, key=lambda r: r.start):
        out += lines[done:r.start]
        line = len(out) + 2  # the student copy's line of the raise, named in its message
        if path.endswith(_CUDA_SUFFIXES):
            todo = hidden or ("write this part (until you do, the outputs stay NaN and the "
                              "check fails)")
            out.append(f"{r.indent}// TODO: {what}: {todo}.\n")
        elif hidden:
            out.append(f"{r.indent}# {what}: {hidden}.\n")
            out.append(f'{r.indent}raise NotImplementedError("hidden: {what} ({path}:{line}): '
                       f'{hidden}")\n')
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


