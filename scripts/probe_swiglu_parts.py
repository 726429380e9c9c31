"""Where Level 4's SwiGLU forward loses to cuBLAS at Llama 3 8B's width (the bench: 0.82x at
hidden 14336 against 0.93x at Llama 2 7B's 11008, M = 4096, K = 4096, bf16): each launch of
the forward timed alone beside the library's, at both widths, with the tile each one ran.

    python scripts/probe_swiglu_parts.py OUT.json

Rows per width: the fused gate+up launch (triton_kernels.swiglu_mlp.gate_up) against cuBLAS's
two GEMMs plus eager silu(g) * u, and against one cuBLAS GEMM of the concatenated weight
(the same FLOPs in one call: what the fused launch could reach); the down projection
(triton_kernels.gemm.gemm) against cuBLAS's. Kernel time: triton.testing.do_bench (L2
flushed between calls), median of its runs. Then the whole forward at Llama 3 8B as the
bench times it, eager and Levels 4 and 5 in rounds (see _interleaved_rounds). Needs a CUDA GPU.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    import triton
    from triton.testing import do_bench

    from triton_kernels import gemm as G
    from triton_kernels import swiglu_mlp as S

    out = Path(sys.argv[1])
    dev = torch.device("cuda")
    sms = G.sm_count(dev)
    rows = []
    for hidden in (11008, 14336):
        M, K, dt = 4096, 4096, torch.bfloat16
        torch.manual_seed(0)
        x = torch.randn(M, K, device=dev, dtype=dt)
        wg = torch.randn(hidden, K, device=dev, dtype=dt) / K ** 0.5
        wu = torch.randn(hidden, K, device=dev, dtype=dt) / K ** 0.5
        wd = torch.randn(K, hidden, device=dev, dtype=dt) / hidden ** 0.5
        w_cat = torch.cat([wg, wu])
        act, _, _ = S.gate_up(x, wg, wu)
        ref = torch.nn.functional.silu(x @ wg.t()) * (x @ wu.t())
        err = ((act.float() - ref.float()).norm() / ref.float().norm()).item()

        def timed(name, fn, flops, tile=None):
            ms = do_bench(fn, warmup=25, rep=200, return_mode="median")
            rows.append({"hidden": hidden, "what": name, "ms": round(ms, 4),
                         "tflops": round(flops / ms / 1e9, 1), "tile": tile})
            print(f"hidden {hidden:6d} {name:44s} {ms:7.3f} ms {flops / ms / 1e9:6.0f} TFLOP/s"
                  + (f"  {tile}" if tile else ""), flush=True)

        f_up, f_down = 2 * M * K * 2 * hidden, 2 * M * hidden * K
        timed("gate+up: Level 4 fused launch", lambda: S.gate_up(x, wg, wu), f_up,
              S.size_rule(M, hidden, K, S.GATE_UP, sms))
        timed("gate+up: cuBLAS x2 + silu * mul",
              lambda: torch.nn.functional.silu(x @ wg.t()) * (x @ wu.t()), f_up)
        timed("gate+up: one cuBLAS GEMM of [W_gate; W_up]", lambda: x @ w_cat.t(), f_up)
        timed("down: Level 4 gemm", lambda: G.gemm(act, wd.t(), check=False), f_down,
              G._as_dict(G.tile_for(M, K, sms)))
        timed("down: cuBLAS", lambda: act @ wd.t(), f_down)
        rows.append({"hidden": hidden, "what": "gate+up relative error vs eager", "value": err})
    rounds = _interleaved_rounds(dev)
    out.write_text(json.dumps({"rounds": rounds, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                               "triton": triton.__version__, "sms": sms,
                               "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                               "command": "python scripts/probe_swiglu_parts.py OUT.json",
                               "rows": rows}, indent=1, default=str))


def _interleaved_rounds(dev) -> list:
    """The bench's forward figure again (levels' contract functions under no_grad), eager,
    Level 4 and Level 5 timed in rotated rounds with the SM clock read before each side
    (equivalence/commands/bench/goals.py figures_in_rounds, which `levels bench --component
    swiglu_mlp` now uses too): one record per side and round."""
    import levels
    from equivalence import cards
    from equivalence.commands.bench.goals import figures_in_rounds

    card = cards.get("swiglu_mlp")
    shape = next(s for s in card.model_shapes if s.name == "llama3-8b-train")
    args = card.module.make_args(dict(shape.sizes, rows=(1, 4096)), torch.bfloat16, dev,
                                 torch.Generator().manual_seed(0))
    tensors = [args[n] for n in ("x", "w_gate", "w_up", "w_down")]

    def forward(fn):
        def go():
            with torch.no_grad():
                fn(*tensors)
        return go

    specs = [dict(component="swiglu_mlp", name="forward llama3-8b-train", level=name,
                  dtype=torch.bfloat16, shape={}, fn=forward(levels.get(name).swiglu_mlp))
             for name in ("native", "triton", "cuda")]
    out = []
    for fig in figures_in_rounds(specs, dev):
        for r, (ms, mhz) in enumerate(zip(fig.extra["round_ms"], fig.extra["sm_mhz"])):
            out.append({"round": r, "side": fig.level, "ms": round(ms, 4), "sm_mhz_before": mhz})
            print(f"round {r} {fig.level:7s} {ms:7.3f} ms  SM {mhz} MHz", flush=True)
    return out


if __name__ == "__main__":
    main()
