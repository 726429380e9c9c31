"""One Level 4 weight gradient (conv_wgrad_kernel, with its finish kernel) at the CNN's
block1 convolution, 3x3 64 -> 64 (128 images of 64x64, bf16, channels_last), for ncu:

    ncu --clock-control none --kernel-name regex:conv_wgrad_kernel --launch-skip 2 \\
        --launch-count 1 --section SpeedOfLight --section WarpStateStats \\
        --section MemoryWorkloadAnalysis --section InstructionStats --section Occupancy \\
        --section LaunchStats python scripts/probe_ncu_wgrad.py

Why this one: it is the CNN's largest weight gradient, 1.8x cuDNN's (scripts/sweep_conv_wgrad.py),
and the weight gradient is most of what Level 4's backward loses to torch's on the GPU
(reports/conv-bn-layout-and-suite/, 10-ncu-wgrad-64x64.txt: one block per SM, 12.5% occupancy
by its 123 KB of shared memory, 4.2 cycles per issued instruction). Needs a CUDA GPU.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from triton_kernels import conv_bn as C  # noqa: E402


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("probe_ncu_wgrad.py: needs a CUDA GPU (it runs Level 4's compiled kernel for ncu)")
    dev, dt = torch.device("cuda"), torch.bfloat16
    x = torch.randn(128, 64, 64, 64, device=dev, dtype=dt).contiguous(memory_format=torch.channels_last)
    w = torch.randn(64, 64, 3, 3, device=dev, dtype=dt) * 0.05
    s = C._dims(x, w, (1, 1), (1, 1))
    dy = torch.randn(128 * s["H_out"] * s["W_out"], 64, device=dev, dtype=dt)
    for _ in range(4):  # the first calls compile; ncu's --launch-skip passes them
        C.train_wgrad(dy, x, w, s, 3, 3)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
