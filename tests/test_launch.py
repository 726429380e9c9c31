"""triton_kernels/launch.py: Level 4's direct launch path (host time per call).

On a CPU the path is exercised with a stand-in kernel (the interpreter never takes it);
on a GPU (`-m gpu`) with the real kernels: the same results as kernel[grid], a new
specialization (a misaligned view) compiled rather than mislaunched, fewer microseconds.
"""

from __future__ import annotations

import types

import pytest
import torch

import levels  # noqa: F401 - switches Triton's interpreter on where there is no GPU
from triton_kernels import launch as L


class _Param:
    def __init__(self, name, constexpr=False, default=None):
        self.name, self.is_constexpr = name, constexpr
        self.has_default, self.default = default is not None, default


class _Compiled:
    function, packed_metadata = "fn", "meta"

    def __init__(self, log):
        self.log = log

    def run(self, *args):
        self.log.append(("direct", args))

    def launch_metadata(self, grid, stream, *args):
        raise AssertionError("only called when a launch hook is set")


class _Kernel:
    """Stands in for a JITFunction: params, and kernel[grid](...) -> a compiled kernel."""

    def __init__(self):
        self.params = [_Param("x_ptr"), _Param("n"), _Param("scale"), _Param("BLOCK", True),
                       _Param("FLAG", True, default=1)]
        self.log = []

    def __getitem__(self, grid):
        def jit(*args, **kwargs):
            self.log.append(("jit", grid, args, kwargs))
            return _Compiled(self.log)
        return jit


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setattr(L, "INTERPRETED", False)
    monkeypatch.setattr(L, "ENABLED", True)
    monkeypatch.setattr(L, "_DRIVER", [(lambda: 0, lambda device: 77)])
    monkeypatch.setattr(L, "_BROKEN", [])
    return _Kernel()


def test_first_call_compiles_through_the_jit_then_launches_directly(fake):
    x = torch.zeros(64)
    L.launch(fake, (3,), x, 100, 0.5, BLOCK=32, num_warps=4)
    assert [e[0] for e in fake.log] == ["jit"]
    L.launch(fake, (3,), x, 100, 0.5, BLOCK=32, num_warps=4)
    kind, args = fake.log[-1]
    assert kind == "direct"
    # grid padded to 3-D, the stream, the kernel's handles, no hooks, then every parameter
    # in signature order, the constexprs and their defaults included
    assert args[:9] == (3, 1, 1, 77, "fn", "meta", None, None, None)
    assert args[9] is x and args[10:] == (100, 0.5, 32, 1)
    assert L.compiled_count(fake) == 1


@pytest.mark.parametrize("change", ["constexpr", "option", "int is 1", "int % 16", "dtype",
                                    "misaligned", "int64"])
def test_a_different_specialization_goes_through_the_jit_again(fake, change):
    base = torch.zeros(64)
    args, kw = [base, 32, 0.5], dict(BLOCK=32, num_warps=4)
    L.launch(fake, (1,), *args, **kw)
    if change == "constexpr":
        kw["BLOCK"] = 64
    elif change == "option":
        kw["num_warps"] = 8
    elif change == "int is 1":
        args[1] = 1
    elif change == "int % 16":
        args[1] = 33
    elif change == "dtype":
        args[0] = base.half()
    elif change == "misaligned":
        args[0] = base[1:]  # 4 bytes past a 16-byte boundary: Triton compiles another kernel
    elif change == "int64":
        args[1] = 2 ** 32
    L.launch(fake, (1,), *args, **kw)
    assert [e[0] for e in fake.log] == ["jit", "jit"]
    assert L.compiled_count(fake) == 2


def test_other_addresses_and_grids_stay_one_key_other_values_do_not(fake):
    L.launch(fake, (1,), torch.zeros(64), 32, 0.5, BLOCK=32)
    L.launch(fake, (9,), torch.zeros(128), 32, 0.5, BLOCK=32)  # other grid, tensor, address
    assert [e[0] for e in fake.log] == ["jit", "direct"]
    L.launch(fake, (9,), torch.zeros(128), 48, 0.5, BLOCK=32)  # a new size: the JIT once
    L.launch(fake, (9,), torch.zeros(128), 48, 0.5, BLOCK=32)
    L.launch(fake, (9,), torch.zeros(128), True, 0.5, BLOCK=32)  # True == 1, not the same
    assert [e[0] for e in fake.log] == ["jit", "direct", "jit", "direct", "jit"]


def test_the_table_is_bounded(fake, monkeypatch):
    monkeypatch.setattr(L, "_MAX_KEYS", 3)
    for n in range(7):
        L.launch(fake, (1,), torch.zeros(4), n, 0.5, BLOCK=32)
    assert L.compiled_count(fake) <= 3


