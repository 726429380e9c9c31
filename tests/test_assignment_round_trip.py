"""The instructor's round trip, for two components (layer_norm and attention at Levels 1 and
4): build the student copy, grade it blank, grade a partial solution (through the Gradescope
package, as Gradescope runs it), grade the full solution, and grade the planted cheats.

One build per session (tests/conftest.py: assignment_build). Every grade runs each part in a
process of its own (about 5 s each on a 2-core CPU, two at a time); the submissions are graded
concurrently where they are independent. About 2 minutes in all."""

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from concurrent.futures import ThreadPoolExecutor

import pytest

from equivalence.commands import assignment, assignment_bundle, grade as grading

ROOT = assignment.ROOT
PARTS = [(c, level) for level in ("native", "triton") for c in ("layer_norm", "attention")]
SOLUTION_FILES = ("levels/native.py", "triton_kernels/layer_norm.py", "triton_kernels/attention.py")


def submission(copy, dest, restore=(), texts=None):
    """The student copy as handed in: `restore`d files are the reference's (the student's
    answer), `texts` {file: text} written as given."""
    shutil.copytree(copy.out, dest)
    for rel in restore:
        shutil.copy2(ROOT / rel, dest / rel)
    for rel, text in (texts or {}).items():
        (dest / rel).write_text(text)
    return dest


def scores(result):
    return {(t["component"], t["level"]): t["score"] for t in result["tests"]}


def reasons(result):
    return {(t["component"], t["level"]): t["reason"] for t in result["tests"]}


def forward_only(rel="triton_kernels/layer_norm.py"):
    """The reference with its backward region(s) blanked again: a forward-only solution."""
    text = (ROOT / rel).read_text()
    regions = assignment.find_regions(text, rel)
    return assignment.blank(text, rel, regions[1:], "layer_norm, Level 4 (triton)")


def test_the_build_writes_the_parts_and_the_bundle(assignment_build):
    copy = assignment_build
    config = json.loads((copy.instructor / "grading.json").read_text())
    assert [(p["component"], p["level"]) for p in config["parts"]] == [
        ("layer_norm", "native"), ("attention", "native"), ("layer_norm", "triton"),
        ("attention", "triton")]
    assert config["assignment"]["student_files"][:3] == sorted(SOLUTION_FILES)
    # the levels that would give the answers away are cut too, and said to be
    hidden = {(p.component, p.level) for p in copy.parts if p.gives_away}
    assert {("layer_norm", "torchscript"), ("attention", "numba")} <= hidden
    assert "hidden while layer_norm is assigned" in (copy.out / "levels/torchscript.py").read_text()
    # the hidden tests are in the bundle, and nowhere in the copy
    hidden = (copy.instructor / "hidden-tests.md").read_text()
    assert "## notebooks/00_start_here.ipynb" in hidden
    assert hidden.count("### BEGIN HIDDEN TESTS") >= 10
    # instructor-only files stay out; the student's instructions come in
    assert not (copy.out / "notebooks/INSTRUCTORS.md").exists()
    assert (copy.instructor / "INSTRUCTORS.md").is_file()
    guide = (copy.out / "ASSIGNMENT.md").read_text()
    assert "pip install -e" in guide and "levels check --component layer_norm --level triton" in guide
    assert (copy.out / assignment_bundle.STUDENT_TESTS).is_file()


def _normal(line):
    return " ".join(re.sub(r"\s+(#|//).*$", "", line).split())


def _lines(path, regions=()):
    """(lines inside `regions`, lines outside) of a file, normalized; a notebook's lines are
    its cells' sources and outputs (regions then apply to none of them: the notebooks' own
    exercises are checked by test_assignment_notebooks.py)."""
    text = path.read_text(errors="replace")
    if path.suffix != ".ipynb":
        lines = text.splitlines()
        cut = {i for r in regions for i in range(r.start, r.end + 1)}
        return ({_normal(x) for i, x in enumerate(lines) if i in cut},
                {_normal(x) for i, x in enumerate(lines) if i not in cut})

    def joined(value):
        return "".join(value) if isinstance(value, list) else str(value)

    shown = set()
    for cell in json.loads(text)["cells"]:
        texts = [joined(cell.get("source", ""))]
        for out in cell.get("outputs", []):
            texts += [joined(out.get("text", "")), str(out.get("evalue", ""))]
            texts += [joined(v) for v in out.get("data", {}).values()]
        shown |= {_normal(x) for t in texts for x in t.splitlines()}
    return set(), shown


