"""triton_kernels/launch.py's compile-ahead: a new shape's kernels compiled at once.

On a CPU: the mechanism with stand-in kernels (a miss of the direct path's table starts a
dry pass, each distinct specialization is compiled once, in the pool, with small stand-in
tensors, and a launch waits for its kernel's compiles), and every component's dry pass
recording exactly the specializations its real forward and backward launch (the real
ones run in Triton's interpreter). On a GPU (`-m gpu`): after compiling ahead, the real
call compiles nothing more.
"""

from __future__ import annotations

import threading

import pytest
import torch

import levels  # noqa: F401 - switches Triton's interpreter on where there is no GPU
from triton_kernels import launch as L


class _Param:
    def __init__(self, name, constexpr=False):
        self.name, self.is_constexpr, self.has_default, self.default = name, constexpr, False, None


class _Compiled:
    function, packed_metadata = "fn", "meta"

    def __init__(self, log):
        self.log = log

    def run(self, *args):
        self.log.append(("direct",))

    def launch_metadata(self, grid, stream, *args):
        raise AssertionError("no launch hook is set")


class _Kernel:
    """Stands in for a JITFunction: kernel[grid](...) and kernel.warmup(...)."""

    def __init__(self, name):
        self.name = name
        self.params = [_Param("x_ptr"), _Param("n"), _Param("BLOCK", True)]
        self.log = []
        self.release = threading.Event()
        self.release.set()

    def __getitem__(self, grid):
        def jit(*args, **kwargs):
            self.log.append(("jit", args[1], kwargs["BLOCK"]))
            return _Compiled(self.log)
        return jit

    def warmup(self, *args, grid, **kwargs):
        self.release.wait(5)
        self.log.append(("warmup", threading.current_thread().name, args[0].numel(), args[1],
                         kwargs["BLOCK"]))


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setattr(L, "INTERPRETED", False)
    monkeypatch.setattr(L, "ENABLED", True)
    monkeypatch.setattr(L, "COMPILE_AHEAD", True)
    monkeypatch.setattr(L, "_DRIVER", [(lambda: 0, lambda device: 0)])
    monkeypatch.setattr(L, "_BROKEN", [])
    monkeypatch.setattr(L, "_PENDING", {})
    return _Kernel("fwd"), _Kernel("bwd")


