"""Level 5 (CUDA C++) rope: every version of cuda_kernels/rope.cu, forward and backward,
through the harness (float64 reference, NaN-poisoned allocations, both layouts), and the op
a call is (autograd.cpp's C++ node, whose backward is the same kernel rotating by -theta).

On a CPU: the version plumbing, and (with nvcc) that the file compiles for sm_90a without
spilling. tests/test_cuda_autograd_cpu.py runs the C++ autograd node against a torch twin of
the kernel op; tests/test_cuda_build.py compiles the file alone and with all the others."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch

import levels
from cuda_kernels import build
from cuda_kernels import rope as kr
from equivalence import cards
from equivalence.check import check, check_args

ENV = kr.ENV_VERSION
CU = Path(kr.__file__).with_suffix(".cu")
VERSIONS = sorted(kr.VERSIONS)
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


# ------------------------------------------------------------------------------ CPU --

def test_versions_come_from_the_argument_then_the_environment(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert kr.resolve_version() == kr.DEFAULT_VERSION
    monkeypatch.setenv(ENV, "1")
    assert kr.resolve_version() == 1 and kr.resolve_version(3) == 3
    monkeypatch.setenv(ENV, "9")
    with pytest.raises(ValueError, match=r"rope: \$LEVELS_CUDA_VERSION_ROPE must be one of \[1, 2, 3\]"):
        kr.resolve_version()


@pytest.mark.skipif(shutil.which("nvcc") is None,
                    reason="nvcc not found: install the CUDA toolkit (or put it on PATH) to "
                           "compile the Level 5 kernels")
def test_kernels_compile_for_sm90a_without_spills():
    out = subprocess.run(
        ["nvcc", "-std=c++17", "-O3", "-gencode=arch=compute_90a,code=sm_90a", "--cubin",
         "-Xptxas", "-v", "-I", str(CU.parent), *build.TORCH_NVCC_FLAGS, "-o", "/dev/null",
         str(CU)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    kernels = out.stderr.count("Compiling entry function")
    # each version in 3 dtypes, v3 once per pair layout
    assert kernels == 3 * (len(VERSIONS) + 1), out.stderr[-3000:]
    assert " 0 bytes spill stores, 0 bytes spill loads" in out.stderr
    assert "bytes spill stores" not in out.stderr.replace(" 0 bytes spill stores", "")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only behaviour")
def test_without_gpu_level5_says_why():
    assert "needs a CUDA GPU" in levels.status("cuda", "cpu", "rope")


# ------------------------------------------------------------------------------ GPU --

def _args(shape, dtype, interleaved=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    args = cards.get("rope").module.make_args(shape, dtype, torch.device("cuda"), g)
    return args | {"interleaved": interleaved}


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_harness_tiny_both_layouts(version, dtype, monkeypatch):
    monkeypatch.setenv(ENV, str(version))
    results = check("rope", "cuda", dtype=dtype, device="cuda", size="tiny")
    assert {r.layout for r in results} == set(cards.LAYOUTS)
    for r in results:
        assert r.passed, f"v{version}: {r.summary()}"


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("B,H,N,D", [(1, 1, 1, 2), (2, 3, 1000, 96), (1, 32, 4096, 128),
                                     (3, 8, 777, 80), (2, 4, 129, 256), (1, 2, 5, 6)])
def test_sizes(version, dtype, interleaved, B, H, N, D, monkeypatch):
    # half = 1, 3, 40, 48, 64, 128: every block width of v2 (32, 64, 128 threads a row) and
    # rows that leave the last block part-empty
    monkeypatch.setenv(ENV, str(version))
    r = check_args("rope", "cuda", _args(dict(B=B, H=H, N=N, D=D), dtype, interleaved, seed=N))
    assert r.passed, f"v{version}: {r.summary()}"


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("view", ["one_element_off", "tables_every_other", "x_every_other"])
def test_views_that_defeat_vectors_fall_back(view, interleaved, dtype, monkeypatch):
    # v3 reads 16-byte vectors only where the operands allow them; these do not (a start one
    # element past a 16-byte boundary, table columns 2 apart, x's last stride 2), and must
    # give the same answer by v2's path
    monkeypatch.setenv(ENV, "3")
    args = _args(dict(B=2, H=3, N=40, D=64), dtype, interleaved, seed=4)
    if view == "one_element_off":
        buf = torch.full((args["x"].numel() + 1,), float("nan"), dtype=dtype, device="cuda")
        args["x"] = buf[1:].view(args["x"].shape).copy_(args["x"])
    else:
        names = ("cos", "sin") if view == "tables_every_other" else ("x",)
        for name in names:
            args[name] = cards.as_view(args[name], "last_every_other")
    r = check_args("rope", "cuda", args)
    assert r.passed, r.summary()


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("version", VERSIONS)
def test_q_sliced_from_fused_qkv_and_an_expanded_gradient(version):
    B, H, N, D = 2, 4, 33, 64
    args = _args(dict(B=B, H=H, N=N, D=D), torch.float32, seed=2)
    qkv = torch.full((B, N, 3 * H * D), float("nan"), device="cuda")
    q = qkv[..., :H * D].view(B, N, H, D).transpose(1, 2)
    q.copy_(args["x"])
    leaf = q.detach().requires_grad_(True)  # same strides as the slice
    out = kr.rope(leaf, args["cos"], args["sin"], version=version)
    assert out.is_contiguous() and torch.isfinite(out).all()
    out.sum().backward()  # dy has stride 0 everywhere
    x64 = args["x"].double().requires_grad_(True)
    ref = cards.get("rope").reference(dict(x=x64, cos=args["cos"].double(),
                                           sin=args["sin"].double()))[0]
    ref.sum().backward()
    torch.testing.assert_close(out, ref.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(leaf.grad, x64.grad.float(), rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_opcheck(version, dtype):
    build.load()
    ops = torch.ops.levels_cuda
    args = _args(dict(B=2, H=3, N=17, D=20), dtype, seed=version)
    x, cos, sin = args["x"], args["cos"], args["sin"]
    for interleaved in (False, True):
        torch.library.opcheck(ops.rope_rotate, (x, cos, sin, interleaved, False, version))
        torch.library.opcheck(ops.rope, (x.clone().requires_grad_(True), cos, sin, interleaved,
                                         version))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("version", VERSIONS)
def test_inside_torch_compile(version, monkeypatch):
    monkeypatch.setenv(ENV, str(version))
    levels.get("cuda")
    build.load()  # before tracing: Dynamo cannot trace a build
    args = _args(dict(B=1, H=4, N=50, D=64), torch.bfloat16, seed=11)
    x = args["x"].clone().requires_grad_(True)

    def f(x):
        return torch.relu(kr.rope(x, args["cos"], args["sin"])) + 1

    torch._dynamo.reset()
    results = []
    for fn in (f, torch.compile(f, fullgraph=True)):
        out = fn(x)
        results.append((out, *torch.autograd.grad(out.float().square().sum(), (x,))))
    for got, want in zip(results[1], results[0]):
        torch.testing.assert_close(got, want)