def assert_no_solution_text(copy):
    """Each blanked region's distinctive lines (20 characters or more, shown nowhere in the
    reference's code outside a region), searched for in every file of the copy: sources,
    docs, tests, notebooks (sources and outputs). Written apart from the build's own scan,
    so that the check does not trust what it checks. Returns {file: its distinctive lines}."""
    regions = {}
    for part in copy.parts:
        for rel in part.regions:
            regions.setdefault(rel, []).extend(
                assignment.regions_of((ROOT / rel).read_text(), rel, part.component))
    inside, outside, owner = set(), set(), {}
    for rel in assignment.repo_files(ROOT):
        if rel.endswith(".ipynb"):  # what a lesson's code gives is given, not an answer
            for cell in json.loads((ROOT / rel).read_text())["cells"]:
                opened = False
                for line in "".join(cell["source"]).splitlines():
                    opened = (opened or "BEGIN SOLUTION" in line) and "END SOLUTION" not in line
                    if cell["cell_type"] == "code" and not opened:
                        outside.add(_normal(line))
        if rel.endswith((".py", ".cu", ".cuh")):
            own = assignment.find_regions((ROOT / rel).read_text(), rel)  # any part's region
            a, b = _lines(ROOT / rel, regions.get(rel, own))
            inside |= a if rel in regions else set()
            outside |= b
            owner.update(dict.fromkeys(a, rel) if rel in regions else {})
    answers = {line for line in inside - outside if len(line) >= 20}
    assert len(answers) > 30, "too few distinctive lines: the regions were not found"
    found = []
    for path in copy.out.rglob("*"):
        if path.is_file() and path.suffix not in (".png", ".zip"):
            shown = _lines(path)[1]
            found += [f"{path.relative_to(copy.out)}: {line}" for line in shown & answers]
    assert not found, "solution text in the student copy:\n" + "\n".join(sorted(found)[:20])
    by_file = {}
    for line in answers:
        by_file.setdefault(owner[line], set()).add(line)
    return by_file


def test_no_solution_text_anywhere_in_the_student_copy(assignment_build):
    assert_no_solution_text(assignment_build)


def test_every_part_at_once_leaves_no_solution_text(tmp_path):
    """Every component at Levels 1-5, blanked in one copy (the numba twins with them, hidden:
    they would give Level 5 away): every marked part is cut, the grep finds no answer in the
    copy, and each part's files held answers to look for (a region of comments alone would
    hide nothing). Graded on a CPU, each Level 5 part is "not implemented yet", naming its
    TODO (no nvcc run: the TODO is found first)."""
    from levels.contract import COMPONENTS

    copy = assignment.build(COMPONENTS, ("native", "torchscript", "compile", "triton", "cuda"),
                            tmp_path / "student", instructor_dir=tmp_path / "instructor")
    assert {(p.component, p.level) for p in copy.parts} == set(assignment.marked_parts(ROOT))
    assert not copy.still_shows, copy.still_shows  # every given-away file is marked
    answers = assert_no_solution_text(copy)
    for part in copy.parts:
        for rel in part.regions:
            assert answers.get(rel), f"{part.component} @ {part.level}: no distinctive line in {rel}"
    from cuda_kernels import build

    if build.nvcc_available() is not None:
        return  # the grader refuses Level 5 on a CPU without nvcc
    result = grading.grade(copy.out, parts=[(c, "cuda") for c in COMPONENTS], device="cpu")
    for (component, level), why in reasons(result).items():
        assert scores(result)[(component, level)] == 0, why
        assert re.search(rf"{component} @ cuda is not implemented yet \(the TODO at "
                         r"cuda_kernels/\w+\.cuh?:\d+ is still there\)", why), why


@pytest.fixture(scope="module")
def graded(assignment_build, tmp_path_factory):
    """The blank copy, a partial and a full solution, graded at once (two parts at a time
    each: the machine's two cores)."""
    copy = assignment_build
    tmp = tmp_path_factory.mktemp("round-trip")
    config = copy.instructor / "grading.json"
    subs = {
        "blank": copy.out,
        "full": submission(copy, tmp / "full", restore=SOLUTION_FILES),
        # Level 1 of both, the forward of layer_norm's kernel; attention's kernel not begun
        "partial": submission(copy, tmp / "partial", restore=("levels/native.py",),
                              texts={"triton_kernels/layer_norm.py": forward_only()}),
    }
    with ThreadPoolExecutor(3) as pool:
        results = pool.map(lambda repo: grading.grade(repo, config=config, jobs=1), subs.values())
    return dict(zip(subs, results))


