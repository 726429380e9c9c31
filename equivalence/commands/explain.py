"""`levels explain`: what a level actually runs for one call of a component.

    from equivalence.commands.explain import explain
    print(explain("layer_norm", "compile"))          # terminal
    explain("layer_norm", "native")                  # a notebook shows it as text

Each level answers in its own terms, from the real thing, never from a description:

  native       the ATen operators one forward and one backward call dispatch (recorded
               with a TorchDispatchMode), with counts: every non-view op is a kernel
               launch and a round trip through memory.
  torchscript  the graph the TorchScript executor optimized after warm-up calls, with its
               fusion groups (prim::TensorExprGroup) and what each one fused; for conv_bn,
               the frozen module's graph where batch norm was folded into the conv.
  compile      the code Inductor generated for the forward and the backward graph: C++
               (OpenMP + SIMD) on a CPU, Triton on a GPU, plus the library calls it kept.
  others       the level module's own `explain(component, device)`, if it has one.
  triton       also "Where the microseconds go": one small call's host time, piece by piece,
               live on a CUDA GPU, else as recorded (host_probe.py); triton and cuda: the
               host path before and after, as recorded on an H100 (host_path.py).
Inputs are the component's `tiny` case (float32 unless asked), so the listing is short.
"""

from __future__ import annotations

import re
import types
from collections import Counter
from dataclasses import dataclass
from unittest import mock

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import levels
from levels.contract import COMPONENTS

from .. import cards
from ..calls import upstream as _upstream  # a fixed random upstream gradient per output
from ..check import _prepare, flatten, resolve_dtype
from . import host_path, host_time
from .console import EXIT_NOTHING_RAN, EXIT_OK, HELP_FORMAT, resolve_device
from .host_time import NAME_WIDTH  # noqa: F401 - the piece column's width, read by tests

RULE = "=" * 88


@dataclass(frozen=True)
class Section:
    title: str
    body: str


class Explanation(str):
    """The explanation as one printable string, with its parts in `.sections`.

    A str so that `print(explain(...))`, `"aten::erf" in explain(...)` and the CLI just
    work; `_repr_pretty_` makes a notebook cell show the text rather than its repr."""

    sections: tuple[Section, ...]
    component: str
    level: str
    device: str

    def __new__(cls, component: str, level: str, device: str, sections: list[Section]):
        info = levels.resolve(level)
        head = f"{component} at Level {info.number} ({info.title}) on {device}"
        parts = [RULE, head, RULE]
        for s in sections:
            parts += ["", f"--- {s.title} ---", s.body.rstrip()]
        obj = super().__new__(cls, "\n".join(parts) + "\n")
        obj.sections, obj.component = tuple(sections), component
        obj.level, obj.device = info.name, device
        return obj

    def section(self, title_start: str) -> str:
        """The body of the section titled `title_start` (shapes suffix aside), else of the
        first section whose title starts with it."""
        for s in self.sections:
            if s.title == title_start or s.title.startswith(title_start + "  ("):
                return s.body
        for s in self.sections:
            if s.title.startswith(title_start):
                return s.body
        titles = [s.title for s in self.sections]
        raise KeyError(f"no section starting with {title_start!r}; have {titles}")

    def _repr_pretty_(self, printer, cycle):  # IPython / Jupyter
        printer.text(str(self))


