"""`levels assignment build` on the notebooks and hidden tests: every answer cut, every
lesson kept, no answer shown by a lesson, and a typo in a marker stops the build instead of
handing out an answer. Then `levels grade --notebooks`: each grade cell scored.

CPU only: two builds of the real repo (a copy of its tracked files, a few seconds each),
small synthetic repos for the failure modes, one exercise run in a subprocess from the
student copy, tiny notebooks graded (a hang cut off at 3 s), and one real notebook graded
from the student copy and from this repo (01, the fastest: about 10 s for both, at once).
CI executes every notebook of this repo besides (--nbmake)."""

import argparse
import ast
import io
import itertools
import json
import os
import re
import subprocess
import sys
import tokenize
from concurrent.futures import ThreadPoolExecutor

import pytest
from rich.console import Console

from equivalence.commands import assignment, grade as grading, grade_notebooks

ROOT = assignment.ROOT
NOTEBOOKS = sorted(rel for rel in assignment.repo_files(ROOT) if rel.endswith(".ipynb"))
MARKER_TEXT = ("BEGIN SOLUTION", "END SOLUTION", "HIDDEN TESTS")


def load(path):
    return json.loads(path.read_text(encoding="utf-8"))


def source(cell):
    text = cell["source"]
    return "".join(text) if isinstance(text, list) else text


def nbgrader(cell):
    return cell.get("metadata", {}).get("nbgrader", {})


def is_exercise(cell):
    return bool(nbgrader(cell).get("solution") or nbgrader(cell).get("grade"))


def as_python(cell_source):
    """The cell as plain Python: IPython's `%line` magics and `!shell` lines become `pass`
    (written here, not taken from assignment.py, so the check does not trust what it checks)."""
    lines = cell_source.splitlines()
    return "\n".join(line[:len(line) - len(line.lstrip())] + "pass"
                     if line.lstrip().startswith(("%", "!")) else line for line in lines)


def marker_lines(marker):
    """(notebook, cell index) of every line of a code cell of the reference notebooks that
    starts with `marker`, counted without assignment.py."""
    found = []
    for rel in NOTEBOOKS:
        for index, cell in enumerate(load(ROOT / rel)["cells"]):
            if cell["cell_type"] == "code":
                found += [(rel, index) for line in source(cell).splitlines()
                          if line.strip().startswith(marker)]
    return found


def code_sources(repo):
    """The source of every code cell of `repo`'s notebooks."""
    return [source(cell) for rel in NOTEBOOKS for cell in load(repo / rel)["cells"]
            if cell["cell_type"] == "code"]


def comment_markers(text):
    """Line numbers of the comments of Python `text` that hold a marker."""
    tokens = tokenize.generate_tokens(io.StringIO(text).readline)
    return [t.start[0] for t in tokens
            if t.type == tokenize.COMMENT and any(m in t.string for m in MARKER_TEXT)]


@pytest.fixture(scope="module")
def built(assignment_build):
    """The session's student copy (tests/conftest.py): its parts blanked, and the parts that
    would give them away, every notebook cleared."""
    copy = assignment_build
    return copy.out, copy, [(p.component, p.level) for p in copy.parts]


def test_no_marker_is_left_in_the_student_copy(built):
    out, _, chosen = built
    for rel in NOTEBOOKS:  # sources, outputs, metadata: the whole file
        text = (out / rel).read_text(encoding="utf-8")
        assert not [m for m in MARKER_TEXT if m in text], rel
    part_files = {f for c, level in assignment.marked_parts(ROOT)
                  for f in assignment.part_files(c, level)}
    for component, level in chosen:  # a blanked part keeps no region (a shared file keeps
        for rel in assignment.part_files(component, level):  # the other components')
            text = (out / rel).read_text(encoding="utf-8")
            assert assignment.regions_of(text, rel, component) == [], (component, level, rel)
    for rel in assignment.repo_files(out):
        if not rel.endswith((".py", ".cu", ".cuh")) or rel in part_files:
            continue  # Markdown may show the markers (it marks nothing); the rest is data
        text = (out / rel).read_text(encoding="utf-8")
        if rel.endswith(".py"):
            kept = comment_markers(text)
        else:
            kept = [i + 1 for i, line in enumerate(text.splitlines())
                    if line.strip().startswith("//") and any(m in line for m in MARKER_TEXT)]
        # only a part's file may keep regions (a part nobody chose); nothing else has any
        assert not kept, f"{rel}: marker comments left at lines {kept}"


