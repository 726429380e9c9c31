"""Level 4 (Triton) attention and LSTM on the GPU, in one call: correctness, then speed.

    PYTHONPATH=. python scripts/device_triton_attention_lstm.py [--sweep] [--skip-checks]

1. smoke: the persistent LSTM (grid barrier) in a subprocess with a timeout, so that a
   deadlock cannot eat the whole call; if it fails, the rest runs in step mode, in a child
   process started with LSTM_TRITON_MODE=step in its environment (the kernels read it once,
   at import; nothing here writes os.environ).
2. the harness (equivalence.check) for attention and lstm at fp32/fp16/bf16, tiny+small,
   while `pytest -m gpu tests/test_triton_attention.py tests/test_triton_lstm.py` runs in parallel (compiles are CPU-bound).
3. equivalence.commands.bench.goals.run(["attention", "lstm"]): the figures of the speed goals.
4. --sweep: a few block shapes of the attention kernels and both LSTM recurrence modes,
   each passed to the launcher as an argument (config=, backward_config=, mode=, num_warps=).
Writes $OUT/device-triton-attention-lstm.json (or reports/device-triton-attention-lstm-local.json) and prints a summary last.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

SMOKE = """
import levels.triton, torch
from equivalence.check import check
for r in check('lstm', 'triton', dtype='float32', device='cuda', size='bench', seed=1):
    print('SMOKE', r.status, r.reason, r.worst)
    assert r.status == 'pass'
