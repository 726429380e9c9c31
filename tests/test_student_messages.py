"""What a student reads when their code is wrong: the first wrong element of a failing
value, an out-of-bounds access of a Triton kernel in the interpreter named (kernel, line,
tensor, element) instead of a corrupted heap, and numba's simulator artifacts said in CUDA's
terms. Tiny shapes; about 3 s on a 2-core CPU."""

import pytest
import torch

import levels  # (also switches Triton's interpreter on without a GPU, before triton)
from equivalence import interpreter
from equivalence.check import check


def test_a_wrong_value_names_its_first_wrong_element():
    def off_by_one_element(x, weight, bias, eps=1e-5):
        y = torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, eps)
        bump = torch.zeros_like(y)
        bump[1, 2, 7] = 0.5
        return y + bump

    (r,) = check("layer_norm", fn=off_by_one_element, layout="contiguous", seed=3)
    assert r.status == "fail"
    out = r.comparisons[0]
    assert out.first_wrong.startswith("first wrong element [1, 2, 7]: got "), out.first_wrong
    assert ", expected " in out.first_wrong and out.first_wrong in r.summary()

    def forgets_last_column(x, weight, bias, eps=1e-5):
        y = torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, eps)
        return torch.cat([y[..., :-1], torch.full_like(y[..., -1:], float("nan"))], dim=-1)

    (r,) = check("layer_norm", fn=forgets_last_column, layout="contiguous", seed=3)
    assert "non-finite" in r.comparisons[0].problem
    assert r.comparisons[0].first_wrong.startswith("first wrong element [0, 0, 128]: got nan")


@pytest.mark.skipif(not interpreter.active(), reason="the guard watches Triton's CPU interpreter")
@pytest.mark.parametrize("mask, what, message", [
    ("cols < N + 3", "load", "out-of-bounds tl.load in copy_kernel"),
    ("cols <= N", "store", "out-of-bounds tl.store in copy_kernel"),
])
def test_an_out_of_bounds_access_is_named_not_a_crash(mask, what, message):
    load_mask = mask if what == "load" else "cols < N"
    store_mask = mask if what == "store" else "cols < N"
    source = f'''
@triton.jit
def copy_kernel(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + cols, mask={load_mask}, other=0.0)
    tl.store(y_ptr + cols, x, mask={store_mask})
'''
    # a real file: the interpreter reads a kernel's source, and the message quotes its line
    import importlib.util
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"oob_{what}.py"
        path.write_text("import triton\nimport triton.language as tl\n" + source)
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)

        def copy(x, weight, bias, eps=1e-5):
            y = torch.empty_like(x)
            module.copy_kernel[(1,)](x, y, x.numel(), BLOCK=2048)
            return y

        (r,) = check("layer_norm", fn=copy, layout="contiguous", seed=1)
    assert r.status == "error" and r.reason.startswith("level raised OutOfBounds: " + message)
    assert f"oob_{what}.py:" in r.reason and mask in r.reason  # the line, mask and all
    tensor = "x_ptr" if what == "load" else "y_ptr"
    assert f"past the end of {tensor} (float32, shape (2, 5, 129), 1290 elements): element " \
           f"offset 1290" in r.reason


def test_simulator_artifacts_are_said_in_cuda_terms():
    from numba_kernels.binding import _translated

    swapped = AttributeError("tid=[3, 0, 0] ctaid=[0, 0, 0]: module 'numba.cuda' has no "
                             "attribute 'blockDim'")
    said = str(_translated(swapped))
    assert said.startswith("tid=[3, 0, 0] ctaid=[0, 0, 0] used cuda.blockDim after other threads")
    assert "cuda.syncthreads()" in said
    domain = str(_translated(ValueError("tid=[1, 0, 0] ctaid=[0, 0, 0]: math domain error")))
    assert "where a GPU returns NaN" in domain
    other = AttributeError("'NoneType' object has no attribute 'x'")
    assert _translated(other) is other


def test_the_cli_says_when_it_runs_another_copy_than_the_one_here(tmp_path, monkeypatch):
    """A student in their copy, before `pip install -e .`: `levels check` would run the
    installed reference, and passes on blank stubs; the CLI says so first."""
    from equivalence import cli

    (tmp_path / "levels").mkdir()
    (tmp_path / "levels/__init__.py").write_text("")
    monkeypatch.chdir(tmp_path)
    warning = cli.other_copy_here()
    assert warning.startswith(f"note: this directory has its own levels/ ({tmp_path})")
    assert "pip install -e ." in warning
    monkeypatch.chdir(cli.Path(levels.__file__).parent.parent)
    assert cli.other_copy_here() is None
