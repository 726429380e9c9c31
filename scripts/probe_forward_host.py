"""Host time of a whole model's forward, eager and under torch.autocast, where it goes (cProfile
by cumulative and own time, torch.profiler's CPU operators) and how many calls missed Level
4's conv_bn Plans table: the CNN at batch 2, so that the GPU never holds the host back.

    python scripts/probe_forward_host.py OUT.json [--model cnn] [--runs triton,torch]

Found with it (reports/amp-host-path/): under autocast Level 4's CNN step made 43 casts
(aten::_to_copy) against torch's 25. The 18 more were autograd casting conv_bn's bfloat16
dgamma and dbeta to the float32 BatchNorm parameters; conv_bn now makes them in float32.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--model", default="cnn")
    ap.add_argument("--runs", default="triton,torch")
    ap.add_argument("--batch", type=int, default=2)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("probe_forward_host.py: needs a CUDA GPU (Level 4's host path replays on "
                 "one); the committed runs are under reports/amp-host-path/")
    import probe_model_host as P
    from probe_table_interleave import count_conv_bn_builds, environment
    from torch.profiler import ProfilerActivity, profile

    from equivalence.commands.steps import loss_of

    builds = count_conv_bn_builds()
    rows = {}
    for name in a.runs.split(","):
        for amp in (None, torch.bfloat16):
            tag = f"{name}-{'amp' if amp else 'eager'}"
            net, opt, step, batches, *_ = P.setup(a.model, name, amp, batch=a.batch)
            for i in range(20):
                step(*batches[i % len(batches)])
            torch.cuda.synchronize()

            def forward(i):
                x, y = batches[i % len(batches)]
                opt.zero_grad(set_to_none=True)
                with torch.autocast("cuda", dtype=amp or torch.float32, enabled=amp is not None):
                    return loss_of(net(x), y)

            before, us = builds[0], []
            for i in range(200):
                t0 = time.perf_counter()
                loss = forward(i)
                us.append((time.perf_counter() - t0) * 1e6)
                loss.backward()  # frees the graph, as a step does
                torch.cuda.synchronize()
            q = statistics.quantiles(us, n=5)
            row = {"forward_us_median": statistics.median(us), "forward_us_p20_p80": [q[0], q[3]],
                   "conv_bn_plan_builds_in_200": builds[0] - before}
            prof = cProfile.Profile()
            for i in range(50):
                prof.enable()
                loss = forward(i)
                prof.disable()
                loss.backward()
                torch.cuda.synchronize()
            for key, order, n in (("cprofile_cumulative_50_forwards", "cumulative", 45),
                                  ("cprofile_own_50_forwards", "tottime", 30)):
                text = io.StringIO()
                pstats.Stats(prof, stream=text).sort_stats(order).print_stats(n)
                row[key] = text.getvalue()
            with profile(activities=[ProfilerActivity.CPU]) as p:
                for i in range(20):
                    forward(i).backward()
                    torch.cuda.synchronize()
            row["cpu_operators_20_steps"] = p.key_averages().table(
                sort_by="self_cpu_time_total", row_limit=40)
            rows[tag] = row
            print(f"{tag:14s} forward {row['forward_us_median']:7.1f} us  "
                  f"plan builds {row['conv_bn_plan_builds_in_200']}", flush=True)
    Path(a.out).write_text(json.dumps({"environment": environment(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
