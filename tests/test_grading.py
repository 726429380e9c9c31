"""Assignments and grading: the student copy, the grader, and what it refuses to credit.

Every grade runs each part in its own process (about 5 s each on a CPU: imports plus the
tiny checks), so the submissions here are few and each is graded on the parts that say
something about it."""

import argparse
import io
import json
import os
import shutil
import subprocess
import sys

import pytest
from rich.console import Console

from equivalence import assignment, grading

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
    grading.add_parsers(sub)
    args = sub._name_parser_map["assignment"].parse_args(
        ["build", "--components", "layer_norm", "--levels", "native,4", "--out", str(out)])
    text = io.StringIO()
    assert grading.run_assignment(args, Console(file=text, width=200)) == 0
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
    grading.add_parsers(sub)
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
    assert "forward: your kernels ran: layer_norm.layer_norm_fwd_kernel x4" in triton
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
        "    return _LayerNorm.apply(x, weight.contiguous(), bias.contiguous(), eps)",
        ("    m = x.float().mean(-1, keepdim=True)\n"
         "    v = ((x.float() - m) ** 2).mean(-1, keepdim=True)\n"
         "    return ((x.float() - m) * torch.rsqrt(v + eps) * weight + bias).to(x.dtype)"),
        "no kernel of your triton_kernels/ ran in the forward pass"),
    # the kernels run (forward and backward) as a decoy, the value comes from Level 1
    "another level": (
        "    return _LayerNorm.apply(x, weight.contiguous(), bias.contiguous(), eps)",
        ("    import levels\n"
         "    y = _LayerNorm.apply(x, weight.contiguous(), bias.contiguous(), eps)\n"
         "    return y + (levels.get('native').layer_norm(x, weight, bias, eps) - y).detach()"),
        "another level's code ran inside yours (levels/native.py:layer_norm"),
    # the same decoy, the value from torch's fused layer_norm
    "F.layer_norm": (
        "    return _LayerNorm.apply(x, weight.contiguous(), bias.contiguous(), eps)",
        ("    y = _LayerNorm.apply(x, weight.contiguous(), bias.contiguous(), eps)\n"
         "    ref = torch.nn.functional.layer_norm(x, (N,), weight, bias, eps)\n"
         "    return y + (ref - y).detach()"),
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
