import ctypes
import os
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    # Level 4 runs in Triton's interpreter here. It must be on before anything imports
    # triton: triton.language builds its own @jit helpers (tl.max's combine, ...) at import.
    os.environ.setdefault("TRITON_INTERPRET", "1")

GPU_REASON = "needs a CUDA GPU: run `pytest -m gpu` on a GPU machine"

# The tests that make the whole suite too long for the README's command on a 2-core CPU
# (`-m "not slow"`, under 10 minutes there); CI runs them after it (`.ci/run`: `-m slow`).
# One place, so the split is read and changed here, not hunted for across the files: a file,
# or a test of a file (all its parameters). Seconds: the whole run on the 2-core CPU, loaded.
SLOW = {
    "notebooks/": "the notebooks 00-09, 04a and 05a, executed (239 s; 08 adds 15 s, 09 18 s)",
    "tests/test_cuda_build.py": "nvcc compiles every .cu file and the loader's unit (215 s)",
    "tests/test_fuzz.py::test_fuzz_compile": "Inductor compiles each drawn shape (128 s; rope adds 35 s)",
    "tests/test_fuzz.py::test_fuzz_triton_interpreter": "the interpreter on drawn shapes (57 s; rope adds 6 s)",
    "tests/test_compiled.py::test_harness_passes_all_components_forward_and_backward":
        "Level 3 compiles every case (111 s)",
    "tests/test_numba_twins.py": "numba's CUDA simulator, a Python thread per GPU thread (57 s; rope adds 11 s)",
    "tests/test_models.py::test_every_level_trains_the_same_curve": "four models, five levels (41 s without the Llama)",
    "tests/test_optim_muon.py::test_train_with_muon_agrees_with_native":
        "levels train --optimizer muon, tiny GPT at Levels 1-2 (15 s)",
    "tests/test_models.py::test_ddp_two_processes_train_what_one_process_with_twice_the_batch_trains":
        "two processes training (8 s)",
    "tests/test_cuda_attention.py::test_no_kernel_spills_on_sm90a":
        "ptxas on every kernel, RoPE's too (~86 s; attention v7's 16 kernels add ~15 s)",
    "tests/test_cuda_autograd_cpu.py::test_cpp_op_passes_the_harness": "g++ builds the C++ op (43 s)",
    "tests/test_shapes_suite.py::test_cpu_run_writes_every_shape_and_a_plot": "37 s",
    "tests/test_autocast.py::test_under_autocast_a_level_computes_its_function_of_the_cast_arguments":
        "Level 3 compiles under autocast (35 s)",
    "tests/test_torchscript.py::test_harness_passes_at_small_size": "19 s",
    "tests/test_attention_rope.py::test_level3_compiles_the_interleaved_layout":
        "Inductor compiles attention with rope, forward and backward (65 s on a loaded 2-core CPU)",
    "tests/test_cuda_mlp.py::test_version_5_uses_wgmma_on_sm90a": "nvcc (9 s)",
    "tests/test_cuda_layer_norm.py::test_register_resident_kernels_do_not_spill_on_sm90a":
        "ptxas on layer_norm.cu's 113 kernels (13 s; 11 s before version 4)",
    "tests/test_cuda_mlp.py::test_each_rung_uses_its_instructions": "nvcc (6 s)",
    "tests/test_cuda_conv_bn.py::test_v3_compiles_to_tensor_core_and_cp_async_code": "nvcc (12 s)",
    "tests/test_triton_conv_bn.py::test_harness_tiny": "the interpreter (11 s)",
    "tests/test_triton_newton_schulz.py::test_harness_tiny":
        "the interpreter, one matrix and a batch, both layouts (13 s for float32 and bfloat16)",
    "tests/test_grading.py::test_hang_and_segfault_cost_their_part_only": "a hang's timeout (21 s)",
    "tests/test_assignment_round_trip.py::test_level5_round_trip_compiles_on_a_cpu":
        "a build, and nvcc on seven .cu files (35-41 s at a load of 8-10 on 2 cores; two files took 10-20 s)",
    "tests/test_assignment_round_trip.py::test_every_part_at_once_leaves_no_solution_text":
        "a build of every part, and the grep (8-20 s at a load of 5-10 on 2 cores)",
    "tests/test_assignment_notebooks.py::test_a_real_notebook_scores_zero_blanked_and_full_as_the_reference":
        "a notebook run twice (20 s)",
    "tests/test_assignment_notebooks.py::test_a_blanked_exercise_fails_its_grade_cell_and_the_reference_passes":
        "15 s",
    "tests/test_assignment_notebooks.py::test_notebook_grade_cells_score_their_points_and_a_hang_costs_the_rest":
        "11 s",
}


