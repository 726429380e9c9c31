"""The shape of the code, checked like its behaviour.

- Dependencies point one way: kernels (triton_kernels, cuda_kernels, numba_kernels) ->
  levels -> the harness core (equivalence/) -> the commands (equivalence/commands/) ->
  the CLI (equivalence/cli.py). No module imports one of a higher layer, and no group of
  modules imports itself in a circle. Every import counts, the ones inside functions too:
  a lazy import is still a dependency, and a circle of lazy imports is still a knot a
  reader has to untie.
- Shared code asks the cards: no module of equivalence/ outside equivalence/cards/
  compares a value with a component's name or keys a table by one.
- Files stay readable: none in equivalence/ over MAX_LINES.

Run as a script, it prints the graph's numbers: `python tests/test_architecture.py`.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("triton_kernels", "cuda_kernels", "numba_kernels", "levels", "equivalence")
LAYERS = ("kernels", "levels", "harness", "commands", "cli")
MAX_LINES = 600


def _component_names() -> tuple[str, ...]:
    """levels.contract.COMPONENTS, read from its source (no import: this file also runs as a
    script), so that a component added later is watched for too."""
    tree = ast.parse((ROOT / "levels" / "contract.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "COMPONENTS"
                                                for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    raise AssertionError("levels/contract.py has no COMPONENTS")


COMPONENT_NAMES = _component_names()


def layer_of(module: str) -> str:
    top = module.split(".")[0]
    if module == "numba_kernels.level":
        # the numba twins as a level (levels.register("numba", numba_kernels.level)): it sits
        # beside levels/native.py, behind the contract's validators
        return "levels"
    if top in ("triton_kernels", "cuda_kernels", "numba_kernels"):
        return "kernels"
    if top == "levels":
        return "levels"
    if module in ("equivalence.cli", "equivalence.__main__"):
        return "cli"
    if module == "equivalence.commands" or module.startswith("equivalence.commands."):
        return "commands"
    return "harness"


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(known: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the project modules it imports (anywhere in its body)."""
    graph: dict[str, set[str]] = defaultdict(set)

    def project(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    for module, path in known.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(module, is_package, node)
                # `from package import module` imports that module; `from module import name`
                # the module itself
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                           for alias in node.names]
            for target in targets:
                hit = project(target)
                if hit is not None and hit != module:
                    graph[module].add(hit)
    return graph


def upward(graph) -> list[str]:
    rank = {name: i for i, name in enumerate(LAYERS)}
    return sorted(f"{a} ({layer_of(a)}) imports {b} ({layer_of(b)})"
                  for a, targets in graph.items() for b in targets
                  if rank[layer_of(b)] > rank[layer_of(a)])


def circles(graph, known) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    sys.setrecursionlimit(10000)
    for v in known:
        if v not in index:
            visit(v)
    return found


def component_switches(known) -> list[str]:
    """Places in shared harness and command code that branch on a component's name: a
    comparison of a component with one (`component == "mlp"`, `entry["component"] in
    ("lstm", ...)`) or a dict literal keyed by them. The cards are where that knowledge
    lives. (A model's name that is also a component's, `model == "lstm"`, is no switch.)"""
    names = set(COMPONENT_NAMES)
    found = []
    for module, path in known.items():
        if not module.startswith("equivalence") or module.startswith("equivalence.cards"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Compare):
                values = [node.left, *node.comparators]
                literals = [v.value for v in values if isinstance(v, ast.Constant)]
                for v in values:
                    if isinstance(v, (ast.Tuple, ast.List, ast.Set)):
                        literals += [e.value for e in v.elts if isinstance(e, ast.Constant)]
                subjects = " ".join(ast.unparse(v) for v in values
                                    if not isinstance(v, (ast.Constant, ast.Tuple, ast.List, ast.Set)))
                if names & {x for x in literals if isinstance(x, str)} and "component" in subjects:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: compares with a "
                                 f"component's name")
            elif isinstance(node, ast.Dict):
                keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
                if len(names & keys) >= 2:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: a table keyed by "
                                 f"component names")
    return found


def long_files() -> list[str]:
    return [f"{p.relative_to(ROOT)}: {n} lines" for p in sorted((ROOT / "equivalence").rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_LINES]


def test_no_module_imports_a_higher_layer():
    known = modules()
    assert upward(imports(known)) == []


def test_no_import_circles():
    known = modules()
    assert circles(imports(known), known) == []


def test_shared_code_asks_the_cards():
    assert component_switches(modules()) == []


def test_files_in_the_harness_stay_under_the_limit():
    assert long_files() == []


def test_importing_levels_imports_no_harness():
    import subprocess

    code = ("import sys, levels, levels.nn, levels.auto; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'equivalence'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"


def test_auto_finds_the_harness_chooser_without_levels_importing_it():
    """levels.auto gets its decision function from the harness's entry point (pyproject.toml),
    so a process that never imported the harness still chooses with it."""
    import subprocess

    code = ("import levels.auto as auto; chooser = auto._choose(); "
            "print(chooser.__module__, chooser.__name__)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "equivalence.select decide_for_call"


def test_every_slow_entry_names_a_test_that_exists():
    """conftest.SLOW splits the suite by name: a renamed test must not fall back into the
    README's command unnoticed."""
    from conftest import SLOW

    for key in SLOW:
        path, _, name = key.partition("::")
        assert (ROOT / path).exists(), key
        if name:
            tree = ast.parse((ROOT / path).read_text())
            names = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
            assert name in names, f"conftest.SLOW names {key}, which does not exist"


if __name__ == "__main__":
    known = modules()
    graph = imports(known)
    edges = sum(len(t) for t in graph.values())
    print(f"{len(known)} modules, {edges} import edges")
    for title, items in (("upward imports", upward(graph)),
                         ("circles", [" <-> ".join(c) for c in circles(graph, known)]),
                         ("component switches in shared code", component_switches(known)),
                         (f"files in equivalence/ over {MAX_LINES} lines", long_files())):
        print(f"{title}: {len(items)}")
        for item in items:
            print(f"  {item}")