def explain(component: str, level: str | int, device="cpu", *, variant: str | None = None,
            dtype="float32") -> str:
    """What `level` runs for one call of `component` on `device` (see the module doc).

    variant: one of the component's variants (default: all of them); dtype: of the inputs."""
    if component not in COMPONENTS:
        raise ValueError(f"argument 'component' must be one of {', '.join(COMPONENTS)}; "
                         f"got {component!r}")
    info = levels.resolve(level)
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"argument 'device' must be a torch device such as 'cpu' or 'cuda'; "
                         f"got {device!r}") from exc
    dtype = resolve_dtype(dtype)
    spec = cards.get(component)
    if variant is not None and variant not in spec.variants:
        raise ValueError(f"argument 'variant' must be one of {sorted(spec.variants)} for "
                         f"{component}; got {variant!r}")
    variants = [variant] if variant else list(spec.variants)
    name = str(device)

    reason = levels.status(info.name, device, component)
    if device.type == "cuda" and not torch.cuda.is_available():
        reason = "no CUDA device here (torch.cuda.is_available() is False)"
    if reason:
        note = f"Level {info.number} ({info.title}) cannot run {component} on {name}:\n{reason}"
        module = None if info.number == 0 else levels.get(info.name)
        if getattr(module, "EXPLAIN_WITHOUT_DEVICE", False):
            # Level 5's kernels can still be read, and their ptxas report made, with nvcc alone.
            return Explanation(component, info.name, name, [
                Section("runs elsewhere", note), Section("the kernels", module.explain(component, device)),
                Section(*host_path.section(component, info.name))])
        sections = [Section("unavailable", note)]
        if info.name == "triton":  # the recorded host-time lessons need no GPU
            sections += [host_time_section(component, device),
                         Section(*host_path.section(component, "triton"))]
        return Explanation(component, info.name, name, sections)
    explainers = {"native": _explain_native, "torchscript": _explain_torchscript,
                  "compile": _explain_compile}
    if info.name in explainers:
        sections = []
        for var in variants:
            case = spec.case("tiny", var, dtype, device, seed=0)
            label = f"[{var}] " if len(variants) > 1 else ""
            sections += [Section(label + s.title, s.body)
                         for s in explainers[info.name](component, case, device)]
        return Explanation(component, info.name, name, sections)

    module = levels.get(info.name)
    own = getattr(module, "explain", None)
    if own is None:
        return Explanation(component, info.name, name, [Section(
            "no explain yet", f"Level {info.number} ({info.title}) has no explain yet: its code "
                              f"is in the module {info.module} and the files it calls.")])
    if device.type == "cuda":
        # Kernel levels summarize the code they compiled; compile it here, once per variant,
        # forward and backward, on the spec's inputs (a level never imports the harness).
        for var in variants:
            _run(getattr(module, component), spec.case("small", var, dtype, device, seed=0))
        torch.cuda.synchronize(device)
    sections = [Section(info.title, str(own(component, device)))]
    if info.name == "triton":
        sections.append(host_time_section(component, device))
    if info.name in host_path.WHAT_CHANGED:
        sections.append(Section(*host_path.section(component, info.name)))
    return Explanation(component, info.name, name, sections)


# ---------------------------------------------------------------------------------------
# Running one case forward and backward
# ---------------------------------------------------------------------------------------

def _run(fn, case: cards.Case, backward: bool = True, seed: int = 0):
    """Call fn on fresh leaf copies of the case's inputs; then backward with a fixed
    upstream gradient (none for a forward-only card: DIFFERENTIABLE = ()). Returns the flat
    outputs."""
    args, _ = _prepare(case)
    outs = flatten(fn(**args))[:case.n_returned]
    if backward and case.differentiable:
        torch.autograd.backward(outs, _upstream(outs, seed))
    return outs


def _variant_title(case: cards.Case, what: str) -> str:
    """A section title; forward sections also name the input shapes and dtype."""
    shapes = ", ".join(f"{k}{tuple(v)}" for k, v in case.shapes().items())
    return what + (f"  ({shapes}, {case.dtype})" if what.startswith("forward") else "")


# ---------------------------------------------------------------------------------------
# Level 1: the ATen ops, recorded at the dispatcher
# ---------------------------------------------------------------------------------------

class _OpRecorder(TorchDispatchMode):
    """Sees every ATen op after autograd and decompositions: what actually executes."""

    def __init__(self):
        super().__init__()
        self.ops: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func)
        return func(*args, **(kwargs or {}))