def test_every_region_of_the_notebooks_is_counted_and_cut(built):
    out, copy, _ = built
    begins = marker_lines(assignment.PY_BEGIN)
    assert len(begins) == len(marker_lines(assignment.PY_END))
    assert sum(nb.solutions for nb in copy.notebooks) == len(begins)
    assert sum(nb.hidden_tests for nb in copy.notebooks) == len(
        marker_lines(assignment.HIDDEN_BEGIN))
    # every cell nbgrader calls a solution held a region (a typo would leave one without)
    solution_cells = {(rel, i) for rel in NOTEBOOKS
                      for i, cell in enumerate(load(ROOT / rel)["cells"])
                      if nbgrader(cell).get("solution")}
    assert solution_cells and solution_cells == set(begins)
    assert len(begins) == sum(text.count("BEGIN SOLUTION") for text in code_sources(ROOT)), (
        "a line names a solution marker without being one")

    def stubs(repo):
        return sum(1 for text in code_sources(repo)
                   for a, b in itertools.pairwise(line.strip() for line in text.splitlines())
                   if (a, b) == ("# YOUR CODE HERE", "raise NotImplementedError()"))

    assert stubs(out) - stubs(ROOT) == len(begins)


def test_every_code_cell_still_parses(built):
    out, _, _ = built
    for rel in NOTEBOOKS:
        for index, cell in enumerate(load(out / rel)["cells"]):
            if cell["cell_type"] == "code" and not source(cell).lstrip().startswith("%%"):
                try:
                    ast.parse(as_python(source(cell)))
                except SyntaxError as e:
                    pytest.fail(f"{rel} cell {index} no longer parses: {e}")


def test_exercises_lose_their_outputs_and_lessons_keep_theirs(built):
    out, copy, _ = built
    reported = {nb.path: nb for nb in copy.notebooks}
    pictures = 0
    for rel in NOTEBOOKS:
        text = (out / rel).read_text(encoding="utf-8")
        # written as nbformat writes it, so the diff against the reference is the answers
        assert text == json.dumps(json.loads(text), indent=1, sort_keys=True,
                                  ensure_ascii=False) + "\n", rel
        before, after = load(ROOT / rel)["cells"], load(out / rel)["cells"]
        assert len(before) == len(after), rel
        cleared, showed = [], []
        for index, (old, new) in enumerate(zip(before, after)):
            assert new["metadata"] == old["metadata"], f"{rel} cell {index}: metadata changed"
            outputs = json.dumps(old.get("outputs", []))
            if old["cell_type"] == "code" and is_exercise(old):
                assert new["outputs"] == [] and new["execution_count"] is None, (rel, index)
                cleared.append(index)
            elif any(m in outputs for m in MARKER_TEXT):
                # a lesson that printed a marked source: its output showed an answer
                assert new["outputs"] == [] and new["source"] == old["source"], (rel, index)
                cleared.append(index)
                showed.append(index)
            else:
                assert new == old, f"{rel} cell {index} changed, and it is no exercise"
                pictures += outputs.count('"image/png"')
        assert reported[rel].cleared == cleared and reported[rel].showed_markers == showed
    assert pictures > 0, "the lessons' pictures are gone from the student copy"


# Exercise answers in the student copy: each solution region's distinctive lines (code
# lines of ANSWER_MIN_CHARS or more, not given in its own cell or its grade cell) must
# appear nowhere in any notebook of the copy, sources or outputs (a lesson that prints a
# file, or inspect.getsource of a function, holding the answer).
ANSWER_MIN_CHARS = 20  # shorter lines (`cuda.syncthreads()`, `offset //= 2`) are any kernel's
# An exercise that rewrites code its lesson gives: the lines it keeps are the lesson's.
# Keyed by cell id (cells move when a lesson grows): exercise cell -> the cell it rewrites.
GIVEN = {
    # layer_norm_graph is cell 03-27's layer_norm_branchy without its branch
    ("notebooks/03_compile.ipynb", "03-28"): "03-27",
}
# Answers that a lesson of a notebook outside this change still shows, each to be fixed
# there: (notebook, exercise cell) -> the cells that show it. The test fails once one is
# fixed, too, so that its entry goes.
KNOWN_LEAKS: dict = {}  # (notebook, exercise cell) -> {(notebook, cell) that shows its answer}


