"""`levels grade`: the watch around each call the harness makes of a kernel level, and the
verdicts it leads to (the rules are said in equivalence/commands/grade_rules.py).

`watcher(...)` returns a stand-in for the harness's `run_case` that runs the real one with
everything watched: a TorchDispatchMode (fused ATen ops, the student's torch arithmetic,
Level 5's extension ops, and which bytes each torch op overwrote), sys.setprofile (other
levels' code), and the stores of interpreted Triton kernels and simulated numba kernels.
Once the call is done, its outputs and gradients are held against the bytes the kernels
wrote. Everything is recorded per pass in a `Ledger`, whose `verdicts()` says, per pass,
what took its credit.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from pathlib import Path

from .grade_rules import (_ALLOWED, _NUMBA_LISTENERS, COPY_OPS, CUDA_OP_NAMESPACE, PASSES,
                          SUBMISSION_PACKAGES, VIEW_OPS, Written, _patch_numba_stores,
                          _whole_storage, element_addresses, forbidden_files, phase)


class Ledger:
    """What a part's calls did, per pass ("forward", "backward")."""

    def __init__(self):
        self.launches = {p: {} for p in PASSES}  # kernel -> launches
        self.other_calls = {p: {} for p in PASSES}  # "dir/file.py:function" -> calls
        self.fused = {p: {} for p in PASSES}  # fused ATen op -> calls
        self.computed = {p: {} for p in PASSES}  # aten op -> where the student called it
        self.unwritten = {p: {} for p in PASSES}  # output -> why its bytes are not the kernels'
        self.handed_back = {p: {} for p in PASSES}  # output -> the input it is
        self.interpreted: dict[str, str] = {}  # Level 5 op -> where it was registered in Python
        self.stores_seen = False  # whether this process could see the kernels' stores

    def verdicts(self, level: str, notes: list) -> dict:
        """What took credit, and what ran (into `notes`): {"forward": [...], "backward":
        [...]}, a pass's own problems (no kernel of the submission ran in it: the pass earns
        nothing), and "cheats": [{"pass", "rule", "output", "text"}], the rules broken, each
        of which costs the whole part (grade_credit.cells)."""
        if level == "cuda":
            ran_what = "your CUDA ops ran"
            none_ran = (f"no op of your compiled cuda_kernels/ (torch.ops.{CUDA_OP_NAMESPACE}, "
                        f"built from your .cu files) ran")
        else:
            package = "triton_kernels" if level == "triton" else "numba_kernels"
            ran_what, none_ran = "your kernels ran", f"no kernel of your {package}/ ran"
        found: dict = {p: [] for p in PASSES}
        cheats = found["cheats"] = []

        def cheat(p, rule, text, output=""):
            cheats.append({"pass": p, "rule": rule, "output": output, "text": text})

        for p in PASSES:
            ran = self.launches[p]
            if ran:
                notes.append(f"{p}: {ran_what}: " + ", ".join(f"{k} x{n}"
                                                             for k, n in sorted(ran.items())))
            else:
                found[p].append(f"{none_ran} in the {p} pass: at a kernel level the answer must "
                                f"come from your own kernel, not from PyTorch ops or another level")
            if self.computed[p]:
                ops = ", ".join(f"aten.{op} ({where})" for op, where in sorted(self.computed[p].items()))
                cheat(p, "computed", f"PyTorch computed inside your {p}: {ops}: at a kernel level "
                                     f"only allocations, views and copies may run as torch ops; "
                                     f"the arithmetic must be in your kernels")
            for output, why in self.unwritten[p].items():
                cheat(p, "unwritten", f"not written by your kernels ({p}): {why}", output)
            for output, given in self.handed_back[p].items():
                cheat(p, "input", f"{output} is your input {given!r} handed back ({p}), not a "
                                  f"result your kernels wrote", output)
            if self.other_calls[p]:
                cheat(p, "other level", f"another level's code ran inside your {p} ("
                      + ", ".join(sorted(self.other_calls[p])) + "): no credit for its answer")
            if self.fused[p]:
                cheat(p, "fused", f"PyTorch computed the component for you in the {p} (ATen "
                      + ", ".join(sorted(self.fused[p])) + "): no credit at a kernel level")
        if self.interpreted:
            cheat("forward", "python op", "not compiled from your cuda_kernels/: "
                  + ", ".join(f"{op} is Python (registered at {where})"
                              for op, where in sorted(self.interpreted.items()))
                  + ": no credit for ops written in Python at Level 5")
        if level != "cuda" and not self.stores_seen:
            notes.append("the kernels' stores were not observed here (compiled kernels on a GPU): "
                         "outputs were not matched to them")
        # the most telling first: the message leads with it (a decoy's arithmetic, `y +
        # (ref - y).detach()`, is also torch computing, but another level's answer is the news)
        order = ("other level", "fused", "python op", "input", "computed", "unwritten")
        cheats.sort(key=lambda c: (order.index(c["rule"]), PASSES.index(c["pass"])))
        return found