def _op_table(ops: list) -> str:
    def key(op):
        return str(op.overloadpacket) if hasattr(op, "overloadpacket") else str(op)

    counts = Counter(key(op) for op in ops)
    is_view = {key(op): bool(getattr(op, "is_view", False)) for op in ops}
    kernels = sum(c for k, c in counts.items() if not is_view[k])
    lines = [f"{len(ops)} ATen ops, {kernels} of them compute (views only relabel memory):",
             "  count  op"]
    for key, count in counts.items():  # in order of first appearance
        lines.append(f"  {count:5d}  {key}" + ("   (view: no kernel)" if is_view[key] else ""))
    return "\n".join(lines)


def _explain_native(component: str, case: cards.Case, device) -> list[Section]:
    fn = getattr(levels.get("native"), component)
    args, _ = _prepare(case)
    with _OpRecorder() as fwd:
        outs = flatten(fn(**args))[:case.n_returned]
    sections = [Section(_variant_title(case, "forward: ATen ops dispatched"), _op_table(fwd.ops))]
    if not case.differentiable:  # a forward-only component
        return sections
    upstream = _upstream(outs)
    with _OpRecorder() as bwd:
        torch.autograd.backward(outs, upstream)
    return sections + [Section(_variant_title(case, "backward: ATen ops dispatched by autograd"),
                               _op_table(bwd.ops))]


# ---------------------------------------------------------------------------------------
# Level 2: the optimized TorchScript graph and its fusion groups
# ---------------------------------------------------------------------------------------

FUSION_KINDS = ("prim::TensorExprGroup", "prim::TensorExprDynamicGroup", "prim::FusionGroup",
                "prim::CudaFusionGroup", "prim::oneDNNFusionGroup")
_BOOKKEEPING = ("prim::Constant", "prim::ListConstruct", "prim::TupleConstruct",
                "prim::TupleUnpack", "prim::ListUnpack", "prim::Return", "prim::Param")


def _nodes(graph_or_block):
    """Every node, recursing into blocks (if/loop bodies) and subgraphs (fusion groups),
    but not into the unfused fallback copies that guard fused groups on a GPU."""
    for node in graph_or_block.nodes():
        yield node
        if node.kind() == "prim::FallbackGraph":
            continue
        for block in node.blocks():
            yield from _nodes(block)
        if node.hasAttribute("Subgraph"):
            yield from _nodes(node.g("Subgraph"))


def _fusion_report(graph) -> str:
    kinds = Counter(n.kind() for n in _nodes(graph))
    groups = [n for n in _nodes(graph) if n.kind() in FUSION_KINDS]
    lines = ["differentiable graphs (autograd through the graph): "
             f"{kinds['prim::DifferentiableGraph']}",
             f"loops kept in the graph (prim::Loop): {kinds['prim::Loop']}",
             f"fusion groups: {len(groups)}"]
    for i, node in enumerate(groups):
        inner = [n.kind() for n in _nodes(node.g("Subgraph")) if n.kind() not in _BOOKKEEPING]
        lines.append(f"  group {i} ({node.kind()}): {len(inner)} ops in one kernel: "
                     + ", ".join(inner))
    # Shape bookkeeping (aten::size, aten::eq on ints...) runs in the interpreter, not as kernels.
    aten = Counter(n.kind() for n in _nodes(graph) if n.kind().startswith("aten::")
                   and any(isinstance(o.type(), torch._C.TensorType) for o in n.outputs()))
    lines.append("tensor ops in the graph (inside groups too): "
                 + ", ".join(f"{k} x{c}" if c > 1 else k for k, c in aten.items()))
    return "\n".join(lines)


def _why_no_fusion(device) -> str:
    if device.type == "cuda":
        return ("No fusion group here: the TensorExpr fuser found nothing it supports between the "
                "library calls, or it is switched off (torch._C._jit_texpr_fuser_enabled() = "
                f"{torch._C._jit_texpr_fuser_enabled()}).")
    llvm = torch._C._llvm_enabled() if hasattr(torch._C, "_llvm_enabled") else False
    return ("No fusion groups on the CPU, and that is the lesson: TorchScript's fuser (NNC) "
            "generates CPU code only through LLVM, and only when asked to "
            f"(torch._C._jit_can_fuse_on_cpu() = {torch._C._jit_can_fuse_on_cpu()}, this build "
            f"has LLVM: {llvm}). The standard PyTorch wheels do not, so on a CPU this level runs "
            "the same ATen kernels as Level 1 through the graph interpreter. On a CUDA device "
            "the same graph gets prim::TensorExprGroup nodes: one generated kernel per pointwise "
            "chain. torch.compile (Level 3) fuses on the CPU too.")


