"""The grader's machinery: what a part is, what it refuses, partial credit, the kernel rules'
wiring (Level 4's and the numba twins' on any machine, Level 5's here and on a GPU), and the
parts at every level graded from the reference. The instructor's round trip (build, blank,
partial, full, cheats, Gradescope) is tests/test_assignment_round_trip.py.

Every grade runs each part in its own process (about 5 s each on a CPU: imports plus the
tiny checks), two at a time. Level 5 runs only on a GPU: its wiring is checked here on any
machine, its rules by the `gpu`-marked tests (`pytest -m gpu`, skipped without one)."""

import argparse
import io
import json
import re
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from equivalence.commands import (assignment, grade as grading, grade_credit, grade_rules,
                                  grade_watch)

ROOT = assignment.ROOT


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


def test_every_component_is_marked_at_every_level_and_the_twins():
    from levels.contract import COMPONENTS

    marked = set(assignment.marked_parts(ROOT))
    for component in COMPONENTS:
        for level in ("native", "torchscript", "compile", "triton", "cuda"):
            assert (component, level) in marked, (component, level)
        twins = assignment.part_files(component, "numba")
        assert ((component, "numba") in marked) == all((ROOT / f).is_file() for f in twins), component
    with pytest.raises(ValueError, match="never closed"):
        assignment.find_regions("x = 1\n    ### BEGIN SOLUTION\ny = 2\n", "f.py")
    with pytest.raises(ValueError, match="without a"):
        assignment.find_regions("// ### END SOLUTION\n", "f.cu")
    # one kernel file, two components' answers: each region names its owner
    gemm = "cuda_kernels/gemm.cu"
    text = (ROOT / gemm).read_text()
    mlp, swiglu = (assignment.regions_of(text, gemm, c) for c in ("mlp", "swiglu_mlp"))
    assert mlp and swiglu and not {r.start for r in mlp} & {r.start for r in swiglu}
    with pytest.raises(ValueError, match=r"f\.cu:1: after the marker, expected nothing or a "
                                         r"component in parentheses .*got '\(swiglu\)'"):
        assignment.find_regions("// ### BEGIN SOLUTION (swiglu)\n// ### END SOLUTION\n", "f.cu")


def test_a_build_refuses_what_it_cannot_hand_out(assignment_build, tmp_path):
    with pytest.raises(ValueError, match="lstm at level numba has no solution region"):
        assignment.build(["lstm"], ["numba"], tmp_path / "lstm")
    with pytest.raises(ValueError, match="exists and is not empty"):
        assignment.build(["layer_norm"], ["native"], assignment_build.out)
    with pytest.raises(ValueError, match="argument .level. must be one of"):
        assignment.build(["layer_norm"], ["fast"], tmp_path / "c")


def test_cuda_regions_become_a_comment():
    source = ("__global__ void k(float* y) {\n  int i = threadIdx.x;\n  // ### BEGIN SOLUTION\n"
              "  y[i] = 1.0f;\n  // ### END SOLUTION\n}\n")
    out = assignment.blank(source, "k.cu", assignment.find_regions(source, "k.cu"), "k")
    assert out == ("__global__ void k(float* y) {\n  int i = threadIdx.x;\n  // TODO: k: write this "
                   "part (until you do, the outputs stay NaN and the check fails).\n}\n")


def test_hang_and_segfault_cost_their_part_only(tmp_path):
    sub = copy_repo(tmp_path / "sub")
    edit(sub / "levels/native.py", "    ### BEGIN SOLUTION\n    x32 = x.float()\n    mean = x32.mean(",
         "    ### BEGIN SOLUTION\n    import time\n    while True:\n        time.sleep(1)\n"
         "    mean = x32.mean(")
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


def test_the_reference_scores_full_at_levels_1_to_4_within_a_minute():
    """One component graded at Levels 1-4 from the reference, as an autograder would: every
    part full marks, in a minute on a 2-core CPU (the goal; Level 3's compiles are most of it)."""
    parts = [("layer_norm", level) for level in ("native", "torchscript", "compile", "triton")]
    # a performance share cannot be scored on a CPU: the other checks count for all 10 points
    timed = [{"component": c, "level": lev, "credit": {
        "performance": 0.2, "performance_reference": "compile" if lev != "compile" else "native"}}
        for c, lev in parts]
    result = grading.grade(ROOT, parts=timed, device="cpu")
    assert scores(result) == dict.fromkeys(parts, 10), reasons(result)
    for test in result["tests"]:
        assert ("performance (20% of the part) not scored: needs a CUDA GPU (this grader runs "
                "on cpu)") in test["output"]
    print(f"layer_norm at Levels 1-4: {result['execution_time']} s")
    assert result["execution_time"] < 90  # the goal is 60 s; CI machines vary


