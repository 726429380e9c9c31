"""The `levels` command line: exit codes, tables, and the files `compare` writes."""

import json
import subprocess
import sys

import pytest

import levels.native as native
from equivalence.cli import EXIT_FAILED, EXIT_NOTHING_RAN, EXIT_OK, EXIT_USAGE, main


def test_check_passes_with_exit_0(capsys):
    assert main(["check", "--level", "native", "--component", "layer_norm,mlp"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "layer_norm" in out and "bfloat16" in out and "4 passed, 0 failed" in out


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
    [row] = data["results"]
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
    assert rows["mlp", "cuda"]["status"] == "skip" and "not implemented" in rows["mlp", "cuda"]["reason"]
    assert len(rows["conv_bn", "native"]["checks"]) == 2  # eval and train
    if rows["mlp", "triton"]["status"] == "untimed":  # the interpreter: checked, never timed
        assert rows["mlp", "triton"]["check"] == "pass" and rows["mlp", "triton"]["fwd"] is None
    assert report["environment"]["torch"]
    png = (tmp_path / "compare.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert "compare.json" in capsys.readouterr().out


def test_agree_prints_matrix(capsys):
    assert main(["agree", "--component", "attention", "--variant", "causal"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "float64 reference" in out and "native" in out


def test_help_teaches_the_levels():
    out = subprocess.run([sys.executable, "-m", "equivalence", "--help"], capture_output=True, text=True,
                         check=True).stdout
    for word in ("native", "torchscript", "compile", "triton", "cuda", "float64 reference"):
        assert word in out


def test_explain_prints_the_components_ops(capsys):
    assert main(["explain", "--component", "layer_norm", "--level", "native"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "aten" in out and ("mean" in out or "rsqrt" in out)


def test_bench_without_gpu_says_why(tmp_path, capsys):
    import torch
    if torch.cuda.is_available():
        pytest.skip("on a GPU this runs the real benchmark")
    assert main(["bench", "--component", "layer_norm", "--out", str(tmp_path)]) == EXIT_NOTHING_RAN
    assert "needs a CUDA GPU" in capsys.readouterr().out
    assert json.loads((tmp_path / "bench.json").read_text())["skipped"]["layer_norm"]