def _explain_torchscript(component: str, case: cards.Case, device) -> list[Section]:
    ts = levels.get("torchscript")
    fn = getattr(ts, component)
    # The profiling executor records shapes on the first calls and optimizes (fuses) once it
    # has seen them; a few forward+backward calls get us to the optimized graphs.
    for _ in range(3):
        _run(fn, case)
    outs = _run(fn, case, backward=False)
    forward = torch.jit.last_executed_optimized_graph()
    forward_text = str(forward)
    backward = None
    if case.differentiable:
        torch.autograd.backward(outs, _upstream(outs))
        backward = torch.jit.last_executed_optimized_graph()
    fused = [n for g in (forward, backward) if g is not None for n in _nodes(g)
             if n.kind() in FUSION_KINDS]
    sections = [
        Section(_variant_title(case, "forward: optimized graph summary"),
                _fusion_report(forward) + ("" if fused else "\n\n" + _why_no_fusion(device))),
        Section(_variant_title(case, "forward: optimized graph "
                                     "(torch.jit.last_executed_optimized_graph)"), forward_text),
    ] + ([Section(_variant_title(case, "backward: the last backward graph autograd ran"),
                  "Each prim::DifferentiableGraph above carries its own backward graph (symbolic "
                  "derivatives), which the executor profiles and fuses like the forward one; "
                  "this is the last of them to run, optimized:\n" + _fusion_report(backward))]
         if backward is not None else [])
    sections += [Section(title, body)
                 for title, body in cards.get(component).explain("torchscript", case, device)]
    return sections


# ---------------------------------------------------------------------------------------
# Level 3: the code Inductor generates
# ---------------------------------------------------------------------------------------

def inductor_code(component: str, case: cards.Case, device, backward: bool = True,
                  **settings) -> list[str]:
    """Compile the Level 3 math of `case` afresh and return Inductor's output code
    (one module per graph: forward, then backward).

    A fresh copy of the function's code object gets its own Dynamo cache, so this
    compiles (or loads from Inductor's on-disk cache) without disturbing the level's
    compiled functions. `settings` override compiled.settings(), e.g. sdpa_rewrite=False."""
    from torch._inductor.graph import GraphLowering

    compiled = levels.get("compile")
    math = compiled.MATH[component]
    fresh = types.FunctionType(math.__code__.replace(), math.__globals__, math.__name__,
                               math.__defaults__, math.__closure__)
    fn = torch.compile(fresh, **compiled.compile_kwargs(device, **settings))
    codes: list[str] = []
    # Inductor hands every module it writes (or loads from its cache) to this hook;
    # torch._inductor.utils.run_and_get_code uses the same one, but resets all of Dynamo.
    with mock.patch.object(GraphLowering, "save_output_code", codes.append, create=True):
        _run(lambda **kw: compiled.call(component, fn, compiled.prepare(component, **kw)), case,
             backward=backward)
    return codes


def _strip_header(code: str) -> str:
    """Drop the import boilerplate every output module starts with: keep the kernels
    and the `call` function that runs them."""
    start = re.search(r"^(\w+ = async_compile\.|class Runner|def call|def partition_0)", code, re.M)
    if start is None:
        return code
    return "# (imports and helpers omitted)\n\n" + code[start.start():].strip("\n")


def _code_summary(code: str) -> str:
    kernels = re.findall(r"^(\w+) = async_compile\.(\w+)\(", code, re.M)
    externs = re.findall(r"(extern_kernels\.\w+|torch\.ops\.aten\.\w+(?:\.\w+)?)\(", code)
    lines = [f"{len(kernels)} generated kernel(s):"]
    lines += [f"  {name}  ({kind.replace('cpp_pybinding', 'C++').replace('triton', 'Triton')})"
              for name, kind in kernels]
    calls = Counter(externs)
    lines.append(f"{sum(calls.values())} library call(s) kept: "
                 + (", ".join(f"{k} x{c}" if c > 1 else k for k, c in calls.items()) or "none"))
    return "\n".join(lines)