NUMBA_CHEAT = (
    "    return y.to(x.dtype)\n",
    ("    xf = x.float()  # the twin ran as a decoy; the value is torch's\n"
     "    m = xf.mean(-1, keepdim=True)\n"
     "    v = ((xf - m) ** 2).mean(-1, keepdim=True)\n"
     "    ref = ((xf - m) * torch.rsqrt(v + eps) * weight + bias).to(x.dtype)\n"
     "    return y.to(x.dtype) + (ref - y.to(x.dtype)).detach()\n"))


def test_the_numba_twin_is_graded_as_a_kernel_level(tmp_path):
    """The CPU-runnable CUDA exercise: the reference twin scores full, with its kernels' stores
    covering its outputs; the twin run as a decoy around torch's arithmetic scores 0."""
    from concurrent.futures import ThreadPoolExecutor

    cheat = copy_repo(tmp_path / "cheat")
    edit(cheat / "numba_kernels/level.py", *NUMBA_CHEAT)
    part = [{"component": "layer_norm", "level": "numba", "dtypes": ["float32"]}]
    with ThreadPoolExecutor(2) as pool:
        honest, cheated = pool.map(lambda repo: grading.grade(repo, parts=part, jobs=1),
                                   (ROOT, cheat))
    (test,) = honest["tests"]
    assert (test["score"], test["status"]) == (10, "passed"), test["output"]
    assert "forward: your kernels ran: layer_norm.fwd_block_row x4" in test["output"]
    (test,) = cheated["tests"]
    assert test["score"] == 0
    assert test["reason"].startswith("no credit for this part: PyTorch computed inside your "
                                     "forward: aten."), test["reason"]
    assert "(numba_kernels/level.py:" in test["reason"]


def test_the_grader_refuses_what_it_cannot_grade(monkeypatch, tmp_path):
    """No parts named, or a dependency missing: exit 2, saying what to do, before anything
    runs (never a 0 for every student)."""
    sub = argparse.ArgumentParser().add_subparsers(dest="command")
    grading.add_parser(sub)
    parser = sub._name_parser_map["grade"]
    with pytest.raises(ValueError, match="no parts to grade: pass the config"):
        grading.run_grade(parser.parse_args(["--repo", str(ROOT)]), Console(file=io.StringIO()))
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "nbclient" else real(name, *a))
    text = io.StringIO()
    args = parser.parse_args(["--repo", str(ROOT), "--parts", "layer_norm@native", "--notebooks"])
    assert grading.run_grade(args, Console(file=text, width=200)) == 2
    assert "nbclient (for --notebooks): pip install nbformat nbclient ipykernel" in text.getvalue()
    assert grading.requirements([grading.Part("mlp", "native")], False, "cpu") == []


def _check(dtype, layout, forward_ok=True, backward=None, status="pass"):
    comparisons = [{"name": "out", "ok": forward_ok, "problem": "", "rel_err": 0.0 if forward_ok
                    else 0.5, "first_wrong": "" if forward_ok else "first wrong element [0]: "
                    "got 1, expected 2"},
                   {"name": "out (no grad)", "ok": forward_ok, "problem": "", "rel_err": 0.0,
                    "first_wrong": ""}]
    if backward is None:
        comparisons.append({"name": "grad x", "ok": True, "problem": "", "rel_err": 0.0,
                            "first_wrong": ""})
    else:
        comparisons.append({"name": "backward", "ok": False, "problem": f"raised {backward}",
                            "rel_err": float("nan"), "first_wrong": ""})
    return {"dtype": dtype, "layout": layout, "status": status, "reason": "",
            "comparisons": comparisons}


