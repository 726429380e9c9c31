"""Assignments and grading: the student copy, the grader, and what it refuses to credit.

Every grade runs each part in its own process (about 5 s each on a CPU: imports plus the
tiny checks), so the submissions here are few and each is graded on the parts that say
something about it. Level 5 runs only on a GPU: its wiring is checked here on any machine,
its rules by the `gpu`-marked tests (`pytest -m gpu`, skipped without one)."""

import argparse
import io
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from rich.console import Console

from equivalence.commands import assignment, grade as grading, grade_notebooks, grade_process

ROOT = assignment.ROOT
GRADESCOPE_TOP = {"score", "execution_time", "output", "visibility", "tests"}
GRADESCOPE_TEST = {"name", "score", "max_score", "status", "output", "visibility"}


def copy_repo(dest):
    """The reference repo's tracked files, as a student would hand them in."""
    for rel in assignment.repo_files(ROOT):
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dest / rel)
    return dest


def edit(path, old, new):
    text = path.read_text()
    assert text.count(old) == 1, f"{path}: the line to plant into is gone: {old!r}"
    path.write_text(text.replace(old, new))


def scores(result):
    return {(t["component"], t["level"]): t["score"] for t in result["tests"]}


def reasons(result):
    return {(t["component"], t["level"]): t["reason"] for t in result["tests"]}


@pytest.fixture(scope="module")
def student(tmp_path_factory):
    out = tmp_path_factory.mktemp("student") / "copy"
    sub = argparse.ArgumentParser().add_subparsers(dest="command")
    assignment.add_parser(sub)
    grading.add_parser(sub)
    args = sub._name_parser_map["assignment"].parse_args(
        ["build", "--components", "layer_norm", "--levels", "native,4", "--out", str(out)])
    text = io.StringIO()
    assert assignment.run_assignment(args, Console(file=text, width=200)) == 0
    assert "blanked layer_norm at native: levels/native.py (1 region)" in text.getvalue()
    assert "blanked layer_norm at triton: triton_kernels/layer_norm.py (2 regions)" in text.getvalue()
    return out


def test_markers_are_found_where_they_were_put():
    assert assignment.marked_parts(ROOT) == [("layer_norm", "native"), ("layer_norm", "triton")]
    with pytest.raises(ValueError, match="never closed"):
        assignment.find_regions("x = 1\n    ### BEGIN SOLUTION\ny = 2\n", "f.py")
    with pytest.raises(ValueError, match="without a"):
        assignment.find_regions("// ### END SOLUTION\n", "f.cu")


def test_student_copy_blanks_exactly_the_regions(student, tmp_path):
    files = assignment.repo_files(ROOT)
    assert sorted(assignment.repo_files(student)) == sorted(files)
    blanked = {"levels/native.py", "triton_kernels/layer_norm.py"}
    # and every notebook's exercises (tests/test_assignment_notebooks.py checks how)
    blanked |= {rel for rel in files if rel.endswith(".ipynb")}
    for rel in files:
        if rel not in blanked:
            assert (student / rel).read_bytes() == (ROOT / rel).read_bytes(), rel
    native = (student / "levels/native.py").read_text()
    kernels = (student / "triton_kernels/layer_norm.py").read_text()
    for text in (native, kernels):
        assert "BEGIN SOLUTION" not in text and "END SOLUTION" not in text
    assert "var = (centered * centered)" not in native and "tl.sum(xc * xc" not in kernels
    assert native.count("raise NotImplementedError(\"TODO: layer_norm, Level 1 (native)") == 1
    assert kernels.count("raise NotImplementedError(\"TODO: layer_norm, Level 4 (triton)") == 2
    # the other components' code is intact
    assert "probs = torch.softmax(scores, dim=-1)" in native
    with pytest.raises(ValueError, match="mlp at level native has no solution region"):
        assignment.build(["mlp"], ["native"], tmp_path / "mlp")
    with pytest.raises(ValueError, match="exists and is not empty"):
        assignment.build(["layer_norm"], ["native"], student)
    with pytest.raises(ValueError, match="levels with solution files"):
        assignment.build(["layer_norm"], ["compile"], tmp_path / "c")


def test_cuda_regions_become_a_comment():
    source = ("__global__ void k(float* y) {\n  int i = threadIdx.x;\n  // ### BEGIN SOLUTION\n"
              "  y[i] = 1.0f;\n  // ### END SOLUTION\n}\n")
    out = assignment.blank(source, "k.cu", assignment.find_regions(source, "k.cu"), "k")
    assert out == ("__global__ void k(float* y) {\n  int i = threadIdx.x;\n  // TODO: k: write this "
                   "part (the kernel writes nothing until you do, so the check fails on NaN "
                   "outputs).\n}\n")


