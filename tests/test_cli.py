"""The `levels` command line: exit codes, tables, and the files `compare` writes."""

import json
import os
import subprocess
import sys
import warnings

import pytest
import torch

import levels.native as native
from equivalence.cli import EXIT_FAILED, EXIT_NOTHING_RAN, EXIT_OK, EXIT_USAGE, main
from equivalence.profile import overlap


def test_check_passes_with_exit_0(capsys):
    assert main(["check", "--level", "native", "--component", "layer_norm,mlp"]) == EXIT_OK
    out = capsys.readouterr().out
    # 2 components x 2 dtypes, in every layout the harness checks
    assert "layer_norm" in out and "bfloat16" in out and " passed, 0 failed, 0 skipped" in out


def test_check_fails_with_exit_1(monkeypatch, capsys):
    original = native.layer_norm
    monkeypatch.setattr(native, "layer_norm", lambda x, weight, bias, eps=1e-5:
                        original(x, weight, bias * 0, eps))
    assert main(["check", "--level", "1", "--component", "layer_norm", "--dtype", "fp32"]) == EXIT_FAILED
    assert "fail" in capsys.readouterr().out


def test_check_nothing_runnable_exit_3(capsys):
    assert main(["check", "--level", "cuda", "--component", "mlp"]) == EXIT_NOTHING_RAN
    assert "skip" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["check", "--component", "softmax"], ["check", "--level", "7"],
                                  ["check", "--dtype", "int8", "--level", "1"]])
def test_bad_arguments_exit_2(argv, capsys):
    assert main(argv) == EXIT_USAGE
    assert "must be one of" in capsys.readouterr().out


def test_check_writes_json(tmp_path):
    path = tmp_path / "check.json"
    assert main(["check", "--level", "native", "--component", "lstm", "--dtype", "fp32",
                 "--json", str(path)]) == EXIT_OK
    data = json.loads(path.read_text())
    assert data["results"] and data["results"][0].get("layout", "contiguous") == "contiguous"
    for row in data["results"]:
        assert row["status"] == "pass" and row["seed"] is not None and row["comparisons"]
    assert data["environment"]["torch"] and data["environment"]["date"]