def test_partial_credit_splits_a_part_into_passes_dtypes_and_layouts():
    shares = grade_credit.credit_shares(None)
    dtypes, layouts = ["float32", "bfloat16"], ["contiguous", "strided"]
    no_rules = {"forward": [], "backward": [], "cheats": []}
    stub = "NotImplementedError: TODO: ln, Level 4 (triton) (triton_kernels/ln.py:9) (x.py:9)"
    forward_only = [_check(d, lay, backward=stub, status="error") for d in dtypes for lay in layouts]
    cells = grade_credit.cells(forward_only, no_rules, dtypes, layouts, shares)
    score, reason, _ = grade_credit.verdict(cells, 10, "ln @ triton")
    assert score == 5  # exactly the forward's share
    assert reason == ("backward 0/5: ln @ triton is not implemented yet (the TODO at "
                      "triton_kernels/ln.py:9 still raises)")
    # a numba twin's TODO, raised inside the simulator, which names the thread first
    assert grade_credit.not_implemented(
        "level raised NotImplementedError: tid=[1, 0, 0] ctaid=[0, 0, 0]: TODO: ln, the numba "
        "twin (Level 5 in Python) (numba_kernels/ln.py:136)") == (
        "not implemented yet (the TODO at numba_kernels/ln.py:136 still raises)")
    # a wrong value in bfloat16 only: the bfloat16 cells of the forward, 0.25 of its half
    bf16 = [_check(d, lay, forward_ok=d == "float32") for d in dtypes for lay in layouts]
    score, reason, _ = grade_credit.verdict(
        grade_credit.cells(bf16, no_rules, dtypes, layouts, shares), 10, "ln @ triton")
    assert score == 8.75
    assert reason.startswith("forward 3.75/5 [bfloat16 contiguous, bfloat16 strided]: out: "
                             "relative error 0.5 above the bound, first wrong element [0]")
    # a rule broken: nothing, whatever the numbers
    cheat = dict(no_rules, cheats=[{"pass": "forward", "rule": "computed", "output": "",
                                    "text": "PyTorch computed inside your forward: aten.mean"}])
    score, reason, _ = grade_credit.verdict(
        grade_credit.cells(bf16, cheat, dtypes, layouts, shares), 10, "ln @ triton")
    assert score == 0 and reason.startswith("no credit for this part: PyTorch computed inside")
    with pytest.raises(ValueError, match="credit: 'strided' must be a number from 0 to 1"):
        grade_credit.credit_shares({"strided": 2})


def test_performance_points_follow_the_speedup_and_only_for_a_correct_part():
    shares = grade_credit.credit_shares({"performance": 0.2, "performance_target": 1.25})
    timed = {"level_ms": 2.0, "reference_ms": 2.0, "speedup": 1.0, "reference": "compile",
             "size": "bench", "dtype": "float32"}
    points, line = grade_credit.performance_points(timed, True, shares, 10, "cuda")
    assert points == 1.6 and line.startswith("performance 1.6/2: 2 ms against compile's 2 ms")
    assert "1.00x, full marks at 1.25x" in line
    fast = dict(timed, level_ms=1.0, speedup=2.0)
    assert grade_credit.performance_points(fast, True, shares, 10, "cuda")[0] == 2  # capped
    points, line = grade_credit.performance_points(fast, False, shares, 10, "cuda")
    assert points == 0 and "not scored until every check passes" in line
    points, line = grade_credit.performance_points({"error": "compile was not timed"}, True,
                                                   shares, 10, "cuda")
    assert points == 0 and "could not be timed: compile was not timed" in line
    points, line = grade_credit.performance_points(None, True, shares, 10, "cpu")
    assert points is None and "not scored: needs a CUDA GPU (this grader runs on cpu)" in line
    for speedup in (float("nan"), 0.0, -1.0, None):
        assert grade_credit.performance_fraction(speedup, 1.0) == 0.0
    for bad, message in (({"performance": 0.95}, "must leave the correctness checks a share"),
                         ({"performance_target": 0}, "must be a speed-up above 0"),
                         ({"performance_reference": ""}, "must name a level")):
        with pytest.raises(ValueError, match=message):
            grade_credit.credit_shares(bad)


def test_the_performance_timing_compares_one_draw_with_the_reference():
    """The part's process times its level and the reference on the same inputs (a fake
    profiler here: the real one needs a GPU to mean anything)."""
    from equivalence.commands import grade_process

    calls = []

    def fake_profile(component, level, dtype, device, size, case_cache):
        calls.append((level, id(case_cache)))
        ms = {"triton": 0.5, "compile": 1.0}[level]
        return argparse.Namespace(status="ok", reason="", fwd_bwd={"median_ms": ms})

    got = grade_process._timed("layer_norm", "triton", "cuda", "float32", "compile", "bench",
                               profile=fake_profile)
    assert got == {"level_ms": 0.5, "reference_ms": 1.0, "speedup": 2.0, "reference": "compile",
                   "size": "bench", "dtype": "float32"}
    assert [c[0] for c in calls] == ["triton", "compile"] and calls[0][1] == calls[1][1]

    def failing(component, level, **kw):
        return argparse.Namespace(status="skip", reason="no GPU", fwd_bwd=None)

    got = grade_process._timed("layer_norm", "triton", "cuda", "float32", "compile", "bench",
                               profile=failing)
    assert got == {"error": "level triton was not timed (skip: no GPU)"}