def _function(fwd, bwd):
    class Twice(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            n = x.numel()
            L.launch(fwd, (1,), x, n, BLOCK=32)
            L.launch(fwd, (1,), x, n + 16, BLOCK=32)  # the same specialization: one compile
            L.launch(fwd, (1,), x, n, BLOCK=64)  # another
            ctx.save_for_backward(x)
            return x * 2

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            L.launch(bwd, (1,), g, x.numel(), BLOCK=32)
            return g * 2
    return Twice


def test_a_new_shape_compiles_its_forward_and_backward_ahead_in_the_pool(fake):
    fwd, bwd = fake
    fn = _function(fwd, bwd)
    x = torch.randn(48, requires_grad=True)
    L.apply_ahead(fn, x).sum().backward()
    L.wait_compiles()
    warm = [e for e in fwd.log + bwd.log if e[0] == "warmup"]
    # one per distinct specialization, forward's and backward's, none for n + 16
    assert sorted((e[3], e[4]) for e in warm) == [(48, 32), (48, 32), (48, 64)]
    assert all(e[1].startswith("levels-compile") for e in warm)  # in the pool's threads
    assert all(e[2] <= 64 for e in warm)  # small stand-ins, not the call's tensors
    # the real launches went on: through the JIT once per key, then directly
    assert [e for e in fwd.log if e[0] == "jit"] == [("jit", 48, 32), ("jit", 64, 32),
                                                     ("jit", 48, 64)]
    assert x.grad is not None and torch.equal(x.grad, torch.full_like(x, 2.0))
    fwd.log.clear(), bwd.log.clear()
    L.apply_ahead(fn, x).sum().backward()  # the same shape: no dry pass, direct launches
    assert [e[0] for e in fwd.log + bwd.log] == ["direct"] * 4
    L.apply_ahead(fn, torch.randn(80, requires_grad=True)).sum().backward()  # a new one
    L.wait_compiles()
    assert sum(e[0] == "warmup" for e in fwd.log) == 2


def test_a_launch_waits_for_its_kernels_compiles_in_flight(fake):
    fwd, bwd = fake
    fwd.release.clear()  # the pool's compiles of fwd block until released
    fn = _function(fwd, bwd)
    x = torch.randn(48, requires_grad=True)
    done = threading.Event()

    def call():
        L.apply_ahead(fn, x)
        done.set()
    t = threading.Thread(target=call)
    t.start()
    assert not done.wait(0.5)  # the forward's first launch waits for fwd's compiles
    assert [e for e in fwd.log if e[0] == "jit"] == []
    fwd.release.set()
    assert done.wait(5)
    t.join()
    assert [e[0] for e in fwd.log[:2]] == ["warmup", "warmup"]  # compiled, then launched


@pytest.mark.parametrize("off", ["switch", "direct path off", "autotune", "compiling"])
def test_no_dry_pass_where_it_is_off(fake, monkeypatch, off):
    fwd, bwd = fake
    if off == "switch":
        monkeypatch.setattr(L, "COMPILE_AHEAD", False)
    elif off == "direct path off":
        monkeypatch.setattr(L, "ENABLED", False)
    elif off == "autotune":
        monkeypatch.setenv("LEVELS_TRITON_AUTOTUNE", "1")
    else:
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    L.apply_ahead(_function(fwd, bwd), torch.randn(48, requires_grad=True)).sum().backward()
    L.wait_compiles()
    assert not [e for e in fwd.log + bwd.log if e[0] == "warmup"]
    assert len([e for e in fwd.log if e[0] in ("jit", "direct")]) == 3


def test_a_dry_pass_that_fails_leaves_the_real_call_to_raise(fake):
    fwd, _ = fake

    class Broken(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            L.launch(fwd, (1,), x, x.numel(), BLOCK=32)
            raise ValueError("argument 'x' is wrong")

        @staticmethod
        def backward(ctx, g):
            return g
    with pytest.raises(ValueError, match="argument 'x' is wrong"):
        L.apply_ahead(Broken, torch.randn(48, requires_grad=True))
    L.wait_compiles()
    assert [e[0] for e in fwd.log] == ["warmup", "jit"]  # what it recorded still compiled
    assert L._RECORDER.call is None and not L.recording()


def test_specialization_follows_tritons_rules():
    k = _Kernel("k")
    t = torch.zeros(64)
    spec = lambda *a, **kw: L._specialization(k, a, kw)  # noqa: E731
    assert spec(t, 48, BLOCK=32) == spec(torch.zeros(8), 32, BLOCK=32)  # % 16, aligned
    assert spec(t, 48, BLOCK=32) != spec(t, 1, BLOCK=32)  # 1 is a constant
    assert spec(t, 48, BLOCK=32) != spec(t, 47, BLOCK=32)
    assert spec(t, 48, BLOCK=32) != spec(t, 2 ** 32, BLOCK=32)  # 64-bit
    assert spec(t, 48, BLOCK=32) != spec(t[1:], 48, BLOCK=32)  # misaligned
    assert spec(t, 48, BLOCK=32) != spec(t.half(), 48, BLOCK=32)
    assert spec(t, 48, BLOCK=32) != spec(t, 48, BLOCK=64)
    assert spec(t, 48, 64) != spec(t, 48, 32)  # a positional constexpr, by value
    assert L._stand_in(t[1:]).data_ptr() % 16 != 0 and L._stand_in(t).data_ptr() % 16 == 0


# Every component's dry pass against its real forward+backward, in the interpreter.

def _cases():
    g = torch.Generator().manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, generator=g).requires_grad_()
    import levels.triton as L4
    yield "layer_norm", lambda: L4.layer_norm(r(6, 40), r(40), r(40), 1e-5)
    yield "mlp", lambda: L4.mlp(r(5, 16), r(32, 16), r(32), r(8, 32), r(8))
    for causal in (False, True):
        yield f"attention causal={causal}", lambda causal=causal: L4.attention(
            r(1, 2, 20, 16), r(1, 2, 20, 16), r(1, 2, 20, 16), causal)
    yield "lstm", lambda: L4.lstm(r(2, 5, 8), r(1, 2, 12), r(1, 2, 12), r(48, 8), r(48, 12),
                                  r(48), r(48))[0]
    for training in (True, False):
        yield f"conv_bn training={training}", lambda training=training: L4.conv_bn(
            r(2, 3, 6, 6), r(4, 3, 3, 3), r(4), r(4), r(4), torch.zeros(4), torch.ones(4),
            stride=1, padding=1, training=training)


@pytest.mark.skipif(not L.INTERPRETED, reason="the interpreter's launches are observed here")
@pytest.mark.parametrize("name,call", list(_cases()), ids=[n for n, _ in _cases()])
def test_a_dry_pass_records_every_launch_of_the_real_call(monkeypatch, name, call):
    import importlib

    from triton.runtime.interpreter import InterpretedFunction

    real, applied = set(), []
    original = InterpretedFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        real.add((self, L._specialization(self, L._job(self, args, kwargs)[1], kwargs)))
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)
    monkeypatch.setattr(InterpretedFunction, "run", run)

    def apply_ahead(function, *args):
        applied.append((function, args))
        return function.apply(*args)
    component = name.split()[0]
    module = importlib.import_module(f"triton_kernels.{component}")
    monkeypatch.setattr(module, "apply_ahead", apply_ahead)
    out = call()
    out.backward(torch.randn_like(out))
    assert len(applied) == 1 and real
    function, args = applied[0]
    recorded = {(k, L._specialization(k, a, kw)) for k, a, kw in L._record(function, args)}
    assert recorded == real


