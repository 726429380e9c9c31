"""How close is close enough: one relative-error bound per dtype, and why.

The error measured is ||level - ref|| / ||ref|| over a whole tensor, against a float64
reference evaluated on the very same (already rounded) inputs. So the bound only has to
absorb rounding *inside* the computation, which scales with the format's unit roundoff u
(half the gap between 1 and the next representable number):

  dtype     significant bits   u          bound     why this much
  float32   24                 6.0e-08    1e-05     reductions of up to ~16k terms in any
                                                    order (tiles, split-K, trees) grow the
                                                    error like sqrt(K)*u to K*u
  tf32      11 (inputs only)   4.9e-04    4e-03     8u: operands of every dot product are
                                                    rounded to 11 bits, accumulation is fp32
  float16   11                 4.9e-04    4e-03     8u
  bfloat16   8                 3.9e-03    3.1e-02   8u

Measured for Level 1 on the CPU (fresh seeds, tiny and small presets): worst float32 error
1.5e-6, worst float16 1.0e-3 (2u), worst bfloat16 7.8e-3 (2u, the LSTM's grad w_hh after
16 steps). Merely *storing* a correct result in a 16-bit format costs about u/sqrt(3).
8u leaves room for a different but legitimate order of operations, and is far below what
any real bug does: a wrong scale, a dropped bias, a transposed gate or a shifted mask all
move the result by 10% or more (tests/test_planted_bugs.py proves they are caught).

These bounds are never loosened to make a level pass. A level that computes fp32 matmuls
in TF32 must declare it (`uses_tf32`), and gets the TF32 bound only there.
"""

from __future__ import annotations

import torch

BOUNDS = {
    torch.float32: 1e-5,
    "tf32": 4e-3,
    torch.float16: 4e-3,
    torch.bfloat16: 3.1e-2,
}


def tolerance(dtype: torch.dtype, tf32: bool = False) -> float:
    if tf32 and dtype == torch.float32:
        return BOUNDS["tf32"]
    if dtype not in BOUNDS:
        raise ValueError(f"argument 'dtype' must be float32, float16 or bfloat16; got {dtype}")
    return BOUNDS[dtype]
