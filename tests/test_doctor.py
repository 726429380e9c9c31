"""`levels doctor`: the facts, each level's reason and fix, the exit code, and its speed."""

import argparse
import io
import json
import time
import warnings

import pytest
import torch
from rich.console import Console

import levels
from cuda_kernels import build
from equivalence.commands import doctor

NO_GPU = not torch.cuda.is_available()


def _run(**options):
    """doctor.run as `levels doctor` calls it; returns (exit code, what it printed)."""
    out = io.StringIO()
    console = Console(file=out, width=220, color_system=None)
    args = argparse.Namespace(device=options.get("device"), json=options.get("json"))
    return doctor.run(args, console), out.getvalue()


def test_run_is_quick_and_prints_only_its_tables(capsys):
    # the first call in a process pays for Level 3's check importing torch._dynamo
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, text = _run()
    seconds = time.perf_counter() - start
    assert seconds < 3, f"levels doctor took {seconds:.1f} s"
    assert code in (doctor.EXIT_OK, doctor.EXIT_NOTHING_RAN)
    assert not caught, [str(w.message) for w in caught]  # TorchScript's notice stays inside
    assert capsys.readouterr().err == ""
    for name in ("Python", "torch", "triton", "numba", "GPU", "nvcc", "ninja", "Level 5 build dir"):
        assert name in text


@pytest.mark.skipif(not NO_GPU, reason="checks the CPU-only answer")
def test_cpu_machine_exits_3_with_level5_reason_and_fix():
    code, text = _run(device="cpu")
    assert code == doctor.EXIT_NOTHING_RAN
    assert "5 cuda" in text and "unavailable" in text
    assert "needs a CUDA GPU" in text  # the level's own reason
    assert "run on a machine with an NVIDIA GPU" in text and "levels explain --level cuda" in text
    assert "1 of 5 levels cannot run on cpu: cuda" in " ".join(text.split())
    report = doctor.diagnose("cpu")
    assert [r.level for r in report.levels if not r.available] == ["cuda"]
    assert all(r.fix for r in report.levels if not r.available)
    if torch.version.cuda is None:
        assert "Level 5 needs a CUDA build of torch" in report.fact("nvcc vs torch's CUDA").value


def test_json_has_every_level(tmp_path):
    path = tmp_path / "doctor.json"
    code, text = _run(device="cpu", json=str(path))
    data = json.loads(path.read_text())
    assert [row["level"] for row in data["levels"]] == list(levels.LEVEL_NAMES)
    assert data["exit_code"] == code and data["device"] == "cpu"
    for row in data["levels"]:
        assert set(row) == {"level", "number", "available", "reason", "fix"}
        assert row["available"] or (row["reason"] and row["fix"])
    assert {f["name"] for f in data["facts"]} >= {"Python", "torch", "torch's CUDA", "nvcc", "ninja"}
    assert f"wrote {path}" in text


def test_every_level_available_exits_0(monkeypatch):
    monkeypatch.setattr(levels, "status", lambda level, device="cpu", component=None: None)
    code, text = _run(device="cpu")
    assert code == doctor.EXIT_OK
    assert "unavailable" not in text and "Every level can run on cpu" in text


def test_missing_nvcc_shows_the_fix(monkeypatch):
    monkeypatch.setattr(build, "find_nvcc", lambda: None)
    monkeypatch.setattr(build, "nvcc_available", lambda: "nvcc (the CUDA compiler) was not found")
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    report = doctor.diagnose("cpu")
    nvcc = report.fact("nvcc")
    assert nvcc.ok is False and "was not found" in nvcc.value
    assert nvcc.fix == ("install the CUDA toolkit matching torch.version.cuda 12.8 and put nvcc on PATH, "
                        "or set CUDA_HOME to the toolkit's directory")
    assert "cannot compare: no nvcc" in report.fact("nvcc vs torch's CUDA").value
    _, text = _run(device="cpu")
    assert "matching torch.version.cuda 12.8" in " ".join(text.split())


@pytest.mark.parametrize("nvcc, torch_cuda, ok, words", [
    ("12.8", "12.8", True, "match (12.8)"),
    ("12.4", "12.8", True, "same major version"),
    ("13.0", "12.8", False, "mismatch: nvcc 13.0, torch 12.8"),
])
def test_nvcc_against_torch_cuda(monkeypatch, nvcc, torch_cuda, ok, words):
    monkeypatch.setattr(doctor, "nvcc_cuda_version", lambda path: nvcc)
    monkeypatch.setattr(build, "find_nvcc", lambda: "/usr/local/cuda/bin/nvcc")
    monkeypatch.setattr(build, "nvcc_available", lambda: None)
    monkeypatch.setattr(torch.version, "cuda", torch_cuda)
    fact = doctor.diagnose("cpu").fact("nvcc vs torch's CUDA")
    assert fact.ok is ok and words in fact.value
    assert bool(fact.fix) is not ok


def test_nvcc_version_is_parsed(tmp_path):
    fake = tmp_path / "nvcc"
    fake.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.8, V12.8.93'\n")
    fake.chmod(0o755)
    assert doctor.nvcc_cuda_version(str(fake)) == "12.8"
    assert doctor.nvcc_cuda_version(None) is None
    assert doctor.nvcc_cuda_version(str(tmp_path / "absent")) is None


def test_reasons_without_a_command_get_one(monkeypatch):
    reasons = {"triton": "triton is not installed (No module named 'triton'); it ships for Linux only",
               "compile": "Inductor needs a C++ compiler for CPU code and found none (x)"}
    monkeypatch.setattr(levels, "status",
                        lambda level, device="cpu", component=None: reasons.get(level))
    report = doctor.diagnose("cpu")
    assert report.exit_code == doctor.EXIT_NOTHING_RAN
    assert report.level("triton").fix.startswith("pip install triton==")
    assert "apt-get install g++" in report.level("compile").fix