def test_blank_copy_scores_zero_and_says_not_implemented(graded):
    result = graded["blank"]
    assert scores(result) == dict.fromkeys(PARTS, 0.0)
    for (component, level), why in reasons(result).items():
        assert why.startswith(f"{component} @ {level} is not implemented yet (the TODO at "), why


def test_a_partial_solution_scores_its_share(graded):
    result = graded["partial"]
    assert scores(result) == {("layer_norm", "native"): 10, ("attention", "native"): 10,
                              ("layer_norm", "triton"): 5, ("attention", "triton"): 0}
    why = reasons(result)[("layer_norm", "triton")]
    assert why.startswith("backward 0/5: layer_norm @ triton is not implemented yet (the TODO at "
                          "triton_kernels/layer_norm.py:"), why


def test_the_full_solution_scores_full_marks(graded):
    result = graded["full"]
    assert (result["score"], result["max_score"]) == (40, 40), reasons(result)
    triton = next(t for t in result["tests"] if t["name"] == "layer_norm @ triton")["output"]
    assert "forward: your kernels ran: layer_norm.layer_norm_fwd_kernel x8" in triton


def test_the_visible_tests_check_behaviour_not_values(assignment_build, graded):
    """The student's visible tests fail on the blank copy and pass on the full solution."""
    def visible(repo):
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               assignment_bundle.STUDENT_TESTS], cwd=repo,
                              capture_output=True, text=True, timeout=300, check=False,
                              env=dict(os.environ, PYTHONPATH=str(repo)))
    with ThreadPoolExecutor(2) as pool:
        blank, full = pool.map(visible, (assignment_build.out, graded["full"]["repo"]))
    assert "4 failed" in blank.stdout, blank.stdout[-2000:]
    assert "4 passed" in full.stdout, full.stdout[-2000:]
    text = (assignment_build.out / assignment_bundle.STUDENT_TESTS).read_text()
    assert "assert_close" not in text and "allclose" not in text  # no value is compared


def test_the_gradescope_package_grades_a_submission_end_to_end(assignment_build, tmp_path):
    """autograder.zip as Gradescope unpacks it, a submission of loose files (the two the
    student wrote), run_autograder, results.json."""
    gradescope = assignment_build.instructor / "gradescope"
    assert subprocess.run(["bash", "-n", str(gradescope / "setup.sh")], check=False).returncode == 0
    root = tmp_path / "autograder"
    with zipfile.ZipFile(gradescope / "autograder.zip") as z:
        z.extractall(root / "source")
    (root / "source/run_autograder").chmod(0o755)
    upload = root / "submission"
    upload.mkdir()
    shutil.copy2(ROOT / "levels/native.py", upload / "native.py")
    (upload / "layer_norm.py").write_text(forward_only())
    proc = subprocess.run([str(root / "source/run_autograder")], capture_output=True, text=True,
                          timeout=600, check=False,
                          env=dict(os.environ, AUTOGRADER_ROOT=str(root),
                                   LEVELS_PYTHON=sys.executable))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((root / "results/results.json").read_text())
    assert set(results) == {"score", "execution_time", "output", "visibility", "tests"}, results
    assert results["score"] == 25, results["output"]
    assert [(t["name"], t["score"], t["max_score"], t["status"]) for t in results["tests"]] == [
        ("layer_norm @ native", 10, 10, "passed"), ("attention @ native", 10, 10, "passed"),
        ("layer_norm @ triton", 5, 10, "failed"), ("attention @ triton", 0, 10, "failed")]
    assert "taken from the submission: levels/native.py, triton_kernels/layer_norm.py" in proc.stdout


# ---------------------------------------------------------------------------------------
# Planted cheats: each scores 0 on its part, with a message that says why
# ---------------------------------------------------------------------------------------

LN = "triton_kernels/layer_norm.py"
LN_CALL = ("    if needs_grad(x, weight, bias):\n"
           "        return apply_ahead(_LayerNorm, x, weight, bias, eps, tiling, backward_tiling)\n")
