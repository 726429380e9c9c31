"""`levels grade --notebooks`: the notebooks' grade cells, each notebook run in a process of its
own (equivalence/commands/grade.py says how a grade cell is scored)."""

from __future__ import annotations

import ast
import json
import re
import tempfile
import time
from pathlib import Path

from .grade_process import _EVENTS, ROOT, GradeCell, PartResult, _bootstrap, _inside, _run_child

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
    from .parts import repo_files
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

        log, returncode, killed = _run_child(_bootstrap("equivalence.commands.grade_notebooks._notebook_child"), spec, repo,
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
