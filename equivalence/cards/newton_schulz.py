"""Newton-Schulz orthogonalization as the Muon optimizer runs it (Jordan et al. 2024): five
quintic iterations X <- aX + (bA + cA^2)X, A = XX^T, from X0 = G / (||G||_F + eps), on G's
transpose when G is tall, in G's dtype (Muon passes bfloat16). It maps G = U S V^T to about
U V^T: every singular value not tiny against ||G||_F lands in a band around 1.

    newton_schulz(G, steps=5, coefficients=(3.4445, -4.7750, 2.0315), eps=1e-7)
    G: (rows, cols), or (batch, rows, cols): a batch of same-shape matrices, each
       orthogonalized on its own (its own norm; the batch iterated on G.mT when tall)

Variants: "default" is one matrix; "batched" is a batch of BATCH of them (what Muon sends
for the parameters of one shape: levels.optim.Muon groups them so), in both layouts (the
strided one: each matrix's rows padded, so the batch stride is no multiple of rows * cols).
A model shape may set its own batch (`batch` in its sizes: the layers of a model).

Forward only (DIFFERENTIABLE = ()): Muon orthogonalizes gradients under no_grad, and the
contract refuses a G that requires grad. Two entries of this card go beyond the others':
TOLERANCE, because the iteration compounds its roundings, and `properties`, which checks
that a level's output really is what Muon wants (its singular values in the band)."""

import torch

from . import Shape, infer, nbytes, randn, shrink

COEFFICIENTS = (3.4445, -4.7750, 2.0315)
SIZES = {
    "tiny": dict(rows=40, cols=24),  # tall: the transposed iteration; no multiple of 16
    "small": dict(rows=96, cols=160),
    "bench": dict(rows=4096, cols=4096),
}
VARIANTS = {"default": {}, "batched": {}}
# The batch is a shape, not an argument: the variant adds it to every preset (make_args reads
# it; a model shape's own `batch` wins over BATCH).
BATCH = 3
VARIANT_SHAPES = {"batched": dict(batched=True)}
OUTPUTS = ("out",)
DIFFERENTIABLE = ()  # forward only: see the module doc
MUTATED: dict = {}
STRIDED = {"G": "row_padded"}  # a weight's gradient sliced out of a fused (qkv) buffer
SCALING_DIM = "cols"
GRAPH_INPUTS = ("G",)

# The float64 iteration against the same iteration in G's dtype: each step rounds A, B and X
# to that dtype (15 roundings in five steps), and a direction whose singular value is still
# small grows 3.4445x a step (p'(0) = a), its rounding error with it. Level 1 measured on the
# CPU (shapes 16x16 to 256x256, five seeds each): worst relative error 9.6u in bfloat16
# (3.74e-2) and 8.9u in float16 (4.35e-3), where one GEMM stays within the house's 8u; float32
# 1.5e-6 (its bound holds: 1e-5). The bound here is 16u for the 16-bit dtypes: twice the
# house's, room for a GPU's other summation order; a wrong coefficient, a missed transpose
# or a skipped step moves the result by 10% or more (tests/test_planted_bugs.py).
TOLERANCE = {torch.float16: 8e-3, torch.bfloat16: 6.2e-2}

# Muon's band: the quintic maps every normalized singular value in [2e-3, 1] into
# [0.68, 1.21] after five steps (exact arithmetic); a level's output, rounded, must keep them
# in [0.6, 1.3], and no singular value may leave [0, 1.3].
BAND = (0.6, 1.3)
CONVERGED_FROM = 2e-3


def _batch(shape) -> tuple:
    return (shape.get("batch", BATCH),) if shape.get("batched") else ()


def make_args(shape, dtype, device, generator):
    return dict(G=randn((*_batch(shape), shape["rows"], shape["cols"]), generator, dtype, device),
                steps=5, coefficients=COEFFICIENTS, eps=1e-7)


def reference(G, steps=5, coefficients=COEFFICIENTS, eps=1e-7):
    # a batch is the same math matrix by matrix: batched matmuls, a norm per matrix
    a, b, c = coefficients
    tall = G.shape[-2] > G.shape[-1]
    X = G.mT if tall else G
    X = X / (torch.sqrt((X * X).sum((-2, -1), keepdim=True)) + eps)
    for _ in range(steps):
        gram = X @ X.mT
        X = a * X + (b * gram + c * gram @ gram) @ X
    return (X.mT if tall else X,)


def properties(args, outputs):
    """The singular values of the level's output in Muon's band (with the default steps and
    coefficients, for which the band is known): as many at or above BAND[0] as G has
    normalized singular values at or above CONVERGED_FROM, and none above BAND[1]."""
    if args.get("steps", 5) != 5 or tuple(args.get("coefficients", COEFFICIENTS)) != COEFFICIENTS:
        return []
    out = outputs[0]
    if not isinstance(out, torch.Tensor) or not torch.isfinite(out).all():
        return [("singular values in Muon's band", False, "the output is not finite")]
    G = args["G"].detach().to("cpu", torch.float64)
    if G.numel() == 0:
        return []
    # per matrix of a batch (a 2-D G is a batch of one): its own norm, its own count
    got = torch.linalg.svdvals(out.detach().to("cpu", torch.float64)).reshape(-1, min(G.shape[-2:]))
    norms = torch.linalg.matrix_norm(G).reshape(-1, 1)
    normalized = torch.linalg.svdvals(G).reshape(got.shape) / (norms + args.get("eps", 1e-7))
    expected = (normalized >= CONVERGED_FROM).sum(-1)
    reached = (got >= BAND[0]).sum(-1)
    ok = bool((reached >= expected).all()) and float(got.max()) <= BAND[1]
    reached, expected = int(reached.sum()), int(expected.sum())
    problem = "" if ok else (f"{reached} singular values >= {BAND[0]} (expected {expected}), "
                             f"largest {float(got.max()):.3f} (at most {BAND[1]})")
    return [(f"singular values in [{BAND[0]}, {BAND[1]}]", ok, problem)]