def _student_frame(roots: tuple[str, ...]) -> str | None:
    """"dir/file.py:line" of the innermost frame of the submission's packages on the stack,
    or None: then the op is the harness's or autograd's engine's, not the student's."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(roots):
            return f"{Path(name).parent.name}/{Path(name).name}:{frame.f_lineno}"
        frame = frame.f_back
    return None


def _caller_in(frame, roots: tuple[str, ...]) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.startswith(roots):
            return True
        frame = frame.f_back
    return False


def _tensors(value) -> list:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def watcher(repo: Path, grader: Path, component: str, level: str, ledger: Ledger,
            extension=None, stores: bool = False):
    """A function running the harness's run_case(fn, case, upstream, memory) with everything
    watched into `ledger`; `extension` (an OpCounter) sees every op dispatched; `stores`:
    whether the kernels' stores can be observed here (the interpreter, the simulator)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from .. import cards
    from ..check import BackwardFailed

    forbidden = forbidden_files({repo, grader}, level, grader)
    denied = set(cards.get(component).fused_aten)
    roots = tuple(str(Path(repo).resolve() / p) + "/" for p in SUBMISSION_PACKAGES)
    written = Written()
    ledger.stores_seen = stores

    def profile(frame, event, arg):
        if event == "call":
            filename = frame.f_code.co_filename
            # a module body running is an import (levels.get imports lazily), not a call
            # (and only when the submission's code is calling: the harness reads its cards)
            if (filename in forbidden and frame.f_code.co_name != "<module>"
                    and _caller_in(frame.f_back, roots)):
                where = f"{Path(filename).parent.name}/{Path(filename).name}:{frame.f_code.co_name}"
                calls = ledger.other_calls[phase()]
                calls[where] = calls.get(where, 0) + 1

    def track(name: str, args, kwargs, out) -> None:
        """Rule 2's bookkeeping: what an op's outputs hold, kernel bytes or not."""
        outs = _tensors(out)
        if not outs or name in VIEW_OPS:
            return
        inputs = _tensors(args) + _tensors(list((kwargs or {}).values()))
        if name in COPY_OPS:
            source = inputs[1] if name == "copy_" else None
            for dst in outs:
                if source is None:  # _to_copy, clone, cat: covered if every input was
                    ok = all(written.covered(element_addresses(s), s.element_size()).all()
                             for s in inputs if s.is_floating_point())
                    (written.mark if ok else written.forget)(element_addresses(dst),
                                                           dst.element_size())
                    continue
                if source.data_ptr() == dst.data_ptr() and source.dtype == dst.dtype:
                    continue  # the interpreter copying a storage onto itself
                src = element_addresses(source, dst.shape)
                ok = written.covered(src, source.element_size())
                addrs = element_addresses(dst)
                written.mark(addrs[ok], dst.element_size())
                written.forget(addrs[~ok], dst.element_size())
            return
        storages = {t.untyped_storage().data_ptr() for t in inputs}
        for t in outs:
            if name in ("fill_", "zero_") or t.untyped_storage().data_ptr() not in storages:
                written.forget(element_addresses(t) if name in ("fill_", "zero_")
                               else _whole_storage(t), 1 if name not in ("fill_", "zero_")
                               else t.element_size())

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            p = phase()
            # by namespace too: an op of the submission's own may share an ATen op's name
            if func.namespace == "aten" and name in denied:
                ledger.fused[p][name] = ledger.fused[p].get(name, 0) + 1
            if extension is not None:
                extension(func)
            out = func(*args, **(kwargs or {}))
            if func.namespace == "aten" and name not in _ALLOWED and any(
                    t.is_floating_point() for t in _tensors(out)):
                where = _student_frame(roots)
                if where is not None:
                    ledger.computed[p].setdefault(name, where)
            if stores:
                track(name, args, kwargs, out)
            return out

    def judge(case, outs, grads, args: dict) -> None:
        """Rule 2 on a call's results: every element of every output and gradient written
        by the kernels during the call, none of them one of the call's own inputs."""
        inputs = {t.untyped_storage().data_ptr(): name for name, t in args.items()
                  if isinstance(t, torch.Tensor) and name not in case.mutated}
        named = [("forward", n, t) for n, t in zip(case.outputs, outs)]
        named += [("backward", f"grad {n}", t) for n, t in zip(case.differentiable, grads or ())]
        for p, name, t in named:
            if not isinstance(t, torch.Tensor) or name in ledger.unwritten[p] \
                    or name in ledger.handed_back[p]:
                continue
            given = inputs.get(t.untyped_storage().data_ptr())
            if given is not None:
                ledger.handed_back[p].setdefault(name, given)
                continue
            ok = written.covered(element_addresses(t), t.element_size())
            if not ok.all():
                ledger.unwritten[p][name] = (f"{name}: {int((~ok).sum())} of {t.numel()} "
                                             f"elements were not written by your kernels in this "
                                             f"call")

    def on_store(addresses, itemsize):
        written.mark(addresses, itemsize)

    def on_numba_copy(kept, dropped, itemsize):
        written.mark(kept, itemsize)
        written.forget(dropped, itemsize)

    def watch(run_case, fn, case, upstream=None, memory=None):
        from .. import interpreter

        written.clear_all()
        seen: dict = {}

        def spy(**kwargs):  # the call's own arguments: an output may not be one of them
            seen.update(kwargs)
            return fn(**kwargs)

        old = sys.getprofile()
        sys.setprofile(profile)
        threading.setprofile(profile)
        if stores and level == "numba":
            _patch_numba_stores()
            _NUMBA_LISTENERS.append(on_numba_copy)
        failure = None
        try:
            with Watch(), (interpreter.listening(on_store) if stores and level == "triton"
                           else contextlib.nullcontext()):
                result = run_case(spy, case, upstream=upstream, memory=memory)
        except BackwardFailed as exc:
            failure, result = exc, (exc.outs, None)
        finally:
            sys.setprofile(old)
            threading.setprofile(None)
            if on_numba_copy in _NUMBA_LISTENERS:
                _NUMBA_LISTENERS.remove(on_numba_copy)
        if stores:
            judge(case, result[0], result[1] if upstream is not None else None, seen)
        if failure is not None:
            raise failure
        return result

    return watch