# ------------------------------------------------------------------------------- GPU --

def _compiled_counts(kernels, device):
    return {k: len(k.device_caches[device][0]) for k in kernels}


@pytest.mark.gpu
@pytest.mark.parametrize("component", ["layer_norm", "mlp", "attention", "lstm", "conv_bn",
                                       "rms_norm"])
def test_gpu_after_compiling_ahead_the_call_compiles_nothing(component):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    import importlib

    import levels.triton as L4
    module = importlib.import_module(f"triton_kernels.{component}")
    kernels = [k for k in module.KERNELS if hasattr(k, "device_caches")]
    from triton_kernels.gemm import KERNELS as GEMM
    kernels += [k for k in GEMM if k not in kernels]
    dev = torch.cuda.current_device()
    torch.manual_seed(7)

    def r(*shape):  # odd sizes no other test uses: new specializations
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16).requires_grad_()
    calls = {
        "layer_norm": lambda: L4.layer_norm(r(37, 1000 + 7), r(1007), r(1007), 1e-5),
        "mlp": lambda: L4.mlp(r(77, 200), r(408, 200), r(408), r(136, 408), r(136)),
        "attention": lambda: L4.attention(r(1, 3, 333, 64), r(1, 3, 333, 64), r(1, 3, 333, 64),
                                          True),
        "lstm": lambda: L4.lstm(r(3, 7, 40), r(1, 3, 56), r(1, 3, 56), r(224, 40), r(224, 56),
                                r(224), r(224))[0],
        "rms_norm": lambda: L4.rms_norm(r(37, 1000 + 7), r(1007), 1e-6),
        "conv_bn": lambda: L4.conv_bn(r(2, 5, 11, 11), r(24, 5, 3, 3), r(24), r(24), r(24),
                                      torch.zeros(24, device="cuda", dtype=torch.bfloat16),
                                      torch.ones(24, device="cuda", dtype=torch.bfloat16),
                                      stride=2, padding=1, training=True),
    }
    seen = []
    original = L.compile_ahead

    def spy(function, args):
        original(function, args)
        seen.append(function)
        L.wait_compiles()  # everything compiled before the real call goes on
        seen.append(_compiled_counts(kernels, dev))
    try:
        L.compile_ahead = spy
        out = calls[component]()
        out.backward(torch.randn_like(out))
        torch.cuda.synchronize()
    finally:
        L.compile_ahead = original
    assert len(seen) == 2, "the first launch of a new shape compiles ahead, once"
    assert _compiled_counts(kernels, dev) == seen[1], "the real call compiled more kernels"
    assert not L._PENDING