@pytest.mark.gpu
def test_performance_points_on_a_gpu():
    """The real path (the lead's H100): the reference's Triton part timed against
    torch.compile earns a share in proportion to its speed-up, said in the output."""
    part = {"component": "layer_norm", "level": "triton", "points": 10,
            "credit": {"performance": 0.2, "performance_target": 0.5}}
    (test,) = grading.grade(ROOT, parts=[part], timeout_s=600)["tests"]
    match = re.search(r"performance ([\d.]+)/2: .* against compile's .* ms .*: ([\d.]+)x",
                      test["output"])
    assert match, test["output"]
    earned, speedup = float(match[1]), float(match[2])
    assert earned == pytest.approx(min(2.0, 2.0 * speedup / 0.5), abs=0.03)
    assert test["score"] == pytest.approx(8 + earned, abs=0.01), test["output"]


# ---------------------------------------------------------------------------------------
# Level 5 (cuda): the same three rules, wired for its compiled ops. The wiring is checked
# here without a GPU; the rules themselves, on a GPU (`pytest -m gpu`).
# ---------------------------------------------------------------------------------------

def test_each_kernel_level_forbids_the_others_code_and_not_its_own():
    import importlib.util

    import levels

    triton, cuda = grade_rules.other_level_code("triton"), grade_rules.other_level_code("cuda")
    assert {"levels/cuda.py", "cuda_kernels"} <= set(triton)
    assert {"levels/triton.py", "triton_kernels"} <= set(cuda)
    assert not {"levels/triton.py", "triton_kernels"} & set(triton)
    assert not {"levels/cuda.py", "cuda_kernels"} & set(cuda)
    for shared in ("levels/native.py", "levels/torchscript.py", "levels/compiled.py",
                   "levels/auto.py", "numba_kernels"):
        assert shared in triton and shared in cuda, shared
    # every rung's module is named, under the harness's level names: a renamed module must
    # not quietly drop out of the rule
    assert set(grade_rules.LEVEL_CODE) == set(levels.LEVEL_NAMES)
    for info in levels.LEVELS:
        assert importlib.util.find_spec(info.module).origin == str(
            ROOT / grade_rules.LEVEL_CODE[info.name][0]), info.name
    for rel in set(triton) | set(cuda):
        assert (ROOT / rel).exists(), rel
    # the files the profiler watches at Level 5: Level 4's kernels, none of its own
    watched = grade_rules.forbidden_files({ROOT}, "cuda", ROOT)
    assert str(ROOT / "triton_kernels/layer_norm.py") in watched
    assert str(ROOT / "numba_kernels/layer_norm.py") in watched
    assert str(ROOT / "equivalence/cards/layer_norm.py") in watched  # the grader's reference
    assert not [f for f in watched if "/cuda_kernels/" in f or f.endswith("levels/cuda.py")]
    # the numba twins, a level of their own: Level 5's C++ and Level 4 are others' code there
    numba = grade_rules.other_level_code("numba")
    assert {"cuda_kernels", "triton_kernels", "levels/native.py"} <= set(numba)
    assert "numba_kernels" not in numba
    with pytest.raises(ValueError, match="argument 'level' must be one of"):
        grade_rules.other_level_code("auto")


def test_the_grader_counts_the_namespace_the_build_registers():
    from cuda_kernels import build  # importing it builds nothing

    assert grade_rules.CUDA_OP_NAMESPACE == build.OP_NAMESPACE
    # and the GPU tests below still find the line they plant their cheats into
    assert (ROOT / "cuda_kernels/layer_norm.py").read_text().count(CUDA_ANSWER) == 1
    bindings = [p.read_text() for p in (ROOT / "cuda_kernels").glob("*_binding.cpp")]
    assert bindings and all(f"TORCH_LIBRARY_FRAGMENT({build.OP_NAMESPACE}, m)" in text
                            for text in bindings)


