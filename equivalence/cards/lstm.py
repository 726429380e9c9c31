"""LSTM, one layer, batch_first, gates i, f, g, o, parameters laid out as nn.LSTM's."""

import json
from pathlib import Path

import torch

from . import Shape, infer, nbytes, randn, shrink, train, uniform

SIZES = {
    "tiny": dict(B=3, T=5, I=12, H=16),
    "small": dict(B=8, T=16, I=64, H=128),
    "bench": dict(B=8, T=64, I=256, H=512),
    "bench-large": dict(B=64, T=100, I=512, H=512),
}
VARIANTS = {"default": {}}
OUTPUTS = ("output", "h_T", "c_T")
DIFFERENTIABLE = ("x", "h0", "c0", "w_ih", "w_hh", "b_ih", "b_hh")
MUTATED: dict = {}
STRIDED = {"x": "time_major", "h0": "last_every_other", "c0": "last_every_other",
           "w_ih": "transposed", "w_hh": "transposed", "b_ih": "every_other", "b_hh": "every_other"}
SCALING_DIM = "B"  # the batch
GRAPH_INPUTS = ("x", "h0", "c0")
FUSED_ATEN = ("lstm", "_thnn_fused_lstm_cell", "_thnn_fused_lstm_cell_backward_impl")
NN_MODULES = ("LSTM",)
SUITE_GOAL = 1.0


def make_args(shape, dtype, device, generator):
    B, T, I, H = shape["B"], shape["T"], shape["I"], shape["H"]
    bound = H ** -0.5  # nn.LSTM's own initialization range
    return dict(x=randn((B, T, I), generator, dtype, device),
                h0=randn((1, B, H), generator, dtype, device, scale=0.5),
                c0=randn((1, B, H), generator, dtype, device, scale=0.5),
                w_ih=uniform((4 * H, I), generator, dtype, device, -bound, bound),
                w_hh=uniform((4 * H, H), generator, dtype, device, -bound, bound),
                b_ih=uniform((4 * H,), generator, dtype, device, -bound, bound),
                b_hh=uniform((4 * H,), generator, dtype, device, -bound, bound))


def _sigmoid(z):
    return 1.0 / (1.0 + torch.exp(-z))


def reference(x, h0, c0, w_ih, w_hh, b_ih, b_hh):
    H = w_hh.shape[1]
    h, c = h0[0], c0[0]
    hs = []
    for t in range(x.shape[1]):
        z = x[:, t] @ w_ih.T + b_ih + h @ w_hh.T + b_hh
        i, f, g, o = _sigmoid(z[:, :H]), _sigmoid(z[:, H:2 * H]), torch.tanh(z[:, 2 * H:3 * H]), \
            _sigmoid(z[:, 3 * H:])
        c = f * c + i * g
        h = o * torch.tanh(c)
        hs.append(h)
    return torch.stack(hs, dim=1), h[None], c[None]


def flops(args):
    B, T, I = args["x"].shape
    H = args["w_hh"].shape[1]
    fwd = 2 * B * T * (I + H) * 4 * H + 10 * B * T * H
    return {"fwd": fwd, "bwd": 2 * fwd}


def min_bytes(args):
    params = nbytes(*(args[k] for k in ("w_ih", "w_hh", "b_ih", "b_hh")))
    x = args["x"]
    out = x.shape[0] * x.shape[1] * args["w_hh"].shape[1] * x.element_size()
    states = 4 * nbytes(args["h0"])
    return {"fwd": nbytes(x) + params + out + states, "bwd": 2 * (nbytes(x) + params + out + states)}


# ---------------------------------------------------------------------------------------
# The model-shape suite
# ---------------------------------------------------------------------------------------

MODEL_SHAPES = (
    Shape("zaremba-medium-train", "PTB medium LSTM LM",
          "Zaremba, Sutskever, Vinyals 2014 'Recurrent Neural Network Regularization', medium: "
          "650 units, unrolled 35 steps, batch 20", dict(B=20, T=35, I=650, H=650), train()),
    Shape("zaremba-medium-score", "PTB medium LSTM LM",
          "the same model at inference: one 35-token sequence (batch 1)",
          dict(B=1, T=35, I=650, H=650), infer()),
    Shape("awd-lstm-train", "AWD-LSTM",
          "Merity et al. 2017, salesforce/awd-lstm-lm defaults: embeddings 400, hidden 1150, "
          "bptt 70, batch 80; the last layer maps 1150 -> 400 (hidden 400)",
          dict(B=80, T=70, I=1150, H=400), train()),
    Shape("gnmt-train", "GNMT",
          "Wu et al. 2016 (Google NMT): LSTM layers of 1024 units, batch 128; 50-token sentences",
          dict(B=128, T=50, I=1024, H=1024), train()),
    Shape("las-listener-train", "Listen, Attend and Spell",
          "Chan et al. 2016: pyramidal BLSTM listener, 256 units per direction; each layer "
          "reads two consecutive frames of the layer below (2 x 2 x 256 = 1024); 250 frames, "
          "batch 32", dict(B=32, T=250, I=1024, H=256), train()),
    Shape("headline-fp32", "512-unit LM layer (the fp32 goal's shape)",
          "equivalence/cards/lstm.py 'bench': 256-dim embeddings, 512 units, batch 8, 64 steps; "
          "the goal 'LSTM fp32 >= 1.0x cuDNN' is set at this shape, in float32",
          dict(B=8, T=64, I=256, H=512), train(), dtype="float32"),
)


