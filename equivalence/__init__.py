"""The harness: does every level compute the same function, and how fast?

Layers, each importing only the ones below it (tests/test_architecture.py checks it):

    equivalence/cli.py          the `levels` command line: a parser, nothing else
    equivalence/commands/       one module per command (check, compare, profile, select,
                                agree, explain, bench, doctor, train, assignment, grade),
                                and console.py, what they share on the terminal
    equivalence/                the harness core: cards/ (one card per component: inputs,
                                float64 reference, tolerances' inputs, FLOPs and bytes,
                                model shapes, baselines, goals), check, tolerances, timing,
                                profile, select (level="auto"'s decisions), ceilings,
                                settings, plots
    levels/                     the ladder: five implementations of every component
    triton_kernels/, cuda_kernels/, numba_kernels/   the kernels

`levels` never imports this package: `levels.auto` finds its chooser through the
`levels.auto` entry point declared in pyproject.toml (equivalence.select.decide_for_call).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

# Modules that moved, under their old names, so that code written against them (the
# notebooks' `from equivalence import specs`, `from equivalence.compare import compare`)
# keeps working: the old name is the very same module object as the new one.
MOVED = {
    "equivalence.specs": "equivalence.cards",
    "equivalence.compare": "equivalence.commands.compare",
    "equivalence.explain": "equivalence.commands.explain",
    "equivalence.doctor": "equivalence.commands.doctor",
}


class _Moved(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname in MOVED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module):
        pass  # the module under its new name is already imported, and that is this one


if not any(isinstance(finder, _Moved) for finder in sys.meta_path):
    sys.meta_path.append(_Moved())
