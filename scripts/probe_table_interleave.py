"""Does `levels train`'s interleaving (every run's step i before any run's step i + 1) change
a table, and does Level 4's conv_bn validate again during training? The CNN's table at the gpu
preset, interleaved (Level 4 beside torch) and, with --alone, each run in a table of its own;
each row counts the calls that missed levels.triton's conv_bn Plans table (a miss validates
the call again).

    python scripts/probe_table_interleave.py OUT.json [--steps 60] [--repeats 2] [--alone]

Found with it (reports/amp-host-path/): before conv_bn's Plans key stopped holding every
argument's address, 14-16% of the calls under --amp bf16 missed, every step of every table
(x is new memory each step, and so is each weight autocast casts); now only each new
model's first steps do. Interleaved and alone gave the same ratios within the host's spread.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def count_conv_bn_builds() -> list:
    """[n]: n counts the calls that levels.triton's conv_bn validates anew from now on (the
    misses of its Plans table)."""
    import levels.triton as level4

    builds = [0]
    build = level4._CONV_BN.build

    def counted(*args):
        builds[0] += 1
        return build(*args)

    level4._CONV_BN.build = counted
    return builds


def environment() -> dict:
    return {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "command": " ".join(sys.argv)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--alone", action="store_true", help="also each run in a table of its own")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("probe_table_interleave.py: needs a CUDA GPU (the gpu preset's CNN); the "
                 "committed runs are under reports/amp-host-path/")
    from equivalence.commands.training import train

    builds = count_conv_bn_builds()
    rows = {}

    def table(tag, level_names, baselines, amp):
        before, t0 = builds[0], time.time()
        report = train("cnn", level_names, baselines, "gpu", steps=a.steps, amp=amp)
        row = {"wall_s": round(time.time() - t0, 1), "conv_bn_plan_builds": builds[0] - before,
               "calls": 9 * a.steps * len(level_names)}
        for r in report["runs"]:
            warm = r["step_s"][3:]
            q = statistics.quantiles(warm, n=5)
            row[r["name"]] = {"median_ms": round(statistics.median(warm) * 1e3, 3),
                              "p20_p80_ms": [round(q[0] * 1e3, 2), round(q[3] * 1e3, 2)]}
        rows[tag] = row
        print(tag, json.dumps(row), flush=True)

    for rep in range(a.repeats):
        for amp in ("bf16", None):
            name = amp or "eager"
            table(f"{name}-interleaved-{rep}", ["triton"], ["torch"], amp)
            if a.alone:
                table(f"{name}-triton-alone-{rep}", ["triton"], [], amp)
                table(f"{name}-torch-alone-{rep}", [], ["torch"], amp)
    Path(a.out).write_text(json.dumps({"environment": environment(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