def test_student_copy_imports_its_own_code(student):
    code = ("import levels.native, levels.triton, triton_kernels.layer_norm as k, torch\n"
            "print(levels.__file__); print(k.__file__)\n"
            "try:\n    levels.native.layer_norm(torch.ones(2, 4), torch.ones(4), torch.zeros(4))\n"
            "except NotImplementedError as e:\n    print('raised', e)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=student, capture_output=True,
                         text=True, env=dict(os.environ, PYTHONPATH=str(student)), timeout=60,
                         check=False)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == str(student / "levels/__init__.py")
    assert lines[1] == str(student / "triton_kernels/layer_norm.py")
    assert lines[2].startswith("raised TODO: layer_norm, Level 1 (native) (levels/native.py:")


def test_student_copy_scores_zero_on_blanked_parts_only(student, tmp_path):
    config = tmp_path / "grading.json"
    config.write_text(json.dumps({"timeout_s": 120, "parts": [
        {"component": "layer_norm", "level": "native", "points": 5},
        {"component": "layer_norm", "level": "triton", "points": 10},
        {"component": "mlp", "level": "native", "points": 3}]}))
    sub = argparse.ArgumentParser().add_subparsers(dest="command")
    assignment.add_parser(sub)
    grading.add_parser(sub)
    results = tmp_path / "results.json"
    args = sub._name_parser_map["grade"].parse_args(
        ["--repo", str(student), "--config", str(config), "--gradescope", str(results)])
    text = io.StringIO()
    assert grading.run_grade(args, Console(file=text, width=200)) == 1  # not full marks
    assert "total 3 / 18" in text.getvalue()

    report = json.loads(results.read_text())
    assert set(report) == GRADESCOPE_TOP
    assert report["score"] == 3 and report["visibility"] == "visible"
    assert [set(t) for t in report["tests"]] == [GRADESCOPE_TEST] * 3
    by_name = {t["name"]: t for t in report["tests"]}
    assert [(t["score"], t["max_score"], t["status"]) for t in report["tests"]] == [
        (0, 5, "failed"), (0, 10, "failed"), (3, 3, "passed")]
    native = by_name["layer_norm @ native"]["output"]
    assert "NotImplementedError: TODO: layer_norm, Level 1 (native)" in native
    assert "TODO: layer_norm, Level 4 (triton)" in by_name["layer_norm @ triton"]["output"]
    assert "mlp[default, strided] native bfloat16 cpu: pass" in by_name["mlp @ native"]["output"]


def test_reference_solution_scores_full():
    result = grading.grade(ROOT)  # default parts: every marked one, 10 points each
    assert scores(result) == {("layer_norm", "native"): 10, ("layer_norm", "triton"): 10}
    assert (result["score"], result["max_score"]) == (20, 20)
    triton = result["tests"][1]["output"]
    # x8: each of the 4 checks runs the forward twice, with gradients and under no_grad
    assert "forward: your kernels ran: layer_norm.layer_norm_fwd_kernel x8" in triton
    assert "backward: your kernels ran: layer_norm.layer_norm_bwd_kernel x4" in triton


def test_planted_wrong_answer_loses_exactly_its_points(tmp_path):
    sub = copy_repo(tmp_path / "sub")
    edit(sub / "levels/native.py", "return (y * weight.float() + bias.float()).to(x.dtype)",
         "return (y * weight.float()).to(x.dtype)  # bias dropped")
    result = grading.grade(sub, parts=[("layer_norm", "native", 4), ("layer_norm", "triton", 6)])
    assert scores(result) == {("layer_norm", "native"): 0, ("layer_norm", "triton"): 6}
    assert reasons(result)[("layer_norm", "native")] == "4 of 4 checks did not pass"
    assert (result["score"], result["max_score"]) == (6, 10)


