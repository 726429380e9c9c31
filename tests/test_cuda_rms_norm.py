"""Level 5 (CUDA C++) rms_norm: every version of cuda_kernels/rms_norm.cu, forward and
backward, through the harness (float64 reference, NaN-poisoned allocations, both layouts).

The versions' paths are chosen by size and alignment (v3: a warp per row up to 256 wide, a
block per row up to 1024 vectors, else v2's warp per row; its backward fused with 8 or 16
elements a thread up to 8192 wide, else v2's kernels), so the GPU tests pick widths that
land on every path (the model widths 896, 3584 and 4096 among them), widths that are no
multiple of anything (1, 7, 1023, 4097), rows the persistent backward splits raggedly, and
views that defeat 16-byte loads.

On a CPU (the version plumbing is tests/test_cuda_versions.py's): with nvcc, that the
kernels holding a row in registers do not spill on sm_90a. The C++ autograd around the
kernel ops runs on the CPU in tests/test_cuda_autograd_cpu.py."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cuda_kernels import build
from cuda_kernels import rms_norm as rn
from equivalence import cards
from equivalence.check import check, check_args
from tests.test_cuda_layer_norm import VIEWS, _ptxas, viewed

ENV = rn.ENV_VERSION
CU = Path(rn.__file__).with_suffix(".cu")
VERSIONS = sorted(rn.VERSIONS)
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


# ------------------------------------------------------------------------------ CPU --

@pytest.mark.skipif(shutil.which("nvcc") is None,
                    reason="nvcc not found: install the CUDA toolkit (or put it on PATH) to "
                           "compile the Level 5 kernels")
def test_register_resident_kernels_do_not_spill_on_sm90a():
    # v3 holds a row (and, backward, the weight and the dweight partials) in registers; a
    # spill would turn them into local-memory traffic and the bandwidth goal with them.
    report = _ptxas(CU)
    held = {k: v for k, v in report.items() if "fwd_v3" in k or "bwd_v3_fused" in k}
    assert len(held) == 3 * 4, sorted(report)  # 3 dtypes x (2 forward + 2 backward) variants
    spilled = {k: v for k, v in held.items() if v[1] or v[2]}
    assert not spilled, f"(registers, spill stores, spill loads): {spilled}"


# ------------------------------------------------------------------------------ GPU --

def _args(rows, N, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return cards.get("rms_norm").module.make_args(dict(rows=rows, N=N), dtype,
                                                  torch.device("cuda"), g)


def _passes(args, version, monkeypatch):
    monkeypatch.setenv(ENV, str(version))
    r = check_args("rms_norm", "cuda", args)
    assert r.passed, f"v{version}: {r.summary()}"


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_harness_tiny_both_layouts(version, dtype, monkeypatch):
    monkeypatch.setenv(ENV, str(version))
    results = check("rms_norm", "cuda", dtype=dtype, device="cuda", size="tiny")
    assert {r.layout for r in results} == set(cards.LAYOUTS)
    for r in results:
        assert r.passed, f"v{version}: {r.summary()}"


# Widths that land on every path (module doc), model widths, rows that split raggedly.
SHAPES = [((513,), 1), ((3, 7), 7), ((37,), 256), ((1000,), 1023), ((64,), 896),
          ((2, 50), 3584), ((129,), 4096), ((3, 77), 4097), ((17,), 8192), ((5,), 20000)]


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,N", SHAPES)
def test_odd_and_wide_rows(version, dtype, rows, N, monkeypatch):
    _passes(_args(rows, N, dtype, seed=N), version, monkeypatch)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", VIEWS)
def test_views(version, dtype, layout, monkeypatch):
    args = _args((96,), 1024, dtype, seed=7)  # 1024: wide enough for v3's vector path
    _passes(viewed(args, layout, ("weight",)), version, monkeypatch)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("version", VERSIONS)
def test_expanded_upstream_gradient_and_determinism(version):
    # `.sum().backward()` hands the backward a stride-0 gradient; the dweight reduction has
    # no atomics, so two runs agree bit for bit.
    args = _args((300,), 768, torch.float32, seed=3)
    grads = []
    for _ in range(2):
        x, w = (args[n].detach().clone().requires_grad_(True) for n in ("x", "weight"))
        rn.rms_norm(x, w, 1e-6, version=version).sum().backward()
        grads.append((x.grad, w.grad))
    x, w = (args[n].detach().clone().requires_grad_(True) for n in ("x", "weight"))
    torch.nn.functional.rms_norm(x, (768,), w, 1e-6).sum().backward()
    for got, want in zip(grads[0], (x.grad, w.grad)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for a, b in zip(*grads):
        assert torch.equal(a, b)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_opcheck(version, dtype):
    build.load()
    ops = torch.ops.levels_cuda
    args = _args((33,), 200, dtype, seed=version)
    x, w = args["x"], args["weight"]
    torch.library.opcheck(ops.rms_norm_fwd, (x, w, 1e-6, version))
    # the op a call is (rms_norm_autograd.cpp): its C++ autograd traced by AOT autograd
    leaves = [t.detach().clone().requires_grad_(True) for t in (x, w)]
    torch.library.opcheck(ops.rms_norm, (*leaves, 1e-6, version))
    _, rstd = ops.rms_norm_fwd(x, w, 1e-6, version)
    torch.library.opcheck(ops.rms_norm_bwd, (torch.randn_like(x), x, w, rstd, version))


BAD_VERSION = """
import torch
from cuda_kernels import build
build.load()
x = torch.randn(4, 64, device="cuda")
try:
    torch.ops.levels_cuda.rms_norm_fwd(x, torch.ones(64, device="cuda"), 1e-6, 7)
except RuntimeError as exc:
    print("raised:", exc)
"""


@pytest.mark.gpu
@needs_gpu
def test_bad_version_is_an_error_naming_it():
    # In a child process: an error thrown by the C++ binding must reach Python as a
    # RuntimeError (a crash there would take the whole test session down).
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", BAD_VERSION], capture_output=True, text=True,
                         cwd=root, timeout=600, env={**os.environ, "PYTHONPATH": str(root)})
    assert out.returncode == 0, f"exit {out.returncode}: {out.stderr[-2000:]}"
    assert re.search(r"rms_norm_fwd \(version 7\): this version does not exist", out.stdout), \
        out.stdout + out.stderr[-2000:]


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("version", VERSIONS)
def test_inside_torch_compile(version, monkeypatch):
    # fake kernel ops + the C++ autograd: Dynamo traces one graph, whose backward calls ours
    monkeypatch.setenv(ENV, str(version))
    build.load()  # the library must be loaded before tracing (Dynamo cannot trace a build)
    args = _args((2, 50), 384, torch.bfloat16, seed=11)
    x, w = (args[n].detach().clone().requires_grad_(True) for n in ("x", "weight"))

    def f(x, w):
        return torch.relu(rn.rms_norm(x, w, 1e-6)) + 1

    torch._dynamo.reset()
    results = []
    for fn in (f, torch.compile(f, fullgraph=True)):
        out = fn(x, w)
        results.append((out, *torch.autograd.grad(out.float().square().sum(), (x, w))))
    for got, want in zip(results[1], results[0]):
        torch.testing.assert_close(got, want)