NO_OP_KERNEL = '''

@triton.jit
def _touch_kernel(p):
    tl.load(p)  # launched, and writes nothing


def _torch_layer_norm(x, weight, bias, eps):
    xf = x.float()
    m = xf.mean(-1, keepdim=True)
    v = ((xf - m) ** 2).mean(-1, keepdim=True)
    return ((xf - m) * torch.rsqrt(v + eps) * weight + bias).to(x.dtype)


class _TouchAndCompute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        _touch_kernel[(1,)](x)
        ctx.save_for_backward(x, weight, bias)
        ctx.eps = eps
        return _torch_layer_norm(x, weight, bias, eps)

    @staticmethod
    def backward(ctx, dy):
        _touch_kernel[(1,)](dy)
        with torch.enable_grad():
            xs, ws, bs = (t.detach().requires_grad_() for t in ctx.saved_tensors)
            y = _torch_layer_norm(xs, ws, bs, ctx.eps)
            return (*torch.autograd.grad(y, (xs, ws, bs), dy), None)
'''
CHEATS = {
    # a token kernel launched in both passes, the answer computed by torch ops around it
    "no-op kernel + torch arithmetic": (
        LN_CALL, "    return _TouchAndCompute.apply(x, weight, bias, eps)\n", NO_OP_KERNEL,
        "PyTorch computed inside your forward: aten."),
    # the kernels run as a decoy, the value comes from Level 1
    "another level": (
        LN_CALL, ("    import levels\n"
                  "    y = _LayerNorm.apply(x, weight, bias, eps)\n"
                  "    return y + (levels.get('native').layer_norm(x, weight, bias, eps) - y).detach()\n"),
        "", "another level's code ran inside your forward (levels/native.py:layer_norm"),
    # the right answer, computed by the kernels once, handed out again on the next call
    "cached answer": (
        LN_CALL, ("    key = (tuple(x.shape), x.stride(), x.dtype)\n"
                  "    if not torch.is_grad_enabled() and key in _ANSWERS:\n"
                  "        return _ANSWERS[key]\n"
                  "    y = apply_ahead(_LayerNorm, x, weight, bias, eps)\n"
                  "    _ANSWERS[key] = y.detach()\n"
                  "    return y\n"),
        "\n_ANSWERS = {}\n",
        "not written by your kernels (forward): out: 1290 of 1290 elements were not written by "
        "your kernels in this call"),
    # the kernel writes the answer into the input's own memory, and the input is returned
    "returning an input": (
        LN_CALL, ("    y = apply_ahead(_LayerNorm, x, weight, bias, eps)\n"
                  "    with torch.no_grad():\n"
                  "        x.copy_(y)\n"
                  "    return x if not torch.is_grad_enabled() else y\n"),
        "", "out is your input 'x' handed back (forward)"),
}


@pytest.fixture(scope="module")
def cheats_graded(assignment_build, tmp_path_factory):
    copy, tmp = assignment_build, tmp_path_factory.mktemp("cheats")
    reference = (ROOT / LN).read_text()
    subs = {}
    for name, (old, new, extra, _) in CHEATS.items():
        assert reference.count(old) == 1, f"{LN}: the line to plant into is gone: {old!r}"
        text = reference.replace(old, new) + extra
        subs[name] = submission(copy, tmp / name.replace(" ", "-"), texts={LN: text})
    # attention: torch's fused attention for the value, the real kernels as a decoy
    att = (ROOT / "triton_kernels/attention.py").read_text()
    old = ("def attention(q, k, v, causal: bool, scale: float, config=None, backward_config=None,\n"
           "              bottom_right: bool = False, kv_lens=None, rope: tuple | None = None):\n")
    assert att.count(old) == 1, f"triton_kernels/attention.py: the line to plant into is gone: {old!r}"
    subs["attention: torch's fused op"] = submission(
        copy, tmp / "attention", texts={"triton_kernels/attention.py": att.replace(old, old + (
            "    y = _attention(q, k, v, causal, scale)\n"
            "    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,\n"
            "                                                           scale=scale)\n"
            "    return y + (ref - y).detach()\n\n\n"
            "def _attention(q, k, v, causal, scale, config=None, backward_config=None,\n"
            "               bottom_right=False, kv_lens=None, rope=None):\n"))})
    parts = {name: [("attention" if name.startswith("attention") else "layer_norm", "triton")]
             for name in subs}
    with ThreadPoolExecutor(2) as pool:
        results = pool.map(lambda name: grading.grade(subs[name], parts=parts[name], jobs=1,
                                                      timeout_s=300), subs)
    return {name: result["tests"][0] for name, result in zip(subs, results)}