def test_hang_and_segfault_cost_their_part_only(tmp_path):
    sub = copy_repo(tmp_path / "sub")
    edit(sub / "levels/native.py", "    x32 = x.float()\n",
         "    import time\n    while True:\n        time.sleep(1)\n")
    edit(sub / "triton_kernels/layer_norm.py", '    N = x.shape[-1]\n    if N > MAX_WIDTH:',
         '    import ctypes\n    ctypes.string_at(0)\n    N = x.shape[-1]\n    if N > MAX_WIDTH:')
    config = {"timeout_s": 15, "parts": [{"component": "layer_norm", "level": "native"},
                                         {"component": "layer_norm", "level": "triton"},
                                         {"component": "mlp", "level": "native"}]}
    result = grading.grade(sub, config=config)
    assert scores(result) == {("layer_norm", "native"): 0, ("layer_norm", "triton"): 0,
                              ("mlp", "native"): 10}
    why = reasons(result)
    assert why[("layer_norm", "native")] == "timed out after 15 s (killed)"
    assert why[("layer_norm", "triton")] == "the process died of signal SIGSEGV"
    assert result["tests"][0]["seconds"] < 25


CHEATS = {
    # the answer written out in PyTorch ops: every check passes, no kernel ran
    "torch ops": (
        "    weight, bias = weight.contiguous(), bias.contiguous()\n",
        ("    m = x.float().mean(-1, keepdim=True)\n"
         "    v = ((x.float() - m) ** 2).mean(-1, keepdim=True)\n"
         "    return ((x.float() - m) * torch.rsqrt(v + eps) * weight + bias).to(x.dtype)\n"),
        "no kernel of your triton_kernels/ ran in the forward pass"),
    # the kernels run (forward and backward) as a decoy, the value comes from Level 1
    "another level": (
        "    weight, bias = weight.contiguous(), bias.contiguous()\n",
        ("    import levels\n"
         "    y = _LayerNorm.apply(x, weight.contiguous(), bias.contiguous(), eps)\n"
         "    return y + (levels.get('native').layer_norm(x, weight, bias, eps) - y).detach()\n"),
        "another level's code ran inside yours (levels/native.py:layer_norm"),
    # the same decoy, the value from torch's fused layer_norm
    "F.layer_norm": (
        "    weight, bias = weight.contiguous(), bias.contiguous()\n",
        ("    y = _LayerNorm.apply(x, weight.contiguous(), bias.contiguous(), eps)\n"
         "    ref = torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, eps)\n"
         "    return y + (ref - y).detach()\n"),
        "PyTorch computed the component for you (ATen native_layer_norm)"),
}


@pytest.mark.parametrize("cheat", CHEATS)
def test_kernel_level_gives_no_credit_for_pytorch_answers(tmp_path, cheat):
    old, new, refusal = CHEATS[cheat]
    sub = copy_repo(tmp_path / "sub")
    edit(sub / "triton_kernels/layer_norm.py", old, new)
    (test,) = grading.grade(sub, parts=[("layer_norm", "triton")], timeout_s=120)["tests"]
    assert test["score"] == 0 and test["status"] == "failed"
    assert refusal in test["reason"]
    # the numbers were right: the rule, not the harness, took the points
    assert [c["status"] for c in test["checks"]] == ["pass"] * 4
    assert "checks did not pass" not in test["reason"]


# ---------------------------------------------------------------------------------------
# Level 5 (cuda): the same three rules, wired for its compiled ops. The wiring is checked
# here without a GPU; the rules themselves, on a GPU (`pytest -m gpu`).
# ---------------------------------------------------------------------------------------

def test_each_kernel_level_forbids_the_others_code_and_not_its_own():
    import importlib.util

    import levels

    triton, cuda = grade_process.other_level_code("triton"), grade_process.other_level_code("cuda")
    assert {"levels/cuda.py", "cuda_kernels"} <= set(triton)
    assert {"levels/triton.py", "triton_kernels"} <= set(cuda)
    assert not {"levels/triton.py", "triton_kernels"} & set(triton)
    assert not {"levels/cuda.py", "cuda_kernels"} & set(cuda)
    for shared in ("levels/native.py", "levels/torchscript.py", "levels/compiled.py",
                   "levels/auto.py", "numba_kernels"):
        assert shared in triton and shared in cuda, shared
    # every rung's module is named, under the harness's level names: a renamed module must
    # not quietly drop out of the rule
    assert set(grade_process.LEVEL_CODE) == set(levels.LEVEL_NAMES)
    for info in levels.LEVELS:
        assert importlib.util.find_spec(info.module).origin == str(
            ROOT / grade_process.LEVEL_CODE[info.name][0]), info.name
    for rel in set(triton) | set(cuda):
        assert (ROOT / rel).exists(), rel
    # the files the profiler watches at Level 5: Level 4's kernels, none of its own
    watched = grade_process._forbidden_files({ROOT}, "cuda")
    assert str(ROOT / "triton_kernels/layer_norm.py") in watched
    assert str(ROOT / "numba_kernels/layer_norm.py") in watched
    assert not [f for f in watched if "/cuda_kernels/" in f or f.endswith("levels/cuda.py")]
    with pytest.raises(ValueError, match="argument 'level' must be one of"):
        grade_process.other_level_code("auto")


