"""`levels assignment build`: a student copy of the repo with solution regions cut out.

Solution regions are marked as nbgrader marks them, in the sources themselves:

    ### BEGIN SOLUTION            (Python: levels/native.py, triton_kernels/<component>.py)
    ...the reference code...
    ### END SOLUTION

    // ### BEGIN SOLUTION         (CUDA: cuda_kernels/<component>.cu)
    ...
    // ### END SOLUTION

The markers are comments: the reference repo runs, and is tested, with them in place.

`build(components, levels, out_dir)` copies the repo's tracked files (`git ls-files`; a
directory that is no git checkout is walked, skipping .git, virtual environments and
caches) and, in the files of each chosen component x level, replaces every region by

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

Not yet: notebook cells (nbgrader's cell metadata) are copied unchanged, and
`### BEGIN HIDDEN TESTS` regions are not removed.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from levels.contract import COMPONENTS

ROOT = Path(__file__).resolve().parent.parent

PY_BEGIN, PY_END = "### BEGIN SOLUTION", "### END SOLUTION"
CU_BEGIN, CU_END = "// ### BEGIN SOLUTION", "// ### END SOLUTION"

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


def part_files(component: str, level: str) -> list[str]:
    """The files (relative to the repo) that hold a component's solution at a level."""
    if level == "native":
        return ["levels/native.py"]
    if level == "triton":
        return [f"triton_kernels/{component}.py"]
    if level == "cuda":
        return ["cuda_kernels/gemm.cu" if component == "mlp" else f"cuda_kernels/{component}.cu"]
    raise ValueError(f"argument 'levels' must name levels with solution files "
                     f"({', '.join(ASSIGNABLE_LEVELS)}); got {level!r}")


def find_regions(text: str, path: str = "<text>") -> list[Region]:
    """Every solution region of `text`; a marker without its partner, or a region inside
    another, is a ValueError naming the file and line."""
    begin, end = (CU_BEGIN, CU_END) if path.endswith((".cu", ".cuh")) else (PY_BEGIN, PY_END)
    regions, open_at = [], None
    for i, line in enumerate(text.splitlines()):
        stripped = line.strip()
        if stripped.startswith(begin):
            if open_at is not None:
                raise ValueError(f"{path}:{i + 1}: '{begin}' inside the region opened at line "
                                 f"{open_at + 1}")
            open_at = i
        elif stripped.startswith(end):
            if open_at is None:
                raise ValueError(f"{path}:{i + 1}: '{end}' without a '{begin}' before it")
            opener = text.splitlines()[open_at]
            regions.append(Region(open_at, i, opener[:len(opener) - len(opener.lstrip())]))
            open_at = None
    if open_at is not None:
        raise ValueError(f"{path}:{open_at + 1}: '{begin}' is never closed by '{end}'")
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
        if path.endswith((".cu", ".cuh")):
            out.append(f"{r.indent}// TODO: {what}: write this part (the kernel writes nothing "
                       f"until you do, so the check fails on NaN outputs).\n")
        else:
            out.append(f"{r.indent}# TODO: {what}: write this part.\n")
            out.append(f'{r.indent}raise NotImplementedError("TODO: {what} ({path}:{line})")\n')
        done = r.end + 1
    return "".join(out + lines[done:])


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


def build(components, level_names, out_dir, repo=ROOT) -> list[BuiltPart]:
    """Write a student copy of `repo` into `out_dir` (which must not exist, or be empty)
    with the solution regions of every chosen component x level blanked. A chosen part
    with no region at all is a ValueError, before anything is written: the student copy
    would otherwise hold its whole solution."""
    repo, out = Path(repo).resolve(), Path(out_dir).resolve()
    components = list(components)
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
    new_text: dict[str, str] = {}
    built = []
    for level in chosen:
        for component in components:
            part = BuiltPart(component, level)
            what = f"{component}, Level {_LEVEL_NUMBER[level]} ({level})"
            for rel in part_files(component, level):
                if rel not in files:
                    continue  # refused below
                text = new_text.get(rel, (repo / rel).read_text())
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
            built.append(part)

    out.mkdir(parents=True, exist_ok=True)
    for rel in files:
        target = out / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if rel in new_text:
            target.write_text(new_text[rel])
            shutil.copymode(repo / rel, target)
        else:
            shutil.copy2(repo / rel, target, follow_symlinks=False)
    return built


# ---------------------------------------------------------------------------------------
# The command line (equivalence/cli.py wires these in)
# ---------------------------------------------------------------------------------------

def add_parser(sub) -> None:
    p = sub.add_parser("assignment", help="build a student copy with solution regions blanked",
                       description="Instructor tools. `levels assignment build` copies the repo's "
                                   "tracked files into --out and replaces every '### BEGIN SOLUTION' "
                                   "... '### END SOLUTION' region of the chosen components x levels "
                                   "by a TODO and a NotImplementedError.")
    actions = p.add_subparsers(dest="assignment_command", metavar="ACTION", required=True)
    b = actions.add_parser("build", help="write the student copy")
    b.add_argument("--components", required=True, help=f"comma-separated, from: {', '.join(COMPONENTS)}")
    b.add_argument("--levels", required=True,
                   help=f"comma-separated, from: {', '.join(ASSIGNABLE_LEVELS)} (or 1, 4, 5)")
    b.add_argument("--out", required=True, help="directory for the student copy (new or empty)")
    b.add_argument("--repo", default=str(ROOT), help="the reference repo (default: this one)")


def run_assignment(args, console) -> int:
    components = [c.strip() for c in args.components.split(",") if c.strip()]
    level_names = [lv.strip() for lv in args.levels.split(",") if lv.strip()]
    built = build(components, level_names, args.out, args.repo)
    for part in built:
        where = ", ".join(f"{f} ({n} region{'s' if n > 1 else ''})" for f, n in part.regions.items())
        console.print(f"blanked {part.component} at {part.level}: {where}", markup=False)
    console.print(f"wrote the student copy to {args.out}; grade a submission with "
                  f"`levels grade --repo DIR`", markup=False)
    return 0