def tiny_twin(s):
    return dict(B=shrink(s["B"], 8), T=shrink(s["T"], 16, low=2), I=shrink(s["I"], 16, low=4),
                H=shrink(s["H"], 16, low=4))


def describe(s, variants):
    return f"B{s['B']} T{s['T']} I{s['I']} H{s['H']}"


def libraries(device, dtype):
    """nn.LSTM (cuDNN's fused RNN on a GPU), weights copied in."""
    from ..calls import Impl
    from ..check import flatten

    def prepare(args):
        x, h0, c0 = args["x"], args["h0"], args["c0"]
        m = torch.nn.LSTM(x.shape[-1], args["w_hh"].shape[1], batch_first=True, device=x.device,
                          dtype=x.dtype)
        with torch.no_grad():
            for ours, theirs in (("w_ih", "weight_ih_l0"), ("w_hh", "weight_hh_l0"),
                                 ("b_ih", "bias_ih_l0"), ("b_hh", "bias_hh_l0")):
                getattr(m, theirs).copy_(args[ours])
        m.flatten_parameters()  # one contiguous weight buffer, as cuDNN wants it
        inputs = [t for t in (x, h0, c0) if t.requires_grad] + list(m.parameters())
        return (lambda: flatten(m(x, (h0, c0)))), inputs

    on_gpu = device.type == "cuda"
    # cuDNN's RNNs run fp32 in TF32 unless told not to (the default)
    return [Impl("nn.LSTM (cuDNN)" if on_gpu else "nn.LSTM", "library", prepare,
                 tf32=on_gpu and torch.backends.cudnn.allow_tf32)]


# ---------------------------------------------------------------------------------------
# levels explain: the LSTM LM before and after its recurrence's work (recorded on an H100)
# ---------------------------------------------------------------------------------------

_ROOT = Path(__file__).resolve().parents[2]
# that session's last interleaved table, before the work
_MODEL_BEFORE = _ROOT / "reports" / "training-interleaved" / "4-train-lstm-gpu.json"
_WORK = _ROOT / "reports" / "lstm-recurrence"


def _rates(path: Path) -> dict:
    """tokens/s of every run of a `levels train` report that finished."""
    return {r["name"]: r["timing"]["items_per_s"] for r in json.loads(path.read_text())["runs"]
            if r["status"] == "ok"}


def host_path_note(level: str) -> str:
    """The LSTM LM against nn.LSTM's model before and after the recurrence's work, and what
    changed at this level: the step's wall against GPU time at Level 4 (the replay), the
    recurrence's kernels at Level 5. "" where the recorded files cannot be read."""
    try:
        ratios = [r[level] / r["torch"] for r in
                  (_rates(_MODEL_BEFORE), _rates(_WORK / "7-table-lstm-eager" / "train-lstm-gpu.json"))]
        if level == "triton":
            # one host, one call: Level 4 with the C++ replay off (Python) and on
            probe = json.loads((_WORK / "probe-lstm-model-replayed.json").read_text())["rows"]
            old, new = ({r["replay"]: r for r in probe if r["run"] == "triton"}[on] for on in (False, True))
            how = (f" Its step: {old['wall_ms_median']:.2f} ms on the wall for "
                   f"{old['gpu_ms_per_step']:.2f} of GPU work with its calls run in Python, "
                   f"{new['wall_ms_median']:.2f} for {new['gpu_ms_per_step']:.2f} replayed, the LSTM's "
                   f"included since its barrier reports through a word the kernels set (it was "
                   f"watched from the host); the tiles of scripts/sweep_lstm.py did the rest.")
        else:
            kernels = []
            for name in ("sweep-1.json", "sweep-9-level5-prefetch.json"):
                profile = json.loads((_WORK / name).read_text())["shapes"]["gpu"]["profile"]
                kernels.append(sum(v for k, v in profile["level5"].items() if "lstm_" in k))
            how = (f" Its recurrence's kernels, forward+backward a layer: {kernels[0]:.2f} -> "
                   f"{kernels[1]:.2f} ms (the backward on the tensor cores over batch groups, the "
                   f"forward likewise, cp.async staging without per-copy index arithmetic, the "
                   f"cells' loads before the product).")
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    return (f"The LSTM LM (two layers, batch 64, hidden 1024; levels train --model lstm --preset "
            f"gpu, runs stepped in turn), this level against nn.LSTM's model: {ratios[0]:.2f}x "
            f"before ({_MODEL_BEFORE.relative_to(_ROOT)}), {ratios[1]:.2f}x after "
            f"({_WORK.relative_to(_ROOT)}/7-table-lstm-eager/).{how}")