def code_line(line):
    """A line as code compares: without its comment, whitespace collapsed."""
    if line.lstrip().startswith("#"):
        return ""
    return " ".join(re.sub(r"\s+#.*$", "", line).split())


def answer_lines(rel, cells, index):
    """The distinctive lines of cell `index`'s solution regions (none if it has none)."""
    inside, given, opened = set(), set(), False
    for line in source(cells[index]).splitlines():
        if line.strip().startswith(assignment.PY_BEGIN):
            opened = True
        elif line.strip().startswith(assignment.PY_END):
            opened = False
        else:
            (inside if opened else given).add(code_line(line))
    grade = next((c for c in cells[index + 1:] if nbgrader(c).get("grade")), None)
    rewritten = GIVEN.get((rel, cells[index].get("id")))
    given_cells = [c for c in cells if rewritten and c.get("id") == rewritten]
    for cell in ([grade] if grade else []) + given_cells:
        given |= {code_line(line) for line in source(cell).splitlines()}
    return {line for line in inside - given if len(line) >= ANSWER_MIN_CHARS}


def shown_lines(path):
    """(cell index, code_line) of everything a notebook shows: sources and outputs."""
    def joined(text):  # nbformat keeps text as one string or a list of lines
        return "".join(text) if isinstance(text, list) else text

    for index, cell in enumerate(load(path)["cells"]):
        texts = [source(cell)]
        for out in cell.get("outputs", []):
            texts += [joined(out.get("text", "")), out.get("evalue", ""),
                      "\n".join(out.get("traceback", []))]
            texts += [joined(data) for data in out.get("data", {}).values()]
        for text in texts:
            for line in text.splitlines() if isinstance(text, str) else ():
                yield index, code_line(line)


def leaked_answers(reference, student, notebooks):
    """{(notebook, exercise cell): {(notebook, cell) that shows its answer in `student`}}."""
    where = {}
    for rel in notebooks:
        for index, line in shown_lines(student / rel):
            where.setdefault(line, set()).add((rel, index))
    leaks = {}
    for rel in notebooks:
        cells = load(reference / rel)["cells"]
        for index in range(len(cells)):
            for line in answer_lines(rel, cells, index):
                leaks.setdefault((rel, index), set()).update(where.get(line, ()))
    return {k: v for k, v in leaks.items() if v}


def test_no_exercise_answer_shows_in_the_student_copy(built):
    out, _, _ = built
    assert leaked_answers(ROOT, out, NOTEBOOKS) == KNOWN_LEAKS


def test_the_answer_check_finds_a_lesson_that_prints_the_answer(tmp_path):
    repo = tmp_path / "repo"
    printed = code_cell("print(inspect.getsource(area))", outputs=[{
        "name": "stdout", "output_type": "stream",
        "text": ["def area(r):\n", "    return 3.14159 * r * r\n"]}])
    write_notebook(repo / "notebooks/lesson.ipynb",
                   [printed, code_cell(EXERCISE, "ex1-solution", solution=True),
                    code_cell(GRADE, "ex1-tests", grade=True)])
    assignment.build([], [], tmp_path / "student", repo=repo)
    assert leaked_answers(repo, tmp_path / "student", ["notebooks/lesson.ipynb"]) == {
        ("notebooks/lesson.ipynb", 1): {("notebooks/lesson.ipynb", 0)}}


