"""What a part of an assignment is (a component at a level) and where its solution lives:
shared by `levels assignment build` (assignment.py), its bundle (assignment_bundle.py) and
`levels grade` (grade.py)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ASSIGNABLE_LEVELS = ("native", "torchscript", "compile", "triton", "cuda", "numba")
LEVEL_TITLES = {"native": "Level 1 (native)", "torchscript": "Level 2 (torchscript)",
                "compile": "Level 3 (compile)", "triton": "Level 4 (triton)",
                "cuda": "Level 5 (cuda)", "numba": "the numba twin (Level 5 in Python)"}
# Where a level keeps a component's solution, unless the component's card says otherwise.
USUAL_FILES = {"native": "levels/native.py", "torchscript": "levels/torchscript.py",
               "compile": "levels/native.py", "triton": "triton_kernels/{component}.py",
               "cuda": "cuda_kernels/{component}.cu", "numba": "numba_kernels/{component}.py"}
# The levels whose code of a component would give its answer at a level away: Levels 1-3 are
# one math (Level 3 compiles Level 1's; Level 2 writes it in TorchScript's subset); Level 4,
# Level 5 and the numba twins are one algorithm in three languages.
GIVES_AWAY = {"native": ("torchscript",), "compile": ("torchscript",),
              "torchscript": ("native",), "triton": ("numba", "cuda"),
              "cuda": ("numba", "triton"), "numba": ("cuda", "triton")}
INSTRUCTOR_ONLY = ("notebooks/INSTRUCTORS.md",)
ANSWER_MIN_CHARS = 20  # shorter lines (`offset //= 2`, `x = x.float()`) are any code's
# Files the copy does not run: one that shows an answer is left out rather than refused.
_NOT_RUN = re.compile(r"^(docs|tests|scripts|reports|\.ci)/|\.(md|txt|json|png|log)$")
_SKIP_DIRS = {".git", ".venv", "venv", "__pycache__", ".pytest_cache", ".ipynb_checkpoints",
              ".mypy_cache", ".ruff_cache", "build", "dist", "levels-reports"}


def part_files(component: str, level: str) -> list[str]:
    """The files (relative to the repo) that hold a component's solution at a level."""
    from .. import cards

    if level not in USUAL_FILES:
        raise ValueError(f"argument 'levels' must name levels with solution files "
                         f"({', '.join(ASSIGNABLE_LEVELS)}); got {level!r}")
    own = cards.get(component).solution_files.get(level)
    if own is None:
        return [USUAL_FILES[level].format(component=component)]
    return [own] if isinstance(own, str) else list(own)


def same_algorithm(component: str) -> tuple[str, ...]:
    """The components whose solutions give `component`'s away and the other way round: those
    its card names in SAME_ALGORITHM_AS and those whose cards name it."""
    from .. import cards

    named = set(cards.get(component).same_algorithm_as)
    named |= {c for c in cards.names() if component in cards.get(c).same_algorithm_as}
    return tuple(sorted(named - {component}))


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