def test_a_cuda_part_without_a_gpu_is_compiled_and_the_rest_needs_a_gpu():
    from cuda_kernels import build

    if build.nvcc_available() is not None:  # the grader refuses what it cannot do
        with pytest.raises(grading.MissingRequirement, match="nvcc"):
            grading.grade(ROOT, parts=[("layer_norm", 5, 3)], device="cpu")
        return
    # by alias, as a config may name it: the part is still Level 5
    result = grading.grade(ROOT, parts=[("layer_norm", 5, 3)], device="cpu")
    (test,) = result["tests"]
    assert (test["name"], test["level"], test["score"], test["max_score"], test["status"]) == (
        "layer_norm @ cuda", "cuda", 0.3, 3, "failed")  # the "compiles" share: 0.1
    assert test["reason"].startswith("needs a CUDA GPU: Level 5 runs only on an NVIDIA GPU, "
                                     "and this grader runs on cpu")
    assert ("cuda_kernels/layer_norm.cu compiles (nvcc, sm_90a PTX) and each of its kernels "
            "stores its result") in test["reason"]
    assert (result["score"], result["max_score"]) == (0.3, 3)  # the points stay in the maximum
    report = grading.gradescope(result)
    assert report["tests"][0]["status"] == "failed"
    assert "layer_norm @ cuda: 0.3/3 (needs a CUDA GPU" in report["output"]
    # an alias of Level 4 is held to Level 4's kernel rules, as its name is
    assert grading._named(grading.Part("layer_norm", "4")).level == "triton"
    with pytest.raises(ValueError, match="part layer_norm @ fast: argument 'level' must be one of"):
        grading.grade(ROOT, parts=[("layer_norm", "fast")], device="cpu")


def test_a_kernel_that_stores_nothing_does_not_pass_the_compile_check(tmp_path):
    from cuda_kernels import build

    if build.nvcc_available() is not None:
        pytest.skip(f"needs nvcc: {build.nvcc_available()}")
    sub = tmp_path / "sub"
    (sub / "cuda_kernels").mkdir(parents=True)
    cu = sub / "cuda_kernels/layer_norm.cu"
    cu.write_text('namespace ln {\n__global__ void blank_fwd(const float* x, float* y, int n) {\n'
                  '  // TODO: layer_norm, Level 5 (cuda): write this part.\n}\n}\n')
    ok, why = grading._compiles(sub, grading.Part("layer_norm", "cuda"))
    assert not ok and why == ("layer_norm @ cuda is not implemented yet (the TODO at "
                              "cuda_kernels/layer_norm.cu:3 is still there)")
    cu.write_text(cu.read_text().replace("  // TODO: layer_norm, Level 5 (cuda): write this part.\n",
                                         ""))  # the TODO deleted, the kernel still empty
    ok, why = grading._compiles(sub, grading.Part("layer_norm", "cuda"))
    assert not ok and why.endswith("store nothing (a kernel whose body is still a TODO): "
                                   "ln::blank_fwd"), why


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

        ledger = grade_watch.Ledger()
        counter = grade_rules.OpCounter(namespace, "CPU", ledger.launches, ledger.interpreted)
        watch = grade_watch.watcher(ROOT, ROOT, "layer_norm", "cuda", ledger, counter)
        assert torch.equal(watch(lambda fn, case, upstream=None, memory=None: run_case(), None,
                                 None), torch.full((2, 4), 9.0))
    finally:
        lib._destroy()
    assert ledger.launches == {"forward": {f"{namespace}::scale": 2},
                               "backward": {f"{namespace}::scale_bwd": 2}}
    interpreted = ledger.interpreted
    assert set(interpreted) == {f"{namespace}::scale", f"{namespace}::scale_bwd"}
    assert all(re.fullmatch(r".+\.py:\d+", where) for where in interpreted.values()), interpreted
    assert ledger.fused["forward"] == {"native_layer_norm": 1}
    assert ledger.other_calls == {"forward": {}, "backward": {}}

    notes = []
    verdicts = ledger.verdicts("cuda", notes)
    assert notes == [f"forward: your CUDA ops ran: {namespace}::scale x2",
                     f"backward: your CUDA ops ran: {namespace}::scale_bwd x2"]
    assert verdicts["forward"] == verdicts["backward"] == []
    cheats = [c["text"] for c in verdicts["cheats"]]
    assert cheats[0].startswith("PyTorch computed the component for you in the forward (ATen "
                                "native_layer_norm)")
    assert cheats[1].startswith(f"not compiled from your cuda_kernels/: {namespace}::scale is "
                                f"Python (registered at ")
    # nothing of the extension ran at all: rule 1 in both passes
    empty = grade_watch.Ledger().verdicts("cuda", [])
    assert [empty["forward"], empty["backward"], empty["cheats"]] == [
        [f"no op of your compiled cuda_kernels/ (torch.ops.levels_cuda, built from your .cu files) "
         f"ran in the {phase} pass: at a kernel level the answer must come from your own kernel, "
         f"not from PyTorch ops or another level"] for phase in ("forward", "backward")] + [[]]