@pytest.mark.parametrize("cheat", [*CHEATS, "attention: torch's fused op"])
def test_a_planted_cheat_scores_zero_and_says_why(cheats_graded, cheat):
    test = cheats_graded[cheat]
    assert (test["score"], test["status"]) == (0, "failed"), test["output"]
    expected = CHEATS[cheat][3] if cheat in CHEATS else "PyTorch computed the component for you"
    assert expected in test["reason"], test["reason"]
    assert test["reason"].startswith("no credit for this part: "), test["reason"]


# Level 5's parts on a CPU: the file the TODO is in, and the .cu file nvcc compiles (rope's
# answer is rope.cuh's rotation, compiled where rope.cu includes it)
LEVEL5 = {"layer_norm": ("cuda_kernels/layer_norm.cu",) * 2, "mlp": ("cuda_kernels/gemm.cu",) * 2,
          "attention": ("cuda_kernels/attention.cu",) * 2, "rms_norm": ("cuda_kernels/rms_norm.cu",) * 2,
          "rope": ("cuda_kernels/rope.cuh", "cuda_kernels/rope.cu")}


def test_level5_round_trip_compiles_on_a_cpu(tmp_path):
    """Level 5 without a GPU: the build blanks the marked regions of the .cu files (and the
    numba and Triton twins that would give them away), and the blanked files still compile
    (the student's starting point builds); the blank copy is "not implemented yet", naming
    the TODO; the reference's files handed in compile and earn the compile share, and the
    rest is said to need a GPU."""
    from cuda_kernels import build

    if build.nvcc_available() is not None:
        pytest.skip(f"needs nvcc: {build.nvcc_available()}")
    copy = assignment.build(list(LEVEL5), ["cuda"], tmp_path / "student",
                            instructor_dir=tmp_path / "instructor")
    for component, (rel, _) in LEVEL5.items():
        assert assignment.regions_of((ROOT / rel).read_text(), rel, component), rel
        # (gemm.cu keeps the SwiGLU MLP's regions: a part nobody chose)
        assert not assignment.regions_of((copy.out / rel).read_text(), rel, component), rel
    for twin in ("layer_norm", "gemm", "attention", "rms_norm", "rope"):
        assert "hidden while" in (copy.out / f"numba_kernels/{twin}.py").read_text(), twin
        assert "hidden while" in (copy.out / f"triton_kernels/{twin}.py").read_text(), twin
    assert "the grader compiles your `.cu` file with nvcc" in (copy.out / "ASSIGNMENT.md").read_text()
    config = copy.instructor / "grading.json"
    # The reference's files handed in, but attention's (10 s of nvcc, 45 s on a loaded 2-core
    # machine: its blanked copy is compiled below instead, and the reference by
    # tests/test_cuda_build.py); and the new parts' blanked files compiled as the student gets
    # them (layer_norm.cu's and gemm.cu's blanks were compiled when they were marked).
    handed_in = {c: files for c, files in LEVEL5.items() if c != "attention"}
    done = submission(copy, tmp_path / "done", [rel for rel, _ in handed_in.values()])
    blanked = [compiled for c, (_, compiled) in LEVEL5.items() if c not in ("layer_norm", "mlp")]
    # attention.cu alone compiles the forward's kernels; its backward's (blanked regions
    # included) are compiled where attention_backward.cu includes it
    blanked.append("cuda_kernels/attention_backward.cu")
    with ThreadPoolExecutor(2) as pool:
        graded = [pool.submit(grading.grade, repo, config=config, device="cpu")
                  for repo in (copy.out, done)]
        compiled = [pool.submit(build.compile_ptx, copy.out / rel, "90a",
                                include_dirs=[(copy.out / rel).parent]) for rel in blanked]
        blank, done = (g.result() for g in graded)
        for rel, ptx in zip(blanked, compiled):
            assert ".entry" in ptx.result(), rel
    for component, (rel, compiled) in LEVEL5.items():
        why = reasons(blank)[(component, "cuda")]
        assert scores(blank)[(component, "cuda")] == 0, why
        assert re.search(rf"{component} @ cuda is not implemented yet \(the TODO at {rel}:\d+ "
                         r"is still there\)", why), why
        if component in handed_in:
            why = reasons(done)[(component, "cuda")]
            assert scores(done)[(component, "cuda")] == 1, why  # the compile share: 0.1 of 10
            assert why.startswith("needs a CUDA GPU") and f"{compiled} compiles" in why, why
