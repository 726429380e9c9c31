"""Four small models built from `levels.nn` layers, so a whole model runs at any level.

    from levels import models
    plain = models.TorchGPT(models.GPTConfig(vocab=96))   # nn.LayerNorm, nn.MultiheadAttention...
    gpt = models.GPT.from_torch(plain, level="native")    # the same weights, every component leveled
    gpt.set_level("triton")                               # every levels.nn layer inside, at once

  GPT       decoder-only transformer: token + position embeddings, pre-norm blocks
            (LayerNorm -> causal attention -> residual, LayerNorm -> MLP -> residual), a final
            LayerNorm and a head tied to the token embedding. Components: layer_norm,
            attention, mlp.
  LSTMLM    character language model: embedding, a stack of one-layer LSTMs, LayerNorm,
            linear head. Components: lstm, layer_norm.
  Llama     decoder-only transformer as Llama/Mistral/Qwen2 build it: token embedding,
            pre-norm blocks (RMSNorm -> grouped-query causal attention with rotary
            embeddings fused in -> residual, RMSNorm -> SwiGLU MLP -> residual), a final
            RMSNorm and a tied head. Components: rms_norm, attention (rope=), swiglu_mlp.
  ResNet    small CNN: a ConvBN stem, residual blocks of two ConvBNs (a 1x1 ConvBN on the
            shortcut where the shape changes), global average pooling, linear head.
            Component: conv_bn.

Each leveled model has a twin written with torch's own modules (`TorchGPT`, `TorchLlama`,
`TorchLSTMLM`, `TorchResNet`): the model a user would write without this repository. `Model.from_torch(twin)`
copies its weights, so a test can require both to compute the same function, and a training
run can start every level from the very same initial weights. `COMPONENTS[model]` names the
ladder's components a model runs, which is what decides whether a level can run it here.

What is *not* leveled, on purpose: embeddings (a gather; its backward a scatter-add), the
output head (one GEMM, cuBLAS at every level), residual additions, ReLU and pooling. None of
them is a component of the ladder; each level would call the same ATen kernel. They are the
part of the model no level speeds up, which is exactly what Amdahl's law is about.

The data they train on needs no download: `levels.models.data` (the standard library's own
source code for the character models, generated images for the CNN).
"""

from .cnn import CNNConfig, ResNet, TorchResNet
from .gpt import GPT, GPTConfig, TorchGPT
from .llama import Llama, LlamaConfig, TorchLlama
from .lstm_lm import LSTMLM, LSTMConfig, TorchLSTMLM

# The ladder's components each model runs: a level can train a model only if it has all.
COMPONENTS = {"gpt": ("layer_norm", "attention", "mlp"),
              "llama": ("rms_norm", "attention", "swiglu_mlp"),  # rope fused into attention
              "lstm": ("lstm", "layer_norm"),
              "cnn": ("conv_bn",)}

__all__ = ["CNNConfig", "COMPONENTS", "GPT", "GPTConfig", "LSTMConfig", "LSTMLM", "Llama",
           "LlamaConfig", "ResNet", "TorchGPT", "TorchLSTMLM", "TorchLlama", "TorchResNet"]
