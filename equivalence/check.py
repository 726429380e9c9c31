"""`check`: does a level compute the component's function, forward and backward?

"Identical outputs" in this repo means exactly this and nothing looser:

  for every output, every updated buffer and the gradient of every differentiable input,
      relative error  ||level - ref|| / ||ref||  <=  the bound for the dtype (tolerances.py)
  where ref is the float64 reference of equivalence/cards evaluated on the *same* inputs
  (the level's inputs, rounded to its dtype, then widened to float64), driven by the same
  random upstream gradient; and every value is finite, with the expected shape and dtype.

Then the forward runs once more under torch.no_grad(), on fresh copies of the same inputs,
and its outputs (and updated buffers) are held to the same bound: inference takes other code
paths at some levels (Level 4 skips autograd.Function, stores no activations, folds
BatchNorm into a GEMM's epilogue), and those must compute the same function.

Inputs are fresh random numbers for every check (the seed is reported, so a failure can
be replayed with `seed=`). Outputs are poisoned: while a level runs, torch fills every
uninitialized allocation (torch.empty & co.) with NaN, so a kernel that forgets to write
an element produces a NaN, and a NaN never passes.

Layouts are kept: the level receives copies with the caller's sizes, strides and storage
offset, and the memory around them (a strided view's gaps, NaN-filled by the `strided`
layout of equivalence/cards). After forward and backward every byte of every input's
memory is compared with what it was: an input must be unchanged, and a buffer the call
updates in place (running statistics) may change only at its own elements. A kernel that
indexes a view as if its stride were 1 therefore fails twice: it reads NaN from the gaps,
and if it writes, it writes where nothing may change.

Your own code goes through exactly the same check: `check("layer_norm", fn=my_layer_norm)`
or `check_args("layer_norm", args, fn=my_layer_norm)` for one function, or a module of your
functions registered as a level (`levels.register("mine", module)`, then level="mine").
Your function is called like a level's: the contract's keyword arguments, under poisoned
allocations, in both layouts, with the same memory checks and the same bound (float32's
unless you declare TF32: `uses_tf32=True`, or a `uses_tf32` attribute). Before it runs, the
contract's validator (`levels.contract.VALIDATORS`) checks the arguments, as every level
does first, so your kernel never sees an invalid input. A function that raises is an
"error" (with the line that raised); one that returns the wrong number, type, shape or
dtype of outputs a "fail" naming what was wrong.
"""

from __future__ import annotations

import contextlib
import random
import sys
import traceback
import warnings
from dataclasses import asdict, dataclass, field

import torch

import levels
from levels.contract import COMPONENTS

from . import cards, interpreter
from .tolerances import tolerance

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16,
          "fp16": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}

# The float64 reference's name in an agreement matrix: a name no function of yours may take.
AGREEMENT_REFERENCE = "float64 reference"


