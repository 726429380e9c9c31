"""Host time of Level 5 layer_norm's forward call at small misaligned shapes: the phased
forward's rule (layer_norm.cu fwd_v4_ph_pays: two plans and two cached occupancy answers per
call) against the element loads forced (path 4, which skips the rule), version 4, and the
default (version 0) beside them, at an aligned width for scale.

    python scripts/probe_ln_host.py OUT.json

Each figure: wall time per call over 2000 back-to-back calls (the GPU work of these sizes is
a few microseconds, so the host sets the pace), median of 5 repetitions, CPU-side only."""

from __future__ import annotations

import json
import sys

import torch

from cuda_kernels import layer_norm as ln
from equivalence.commands.host_probe import _host_us

CALLS, REPS = 2000, 5


def per_call_us(fn) -> float:
    # host_probe's timer: CALLS calls back to back a batch, REPS batches, the median
    return _host_us(fn, batch=CALLS, reps=REPS)


def main(out: str) -> None:
    rows = []
    for M, N in ((8, 1023), (8, 1024), (64, 6145), (64, 6144)):
        x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(N, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(N, device="cuda", dtype=torch.bfloat16)
        row = dict(M=M, N=N)
        for name, kw in (("default", {}), ("v4 rule", dict(version=4)),
                         ("v4 element loads", dict(version=4, path=4))):
            row[name] = per_call_us(lambda kw=kw: ln.layer_norm(x, w, b, 1e-5, **kw))
        rows.append(row)
        print(f"{M}x{N} bf16: " + ", ".join(f"{k} {v:.1f} us" for k, v in row.items()
                                            if k not in ("M", "N")), flush=True)
    with open(out, "w") as f:
        json.dump(dict(command="python scripts/probe_ln_host.py OUT.json",
                       gpu=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows), f,
                  indent=1)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python scripts/probe_ln_host.py OUT.json")
    main(sys.argv[1])
