"""The ladder: five implementations of the same five components.

    import levels
    native = levels.get("native")          # or levels.get(1)
    y = native.layer_norm(x, w, b)

Every level module exposes the five functions of `levels.contract` with identical
signatures, plus:

    unavailable_reason(device, component=None) -> str | None
                                             why this level (or one of its components)
                                             cannot run on `device` (None: it can)
    uses_tf32(component, device, dtype) -> bool whether its fp32 math really runs in TF32

Levels are imported lazily: importing `levels` never imports Triton, compiles anything
or builds CUDA code. A level whose import fails is reported as unavailable with the
import error as its reason; the harness shows it as skipped, never substitutes another.
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from types import ModuleType

import torch

from .contract import COMPONENTS

# Without a GPU, Level 4 runs in Triton's CPU interpreter, which must be on before anything
# imports triton (torch._dynamo does, so Level 3 would): triton.language builds its own
# @jit helpers at import. So it is switched on here, at the root of the package; a triton
# imported earlier than that makes Level 4 report itself unavailable, with this reason.
TRITON_IMPORTED_TOO_EARLY = "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1"
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@dataclass(frozen=True)
class LevelInfo:
    number: int
    name: str
    module: str
    title: str
    idea: str
    cost: str


LEVELS: tuple[LevelInfo, ...] = (
    LevelInfo(1, "native", "levels.native", "native PyTorch",
              "vectorized tensor ops; cuBLAS/cuDNN do the heavy lifting",
              "every op is its own kernel and a round trip through memory"),
    LevelInfo(2, "torchscript", "levels.torchscript", "TorchScript",
              "a static graph from a Python subset; pointwise chains get fused",
              "a restricted language, a warm-up before fusion kicks in; deprecated in PyTorch 2.x"),
    LevelInfo(3, "compile", "levels.compiled", "torch.compile",
              "Dynamo captures the graph, Inductor writes fused Triton (GPU) or C++ (CPU)",
              "seconds of compile on the first call and on every new shape"),
    LevelInfo(4, "triton", "levels.triton", "Triton kernels",
              "hand-written block-level kernels: we choose tiling, fusion and what stays on chip",
              "we own correctness, the backward pass and the tuning"),
    LevelInfo(5, "cuda", "levels.cuda", "CUDA C++ (load_inline)",
              "thread-level control: shared memory, warps, registers",
              "the most code, the slowest build, the easiest to get subtly wrong"),
)

LEVEL_NAMES = tuple(info.name for info in LEVELS)
_BY_NAME = {info.name: info for info in LEVELS}
_ALIASES = {str(info.number): info.name for info in LEVELS} | {"compiled": "compile"}


def resolve(level: str | int) -> LevelInfo:
    """'native', 'compile', 3, '3' ... -> LevelInfo. Raises ValueError naming the choices."""
    key = str(level).strip().lower()
    key = _ALIASES.get(key, key)
    if key not in _BY_NAME:
        choices = ", ".join(f"{i.number}={i.name}" for i in LEVELS)
        raise ValueError(f"argument 'level' must be one of {choices}; got {level!r}")
    return _BY_NAME[key]


def get(level: str | int) -> ModuleType:
    """The module implementing a level. Import errors propagate: use `status` to ask politely."""
    return importlib.import_module(resolve(level).module)


def status(level: str | int, device: str | torch.device = "cpu", component: str | None = None) -> str | None:
    """None if the level (or its `component`) can run on `device`, else the reason it cannot."""
    info = resolve(level)
    try:
        module = importlib.import_module(info.module)
    except Exception as exc:  # noqa: BLE001 - any import failure makes the level unavailable
        return f"importing {info.module} failed: {type(exc).__name__}: {exc}"
    return module.unavailable_reason(torch.device(device), component)


__all__ = ["COMPONENTS", "LEVELS", "LEVEL_NAMES", "LevelInfo", "get", "resolve", "status"]