def _slow(nodeid: str) -> bool:
    for key in SLOW:
        if key.endswith("/"):
            if nodeid.startswith(key):
                return True
        elif nodeid == key or nodeid.startswith((key + "::", key + "[")):
            return True
    return False


@pytest.hookimpl(tryfirst=True)  # before -m picks by marker
def pytest_collection_modifyitems(config, items):
    """`slow` on the tests SLOW names; `@pytest.mark.gpu` tests skip cleanly (with the reason)
    on a machine without CUDA."""
    for item in items:
        if _slow(item.nodeid):
            item.add_marker(pytest.mark.slow)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason=GPU_REASON)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_report_teststatus(report, config):
    """A skip prints no `s`: on a CPU most of the suite is GPU tests, and screens of them
    said nothing; the summary counts them by reason instead (pytest_terminal_summary)."""
    if report.skipped and not hasattr(report, "wasxfail"):
        return "skipped", "", "SKIPPED"
    return None


def pytest_terminal_summary(terminalreporter):
    """One line per skip reason, most frequent first: "1962 skipped: needs a CUDA GPU ..."."""
    reasons = Counter()
    for report in terminalreporter.stats.get("skipped", []):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reasons[reason.removeprefix("Skipped: ")] += 1
    if reasons:
        terminalreporter.write_sep("-", "skipped, by reason")
        for reason, n in reasons.most_common():
            terminalreporter.write_line(f"{n} skipped: {reason}")


@pytest.fixture(autouse=True)
def settings_read_anew():
    """A test that sets LEVELS_CACHE_DIR (monkeypatch.setenv) gets it: the harness reads its
    settings from the environment once per process, so each test starts without them."""
    from equivalence import settings

    settings.use(None)
    yield
    settings.use(None)


# One assignment built per session, shared by the grading tests (a build copies the repo:
# a few seconds): layer_norm and attention at Levels 1 and 4, with the instructor's bundle.
ROUND_TRIP = {"components": ("layer_norm", "attention"), "levels": ("native", "triton")}


@pytest.fixture(scope="session")
def assignment_build(tmp_path_factory):
    from equivalence.commands import assignment

    root = tmp_path_factory.mktemp("assignment")
    copy = assignment.build(ROUND_TRIP["components"], ROUND_TRIP["levels"], root / "student",
                            instructor_dir=root / "instructor")
    return copy


@pytest.fixture(scope="session")
def host_library(tmp_path_factory):
    """compile(source, name) -> ctypes.CDLL: a C++ shim over cuda_kernels' plain-C++ headers
    (layer_norm_plan.h, conv_bn_plan.h, tile_order.h: the rules and orders the launchers
    run), compiled by g++ for this CPU and loaded, so the CPU tests call the very functions
    the kernels' launchers call. Skips the test where g++ is missing. One compile per name
    a session: a parametrized test asks for its shim in every case."""
    kernels = Path(__file__).resolve().parent.parent / "cuda_kernels"
    built: dict[str, ctypes.CDLL] = {}

    def compile_(source: str, name: str) -> ctypes.CDLL:
        if name in built:
            return built[name]
        gxx = shutil.which("g++")
        if gxx is None:
            pytest.skip(f"needs g++ to compile the {name} shim over cuda_kernels' headers")
        d = tmp_path_factory.mktemp(name)
        (d / "shim.cpp").write_text(source)
        subprocess.run([gxx, "-std=c++17", "-O1", "-shared", "-fPIC", f"-I{kernels}",
                        str(d / "shim.cpp"), "-o", str(d / "shim.so")], check=True, timeout=120)
        built[name] = ctypes.CDLL(str(d / "shim.so"))
        return built[name]
    return compile_