@pytest.mark.skipif(not NO_GPU, reason="checks --device cuda without a GPU")
def test_cuda_device_without_gpu_is_diagnosed_not_refused():
    code, _ = _run(device="cuda")
    assert code == doctor.EXIT_NOTHING_RAN
    report = doctor.diagnose("cuda")
    assert not any(r.available for r in report.levels)
    assert all("no CUDA GPU here" in r.reason and r.fix for r in report.levels)


def test_bad_device_exits_2():
    code, text = _run(device="gpu")
    assert code == doctor.EXIT_USAGE and "must be cpu, cuda or cuda:N" in text


def test_help_documents_the_exit_codes():
    parser = argparse.ArgumentParser(prog="levels")
    doctor.add_parser(parser.add_subparsers(dest="command"))
    help_text = parser._subparsers._group_actions[0].choices["doctor"].format_help()
    assert "3: some level cannot run here; the table says why and what to run" in help_text
    assert "--json FILE" in help_text and "--device" in help_text


def test_gpu_facts_from_a_faked_gpu(monkeypatch, tmp_path):
    # the GPU branch, checked on any machine: torch's answers faked, nothing runs on a GPU
    class Props:
        name, major, minor, total_memory = "NVIDIA H100 80GB HBM3", 9, 0, 80 * 2**30

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: Props)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    monkeypatch.setattr(build, "gpu_arch", lambda device=None: "90a")
    monkeypatch.setenv("LEVELS_CUDA_CACHE", str(tmp_path))
    report = doctor.diagnose("cpu")
    assert "NVIDIA H100" in report.fact("GPU").value and report.fact("GPU").ok
    assert report.fact("compute capability").value.startswith("9.0 (Level 5 builds for sm_90a)")
    assert report.fact("bfloat16").ok is True
    assert "not built yet" in report.fact("Level 5 build dir").value
    assert not list(tmp_path.iterdir())  # it looked, and created nothing
    # Level 5 asked about the CPU on a GPU machine: its reason, and the doctor's command
    assert report.level("cuda").fix == "levels doctor --device cuda"


# ---------------------------------------------------------------------------------------
# In a second: asking whether Levels 3 and 5 run must not import Dynamo or Inductor (1.4 s
# on a 2-core CPU). The levels answer with the rules those libraries apply; these tests
# hold each rule to the library's own answer, so a torch that changes one fails here.
# ---------------------------------------------------------------------------------------

def test_doctor_imports_neither_dynamo_nor_inductor():
    import subprocess
    import sys

    code = ("import sys; from equivalence.commands import doctor; r = doctor.diagnose('cpu'); "
            "print(sorted(m for m in ('torch._dynamo', 'torch._inductor') if m in sys.modules)); "
            "print(r.seconds)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    imported, seconds = out.stdout.split("\n")[:2]
    assert imported == "[]", f"the doctor imported {imported} (checked in {seconds} s)"


@pytest.mark.parametrize("version", [(3, 11, 7), (3, 12, 0), (3, 13, 2), (3, 13, 3), (3, 14, 1),
                                     (3, 15, 0), (3, 16, 0)])
@pytest.mark.parametrize("gil_disabled", [0, 1])
def test_level3_python_rule_is_dynamos(monkeypatch, version, gil_disabled):
    import sys
    import sysconfig

    from torch._dynamo.eval_frame import check_if_dynamo_supported

    from levels import compiled

    real = sysconfig.get_config_var
    monkeypatch.setattr(sysconfig, "get_config_var",
                        lambda name: gil_disabled if name == "Py_GIL_DISABLED" else real(name))
    monkeypatch.setattr(sys, "version_info", version)
    try:
        check_if_dynamo_supported()
        dynamo_says = None
    except RuntimeError as exc:
        dynamo_says = str(exc)
    ours = compiled._dynamo_rule()
    monkeypatch.undo()
    assert (ours is None) == (dynamo_says is None), (version, gil_disabled, ours, dynamo_says)


@pytest.mark.parametrize("cxx", [None, "no-such-compiler-levels-test"])
def test_level3_cpp_compiler_rule_is_inductors(monkeypatch, cxx):
    import contextlib

    from torch._inductor import config, cpp_builder

    from levels import compiled

    # Inductor reads $CXX once, at import: its config is patched the supported way, and the
    # search's cache is emptied before and after, so later tests compile as before.
    patch = contextlib.nullcontext()
    if cxx is not None:
        monkeypatch.setenv("CXX", cxx)
        patch = config.patch({"cpp.cxx": (None, cxx)})
    cpp_builder.cpp_compiler_search.cache_clear()
    try:
        with patch:
            try:
                cpp_builder.get_cpp_compiler()
                inductor_found = True
            except Exception:  # noqa: BLE001 - InvalidCxxCompiler
                inductor_found = False
    finally:
        cpp_builder.cpp_compiler_search.cache_clear()
    ours = compiled._cpp_compiler_rule()
    assert (ours is None) == inductor_found, ours
    if cxx is not None:
        assert cxx in ours and "set CXX" in ours


def test_level5_constant_mark_is_torch_compilers():
    from levels import cuda

    def ours():
        return 1

    def theirs():
        return 1

    cuda._constant_under_compile(ours)
    torch.compiler.assume_constant_result(theirs)
    assert vars(ours) == vars(theirs) != {}