def resolve_dtype(dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype.lower() in DTYPES:
        return DTYPES[dtype.lower()]
    raise ValueError(f"argument 'dtype' must be one of float32, float16, bfloat16; got {dtype!r}")


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def fresh_seed() -> int:
    return random.SystemRandom().randrange(2 ** 31)


@dataclass
class Comparison:
    name: str  # e.g. "out", "grad q", "running_var"
    rel_err: float
    max_abs_err: float
    ok: bool
    problem: str = ""  # non-numeric failures: NaN, wrong shape or dtype
    # Where a failing value is wrong, for a person to look at: the first element past the
    # bound (its index, what the level gave, what the reference expects); "" when ok.
    first_wrong: str = ""


@dataclass
class CheckResult:
    component: str
    level: str
    variant: str
    dtype: str
    device: str
    size: str
    seed: int | None
    status: str  # "pass", "fail", "error" or "skip"
    reason: str = ""
    tolerance: float | None = None
    tf32: bool = False
    comparisons: list[Comparison] = field(default_factory=list)
    layout: str = "contiguous"  # or "strided": every tensor argument a view (cards.LAYOUTS)

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    @property
    def worst(self) -> Comparison | None:
        finite = [c for c in self.comparisons if c.rel_err == c.rel_err]
        pool = [c for c in self.comparisons if not c.ok] or finite
        return max(pool, key=lambda c: c.rel_err, default=None)

    def summary(self) -> str:
        """One line: what was checked and, if it did not pass, why."""
        case = self.variant if self.layout == "contiguous" else f"{self.variant}, {self.layout}"
        head = f"{self.component}[{case}] {self.level} {self.dtype} {self.device}: {self.status}"
        if self.reason:
            return f"{head} ({self.reason})"
        bad = [(f"{c.name}: {c.problem}" if c.problem else
                f"{c.name}: rel {c.rel_err:.3g} > {self.tolerance:g}")
               + (f", {c.first_wrong}" if c.first_wrong else "")
               for c in self.comparisons if not c.ok]
        return f"{head}" + (f" ({'; '.join(bad)})" if bad else "")

    def to_dict(self) -> dict:
        return asdict(self)


@contextlib.contextmanager
def poisoned_allocations():
    """Fill every uninitialized allocation with NaN while the block runs."""
    was_on = torch.are_deterministic_algorithms_enabled()
    was_warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    was_fill = torch.utils.deterministic.fill_uninitialized_memory
    # Deterministic mode is the switch that makes torch honour fill_uninitialized_memory;
    # warn_only keeps ops without a deterministic variant running (warnings muted below).
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*deterministic.*")
            yield
    finally:
        torch.utils.deterministic.fill_uninitialized_memory = was_fill
        torch.use_deterministic_algorithms(was_on, warn_only=was_warn_only)


def flatten(outputs) -> list:
    """(out, (h, c)) -> [out, h, c]: components return nested tuples."""
    if isinstance(outputs, (tuple, list)):
        return [t for o in outputs for t in flatten(o)]
    return [outputs]


def compare(name: str, got, ref: torch.Tensor, bound: float, dtype: torch.dtype,
            scale: torch.Tensor | None = None) -> Comparison:
    """Relative error of `got` against `ref` (or against ||scale|| where ref is exactly 0)."""
    nan = float("nan")
    if not isinstance(got, torch.Tensor):
        return Comparison(name, nan, nan, False, f"expected a tensor, got {type(got).__name__}")
    if tuple(got.shape) != tuple(ref.shape):
        return Comparison(name, nan, nan, False,
                          f"shape {tuple(got.shape)}, expected {tuple(ref.shape)}")
    if got.dtype != dtype:
        return Comparison(name, nan, nan, False, f"dtype {got.dtype}, expected {dtype}")
    if got.device != ref.device:
        return Comparison(name, nan, nan, False, f"device {got.device}, expected {ref.device}")
    got64 = got.detach().to(torch.float64)
    ref_norm = float(torch.linalg.vector_norm(ref if scale is None else scale))
    if not torch.isfinite(got64).all():
        bad = int((~torch.isfinite(got64)).sum())
        return Comparison(name, nan, nan, False, f"{bad} non-finite value(s) (NaN/Inf)",
                          first_wrong(got64, ref, bound, ref_norm))
    diff = got64 - ref
    rel = float(torch.linalg.vector_norm(diff)) / max(ref_norm, torch.finfo(torch.float64).tiny)
    max_abs = float(diff.abs().max()) if diff.numel() else 0.0
    ok = rel <= bound
    return Comparison(name, rel, max_abs, ok, "", "" if ok else first_wrong(got64, ref, bound,
                                                                           ref_norm))


def first_wrong(got64: torch.Tensor, ref: torch.Tensor, bound: float, ref_norm: float) -> str:
    """The first element (in row-major order) that is wrong on its own: non-finite, or off by
    more than the bound allows at its size (relative to itself, with the tensor's RMS as a
    floor, so that an element near zero is judged at the scale of its neighbours). If the
    error is spread too thin for any one element to stand out, the element with the
    largest error. A relative error says how wrong; this says where to look."""
    if got64.numel() == 0:
        return ""
    bad = ~torch.isfinite(got64)
    if not bad.any():
        err = (got64 - ref).abs()
        rms = ref_norm / got64.numel() ** 0.5
        bad = err > bound * (ref.abs() + rms)
        if not bad.any():
            bad = err == err.max()
    flat = int(bad.reshape(-1).nonzero()[0, 0])
    index, rest = [], flat
    for size in reversed(got64.shape):
        index.append(rest % size)
        rest //= size
    where = "[" + ", ".join(map(str, reversed(index))) + "]"
    got_v, ref_v = float(got64.reshape(-1)[flat]), float(ref.reshape(-1)[flat])
    return f"first wrong element {where}: got {got_v:.6g}, expected {ref_v:.6g}"


def clone_layout(t: torch.Tensor) -> torch.Tensor:
    """A copy of `t` with its sizes, strides and storage offset, and a copy of the whole
    memory around it (a strided view's gaps included). `t.clone()` would not do: cloning a
    strided view returns a contiguous tensor, and the level would never see the layout."""
    copy = torch.empty(0, dtype=t.dtype, device=t.device)
    return copy.set_(t.detach().untyped_storage().clone(), t.storage_offset(), t.size(), t.stride())


def _memory(t: torch.Tensor) -> torch.Tensor:
    """The bytes of t's whole storage, as a uint8 tensor aliasing it."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def _outside_view(t: torch.Tensor) -> torch.Tensor:
    """Boolean mask over the bytes of t's storage: True where t has no element."""
    size = t.element_size()
    n = t.untyped_storage().nbytes() // size
    inside = torch.zeros(n, dtype=torch.bool, device=t.device)
    index = torch.arange(n, device=t.device).as_strided(t.size(), t.stride(), t.storage_offset())
    inside[index.reshape(-1)] = True
    return (~inside).repeat_interleave(size)


def _memory_comparisons(case: cards.Case, args: dict, before: dict) -> list[Comparison]:
    """Every input's memory after the call against `before`: inputs untouched, updated
    buffers changed at their own elements only."""
    found = []
    for name, old in before.items():
        changed = _memory(args[name]) != old
        if name in case.mutated:
            changed &= _outside_view(args[name])
            what = f"{name}: memory around the view"
            problem = "{} byte(s) outside the view were written"
        else:
            what = f"{name}: unchanged"
            problem = "{} byte(s) of this input were written (inputs are read-only)"
        n = int(changed.sum())
        found.append(Comparison(what, 0.0 if n == 0 else float("nan"), 0.0 if n == 0 else float("nan"),
                                n == 0, problem.format(n) if n else ""))
    return found


def _prepare(case: cards.Case, reference: bool = True):
    """Leaf tensors for the level (grads on), laid out like the case's, and their float64
    twins for the reference (an empty dict when `reference` is False: timing needs none, and
    at the bench size they are the biggest allocation of the call)."""
    level_args, ref_args = {}, {}
    for name, value in case.args.items():
        if not isinstance(value, torch.Tensor):
            level_args[name] = ref_args[name] = value
            continue
        wants_grad = name in case.differentiable
        level_args[name] = clone_layout(value).requires_grad_(wants_grad)
        if reference:
            ref_args[name] = value.detach().to(torch.float64).requires_grad_(wants_grad)
    return level_args, ref_args


class WrongOutputs(Exception):
    """The call returned something no backward can be driven through (not a tensor, or a
    tensor of the wrong shape): `check` reports what is wrong with each output."""

    def __init__(self, outs: list):
        super().__init__("the outputs are not tensors of the expected shapes, so backward was "
                         "not run")
        self.outs = outs


class BackwardFailed(Exception):
    """The forward returned its outputs and the backward then raised: `check` still compares
    the forward's outputs (a level whose backward is not written yet gets its forward judged)
    and reports the backward's exception as the error."""

    def __init__(self, outs: list, error: BaseException):
        super().__init__(f"the backward raised {type(error).__name__}: {error}")
        self.outs, self.error = outs, error


def run_case(fn, case: cards.Case, upstream=None, memory: list | None = None):
    """Forward (+ backward if `upstream` is given) of `fn`: (outputs, grads), flat lists.

    Inputs are fresh leaf copies, so the case itself (its buffers too) never changes.
    With a list as `memory`, the memory checks of every input (see the module doc) are
    appended to it once forward and backward are done."""
    level_args, _ = _prepare(case)
    before = {} if memory is None else {
        name: _memory(t).clone() for name, t in level_args.items() if isinstance(t, torch.Tensor)}
    outs = flatten(fn(**level_args))
    outs += [level_args[name] for name in case.mutated]
    inputs = [level_args[name] for name in case.differentiable]
    if upstream is None or not inputs:  # no inputs: a forward-only card (DIFFERENTIABLE = ())
        grads = [None] * len(inputs)
    else:
        pairs = list(zip(outs[:case.n_returned], upstream))
        if not all(isinstance(o, torch.Tensor) and o.shape == g.shape for o, g in pairs):
            raise WrongOutputs([o.detach() if isinstance(o, torch.Tensor) else o for o in outs])
        detached = [o.detach() if isinstance(o, torch.Tensor) else o for o in outs]
        if not all(isinstance(o, torch.Tensor) and o.requires_grad for o, _ in pairs):
            raise BackwardFailed(detached, RuntimeError(
                "an output does not require grad: the level has no backward for it"))
        try:
            grads = torch.autograd.grad([o for o, _ in pairs], inputs, [g for _, g in pairs],
                                        allow_unused=True)
        except Exception as exc:  # noqa: BLE001 - reported by check, with the forward judged
            raise BackwardFailed(detached, exc) from exc
    if memory is not None:
        memory.extend(_memory_comparisons(case, level_args, before))
    return [o.detach() if isinstance(o, torch.Tensor) else o for o in outs], list(grads)


def reference_case(case: cards.Case, seed: int):
    """The float64 reference, forward and backward: (outputs, grads, upstream, scales).

    The upstream gradient is random, one per output, rounded to the case's dtype so that
    the level (which receives it in that dtype) and the reference see the same numbers.
    `scales` names the gradients that are exactly zero here, with what to measure them by."""
    card = cards.get(case.component)
    _, ref_args = _prepare(case)
    outs = card.reference(ref_args)
    g = torch.Generator(device="cpu").manual_seed(seed + 1)
    upstream = [torch.randn(o.shape, generator=g).to(device=o.device, dtype=case.dtype)
                for o in outs[:case.n_returned]]
    upstream64 = [u.to(torch.float64) for u in upstream]
    inputs = [ref_args[name] for name in case.differentiable]
    grads = torch.autograd.grad(outs[:case.n_returned], inputs, upstream64) if inputs else ()
    scales = card.zero_gradient_scales(ref_args, upstream64, dict(zip(case.differentiable, grads)))
    return [o.detach() for o in outs], list(grads), upstream, scales


def check_case(component: str, level: str | int | None, dtype, device, size: str | dict,
               variant: str, seed: int | None = None, layout: str = "contiguous", *, fn=None,
               uses_tf32=None) -> CheckResult:
    """One check on fresh random inputs of a size preset (or dict of shape parameters),
    in a layout of cards.LAYOUTS, of a level or of your function `fn` (see `check`)."""
    target = _target(component, level, fn, uses_tf32)
    dtype = resolve_dtype(dtype)
    seed = fresh_seed() if seed is None else seed
    return _check(lambda: cards.get(component).case(size, variant, dtype, device, seed, layout),
                  target, component, variant, dtype, device,
                  size if isinstance(size, str) else "custom", seed, layout)


def check_args(component: str, level: str | int | dict | None = None, args: dict | None = None,
               seed: int | None = None, *, fn=None, uses_tf32=None) -> CheckResult:
    """The same check on arguments you choose: odd shapes, strided views, channels_last...

        check_args("attention", "triton", args)          # a level
        check_args("attention", args, fn=my_attention)   # your function

    `args` are the component's keyword arguments, passed to the level (or `fn`) with their
    own sizes, strides and offsets (copies of them: the inputs are never modified)."""
    if isinstance(level, dict):  # check_args(component, args, fn=...)
        if args is not None:
            raise ValueError("check_args: 'args' was given twice (as the second argument and "
                             "as args=)")
        level, args = None, level
    if not isinstance(args, dict):
        raise TypeError(f"check_args: argument 'args' must be a dict of the component's keyword "
                        f"arguments; got {type(args).__name__}")
    target = _target(component, level, fn, uses_tf32)
    case = cards.get(component).case_from_args(args)
    seed = fresh_seed() if seed is None else seed
    device = next(iter(case.tensors().values())).device
    return _check(lambda: case, target, component, case.variant, case.dtype, device, "custom", seed,
                  case.layout)


def _target(component: str, level, fn, uses_tf32=None):
    """What a check runs: a level's name, or an `OwnLevel` wrapping your function `fn`."""
    if fn is not None:
        if level is not None:
            raise ValueError(f"pass either a level or fn=, not both; got level={level!r} and "
                             f"fn={getattr(fn, '__name__', fn)!r}")
        return levels.own(component, fn, uses_tf32=uses_tf32)
    if uses_tf32 is not None:
        raise ValueError("argument 'uses_tf32' is for fn=: a level declares TF32 itself "
                         "(its uses_tf32 function)")
    if isinstance(level, levels.OwnLevel):
        return level
    if level is None:
        raise ValueError("pass a level (a name such as 'native', or a registered one) or your "
                         "function as fn=")
    return levels.resolve(level).name


def _is_level(name: str) -> bool:
    try:
        levels.resolve(name)
    except ValueError:
        return False
    return True


def own_targets(component: str, fns) -> list:
    """`fns` ({name: function}) as OwnLevels named by their keys (never a level's name)."""
    if fns is None:
        return []
    if not isinstance(fns, dict):
        raise TypeError(f"argument 'fns' must be a dict {{name: function}}; "
                        f"got {type(fns).__name__}")
    targets = []
    for name, fn in fns.items():
        if not isinstance(name, str) or not name.strip() or name == AGREEMENT_REFERENCE or _is_level(name):
            raise ValueError(f"argument 'fns': each name must be a non-empty str that names no "
                             f"level (those run by their name); got {name!r}")
        targets.append(levels.own(component, fn, name=name))
    return targets


def _open(target, device: torch.device, component: str):
    """(name, reason it cannot run here or None, module) of a level name or an OwnLevel."""
    if isinstance(target, levels.OwnLevel):
        reason = target.status(device, component)
        return target.name, reason, target
    reason = levels.status(target, device, component)
    return target, reason, None if reason else levels.get(target)


def _check(make_case, target, component, variant, dtype, device, size, seed, layout) -> CheckResult:
    device = torch.device(device)
    name, reason, module = _open(target, device, component)
    result = CheckResult(component, name, variant, dtype_name(dtype), str(device), size, seed,
                         status="skip", layout=layout)
    if reason:
        result.reason = reason
        return result
    try:
        result.tf32 = bool(module.uses_tf32(component, device, dtype))
    except Exception as exc:  # noqa: BLE001 - a user's uses_tf32 that fails is a reported error
        result.status = "error"
        result.reason = f"uses_tf32 raised {type(exc).__name__}: {exc}"
        return result
    bound = cards.get(component).tolerance(dtype, tolerance(dtype, tf32=result.tf32))
    result.tolerance = bound
    if "triton" in sys.modules:
        # Level 4 (or a function of yours) may launch Triton kernels: in the interpreter,
        # an access out of bounds becomes a message instead of a corrupted heap
        interpreter.install()

    case = make_case()
    ref_outs = None
    memory: list[Comparison] = []
    backward_error = None
    try:
        ref_outs, ref_grads, upstream, scales = reference_case(case, seed)
        with poisoned_allocations():
            try:
                outs, grads = run_case(getattr(module, component), case, upstream=upstream,
                                       memory=memory)
            except BackwardFailed as exc:
                outs, grads, backward_error = exc.outs, None, _inner(exc.error)
            # Inference takes other code paths at some levels (Level 4 skips autograd's
            # Function, stores no activations for a backward, folds BatchNorm into an
            # epilogue): the forward is checked again with gradients off.
            with torch.no_grad():
                plain, _ = run_case(getattr(module, component), case)
    except WrongOutputs as exc:  # a fail, not an error: say what is wrong with each output
        outs, grads, plain = exc.outs, None, []
    except Exception as exc:  # noqa: BLE001 - any failure of the level is a reported error
        result.status = "error"
        where = "reference" if ref_outs is None else "level"
        inner = _inner(exc)
        tb = (traceback.extract_tb(inner.__traceback__) or traceback.extract_tb(exc.__traceback__))[-1]
        result.reason = f"{where} raised {type(inner).__name__}: {inner} ({tb.filename}:{tb.lineno})"
        return result

    if len(outs) != len(ref_outs):
        result.status = "fail"
        kinds = sorted({type(o).__name__ for o in outs})
        got = (f"{len(outs)} tensors" if kinds == ["Tensor"] else
               f"{len(outs)} values ({', '.join(kinds)})")
        result.reason = f"returned {got}, expected {len(ref_outs)} tensors ({case.outputs})"
        return result
    for out_name, got, ref in zip(case.outputs, outs, ref_outs):
        result.comparisons.append(compare(out_name, got, ref, bound, dtype))
    for what, ok, problem in cards.get(component).properties(case.args, outs):
        result.comparisons.append(Comparison(what, 0.0 if ok else float("nan"), 0.0, ok, problem))
    ran = grads is not None or backward_error is not None  # the no-grad forward too
    if ran and len(plain) != len(ref_outs):
        result.comparisons.append(Comparison("no grad", float("nan"), float("nan"), False,
                                             f"under torch.no_grad() returned {len(plain)} "
                                             f"values, expected {len(ref_outs)}"))
    elif ran:
        for out_name, got, ref in zip(case.outputs, plain, ref_outs):
            result.comparisons.append(compare(f"{out_name} (no grad)", got, ref, bound, dtype))
    if backward_error is not None:
        # the forward is judged above; the backward has nothing to compare
        tb = traceback.extract_tb(backward_error.__traceback__)
        at = f" ({tb[-1].filename}:{tb[-1].lineno})" if tb else ""
        why = f"{type(backward_error).__name__}: {backward_error}{at}"
        nan = float("nan")
        result.comparisons.append(Comparison("backward", nan, nan, False, f"raised {why}"))
        result.status = "error"
        result.reason = f"level's backward raised {why}"
        return result
    if grads is None:
        nan = float("nan")
        result.comparisons.append(Comparison("backward", nan, nan, False,
                                             "not run: the outputs are not what was expected"))
        result.status = "fail"
        return result
    for name, got, ref in zip(case.differentiable, grads, ref_grads):
        if got is None:
            result.comparisons.append(Comparison(f"grad {name}", float("nan"), float("nan"), False,
                                                 "no gradient (input unused by the graph)"))
        elif name in scales:
            result.comparisons.append(compare(f"grad {name} (exactly 0)", got, ref, bound, dtype,
                                              scale=scales[name]))
        else:
            result.comparisons.append(compare(f"grad {name}", got, ref, bound, dtype))
    result.comparisons += memory
    result.status = "pass" if all(c.ok for c in result.comparisons) else "fail"
    return result


def _inner(exc: BaseException) -> BaseException:
    """The exception to report: Triton's interpreter wraps whatever a kernel raised in an
    InterpreterError holding only its repr (quotes escaped, the kernel's line lost), and
    torch.compile a user's exception in an `Unsupported: Observed exception` of its own, so
    the one each was raised from is the one that says what happened, and where."""
    while (type(exc).__name__ in ("InterpreterError", "Unsupported")
           and exc.__cause__ is not None):
        exc = exc.__cause__
    return exc


def check(component: str | None = None, level: str | int | None = None, dtype="float32",
          device="cpu", size: str = "tiny", seed: int | None = None,
          variant: str | None = None, repeat: int = 1, layout: str | None = None, *,
          fn=None, uses_tf32=None) -> list[CheckResult]:
    """Check one or all components at one or all levels: one result per variant, layout
    (both of cards.LAYOUTS unless `layout` names one) and round. Without `level`: the five
    levels, then the registered ones (`levels.names()`).

    `fn`: check your own function for `component` instead of a level (see the module doc);
    the results' `level` is "fn:<its name>". `uses_tf32=True` declares that its float32
    matmuls run in TF32 (default: `fn.uses_tf32` if set, else False). Passing both `level`
    and `fn` is a ValueError.

    `repeat` > 1 checks each case again with new inputs of the same shapes: a level may run
    different code once warm (TorchScript's profiling executor fuses from the second call
    with a given shape on), and that code must be right too."""
    if fn is not None and component is None:
        raise ValueError("fn= checks one component: name it, e.g. check('layer_norm', fn=...)")
    if not isinstance(repeat, int) or repeat < 1:
        raise ValueError(f"argument 'repeat' must be an int >= 1; got {repeat!r}")
    if layout is not None and layout not in cards.LAYOUTS:
        raise ValueError(f"argument 'layout' must be one of {', '.join(cards.LAYOUTS)}; "
                         f"got {layout!r}")
    if fn is not None or level is not None or uses_tf32 is not None:
        targets = [_target(component, level, fn, uses_tf32)]  # refuses fn with level, by name
    else:
        targets = list(levels.names())
    results = []
    for comp in ([component] if component else COMPONENTS):
        card = cards.get(comp)
        for lvl in targets:
            for var in ([variant] if variant else card.variants):
                for lay in ([layout] if layout else cards.LAYOUTS):
                    for r in range(repeat):
                        round_seed = None if seed is None else seed + 7919 * r
                        results.append(check_case(comp, lvl, dtype, device, size, var,
                                                  round_seed, lay))
    return results