def _explain_compile(component: str, case: cards.Case, device) -> list[Section]:
    compiled = levels.get("compile")
    settings = compiled.settings(device)
    codes = inductor_code(component, case, device)
    names = ["forward", "backward"]
    setting_line = (f"torch.compile(fullgraph=True, mode={settings['mode']!r}, "
                    f"dynamic={settings['dynamic']}), Inductor pattern matcher "
                    f"{'on' if settings['sdpa_rewrite'] else 'off'}; "
                    f"{'Triton' if device.type == 'cuda' else 'C++/OpenMP'} code for {device.type}")
    sections = []
    for i, code in enumerate(codes):
        what = names[i] if i < len(names) else f"graph {i}"
        summary = _code_summary(code)
        if i == 0:
            summary = setting_line + "\n" + summary
        if "scaled_dot_product" in code:
            summary += ("\nThe pattern matcher replaced matmul -> scale -> softmax -> matmul "
                        "with a fused scaled_dot_product_attention call: the score matrix is never "
                        "written to memory, and Inductor generated no attention kernel of its own.")
        sections.append(Section(_variant_title(case, f"{what}: Inductor output code summary"),
                                summary))
        sections.append(Section(_variant_title(case, f"{what}: Inductor output code"),
                                _strip_header(code)))
    if any("scaled_dot_product" in c for c in codes):
        plain = inductor_code(component, case, device, sdpa_rewrite=False)
        for i, code in enumerate(plain):
            what = names[i] if i < len(names) else f"graph {i}"
            sections.append(Section(
                _variant_title(case, f"{what} with the SDPA rewrite off (pattern_matcher=False)"),
                "What Inductor writes itself when it may not call the fused attention op "
                "(levels.compiled.configure(sdpa_rewrite=False) makes the level use this):\n"
                + _code_summary(code) + "\n\n" + _strip_header(code)))
    return sections


# ---------------------------------------------------------------------------------------
# Level 4: where a small call's microseconds go (host_time.py writes it)
# ---------------------------------------------------------------------------------------

def host_time_section(component: str, device) -> Section:
    """"Where the microseconds go": one small Level 4 call's host time, piece by piece."""
    return Section(*host_time.section(component, device))


def add_parser(sub) -> None:
    p = sub.add_parser("explain", formatter_class=HELP_FORMAT, help="show what a level actually runs",
                       description="native: the ATen ops a call dispatches; torchscript: the optimized "
                                   "graph; compile: Inductor's generated code; triton: kernel source "
                                   "(and PTX/SASS summary on a GPU); cuda: the kernels' source and "
                                   "ptxas report (nvcc, no GPU needed).\n"
                                   "Exit 0 when it showed the level's code, also for a level that "
                                   "cannot run here (Level 5's kernels are read without a GPU); 3 when "
                                   "it had only the reason to show.")
    p.add_argument("--component", choices=COMPONENTS,
                   help="one component (default: every component, one after the other)")
    p.add_argument("--level", required=True)
    p.add_argument("--device")
    p.set_defaults(run=run)


def run(args, console) -> int:
    level = levels.resolve(args.level).name
    device = resolve_device(args.device)
    shown = False
    for component in [args.component] if args.component else COMPONENTS:
        text = explain(component, level, device)
        console.print(text, markup=False, highlight=False)
        # "unavailable" is the section of a level that cannot run here and has nothing of
        # its own to show; Level 5's "runs elsewhere" shows its kernels
        shown |= not any(s.title == "unavailable" for s in text.sections)
    return EXIT_OK if shown else EXIT_NOTHING_RAN


__all__ = ["Explanation", "Section", "explain", "host_time_section", "inductor_code"]