def test_the_grader_counts_the_namespace_the_build_registers():
    from cuda_kernels import build  # importing it builds nothing

    assert grade_process.CUDA_OP_NAMESPACE == build.OP_NAMESPACE
    # and the GPU tests below still find the line they plant their cheats into
    assert (ROOT / "cuda_kernels/layer_norm.py").read_text().count(CUDA_ANSWER) == 1
    bindings = [p.read_text() for p in (ROOT / "cuda_kernels").glob("*_binding.cpp")]
    assert bindings and all(f"TORCH_LIBRARY_FRAGMENT({build.OP_NAMESPACE}, m)" in text
                            for text in bindings)


def test_a_cuda_part_without_a_gpu_scores_zero_with_the_reason():
    # by alias, as a config may name it: the part is still Level 5
    result = grading.grade(ROOT, parts=[("layer_norm", 5, 3)], device="cpu")
    (test,) = result["tests"]
    assert (test["name"], test["level"], test["score"], test["max_score"], test["status"]) == (
        "layer_norm @ cuda", "cuda", 0, 3, "failed")
    assert test["reason"].startswith("needs a CUDA GPU: Level 5 runs only on an NVIDIA GPU, "
                                     "and this grader runs on cpu")
    assert test["seconds"] == 0  # no process was started for it
    assert (result["score"], result["max_score"]) == (0, 3)  # the points stay in the maximum
    report = grading.gradescope(result)
    assert report["tests"][0]["status"] == "failed"
    assert "needs a CUDA GPU" in report["tests"][0]["output"]
    assert "layer_norm @ cuda: 0/3 (needs a CUDA GPU" in report["output"]
    # an alias of Level 4 is held to Level 4's kernel rules, as its name is
    assert grading._named(grading.Part("layer_norm", "4")).level == "triton"
    with pytest.raises(ValueError, match="part layer_norm @ fast: argument 'level' must be one of"):
        grading.grade(ROOT, parts=[("layer_norm", "fast")], device="cpu")


def test_level5_op_counter_counts_the_extension_ops_per_pass():
    """A torch library defined here, from Python, stands in for the compiled extension (whose
    ops cuda_kernels/build.py loads into torch.ops.levels_cuda): its ops are counted per pass
    by the dispatch mode that also watches the fused ATen ops, and, being Python, they are
    reported as not compiled."""
    import torch

    namespace = "levels_grade_fake_ext"
    lib = torch.library.Library(namespace, "DEF")
    try:
        lib.define("scale(Tensor x) -> Tensor")
        lib.define("scale_bwd(Tensor g) -> Tensor")
        lib.impl("scale", lambda x: x * 3, "CPU")
        lib.impl("scale_bwd", lambda g: g * 3, "CPU")
        ops = getattr(torch.ops, namespace)
        torch.library.register_autograd(f"{namespace}::scale", lambda ctx, g: ops.scale_bwd(g),
                                        setup_context=lambda ctx, inputs, output: None)

        def run_case():
            x = torch.randn(2, 4, requires_grad=True)
            y = ops.scale(ops.scale(x))  # twice forward, so twice backward
            (grad,) = torch.autograd.grad(y.sum(), x)
            torch.nn.functional.layer_norm(x.detach(), (4,))  # rule 3, in the same mode
            return grad

        launches, interpreted = {"forward": {}, "backward": {}}, {}
        other, fused = {}, {}
        counter = grade_process.OpCounter(namespace, "CPU", launches, interpreted)
        watch = grade_process._watcher(ROOT, ROOT, "layer_norm", "cuda", other, fused, counter)
        assert torch.equal(watch(run_case), torch.full((2, 4), 9.0))
    finally:
        lib._destroy()
    assert launches == {"forward": {f"{namespace}::scale": 2},
                        "backward": {f"{namespace}::scale_bwd": 2}}
    assert set(interpreted) == {f"{namespace}::scale", f"{namespace}::scale_bwd"}
    assert all(re.fullmatch(r".+\.py:\d+", where) for where in interpreted.values()), interpreted
    assert fused == {"native_layer_norm": 1} and other == {}

    notes = []
    problems = grade_process._kernel_verdicts("cuda", launches, other, fused, interpreted, notes)
    assert notes == [f"forward: your CUDA ops ran: {namespace}::scale x2",
                     f"backward: your CUDA ops ran: {namespace}::scale_bwd x2"]
    assert problems[0].startswith(f"not compiled from your cuda_kernels/: {namespace}::scale is "
                                  f"Python (registered at ")
    assert problems[1].startswith("PyTorch computed the component for you (ATen native_layer_norm)")
    # nothing of the extension ran at all: rule 1 in both passes
    empty = grade_process._kernel_verdicts("cuda", {"forward": {}, "backward": {}}, {}, {}, {}, [])
    assert empty == [f"no op of your compiled cuda_kernels/ (torch.ops.levels_cuda, built from "
                     f"your .cu files) ran in the {phase} pass: at a kernel level the answer must "
                     f"come from your own kernel, not from PyTorch ops or another level"
                     for phase in ("forward", "backward")]