def test_a_blanked_exercise_fails_its_grade_cell_and_the_reference_passes(built):
    """Notebook 00's third exercise (an MLP checked by the harness), run from the student
    copy after the notebook's setup cell only: the stub raises inside `check`, which reports
    it, and the grade cell's assertion fails; the reference answer, run the same way in the
    same process, passes. (Cheap because this exercise needs nothing but the setup cell.)"""
    out, _, _ = built
    rel = "notebooks/00_start_here.ipynb"

    def cells_of(path):
        cells = load(path)["cells"]
        setup = next(c for c in cells if c["cell_type"] == "code")
        by_id = {nbgrader(c).get("grade_id"): c for c in cells}
        return [source(c) for c in (setup, by_id["00_start_here-ex3-solution"],
                                    by_id["00_start_here-ex3-tests"])]

    script = """
import contextlib, io, json, sys
runs = json.loads(sys.stdin.read())
for name, (setup, exercise, grade) in runs.items():
    ns = {}
    exec(setup, ns)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(exercise, ns)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            exec(grade, ns)
        verdict = "passed"
    except Exception as e:
        verdict = f"{type(e).__name__}: {str(e).splitlines()[0]}"
    print("VERDICT", json.dumps({"run": name, "exercise printed": printed.getvalue(),
                                 "grade cell": verdict}))
"""
    runs = {"student": cells_of(out / rel), "reference": cells_of(ROOT / rel)}
    proc = subprocess.run([sys.executable, "-c", script], input=json.dumps(runs), cwd=out,
                          capture_output=True, text=True, timeout=120, check=False,
                          env=dict(os.environ, PYTHONPATH=str(out)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line.removeprefix("VERDICT ") for line in proc.stdout.splitlines()
             if line.startswith("VERDICT ")]
    verdicts = {r["run"]: r for r in map(json.loads, lines)}
    student, reference = verdicts["student"], verdicts["reference"]
    assert "NotImplementedError" in student["exercise printed"], student
    assert student["grade cell"].startswith("AssertionError"), student
    assert reference["grade cell"] == "passed", reference


# ---------------------------------------------------------------------------------------
# Synthetic repos: hidden tests, and the mistakes that must stop a build
# ---------------------------------------------------------------------------------------

_CELL_IDS = itertools.count()


def code_cell(text, grade_id=None, solution=False, grade=False, outputs=None):
    cell = {"cell_type": "code", "execution_count": 3, "id": f"cell-{next(_CELL_IDS)}",
            "metadata": {}, "outputs": outputs if outputs is not None else
            [{"name": "stdout", "output_type": "stream", "text": ["42\n"]}],
            "source": text.splitlines(keepends=True)}
    if grade_id:
        cell["metadata"]["nbgrader"] = {"grade": grade, "grade_id": grade_id, "locked": grade,
                                        "schema_version": 3, "solution": solution}
        if grade:
            cell["metadata"]["nbgrader"]["points"] = 1
    return cell


def write_notebook(path, cells):
    path.parent.mkdir(parents=True, exist_ok=True)
    notebook = {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path.write_text(json.dumps(notebook, indent=1, sort_keys=True, ensure_ascii=False) + "\n",
                    encoding="utf-8")


EXERCISE = ("def area(r):\n"
            "    ### BEGIN SOLUTION\n"
            "    return 3.14159 * r * r\n"
            "    ### END SOLUTION\n"
            "\n"
            "area(1.0)")
GRADE = ("assert abs(area(2.0) - 12.566) < 1e-2\n"
         "### BEGIN HIDDEN TESTS\n"
         "assert abs(area(3.0) - 28.274) < 1e-2\n"
         "### END HIDDEN TESTS\n"
         "print('correct')")


def test_hidden_tests_go_from_notebooks_and_python_files(tmp_path):
    repo = tmp_path / "repo"
    lesson = code_cell("x = 1\nx", outputs=[{"data": {"image/png": "iVBOR"}, "metadata": {},
                                             "output_type": "display_data"}])
    write_notebook(repo / "notebooks/lesson.ipynb",
                   [lesson, code_cell(EXERCISE, "ex1-solution", solution=True),
                    code_cell(GRADE, "ex1-tests", grade=True)])
    (repo / "tests").mkdir()
    (repo / "tests/test_area.py").write_text(
        'def test_area():\n'
        '    """Markers in a docstring are no region:\n'
        '    ### BEGIN HIDDEN TESTS\n'
        '    """\n'
        '    assert True\n'
        '    ### BEGIN HIDDEN TESTS\n'
        '    assert 1 + 1 == 2  # the secret case\n'
        '    ### END HIDDEN TESTS\n')
    copy = assignment.build([], [], tmp_path / "student", repo=repo)

    assert copy.parts == [] and copy.hidden_tests == {"tests/test_area.py": 1}
    (nb,) = copy.notebooks
    assert (nb.path, nb.solutions, nb.hidden_tests, nb.cleared) == (
        "notebooks/lesson.ipynb", 1, 1, [1, 2])
    tests = (tmp_path / "student/tests/test_area.py").read_text()
    assert "secret" not in tests and tests.count("### BEGIN HIDDEN TESTS") == 1  # the docstring's
    ast.parse(tests)
    lesson_cell, exercise, grade = load(tmp_path / "student/notebooks/lesson.ipynb")["cells"]
    assert lesson_cell == lesson
    assert source(exercise) == ("def area(r):\n"
                                "    # YOUR CODE HERE\n"
                                "    raise NotImplementedError()\n"
                                "\n"
                                "area(1.0)")
    assert source(grade) == "assert abs(area(2.0) - 12.566) < 1e-2\nprint('correct')"
    assert exercise["outputs"] == grade["outputs"] == []
    assert exercise["execution_count"] is grade["execution_count"] is None


@pytest.mark.parametrize("cells, message", [
    ([code_cell("x = 1"), code_cell("def f():\n    ### BEGIN SOLUTION\n    return 1\n")],
     r"notebooks/bad\.ipynb, cell 1, line 2: '### BEGIN SOLUTION' is never closed"),
    ([code_cell("x = 1\n### END SOLUTION")],
     r"notebooks/bad\.ipynb, cell 0, line 2: '### END SOLUTION' without a"),
    ([code_cell("y = 2"), code_cell("## BEGIN SOLUTION\ny = 3\n## END SOLUTION")],
     r"notebooks/bad\.ipynb, cell 1, line 1: '## BEGIN SOLUTION' looks like a marker"),
    ([code_cell("y = 3", "ex-solution", solution=True)],
     (r"notebooks/bad\.ipynb, cell 0: nbgrader's metadata marks it a solution cell, but it "
      r"has no '### BEGIN SOLUTION'")),
    ([code_cell("if True:\n    ### BEGIN HIDDEN TESTS\n    assert x\n    ### END HIDDEN TESTS\n")],
     r"notebooks/bad\.ipynb, cell 0: once its regions are cut, the cell is no longer Python"),
])
def test_a_bad_marker_stops_the_build_naming_notebook_and_cell(tmp_path, cells, message):
    write_notebook(tmp_path / "repo/notebooks/bad.ipynb", cells)
    with pytest.raises(ValueError, match=message):
        assignment.build([], [], tmp_path / "student", repo=tmp_path / "repo")
    assert not (tmp_path / "student").exists(), "a refused build must write nothing"


def test_the_command_reports_what_it_cut(tmp_path):
    repo = tmp_path / "repo"
    printed_source = code_cell("print(src)", outputs=[{
        "name": "stdout", "output_type": "stream",
        "text": ["def f():\n", "    ### BEGIN SOLUTION\n", "    return 1\n"]}])
    write_notebook(repo / "notebooks/lesson.ipynb",
                   [printed_source, code_cell(EXERCISE, "ex1-solution", solution=True),
                    code_cell(GRADE, "ex1-tests", grade=True)])
    sub = argparse.ArgumentParser().add_subparsers(dest="command")
    assignment.add_parser(sub)
    grading.add_parser(sub)
    parser = sub._name_parser_map["assignment"]
    args = parser.parse_args(["build", "--out", str(tmp_path / "student"), "--repo", str(repo)])
    text = io.StringIO()
    assert assignment.run_assignment(args, Console(file=text, width=200)) == 0
    assert ("cleared notebooks/lesson.ipynb: 1 solution region, 1 hidden-test region removed; "
            "outputs of cells 0 (printed a marked source), 1, 2") in text.getvalue()
    half = parser.parse_args(["build", "--components", "layer_norm",
                              "--out", str(tmp_path / "other"), "--repo", str(repo)])
    with pytest.raises(ValueError, match="'components' and 'levels' go together"):
        assignment.run_assignment(half, Console(file=io.StringIO()))


# ---------------------------------------------------------------------------------------
# `levels grade --notebooks`: each grade cell scored, each notebook in its own process
# ---------------------------------------------------------------------------------------

def graded_cell(text, grade_id, points):
    cell = code_cell(text, grade_id, grade=True)
    cell["metadata"]["nbgrader"]["points"] = points
    return cell


def tiny_notebook(answer, grade_cell_edited=False, with_last=True):
    """Two exercises and their grade cells, a lesson cell that hangs, two grade cells after it."""
    ex1_tests = ("print('edited: always passes')" if grade_cell_edited else
                 "assert double(2) == 4, f'double(2) = {double(2)}'\nprint('doubled')")
    return [code_cell("import time"),
            code_cell(f"def double(x):\n    ### BEGIN SOLUTION\n    return {answer}\n"
                      f"    ### END SOLUTION", "ex1-solution", solution=True),
            graded_cell(ex1_tests, "ex1-tests", 2),
            code_cell("### BEGIN SOLUTION\nanswer = 42\n### END SOLUTION", "ex2-solution",
                      solution=True),
            graded_cell("assert answer == 42\nprint('right')", "ex2-tests", 3),
            code_cell("while True:\n    time.sleep(0.05)"),
            graded_cell("print('after the hang')", "ex3-tests", 1),
            ] + ([graded_cell("print('last')", "ex4-tests", 1)] if with_last else [])


def crashing_notebook():
    return [graded_cell("print('before')", "c1-tests", 1),
            code_cell("import os\nos._exit(1)"),  # the kernel dies
            graded_cell("print('after')", "c2-tests", 1)]


def test_notebook_grade_cells_score_their_points_and_a_hang_costs_the_rest(tmp_path):
    reference, sub = tmp_path / "reference", tmp_path / "submission"
    write_notebook(reference / "notebooks/tiny.ipynb", tiny_notebook("2 * x"))
    write_notebook(reference / "notebooks/crash.ipynb", crashing_notebook())
    # the student's: a wrong answer, an edited grade cell (graded by the reference's source
    # all the same), a grade cell deleted
    write_notebook(sub / "notebooks/tiny.ipynb",
                   tiny_notebook("3 * x", grade_cell_edited=True, with_last=False))
    write_notebook(sub / "notebooks/crash.ipynb", crashing_notebook())
    (sub / "levels").mkdir()
    (sub / "levels/__init__.py").write_text("")  # a submission is a levels/ package
    config = {"parts": [], "notebooks": ["notebooks/tiny.ipynb", "notebooks/crash.ipynb"],
              "notebook_timeout_s": 3}
    result = grading.grade(sub, config=config, reference=reference)

    assert [(t["name"], t["score"], t["max_score"], t["status"], t["reason"])
            for t in result["tests"]] == [
        ("tiny.ipynb: ex1-tests", 0, 2, "failed", "AssertionError: double(2) = 6"),
        ("tiny.ipynb: ex2-tests", 3, 3, "passed", ""),
        ("tiny.ipynb: ex3-tests", 0, 1, "failed",
         "not run: the notebook timed out after 3 s in cell 5"),
        ("tiny.ipynb: ex4-tests", 0, 1, "failed",
         ("your notebooks/tiny.ipynb has no grade cell ex4-tests (grade cells must stay in the "
          "notebook as handed out)")),
        # the next notebook starts afresh; its kernel's death costs only what follows it
        ("crash.ipynb: c1-tests", 1, 1, "passed", ""),
        ("crash.ipynb: c2-tests", 0, 1, "failed", "not run: the notebook's kernel died in cell 1"),
    ]
    assert (result["score"], result["max_score"]) == (4, 9)
    assert result["execution_time"] < 60, "the hanging cell was not cut off at its timeout"
    by_id = {t["grade_id"]: t for t in result["tests"]}
    assert by_id["ex2-tests"]["output"] == "right"
    assert "AssertionError: double(2) = 6" in by_id["ex1-tests"]["output"]
    assert "\x1b[" not in by_id["ex1-tests"]["output"]  # IPython's colours taken out
    report = grading.gradescope(result)
    assert [set(t) for t in report["tests"]] == [
        {"name", "score", "max_score", "status", "output", "visibility"}] * 6
    assert "tiny.ipynb: ex1-tests: 0/2 (AssertionError: double(2) = 6)" in report["output"]


def test_a_grade_cell_needs_points_and_a_unique_grade_id(tmp_path):
    write_notebook(tmp_path / "notebooks/a.ipynb", [code_cell("x = 1", "a-tests", grade=True),
                                                    code_cell("x = 2", "a-tests", grade=True)])
    with pytest.raises(ValueError, match=r"notebooks/a\.ipynb, cell 1: grade_id 'a-tests' is used "
                                         r"twice"):
        grade_notebooks.grade_cells(tmp_path, "notebooks/a.ipynb")
    no_points = code_cell("x = 1", "b-tests", grade=True)
    del no_points["metadata"]["nbgrader"]["points"]
    # grade and solution: an answer for a person to grade, no autograder test (so no points
    # needed: the error below is the next cell's)
    answer = code_cell("### BEGIN SOLUTION\nx = 1\n### END SOLUTION", "b-answer", grade=True,
                       solution=True)
    del answer["metadata"]["nbgrader"]["points"]
    write_notebook(tmp_path / "notebooks/b.ipynb", [answer, no_points])
    with pytest.raises(ValueError, match=r"notebooks/b\.ipynb, cell 1: .* needs a grade_id and "
                                         r"numeric points; got grade_id='b-tests', points=None"):
        grade_notebooks.grade_cells(tmp_path, "notebooks/b.ipynb")
    with pytest.raises(ValueError, match="argument 'notebooks': notebooks/c.ipynb is no notebook"):
        grading.grade(ROOT, parts=[], notebooks=["notebooks/c.ipynb"], reference=tmp_path)


def test_the_grade_command_takes_notebooks():
    sub = argparse.ArgumentParser().add_subparsers(dest="command")
    assignment.add_parser(sub)
    grading.add_parser(sub)
    parser = sub._name_parser_map["grade"]
    assert parser.parse_args([]).notebooks is None
    assert grading._notebooks_arg(parser.parse_args(["--notebooks"]).notebooks) is True
    args = parser.parse_args(["--notebooks", "notebooks/01_native.ipynb, notebooks/05_cuda.ipynb",
                              "--notebook-timeout", "120"])
    assert grading._notebooks_arg(args.notebooks) == ["notebooks/01_native.ipynb",
                                                      "notebooks/05_cuda.ipynb"]
    assert args.notebook_timeout == 120
    assert grading.notebooks_with_grade_cells(ROOT) == [rel for rel in NOTEBOOKS if any(
        nbgrader(c).get("grade") for c in load(ROOT / rel)["cells"])]


@pytest.fixture(scope="module")
def notebooks_only(tmp_path_factory):
    """The student copy with the notebooks' exercises cleared and no source part blanked:
    the lessons run the reference's parts, so only the exercises can fail."""
    out = tmp_path_factory.mktemp("notebooks-only") / "student"
    assignment.build([], [], out)
    return out


def test_a_real_notebook_scores_zero_blanked_and_full_as_the_reference(notebooks_only):
    """notebooks/01_native.ipynb, the fastest of 00-07 (about 9 s on 2 cores), graded from
    the student copy and from this repo, at once (each in its own process anyway)."""
    rel = "notebooks/01_native.ipynb"
    cells = grade_notebooks.grade_cells(ROOT, rel)
    with ThreadPoolExecutor(2) as pool:
        student, reference = pool.map(
            lambda repo: grading.grade(repo, parts=[], notebooks=[rel], notebook_timeout_s=300),
            (notebooks_only, ROOT))
    for result in (student, reference):
        assert [t["grade_id"] for t in result["tests"]] == [c.grade_id for c in cells]
        assert result["max_score"] == sum(c.points for c in cells) > 0
    assert reference["score"] == reference["max_score"], [t["reason"] for t in reference["tests"]]
    assert student["score"] == 0
    for t in student["tests"]:  # each lost to an exception of its own cell, not to a timeout
        assert re.match(r"[A-Za-z]+(Error|Exception): ", t["reason"]), t["reason"]
    # the stub raised inside `check`, which reported it; the grade cell rejected the report
    assert student["tests"][0]["reason"] == "AssertionError: the harness rejected my_attention:"