def test_a_compiled_op_is_not_reported_as_python():
    import torch

    # ATen's add: C++ registered by TORCH_LIBRARY_IMPL, as the Level 5 bindings are
    where = grade_rules.kernel_registration("aten::add.Tensor", "CPU")
    assert where is not None and where.rsplit(":", 1)[0].endswith(".cpp"), where
    ledger = grade_watch.Ledger()
    counter = grade_rules.OpCounter("aten", "CPU", ledger.launches, ledger.interpreted)
    watch = grade_watch.watcher(ROOT, ROOT, "layer_norm", "cuda", ledger, counter)
    watch(lambda fn, case, upstream=None, memory=None: torch.ones(3) + torch.ones(3), None, None)
    assert ledger.launches["forward"].get("aten::add", 0) == 1 and ledger.interpreted == {}


CUDA_CHEATS = {
    # the answer written out in PyTorch ops: every check passes, no op of the extension ran
    "torch ops": (
        ("    xf = x.float()\n"
         "    m = xf.mean(-1, keepdim=True)\n"
         "    var = ((xf - m) ** 2).mean(-1, keepdim=True)\n"
         "    return ((xf - m) * torch.rsqrt(var + eps) * weight + bias).to(x.dtype)"),
        "PyTorch computed inside your forward: aten."),
    # the real ops run (forward and backward) as a decoy, the value comes from Level 1
    "another level": (
        ("    y = torch.ops.levels_cuda.layer_norm.default(x, weight, bias, float(eps),\n"
         "                                                 resolve_version(version), int(path))\n"
         "    import levels\n"
         "    return y + (levels.get('native').layer_norm(x, weight, bias, eps) - y).detach()\n"),
        "another level's code ran inside your forward (levels/native.py:layer_norm"),
    # the same decoy, the value from torch's fused layer_norm
    "F.layer_norm": (
        ("    y = torch.ops.levels_cuda.layer_norm.default(x, weight, bias, float(eps),\n"
         "                                                 resolve_version(version), int(path))\n"
         "    ref = torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, eps)\n"
         "    return y + (ref - y).detach()\n"),
        "PyTorch computed the component for you in the forward (ATen native_layer_norm)"),
}
CUDA_ANSWER = ("    return torch.ops.levels_cuda.layer_norm.default(x, weight, bias, float(eps),\n"
               "                                                    resolve_version(version), int(path))")


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


@pytest.mark.parametrize("cheated", [False, True])
def test_a_cuda_part_that_cheats_earns_no_compile_share_either(monkeypatch, tmp_path, cheated):
    # On a GPU a Level 5 part that ran is given the 'compiles' share besides its cells; a
    # cheat must cost that share too (the H100 run of the cheats above scored 1/10 with it).
    # The part's process is faked here: what it reports decides the score, not this machine.
    from equivalence.commands import grade as grade_module
    from equivalence.cards import LAYOUTS

    checks = [{"dtype": "float32", "layout": layout, "status": "pass", "reason": "",
               "summary": f"float32 {layout}: pass",
               "comparisons": [{"name": n, "ok": True, "rel_err": 1e-7, "problem": "",
                                "first_wrong": ""} for n in ("y", "dx")]}
              for layout in LAYOUTS]
    cheats = [{"rule": "torch-compute", "text": "PyTorch computed inside your forward: aten.mean"}]
    child = {"checks": checks, "notes": [], "performance": None,
             "problems": {"forward": [], "backward": [], "cheats": cheats if cheated else []}}

    def fake_child(code, spec, repo, timeout_s, kernel_group=None):
        Path(spec["result"]).write_text(json.dumps(child))
        return "", 0, False

    monkeypatch.setattr(grade_module, "_run_child", fake_child)
    part = grade_module.Part("layer_norm", "cuda")
    result = grade_module._grade_part(ROOT, part, 60, "cuda", ["float32"], "tiny", None)
    if cheated:
        assert (result.score, result.status) == (0.0, "failed")
        assert "PyTorch computed inside your forward" in result.reason
    else:
        assert (result.score, result.status) == (part.max_score, "passed"), result.reason