def test_compare_writes_json_and_png(tmp_path, capsys):
    code = main(["compare", "--level", "native,triton,cuda", "--component", "mlp,conv_bn", "--size", "tiny",
                 "--check-size", "tiny", "--out", str(tmp_path)])
    assert code == EXIT_OK
    report = json.loads((tmp_path / "compare.json").read_text())
    rows = {(r["component"], r["level"]): r for r in report["rows"]}
    assert rows["mlp", "native"]["check"] == "pass"
    assert rows["mlp", "native"]["fwd"]["median_ms"] > 0
    assert rows["conv_bn", "native"]["first_call_ms"] > 0
    if not torch.cuda.is_available():
        assert rows["mlp", "cuda"]["status"] == "skip" and rows["mlp", "cuda"]["reason"]
    assert len(rows["conv_bn", "native"]["checks"]) == 2  # eval and train
    if rows["mlp", "triton"]["status"] == "untimed":  # the interpreter: checked, never timed
        assert rows["mlp", "triton"]["check"] == "pass" and rows["mlp", "triton"]["fwd"] is None
    assert report["environment"]["torch"]
    assert report["settings"]["dtype"] == ("bfloat16" if torch.cuda.is_available() else "float32")
    assert report["settings"]["compile_mode"] in ("default", os.environ.get("LEVELS_COMPILE_MODE"))
    png = (tmp_path / "compare.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    out = capsys.readouterr().out
    assert "compare.json" in out and "compare.log" in out and (tmp_path / "compare.log").exists()


def test_compare_says_never_and_warm_or_cold(tmp_path, capsys):
    assert main(["compare", "--level", "native,torchscript,compile", "--component", "layer_norm",
                 "--size", "tiny", "--check-size", "tiny", "--out", str(tmp_path)]) == EXIT_OK
    rows = {r["level"]: r for r in json.loads((tmp_path / "compare.json").read_text())["rows"]}
    assert rows["compile"]["first_call_cache"] in ("warm", "cold")
    assert rows["native"]["first_call_cache"] is None
    for r in rows.values():
        be = r["break_even_calls_vs_native"]
        if r["level"] == "native":
            assert be is None
        elif overlap(r["fwd_bwd"], rows["native"]["fwd_bwd"]):  # as fast as timing can tell
            assert be == "≈" and len(r["speedup_vs_native"]) == 3
        elif r["fwd_bwd"]["median_ms"] >= rows["native"]["fwd_bwd"]["median_ms"]:
            assert be == "never"
        else:
            assert isinstance(be, int) and be >= 1
    out = capsys.readouterr().out
    assert f"ms {rows['compile']['first_call_cache']}" in out and "baseline" in out


def _chatty_layer_norm(monkeypatch):
    """A library that talks: Python prints, warnings, and C-level writes to fds 1 and 2."""
    original = native.layer_norm

    def chatty(x, weight, bias, eps=1e-5):
        print("AUTOTUNE print from a library")
        warnings.warn("a library warning")
        os.write(2, b"E1122 raw stderr of a subprocess compile\n")
        return original(x, weight, bias, eps)

    monkeypatch.setattr(native, "layer_norm", chatty)


def test_compare_prints_nothing_but_ours(tmp_path, capfd, monkeypatch):
    _chatty_layer_norm(monkeypatch)
    assert main(["compare", "--level", "native", "--component", "layer_norm", "--size", "tiny",
                 "--check-size", "tiny", "--out", str(tmp_path)]) == EXIT_OK
    out, err = capfd.readouterr()
    for noise in ("AUTOTUNE", "library warning", "E1122"):
        assert noise not in out + err
    assert "levels compare" in out and "compare.log" in out
    log = (tmp_path / "compare.log").read_text()
    for noise in ("AUTOTUNE", "library warning", "E1122"):
        assert noise in log
    print("after compare")  # our streams are back where they were
    assert "after compare" in capfd.readouterr().out


def test_check_prints_nothing_but_ours(tmp_path, capfd, monkeypatch):
    _chatty_layer_norm(monkeypatch)
    log = tmp_path / "check.log"
    assert main(["check", "--level", "native", "--component", "layer_norm", "--dtype", "fp32",
                 "--log", str(log)]) == EXIT_OK
    out, err = capfd.readouterr()
    for noise in ("AUTOTUNE", "library warning", "E1122"):
        assert noise not in out + err and noise in log.read_text()
    assert "levels check" in out and str(log) in out and " passed, 0 failed" in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
@pytest.mark.parametrize("argv", [["check", "--component", "mlp"], ["check", "--level", "triton"],
                                  ["compare", "--component", "mlp"], ["agree", "--component", "mlp"],
                                  ["explain", "--component", "mlp", "--level", "native"],
                                  ["profile", "--component", "mlp"], ["select", "--component", "mlp"]])
def test_cuda_without_a_gpu_exits_3_with_the_reason(argv, tmp_path, capsys):
    assert main(argv + ["--device", "cuda"]) == EXIT_NOTHING_RAN
    out = capsys.readouterr().out
    assert "no CUDA GPU here: torch.cuda.is_available() is False" in out
    assert "Traceback" not in out and "TRITON_INTERPRET" not in out


# ids without "gpu": conftest skips every test with a "gpu" keyword on a machine without one
@pytest.mark.parametrize("device", ["gpu", "cuda:x", "mps"], ids=["a-word", "bad-index", "mps"])
def test_a_bad_device_exits_2(device, capsys):
    assert main(["check", "--component", "mlp", "--level", "native", "--device", device]) == EXIT_USAGE
    assert "argument '--device' must be cpu, cuda or cuda:N" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_triton_on_cuda_here_names_the_missing_device():
    import levels
    assert levels.status("triton", "cuda", "mlp").startswith("no CUDA GPU here")


def test_profile_writes_table_json_and_pictures(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LEVELS_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["profile", "--component", "layer_norm", "--level", "torchscript", "--size", "tiny",
                 "--out", str(tmp_path)]) == EXIT_OK
    out = capsys.readouterr().out
    assert "host" in out and "of matmul" in out and "of copy" in out and "ceilings of this device" in out
    data = json.loads((tmp_path / "profile-layer_norm.json").read_text())
    assert [r["level"] for r in data["rows"]] == ["native", "torchscript"]  # native: the baseline
    assert data["rows"][0]["host"]["median_ms"] > 0 and data["ceilings"]["copy_tbps"] > 0
    assert data["rows"][1]["break_even_calls_vs_native"] is not None
    for png in ("profile-layer_norm.png", "roofline-layer_norm.png"):
        assert (tmp_path / png).read_bytes()[:4] == b"\x89PNG"


def test_select_prints_the_decision_table(tmp_path, capsys, monkeypatch):
    from equivalence import select
    monkeypatch.setenv("LEVELS_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(select, "CANDIDATES", ("native", "torchscript"))
    select.forget()
    assert main(["select", "--component", "layer_norm", "--size", "tiny"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "chosen" in out and "x ≤" in out and "measured now" in out
    assert main(["select", "--component", "layer_norm", "--size", "tiny"]) == EXIT_OK
    assert "auto.json" in capsys.readouterr().out  # the second time, from the cache
    select.forget()


def test_agree_prints_matrix(capsys):
    assert main(["agree", "--component", "attention", "--variant", "causal"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "float64 reference" in out and "native" in out


def test_help_teaches_the_levels():
    out = subprocess.run([sys.executable, "-m", "equivalence", "--help"], capture_output=True, text=True,
                         check=True).stdout
    for word in ("native", "torchscript", "compile", "triton", "cuda", "float64 reference", "profile",
                 "select"):
        assert word in out
    out = subprocess.run([sys.executable, "-m", "equivalence", "compare", "--help"], capture_output=True,
                         text=True, check=True).stdout
    assert "max-autotune-no-cudagraphs" in out and "minutes" in out  # the option and its cost


def test_explain_prints_the_components_ops(capsys):
    assert main(["explain", "--component", "layer_norm", "--level", "native"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "aten" in out and ("mean" in out or "rsqrt" in out)


def test_bench_without_gpu_points_to_the_recorded_results(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("on a GPU this runs the real benchmark")
    assert main(["bench", "--component", "layer_norm", "--out", str(tmp_path)]) == EXIT_NOTHING_RAN
    out = capsys.readouterr().out
    assert "GPU figures" in out and "reports/h100-bench.json" in out
    assert not (tmp_path / "bench.json").exists()  # no empty report