"""


def log(*a):
    print(*a, flush=True)


def smoke_persistent(env) -> dict:
    start = time.time()
    try:
        p = subprocess.run([sys.executable, "-c", SMOKE], env=env, capture_output=True, text=True,
                           timeout=75)
        ok, tail = p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    except subprocess.TimeoutExpired as exc:
        ok, tail = False, f"TIMEOUT (deadlock?) {exc}"
    return dict(ok=ok, seconds=round(time.time() - start, 1), tail=tail)


DEADLINE = [float("inf")]  # time.time() after which the sweep stops starting new cases


def late() -> bool:
    return time.time() > DEADLINE[0]


def sweep(device, persistent_ok: bool, attention: bool = True) -> list[dict]:
    import torch

    import levels
    import triton_kernels.attention as A
    import triton_kernels.lstm as LS
    from equivalence import cards
    from equivalence.timing import time_fn

    rows = []
    B, H, N, D = 4, 16, 4096, 128
    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn((B, H, N, D), generator=g).to(device=device, dtype=torch.bfloat16)
                   for _ in range(4))
    fwd_cfgs = [dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3),
                dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3),
                dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=4),
                dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=2)]
    bwd_cfgs = [dict(BLOCK_M=32, BLOCK_N=128, num_warps=8, num_stages=3),
                dict(BLOCK_M=32, BLOCK_N=128, num_warps=4, num_stages=3),
                dict(BLOCK_M=64, BLOCK_N=128, num_warps=8, num_stages=3),
                dict(BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=3)]
    for causal in ((False, True) if attention else ()):
        flops = 4 * B * H * N * N * D // (2 if causal else 1)
        for cfg in fwd_cfgs:
            if late():
                break
            try:
                with torch.no_grad():
                    t = time_fn(lambda: A.attention(q, k, v, causal, D ** -0.5, config=cfg), device,
                                min_time_s=0.2)
                rows.append(dict(what="attn fwd", causal=causal, cfg=cfg, ms=t.median_ms,
                                 tflops=flops / t.median_ms / 1e9))
            except Exception as exc:  # noqa: BLE001 - e.g. out of shared memory: record, go on
                rows.append(dict(what="attn fwd", causal=causal, cfg=cfg, error=repr(exc)[:300]))
            log(rows[-1])
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        for cfg in bwd_cfgs:
            if late():
                break
            try:
                out = A.attention(*leaves, causal, D ** -0.5, backward_config=cfg)
                t = time_fn(lambda: torch.autograd.grad(out, leaves, do, retain_graph=True), device,
                            min_time_s=0.2)
                rows.append(dict(what="attn bwd", causal=causal, cfg=cfg, ms=t.median_ms,
                                 tflops=2.5 * flops / t.median_ms / 1e9))
            except Exception as exc:  # noqa: BLE001
                rows.append(dict(what="attn bwd", causal=causal, cfg=cfg, error=repr(exc)[:300]))
            log(rows[-1])
        out = leaves = None  # the last backward's graph, freed before the next shapes

    spec = cards.get("lstm")
    levels.get("triton")  # Level 4 is set up (the card's tensors need no validation)
    for size in ("bench", "bench-large"):
        for dtype in (torch.float32, torch.bfloat16):
            args = spec.case(size, "default", dtype, device, seed=0).args
            if late():
                break
            modes = ("persistent", "step") if persistent_ok else ("step",)
            for mode in modes:
                for warps in (4, 8):
                    try:
                        with torch.no_grad():
                            t = time_fn(lambda: LS.lstm(**args, mode=mode, num_warps=warps), device,
                                        min_time_s=0.2)
                        rows.append(dict(what="lstm fwd", size=size, dtype=str(dtype), mode=mode,
                                         warps=warps, ms=t.median_ms))
                    except Exception as exc:  # noqa: BLE001
                        rows.append(dict(what="lstm fwd", size=size, dtype=str(dtype), mode=mode,
                                         warps=warps, error=repr(exc)[:300]))
                    log(rows[-1])
            # Backward (fwd + bwd of one call), both modes, for the record.
            leaves = {n: (t.detach().requires_grad_() if n in spec.differentiable else t)
                      for n, t in args.items()}
            for mode in modes:
                def fwd_bwd(mode=mode):
                    out, (h, c) = LS.lstm(**leaves, mode=mode)
                    torch.autograd.grad([out], [leaves[n] for n in spec.differentiable],
                                        [torch.ones_like(out)])
                try:
                    t = time_fn(fwd_bwd, device, min_time_s=0.2)
                    rows.append(dict(what="lstm fwd+bwd", size=size, dtype=str(dtype), mode=mode,
                                     ms=t.median_ms))
                except Exception as exc:  # noqa: BLE001
                    rows.append(dict(what="lstm fwd+bwd", size=size, dtype=str(dtype), mode=mode,
                                     error=repr(exc)[:300]))
                log(rows[-1])
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--sweep-lstm", action="store_true", help="only the LSTM part of the sweep")
    ap.add_argument("--skip-checks", action="store_true")
    ap.add_argument("--skip-bench", action="store_true")
    ap.add_argument("--deadline", type=float, default=1e9, help="seconds; the sweep stops after")
    # set by this script on itself: the rest, in step mode, after a failed smoke test
    ap.add_argument("--after-failed-smoke", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    DEADLINE[0] = time.time() + args.deadline
    out_dir = Path(os.environ.get("OUT") or "reports")
    out_dir.mkdir(parents=True, exist_ok=True)
    result: dict = {}
    env = dict(os.environ, PYTHONPATH=os.getcwd(), PYTHONUNBUFFERED="1")

    report = out_dir / "device-triton-attention-lstm.json"

    def save():
        report.write_text(json.dumps(result, indent=1, default=str))

    t0 = time.time()
    if args.after_failed_smoke:  # the parent's smoke result is in the report already
        result.update(json.loads(report.read_text()))
    else:
        result["smoke_persistent_lstm"] = smoke_persistent(env)
        log("smoke:", result["smoke_persistent_lstm"])
    if not result["smoke_persistent_lstm"]["ok"] and not args.after_failed_smoke:
        result["note"] = "persistent LSTM failed its smoke test: everything below ran in step mode"
        save()
        # triton_kernels.lstm reads LSTM_TRITON_MODE once, at import: the rest runs in a
        # process of its own that has it in its environment (this one's is left alone).
        return subprocess.call([sys.executable, *sys.argv, "--after-failed-smoke"],
                               env=dict(env, LSTM_TRITON_MODE="step"))
    save()

    import torch  # after the mode is settled: triton_kernels.lstm reads it at import

    import levels.triton  # noqa: F401
    from equivalence import environment
    from equivalence.commands.bench import goals as bench
    from equivalence.check import check

    device = torch.device("cuda")
    result["environment"] = environment.describe(device)

    if not args.skip_checks:
        skip = [] if result["smoke_persistent_lstm"]["ok"] else ["-k", "not persistent"]
        py = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "-n", "6",
                               "tests/test_triton_attention.py", "tests/test_triton_lstm.py", *skip], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
        checks = []
        for comp in ("attention", "lstm"):
            for dtype in ("float32", "float16", "bfloat16"):
                for size in ("tiny", "small"):
                    for r in check(comp, "triton", dtype=dtype, device="cuda", size=size):
                        w = r.worst
                        checks.append(dict(component=comp, variant=r.variant, dtype=dtype, size=size,
                                           status=r.status, reason=r.reason, seed=r.seed,
                                           worst=(w.name, w.rel_err) if w else None,
                                           tolerance=r.tolerance))
                        log("check", comp, r.variant, dtype, size, r.status, r.reason,
                            (w.name, f"{w.rel_err:.2e}") if w else "")
        result["checks"] = checks
        try:
            out, _ = py.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            py.kill()
            out = "pytest TIMEOUT after 240 s\n" + py.communicate()[0]
        result["pytest_gpu"] = dict(returncode=py.returncode, tail=out[-4000:])
        log("pytest -m gpu:", py.returncode, out[-1500:])
        save()
    log(f"checks done at {time.time() - t0:.0f} s")

    if not args.skip_bench:
        result["bench"] = bench.run(["attention", "lstm"], device)
        save()
        log(f"bench done at {time.time() - t0:.0f} s")
    if args.sweep or args.sweep_lstm:
        result["sweep"] = sweep(device, result["smoke_persistent_lstm"]["ok"], attention=args.sweep)
        save()
        log(f"sweep done at {time.time() - t0:.0f} s")

    log("\n=== summary ===")
    if "checks" in result:
        bad = [c for c in result["checks"] if c["status"] != "pass"]
        log(f"harness: {len(result['checks']) - len(bad)}/{len(result['checks'])} pass", bad)
        log("pytest -m gpu rc", result["pytest_gpu"]["returncode"],
            result["pytest_gpu"]["tail"].strip().splitlines()[-1:])
    for f in result.get("bench", {}).get("figures", []):
        ratio = f"{f['ratio']:.2f}" if f["ratio"] else "-"
        log(f"{f['name']:45s} {f['ms']:8.3f} ms {f['tflops'] or 0:7.1f} TF/s vs {f['baseline']}: "
            f"{f['baseline_ms'] or 0:8.3f} ms ratio {ratio} goal {f['goal']} met {f['met']}")
    log("skipped:", result.get("bench", {}).get("skipped"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
