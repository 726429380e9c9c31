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

`levels.get("auto")` (or `levels.auto`) is not a level but a chooser with the same five
functions: each call runs the fastest level that passes the harness for its kind of call
(levels/auto.py). It is no rung of the ladder: LEVEL_NAMES, `resolve` and the harness's
loops never include it.

Your own code can be a level too: `levels.register("mine", module)` makes a module (or any
namespace, or a dict) of your functions usable wherever a level name is: `levels.get`,
`levels.nn` layers, and the harness (`check`, `check_args`, `agree`, `profile`,
`compare`). It is no rung either: LEVEL_NAMES stays the five rungs; `levels.names()` lists
them followed by the registered levels. Each of your functions runs the contract's
validator on its arguments first, as every level does, so your kernel never sees an
invalid input.

Levels are imported lazily: importing `levels` never imports Triton, compiles anything
or builds CUDA code. A level whose import fails is reported as unavailable with the
import error as its reason; the harness shows it as skipped, never substitutes another.
"""

from __future__ import annotations

import functools
import importlib
import os
import re
import sys
from dataclasses import dataclass
from types import ModuleType

import torch

from .contract import COMPONENTS, VALIDATORS, autocasts

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
    LevelInfo(5, "cuda", "levels.cuda", "CUDA C++ (torch.utils.cpp_extension)",
              "thread-level control: shared memory, warps, registers",
              "the most code, the slowest build, the easiest to get subtly wrong"),
)

LEVEL_NAMES = tuple(info.name for info in LEVELS)
AUTO = "auto"
_BY_NAME = {info.name: info for info in LEVELS}
_ALIASES = {str(info.number): info.name for info in LEVELS} | {"compiled": "compile"}


def resolve(level: str | int) -> LevelInfo:
    """'native', 'compile', 3, '3', a registered name ... -> LevelInfo. Raises ValueError
    naming the choices."""
    key = str(level).strip().lower()
    key = _ALIASES.get(key, key)
    if key == AUTO:
        raise ValueError("'auto' is not a level but a choice among them: use levels.get('auto') "
                         "or level='auto' in levels.nn, and `levels select` to see what it picks")
    if key in _REGISTERED:
        return _REGISTERED[key][0]
    if key not in _BY_NAME:
        choices = ", ".join([f"{i.number}={i.name}" for i in LEVELS] + list(_REGISTERED))
        hint = (" (to check a function of your own, pass it as fn=...; to make a module of "
                "your functions a level, levels.register(name, module))") if not _REGISTERED else ""
        raise ValueError(f"argument 'level' must be one of {choices}; got {level!r}{hint}")
    return _BY_NAME[key]


def get(level: str | int) -> ModuleType:
    """The module implementing a level (or "auto", the chooser; for a registered level its
    `OwnLevel`). Import errors propagate: use `status` to ask politely."""
    if str(level).strip().lower() == AUTO:
        return importlib.import_module("levels.auto")
    info = resolve(level)
    if info.name in _REGISTERED:
        return _REGISTERED[info.name][1]
    return importlib.import_module(info.module)


def status(level: str | int, device: str | torch.device = "cpu", component: str | None = None) -> str | None:
    """None if the level (or its `component`) can run on `device`, else the reason it cannot."""
    info = resolve(level)
    if info.name in _REGISTERED:
        return _REGISTERED[info.name][1].status(device, component)
    try:
        module = importlib.import_module(info.module)
    except Exception as exc:  # noqa: BLE001 - any import failure makes the level unavailable
        return f"importing {info.module} failed: {type(exc).__name__}: {exc}"
    return module.unavailable_reason(torch.device(device), component)


# ---------------------------------------------------------------------------------------
# Your own code as a level: a module of your functions (register), or one function (own)
# ---------------------------------------------------------------------------------------

OWN_NUMBER = 0  # LevelInfo.number of a registered level: it is no rung of the ladder
_REGISTERED: dict[str, tuple[LevelInfo, "OwnLevel"]] = {}
_NAME = re.compile(r"[a-z_][a-z0-9_.-]*")


def _lookup(source, name: str):
    return source.get(name) if isinstance(source, dict) else getattr(source, name, None)


def _validated(component: str, fn, level_name: str):
    """`fn` behind the component's validator: the harness's arguments, or a user's, reach
    `fn` only once `levels.contract` accepted them, exactly as at every built-in level."""
    validate = VALIDATORS[component]

    @functools.wraps(fn)
    def checked(*args, **kwargs):
        validate(*args, **kwargs)
        return fn(*args, **kwargs)

    checked = autocasts(component)(checked)  # torch.autocast's casts, as at every level
    checked.level = level_name
    return checked


class OwnLevel:
    """Your functions seen as a level: the five component functions (each behind the
    contract's validator), `unavailable_reason` and `uses_tf32`, like a level module.

    `levels.get(name)` returns one for a registered level; the harness makes one for a
    function passed as `fn=`. The functions are looked up in `source` at every call, so a
    module you edit and `importlib.reload` is what runs next. A component `source` has no
    function for is unavailable ("'mine' has no attention function"), everywhere.

    Optional in `source`: `unavailable_reason(device, component) -> str | None` (default:
    runs everywhere) and `uses_tf32`, a bool or `uses_tf32(component, device, dtype) -> bool`
    (default False: the float32 bound, 1e-5; True only if your fp32 matmuls really round
    their inputs to TF32, and then only for float32)."""

    def __init__(self, name: str, source, uses_tf32=None):
        self.name = self.__name__ = name
        self.source = source
        self._tf32 = _lookup(source, "uses_tf32") if uses_tf32 is None else uses_tf32
        if self._tf32 is not None and not isinstance(self._tf32, bool) and not callable(self._tf32):
            raise TypeError(f"{name}: 'uses_tf32' must be a bool or a function (component, device, "
                            f"dtype) -> bool; got {type(self._tf32).__name__} {self._tf32!r}")
        unavailable = _lookup(source, "unavailable_reason")
        if unavailable is not None and not callable(unavailable):
            raise TypeError(f"{name}: 'unavailable_reason' must be a function (device, component) "
                            f"-> str | None; got {type(unavailable).__name__}")
        self._unavailable = unavailable

    def function(self, component: str):
        """Your function for `component` as given (unvalidated), or None."""
        return _lookup(self.source, component)

    def __getattr__(self, component: str):
        if component not in COMPONENTS:
            raise AttributeError(f"level {self.name!r} has no attribute {component!r}")
        fn = self.function(component)
        if fn is None:
            def missing(*args, **kwargs):
                raise NotImplementedError(f"{self.name!r} has no {component} function")
            return missing
        return _validated(component, fn, self.name)

    def unavailable_reason(self, device, component: str | None = None) -> str | None:
        if component is not None and self.function(component) is None:
            return f"{self.name!r} has no {component} function"
        if self._unavailable is None:
            return None
        return self._unavailable(torch.device(device), component)

    def status(self, device, component: str | None = None) -> str | None:
        """`unavailable_reason`, with one of its own exceptions turned into the reason."""
        try:
            return self.unavailable_reason(device, component)
        except Exception as exc:  # noqa: BLE001 - your unavailable_reason failing is a reason
            return f"{self.name}.unavailable_reason raised {type(exc).__name__}: {exc}"

    def uses_tf32(self, component: str, device, dtype) -> bool:
        if callable(self._tf32):
            return bool(self._tf32(component, torch.device(device), dtype))
        return bool(self._tf32)

    def __repr__(self) -> str:
        have = [c for c in COMPONENTS if self.function(c) is not None]
        return f"<level {self.name!r}: {', '.join(have) or 'no functions'}>"


def _check_functions(name: str, source, components=COMPONENTS) -> None:
    for component in components:
        fn = _lookup(source, component)
        if fn is not None and not callable(fn):
            raise TypeError(f"{name}: {component!r} must be a function; got {type(fn).__name__}")


def register(name: str, source, *, title: str | None = None) -> LevelInfo:
    """Make a module (or a namespace, a class instance, a dict) of your functions a level
    named `name`, usable wherever a level name is: `levels.get(name)`, `level=name` in
    `levels.nn`, and `check`, `check_args`, `agreement`, `profile`, `compare`.

    `source` needs at least one of the five component functions, with the contract's
    signatures (`levels.contract`); a missing one makes that component skip with the reason
    "'<name>' has no <component> function". Optional: `unavailable_reason` and `uses_tf32`
    (see OwnLevel). Every function runs the contract's validator on its arguments first.

    A registered level is no rung: LEVEL_NAMES stays the five; `names()` lists them, then
    the registered ones in registration order (the order `check()` runs them in). `levels.auto`
    never picks one: it chooses among the five rungs only. The names of the five levels,
    their aliases (1..5, "compiled") and "auto" are refused; registering a registered name
    again replaces it (re-running a notebook cell). Returns the new level's LevelInfo."""
    if not isinstance(name, str):
        raise TypeError(f"argument 'name' must be a str; got {type(name).__name__} {name!r}")
    key = name.strip().lower()
    if key in _BY_NAME or key in _ALIASES or key == AUTO:
        raise ValueError(f"argument 'name' must not be a level of the ladder or 'auto' "
                         f"({', '.join(LEVEL_NAMES)}, 1..5, compiled, auto): choose a name of "
                         f"your own; got {name!r}")
    if not _NAME.fullmatch(key):
        raise ValueError(f"argument 'name' must be a lowercase identifier (letters, digits, "
                         f"'_', '-', '.'; no leading digit); got {name!r}")
    if callable(source) and not isinstance(source, (ModuleType, type)):
        raise TypeError(f"argument 'source' must be a module (or namespace, or dict) of component "
                        f"functions, not one function: to check one function, pass it as "
                        f"fn=... to check/check_args/profile; got {source!r}")
    _check_functions(key, source)
    if all(_lookup(source, c) is None for c in COMPONENTS):
        raise ValueError(f"argument 'source' has none of the component functions "
                         f"({', '.join(COMPONENTS)}); got {source!r}")
    level = OwnLevel(key, source)
    where = getattr(source, "__name__", type(source).__name__)
    info = LevelInfo(OWN_NUMBER, key, where, title or f"your level {key!r}",
                     f"your own code ({where}), registered with levels.register", "")
    _REGISTERED[key] = (info, level)
    return info


def unregister(name: str) -> None:
    """Forget a registered level (tests, notebooks). The five levels cannot be unregistered."""
    key = str(name).strip().lower()
    if key in _BY_NAME or key in _ALIASES:
        raise ValueError(f"argument 'name': {name!r} is a level of the ladder; only registered "
                         f"levels can be unregistered")
    if key not in _REGISTERED:
        raise ValueError(f"no level {name!r} is registered (registered: "
                         f"{', '.join(_REGISTERED) or 'none'})")
    del _REGISTERED[key]


def registered() -> tuple[str, ...]:
    """The names of the registered levels, in registration order."""
    return tuple(_REGISTERED)


def names() -> tuple[str, ...]:
    """Every level the harness runs by default: the five rungs, then the registered levels."""
    return LEVEL_NAMES + registered()


def own(component: str, fn, *, name: str | None = None, uses_tf32=None) -> OwnLevel:
    """One function of yours for `component`, as a level named `name` (default
    "fn:<function name>"): what the harness checks and times for `fn=`. `uses_tf32`: a bool
    or a function (component, device, dtype) -> bool; None: `fn.uses_tf32` if it has one."""
    if component not in COMPONENTS:
        raise ValueError(f"argument 'component' must be one of {', '.join(COMPONENTS)}; "
                         f"got {component!r}")
    if not callable(fn) or isinstance(fn, (ModuleType, type)):
        hint = (" (a module of your functions: make it a level with levels.register(name, module)"
                " and pass level=name)") if _lookup(fn, component) is not None else ""
        raise TypeError(f"argument 'fn' must be a function with the signature of "
                        f"{component}; got {type(fn).__name__} {fn!r}{hint}")
    if name is None:
        inner = getattr(fn, "func", fn)  # functools.partial
        name = "fn:" + getattr(inner, "__name__", type(inner).__name__)
    tf32 = getattr(fn, "uses_tf32", None) if uses_tf32 is None else uses_tf32
    return OwnLevel(name, {component: fn}, uses_tf32=False if tf32 is None else tf32)


def __getattr__(name: str):
    # `levels.auto.layer_norm(...)` without importing the chooser with the package
    if name == AUTO:
        return importlib.import_module("levels.auto")
    raise AttributeError(f"module 'levels' has no attribute {name!r}")


__all__ = ["AUTO", "COMPONENTS", "LEVELS", "LEVEL_NAMES", "LevelInfo", "OwnLevel", "get", "names",
           "own", "register", "registered", "resolve", "status", "unregister"]