def test_a_compiled_op_is_not_reported_as_python():
    import torch

    # ATen's add: C++ registered by TORCH_LIBRARY_IMPL, as the Level 5 bindings are
    where = grade_process.kernel_registration("aten::add.Tensor", "CPU")
    assert where is not None and where.rsplit(":", 1)[0].endswith(".cpp"), where
    launches, interpreted = {"forward": {}, "backward": {}}, {}
    counter = grade_process.OpCounter("aten", "CPU", launches, interpreted)
    watch = grade_process._watcher(ROOT, ROOT, "layer_norm", "cuda", {}, {}, counter)
    watch(lambda: torch.ones(3) + torch.ones(3))
    assert launches["forward"].get("aten::add", 0) == 1 and interpreted == {}


CUDA_CHEATS = {
    # the answer written out in PyTorch ops: every check passes, no op of the extension ran
    "torch ops": (
        ("    xf = x.float()\n"
         "    m = xf.mean(-1, keepdim=True)\n"
         "    var = ((xf - m) ** 2).mean(-1, keepdim=True)\n"
         "    return ((xf - m) * torch.rsqrt(var + eps) * weight + bias).to(x.dtype)"),
        ("no op of your compiled cuda_kernels/ (torch.ops.levels_cuda, built from your .cu "
         "files) ran in the forward pass")),
    # the real ops run (forward and backward) as a decoy, the value comes from Level 1
    "another level": (
        ("    y = torch.ops.levels_cuda.layer_norm.default(x, weight, bias, float(eps),\n"
         "                                                 resolve_version(version))\n"
         "    import levels\n"
         "    return y + (levels.get('native').layer_norm(x, weight, bias, eps) - y).detach()\n"),
        "another level's code ran inside yours (levels/native.py:layer_norm"),
    # the same decoy, the value from torch's fused layer_norm
    "F.layer_norm": (
        ("    y = torch.ops.levels_cuda.layer_norm.default(x, weight, bias, float(eps),\n"
         "                                                 resolve_version(version))\n"
         "    ref = torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, eps)\n"
         "    return y + (ref - y).detach()\n"),
        "PyTorch computed the component for you (ATen native_layer_norm)"),
}
CUDA_ANSWER = ("    return torch.ops.levels_cuda.layer_norm.default(x, weight, bias, float(eps),\n"
               "                                                    resolve_version(version))")


@pytest.mark.gpu
def test_cuda_reference_scores_full():
    (test,) = grading.grade(ROOT, parts=[("layer_norm", "cuda")], timeout_s=600)["tests"]
    assert (test["score"], test["status"]) == (10, "passed"), test["output"]
    output = test["output"]
    for phase, op in (("forward", "layer_norm_fwd"), ("backward", "layer_norm_bwd")):
        assert re.search(rf"{phase}: your CUDA ops ran: levels_cuda::{op} x\d+", output), output
    assert "not compiled" not in output  # the build's ops: registered from its .cpp


@pytest.mark.gpu
@pytest.mark.parametrize("cheat", CUDA_CHEATS)
def test_cuda_level_gives_no_credit_for_pytorch_answers(tmp_path, cheat):
    new, refusal = CUDA_CHEATS[cheat]
    sub = copy_repo(tmp_path / "sub")
    edit(sub / "cuda_kernels/layer_norm.py", CUDA_ANSWER, new)
    (test,) = grading.grade(sub, parts=[("layer_norm", "cuda")], timeout_s=600)["tests"]
    assert test["score"] == 0 and test["status"] == "failed"
    assert refusal in test["reason"], test["output"]
    # the numbers were right: the rule, not the harness, took the points
    assert [c["status"] for c in test["checks"]] == ["pass"] * 4, test["output"]
    assert "checks did not pass" not in test["reason"]