def test_switched_off_by_the_environment_and_while_compiling(fake, monkeypatch):
    x = torch.zeros(64)
    monkeypatch.setattr(L, "ENABLED", False)
    for _ in range(2):
        L.launch(fake, (1,), x, 32, 0.5, BLOCK=32)
    monkeypatch.setattr(L, "ENABLED", True)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    for _ in range(2):
        L.launch(fake, (1,), x, 32, 0.5, BLOCK=32)
    assert [e[0] for e in fake.log] == ["jit"] * 4


def test_a_compiled_kernel_of_another_shape_turns_the_path_off_with_a_warning(fake):
    class Odd:
        def __getitem__(self, grid):
            return lambda *a, **k: object()  # no run / function / packed_metadata
    odd = Odd()
    odd.params = fake.params
    with pytest.warns(RuntimeWarning, match="kernel\\[grid\\]"):
        L.launch(odd, (1,), torch.zeros(4), 32, 0.5, BLOCK=32)
    L.launch(fake, (1,), torch.zeros(4), 32, 0.5, BLOCK=32)
    L.launch(fake, (1,), torch.zeros(4), 32, 0.5, BLOCK=32)
    assert [e[0] for e in fake.log] == ["jit", "jit"]  # off for every kernel now


def test_host_helpers_match_tritons():
    import triton
    for n in list(range(0, 70)) + [1023, 1024, 1025, 2 ** 20 + 3]:
        assert L.next_power_of_2(n) == triton.next_power_of_2(n), n
        for d in (1, 3, 16, 128):
            assert L.cdiv(n, d) == triton.cdiv(n, d), (n, d)


def test_needs_grad():
    a, b = torch.zeros(2), torch.zeros(2, requires_grad=True)
    assert not L.needs_grad(a, a) and L.needs_grad(a, b)
    with torch.no_grad():
        assert not L.needs_grad(a, b)


_STATIC_PROBE = """
import os, sys
if sys.argv[1] == "inductor-first":
    import torch._inductor.config
import triton_kernels.launch as L
import torch._inductor.config as config
print(os.environ.get(L.STATIC_LAUNCH_ENV), config.static_launch_user_defined_triton_kernels)
"""


@pytest.mark.parametrize("case, env, expected", [
    ("levels-first", {}, "1 True"),                  # the usual order: torch.compile after us
    ("inductor-first", {}, "1 True"),                # Inductor's config imported before us
    ("levels-first", {L.STATIC_LAUNCH_ENV: "0"}, "0 False"),  # the user's choice stands
    ("levels-first", {"TRITON_INTERPRET": "1"}, "None False"),  # nothing to launch
])
def test_inductor_launches_our_kernels_statically_unless_told_not_to(case, env, expected):
    """Under torch.compile, Inductor launches user-defined kernels through Triton's Python
    launcher unless told otherwise (launch.py says what that cost a compiled GPT step)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    base = {k: v for k, v in os.environ.items()
            if k not in (L.STATIC_LAUNCH_ENV, "TRITON_INTERPRET")}
    out = subprocess.run([sys.executable, "-c", _STATIC_PROBE, case], env={**base, **env},
                         cwd=Path(__file__).resolve().parents[1], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[-2] == expected


# ------------------------------------------------------------------------------- GPU --

@pytest.mark.gpu
def test_gpu_direct_launches_give_the_jits_results():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    import levels.triton as L4
    torch.manual_seed(0)
    x = torch.randn(64, 1000, device="cuda", dtype=torch.bfloat16)
    w, b = torch.randn(1000, device="cuda", dtype=torch.bfloat16), torch.randn(
        1000, device="cuda", dtype=torch.bfloat16)
    cases = [(x, w, b), (x[1:], w, b),  # aligned, then rows starting 2000 bytes in
             (x[:, 1:999], w[1:999], b[1:999])]  # each row 2 bytes past the allocation
    for xv, wv, bv in cases:
        want = torch.nn.functional.layer_norm(xv.float(), (xv.shape[-1],), wv.float(),
                                              bv.float(), 1e-5)
        for _ in range(3):  # the first through the JIT, the others directly
            y = L4.layer_norm(xv, wv, bv, 1e-5)
            assert ((y.float() - want).norm() / want.norm()).item() < 1e-2
    a = torch.randn(100, 64, device="cuda", dtype=torch.float16)
    w1 = torch.randn(256, 64, device="cuda", dtype=torch.float16) * 0.1
    b1 = torch.randn(256, device="cuda", dtype=torch.float16)
    w2 = torch.randn(48, 256, device="cuda", dtype=torch.float16) * 0.1
    b2 = torch.randn(48, device="cuda", dtype=torch.float16)
    want = torch.nn.functional.linear(torch.nn.functional.gelu(
        torch.nn.functional.linear(a.float(), w1.float(), b1.float())), w2.float(), b2.float())
    for _ in range(3):
        got = L4.mlp(a, w1, b1, w2, b2)
        assert ((got.float() - want).norm() / want.norm()).item() < 1e-2
