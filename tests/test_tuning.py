"""triton_kernels/tuning.py: LEVELS_TRITON_AUTOTUNE=1 tunes once per shape bucket, on disk.

On a CPU with a stand-in benchmark (the interpreter cannot time kernels): buckets, the
file a later process reads, what happens to a bad file, a failing candidate. On a GPU
(`-m gpu`): the MLP and conv_bn autotuned through the harness, a second shape of the same
bucket launched without benchmarking.
"""

from __future__ import annotations

import json

import pytest
import torch

import levels  # noqa: F401 - switches Triton's interpreter on where there is no GPU
from triton_kernels import tuning

A = dict(BLOCK_M=128, BLOCK_N=128, num_warps=8)
B = dict(BLOCK_M=64, BLOCK_N=64, num_warps=4)
C = dict(BLOCK_M=128, BLOCK_N=256, num_warps=8)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LEVELS_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tuning, "_MEMORY", {})
    monkeypatch.setattr(tuning, "_WARNED", [])
    monkeypatch.setattr(tuning, "_section", lambda device: "Test GPU | triton 9.9")
    return tmp_path / tuning.FILE


def _bench(times, log):
    def bench(cand):
        log.append(cand)
        t = times[json.dumps(cand, sort_keys=True)]
        if isinstance(t, Exception):
            raise t
        return t
    return bench


def _times(a, b, c):
    return {json.dumps(k, sort_keys=True): v for k, v in ((A, a), (B, b), (C, c))}


def test_buckets_and_layouts():
    assert [tuning.bucket(n) for n in (0, 1, 2, 3, 1000, 1024, 1025)] == [0, 1, 2, 4, 1024, 1024,
                                                                         2048]
    m = torch.zeros(6, 4)
    assert (tuning.layout(m), tuning.layout(m.t()), tuning.layout(m[:, ::2])) == \
        ("row", "col", "strided")


def test_a_bucket_is_measured_once_then_read_by_a_later_process(cache, monkeypatch):
    log = []
    bench = _bench(_times(3.0, 1.0, 2.0), log)
    assert tuning.pick("gemm", ("bf16", 1024), [A, B, C], bench, "cuda") == B
    assert len(log) == 3
    assert tuning.pick("gemm", ("bf16", 1024), [A, B, C], bench, "cuda") == B  # remembered
    assert len(log) == 3
    saved = json.loads(cache.read_text())["Test GPU | triton 9.9"]["gemm|bf16|1024"]
    assert saved["config"] == B and [c["ms"] for c in saved["candidates"]] == [3.0, 1.0, 2.0]
    monkeypatch.setattr(tuning, "_MEMORY", {})  # a new process: only the file is left
    assert tuning.pick("gemm", ("bf16", 1024), [A, B, C], bench, "cuda") == B
    assert len(log) == 3
    assert tuning.pick("gemm", ("bf16", 2048), [A, B, C], bench, "cuda") == B  # another bucket
    assert len(log) == 6
    monkeypatch.setattr(tuning, "_section", lambda device: "Other GPU | triton 9.9")
    tuning.pick("gemm", ("bf16", 1024), [A, B, C], bench, "cuda")  # another GPU: measured
    assert len(log) == 9
    data = json.loads(cache.read_text())  # both GPUs' entries kept in one file
    assert set(data) == {"Test GPU | triton 9.9", "Other GPU | triton 9.9"}


def test_an_entry_whose_winner_is_no_longer_a_candidate_is_measured_again(cache):
    log = []
    tuning.pick("conv_fwd", (1,), [A, B], _bench(_times(3.0, 1.0, 2.0), log), "cuda")
    assert tuning.pick("conv_fwd", (1,), [A, C], _bench(_times(3.0, 1.0, 2.0), log),
                       "cuda") == C
    assert len(log) == 4


def test_an_unreadable_file_is_said_and_rewritten(cache):
    cache.write_text("{not json")
    with pytest.warns(RuntimeWarning, match="tile cache .* is unreadable"):
        assert tuning.pick("gemm", (1,), [A, B], _bench(_times(1.0, 2.0, 0), []), "cuda") == A
    assert json.loads(cache.read_text())["Test GPU | triton 9.9"]["gemm|1"]["config"] == A


def test_a_failing_candidate_is_skipped_and_all_failing_raise(cache):
    boom = RuntimeError("out of resource: shared memory")
    assert tuning.pick("gemm", (1,), [A, B], _bench(_times(boom, 2.0, 0), []), "cuda") == B
    saved = json.loads(cache.read_text())["Test GPU | triton 9.9"]["gemm|1"]
    assert [c["ms"] for c in saved["candidates"]] == [None, 2.0]
    with pytest.raises(RuntimeError, match="shared memory"):
        tuning.pick("gemm", (2,), [A, B], _bench(_times(boom, boom, 0), []), "cuda")


# ------------------------------------------------------------------------------- GPU --

@pytest.mark.gpu
def test_gpu_autotuned_levels_pass_the_harness_and_a_bucket_is_timed_once(tmp_path, monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from equivalence.check import check_case

    monkeypatch.setenv("LEVELS_TRITON_AUTOTUNE", "1")
    monkeypatch.setenv("LEVELS_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tuning, "_MEMORY", {})
    timed = []
    real = tuning.benchmark
    monkeypatch.setattr(tuning, "benchmark", lambda fn: timed.append(1) or real(fn))
    for comp, size in (("mlp", dict(rows=(1000,), K=768, hidden=3072, N=768)),
                       ("conv_bn", dict(N=8, C_in=64, H=28, W=28, C_out=128, k=3, stride=1,
                                        padding=1))):
        for variant in (["default"] if comp == "mlp" else ["eval", "train"]):
            r = check_case(comp, "triton", torch.bfloat16, "cuda", size, variant, seed=5)
            assert r.passed, r.summary()
    entries = json.loads((tmp_path / tuning.FILE).read_text())
    (section,) = entries.values()
    assert any(k.startswith("gemm|") for k in section) and any(k.startswith("conv_fwd|")
                                                               for k in section)
    before = len(timed)
    import levels.triton as L4
    x = torch.randn(1020, 768, device="cuda", dtype=torch.bfloat16)  # M 1000 -> 1020: same bucket
    w1 = torch.randn(3072, 768, device="cuda", dtype=torch.bfloat16) * 0.03
    w2 = torch.randn(768, 3072, device="cuda", dtype=torch.bfloat16) * 0.03
    with torch.no_grad():
        L4.mlp(x, w1, torch.zeros(3072, device="cuda", dtype=torch.bfloat16), w2,
               torch.zeros(768, device="cuda", dtype=torch.bfloat16))
    assert len(timed) == before  # no candidate timed: the bucket's winner was launched