def _gemm_flops(M: int, N: int, steps: int) -> int:
    # per step X X^T (2 m^2 n), A A (2 m^3), B X (2 m^2 n), with m <= n: the FLOPs of the
    # GEMMs as a library runs them. Levels 4 and 5 skip half of the first two (symmetry),
    # so their TFLOP/s is "effective": the library's work done per second.
    m, n = min(M, N), max(M, N)
    return steps * (4 * m * m * n + 2 * m ** 3)


def flops(args):
    G = args["G"]
    batch = G.shape[0] if G.dim() == 3 else 1
    return {"fwd": batch * _gemm_flops(*G.shape[-2:], args.get("steps", 5)), "bwd": 0}


def min_bytes(args):
    # read G, write the result; the Gram matrices and iterates need not leave the chip
    return {"fwd": 2 * nbytes(args["G"]), "bwd": 0}


# ---------------------------------------------------------------------------------------
# The model-shape suite: the 2-D parameters of a transformer, each orthogonalized once per
# optimizer step (Muon; embeddings and the head go to AdamW). Weights as nn.Linear stores
# them: (out_features, in_features). The "-layers" shapes are the batched calls Muon makes:
# one per shape, all the model's layers at once (GPT-2 small's 12 blocks; Llama 2 7B's
# q/k/v/o of one block). The whole parameter list, every shape, grouped calls against a
# loop of one call per matrix, is `levels bench --component newton_schulz`'s figure.
# ---------------------------------------------------------------------------------------

GPT2_SMALL = ("GPT-2 small (HF GPT2Config: n_embd=768, n_inner=3072; c_attn projects to "
              "3 x 768 = 2304)")
LLAMA2_7B = ("Llama 2 7B (HF meta-llama/Llama-2-7b: hidden_size=4096, intermediate_size=11008)")

MODEL_SHAPES = (
    Shape("gpt2-small-qkv", "GPT-2 small", GPT2_SMALL + "; c_attn's weight",
          dict(rows=2304, cols=768), infer()),
    Shape("gpt2-small-proj", "GPT-2 small", GPT2_SMALL + "; attention's c_proj",
          dict(rows=768, cols=768), infer()),
    Shape("gpt2-small-fc", "GPT-2 small", GPT2_SMALL + "; the MLP's c_fc",
          dict(rows=3072, cols=768), infer()),
    Shape("llama2-7b-attn", "Llama 2 7B", LLAMA2_7B + "; q/k/v/o_proj", dict(rows=4096, cols=4096),
          infer()),
    Shape("llama2-7b-up", "Llama 2 7B", LLAMA2_7B + "; gate_proj and up_proj",
          dict(rows=11008, cols=4096), infer()),
    Shape("llama2-7b-down", "Llama 2 7B", LLAMA2_7B + "; down_proj",
          dict(rows=4096, cols=11008), infer()),
    Shape("gpt2-small-qkv-layers", "GPT-2 small", GPT2_SMALL + "; c_attn's weight of all 12 "
          "blocks, one batched call", dict(batch=12, rows=2304, cols=768), infer("batched")),
    Shape("gpt2-small-fc-layers", "GPT-2 small", GPT2_SMALL + "; the MLP's c_fc of all 12 "
          "blocks, one batched call", dict(batch=12, rows=3072, cols=768), infer("batched")),
    Shape("llama2-7b-attn-block", "Llama 2 7B", LLAMA2_7B + "; q/k/v/o_proj of one block, one "
          "batched call", dict(batch=4, rows=4096, cols=4096), infer("batched")),
)


def tiny_twin(sizes):
    twin = dict(rows=shrink(sizes["rows"], 32, 8), cols=shrink(sizes["cols"], 32, 8))
    if "batch" in sizes:
        twin["batch"] = min(sizes["batch"], 3)
    return twin


def describe(sizes, variants):
    batch = f"{sizes.get('batch', BATCH)} x " if "batched" in variants else ""
    return f"G {batch}{sizes['rows']}x{sizes['cols']}"


def _muon_reference(G, steps, coefficients, eps):
    """What Muon's own code runs (Keller Jordan's zeropower_via_newtonschulz5, 2024-12):
    addmm with alpha/beta, so cuBLAS applies b*A and a*X in its epilogue: two of Level 1's
    pointwise passes gone, no symmetry used."""
    a, b, c = coefficients
    tall = G.shape[-2] > G.shape[-1]
    X = G.mT if tall else G
    X = X / (torch.linalg.matrix_norm(X, keepdim=True) + eps)
    addmm = torch.baddbmm if X.dim() == 3 else torch.addmm  # a batch: its batched twin
    for _ in range(steps):
        A = X @ X.mT
        B = addmm(A, A, A, beta=b, alpha=c)
        X = addmm(X, B, X, beta=a)
    return X.mT if tall else X


def libraries(device, dtype):
    from ..calls import Impl

    def prepare(args):
        G = args["G"]
        return (lambda: [_muon_reference(G, args["steps"], args["coefficients"], args["eps"])]), [G]

    return [Impl("Muon's addmm iteration", "library", prepare)]

