// autograd.cpp — the ops Level 5 is called through, one per component, each
// differentiable by a C++ autograd Function. A translation unit of its own, beside the binding
// (binding.cpp and its fragments) and the kernels: it calls the kernels' ops through the
// dispatcher only, never their C++ functions, so it needs torch's headers and nothing of
// CUDA, and ninja compiles it in parallel with the rest of the build.
//
//   levels_cuda::layer_norm(x, weight, bias, eps, version, path=0) -> y
//   levels_cuda::attention(q, k, v, causal, scale, version, bottom_right, kv_lens, rope_cos,
//                          rope_sin, rope_interleaved, rope_offset) -> out
//   levels_cuda::mlp(x, w1, b1, w2, b2, version) -> out
//   levels_cuda::lstm(x, h0, c0, w_ih, w_hh, b_ih, b_hh, version, gemm_version) -> (out, h_n, c_n)
//   levels_cuda::conv_bn(x, conv_weight, conv_bias, bn_weight, bn_bias, running_mean!,
//                        running_var!, stride, padding, eps, momentum, training, version) -> out
//
// What this buys (the host path, measured in reports/h100-overhead.json): a Level 5 call used
// to be Python from end to end around its kernels: the layout copies, the version lookup,
// and autograd through torch.library.register_autograd, which dispatches into Python and
// builds a Python autograd.Function per call (on the H100's host 200-350 us of a forward
// that eager PyTorch finishes in 15-45). Here a call is one dispatch from Python into C++:
// the layout work, the kernels' ops and one autograd node, whose backward runs in C++ on the
// autograd engine's own thread, as eager PyTorch's nodes do.
//
// Why every kernel op is called through the dispatcher (`op<...>()`): under torch.compile and
// torch.export these Functions run on fake tensors, which have shapes but no memory. Through
// the dispatcher the kernels' ops reach their fake implementations (cuda_kernels/*.py
// register them); a direct call would hand a fake tensor's missing pointer to a kernel. The
// same indirection lets the tests run this file on a CPU, against torch twins of the kernel
// ops (tests/test_cuda_autograd_cpu.py).
//
// What stays in Python (levels/cuda.py): validation, once per argument signature, and the
// choice of version (it reads $LEVELS_CUDA_VERSION_<COMPONENT>).
#include <torch/library.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/_unsafe_view.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstdint>
#include <optional>
#include <tuple>
#include <vector>

namespace levels_cuda_autograd {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using Tensor = at::Tensor;

// The typed handle of an op of this library, looked up once.
template <typename Signature>
c10::TypedOperatorHandle<Signature> op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

// Kernel ops are called below autograd: they have no autograd formula of their own (the
// Functions below are it), and skipping the autograd keys is also the shorter path.
using BelowAutograd = at::AutoDispatchBelowADInplaceOrView;

// Whether a call records autograd: grad mode on and an input that requires a gradient (or
// carries a forward-mode tangent, which Function::apply refuses for a C++ Function: such a
// call goes through apply, to be refused the same way).
inline bool wants_grad(const Tensor& t) {
  return t.defined() && (t.requires_grad() || t._fw_grad(/*level=*/0).defined());
}
inline bool wants_grad(const std::optional<Tensor>& t) { return t.has_value() && wants_grad(*t); }
template <typename T>
inline bool wants_grad(const T&) { return false; }  // the non-tensor arguments
template <typename... Ts>
bool records_autograd(const Ts&... args) {
  return at::GradMode::is_enabled() && (... || wants_grad(args));
}

// A call that records nothing (under no_grad or inference mode, or with no input that
// requires a gradient: an inference forward) runs its Function's forward on a context of
// its own, with grad mode off as apply runs it. Function::apply would allocate a node, pack
// every tensor the forward saved and wrap every output before finding that there is nothing
// to record: host work a forward-only call does not need. Measured on this file built for a
// CPU with kernel ops that return at once (scripts/probe_forward_only_cpu.py, three runs of
// each version alternated, the best of each): layer_norm 5.9 -> 4.8 us a call, conv_bn 16.4
// -> 14.4. The forward's own saving
// (save_for_backward, saved_data) stays: it lands on this context and goes with it.
template <typename F, typename... Args>
auto forward_only(Args&&... args) {
  AutogradContext ctx;
  at::AutoGradMode off(false);
  return F::forward(&ctx, std::forward<Args>(args)...);
}

// The one entry of every single-output Function below.
template <typename F, typename... Args>
Tensor call(Args&&... args) {
  if (!records_autograd(args...)) return forward_only<F>(std::forward<Args>(args)...);
  return F::apply(std::forward<Args>(args)...);
}

inline std::vector<int64_t> sizes_of(const Tensor& t) { return t.sizes().vec(); }

// ------------------------------------------------------------------------ layer_norm --

// (M, N) with adjacent columns: a view whenever the leading dimensions flatten into one row
// stride, else a copy (cuda_kernels/layer_norm.py's _rows, which the kernels' checks expect).
inline Tensor rows(const Tensor& t) {
  const int64_t N = t.size(-1);
  Tensor t2 = t.reshape({-1, N});
  return (t2.stride(-1) == 1 || N == 1) ? t2 : t2.contiguous();
}

using LayerNormFwd = std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&,
                                                       double, int64_t, int64_t);
using LayerNormBwd = std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&,
                                                       const Tensor&, const Tensor&, int64_t,
                                                       int64_t);

struct LayerNorm : public torch::autograd::Function<LayerNorm> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& weight,
                        const Tensor& bias, double eps, int64_t version, int64_t path) {
    static auto fwd = op<LayerNormFwd>("levels_cuda::layer_norm_fwd");
    BelowAutograd guard;
    const Tensor x2 = rows(x), w = weight.contiguous();
    auto [y, mean, rstd] = fwd.call(x2, w, bias.contiguous(), eps, version, path);
    ctx->save_for_backward({x2, w, mean, rstd});
    ctx->saved_data["version"] = version;
    ctx->saved_data["path"] = path;
    ctx->saved_data["shape"] = sizes_of(x);
    return at::_unsafe_view(y, x.sizes());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static auto bwd = op<LayerNormBwd>("levels_cuda::layer_norm_bwd");
    BelowAutograd guard;
    const auto saved = ctx->get_saved_variables();
    // an expanded `.sum()` gradient has stride 0 along the row: copied, once
    auto [dx, dw, db] = bwd.call(rows(grads[0]), saved[0], saved[1], saved[2], saved[3],
                                 ctx->saved_data["version"].toInt(),
                                 ctx->saved_data["path"].toInt());
    return {at::_unsafe_view(dx, ctx->saved_data["shape"].toIntVector()), dw, db, Tensor(),
            Tensor(), Tensor()};
  }
};

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                  int64_t version, int64_t path) {
  return call<LayerNorm>(x, weight, bias, eps, version, path);
}

// ------------------------------------------------------------------------- attention --

// What the kernels of `version` read (cuda_kernels/attention.py's _operand): stride 1 along D;
// versions 3-7 in 16 bits also 16-byte chunks (batch, head and row strides multiples of 8,
// the first element 16-byte aligned). Anything else is copied, once.
// (sym_*: under torch.compile with dynamic shapes these are symbols, and the rule a guard.)
inline Tensor attention_operand(const Tensor& t, int64_t version) {
  bool ok = t.sym_stride(-1) == 1;
  if (ok && version >= 3 && version <= 7 && t.scalar_type() != at::kFloat) {
    for (int d = 0; d < 3; ++d) ok = ok && (t.sym_size(d) == 1 || t.sym_stride(d) % 8 == 0);
    ok = ok && (t.sym_storage_offset() * static_cast<int64_t>(t.element_size())) % 16 == 0;
  }
  if (ok) return t;
  // .contiguous() of a contiguous view that starts off a 16-byte boundary is the view
  // itself: a clone moves it to a fresh (aligned) allocation.
  return t.is_contiguous() ? t.clone(at::MemoryFormat::Contiguous) : t.contiguous();
}

using AttentionFwd = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, bool,
                                                double, int64_t, bool, const std::optional<Tensor>&,
                                                const std::optional<Tensor>&,
                                                const std::optional<Tensor>&, bool, int64_t);
using AttentionBwd = std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&,
                                                        const Tensor&, const Tensor&, const Tensor&,
                                                        bool, double, int64_t, bool,
                                                        const std::optional<Tensor>&,
                                                        const std::optional<Tensor>&,
                                                        const std::optional<Tensor>&, bool, int64_t);

// An optional tensor kept by save_for_backward (an undefined Tensor stands for None).
inline std::optional<Tensor> present(const Tensor& t) {
  return t.defined() ? std::optional<Tensor>(t) : std::nullopt;
}

struct Attention : public torch::autograd::Function<Attention> {
  static Tensor forward(AutogradContext* ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                        bool causal, double scale, int64_t version, bool bottom_right,
                        const std::optional<Tensor>& kv_lens, const std::optional<Tensor>& rope_cos,
                        const std::optional<Tensor>& rope_sin, bool rope_interleaved,
                        int64_t rope_offset) {
    static auto fwd = op<AttentionFwd>("levels_cuda::attention_fwd");
    BelowAutograd guard;
    const Tensor q_ = attention_operand(q, version), k_ = attention_operand(k, version),
                 v_ = attention_operand(v, version);
    // The kernels read the lengths as int32 (positions are below 2**30): one tiny copy for
    // an int64 tensor.
    std::optional<Tensor> lens;
    if (kv_lens.has_value() && kv_lens->defined()) lens = kv_lens->to(at::kInt).contiguous();
    auto [out, lse] = fwd.call(q_, k_, v_, causal, scale, version, bottom_right, lens, rope_cos,
                               rope_sin, rope_interleaved, rope_offset);
    // RoPE: the tables, not the rotated q and k (the backward turns them again as it loads)
    ctx->save_for_backward({q_, k_, v_, out, lse, lens.has_value() ? *lens : Tensor(),
                            rope_cos.has_value() ? *rope_cos : Tensor(),
                            rope_sin.has_value() ? *rope_sin : Tensor()});
    ctx->saved_data["rope_interleaved"] = rope_interleaved;
    ctx->saved_data["rope_offset"] = rope_offset;
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["version"] = version;
    ctx->saved_data["bottom_right"] = bottom_right;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static auto bwd = op<AttentionBwd>("levels_cuda::attention_bwd");
    BelowAutograd guard;
    const auto s = ctx->get_saved_variables();
    const int64_t version = ctx->saved_data["version"].toInt();
    auto [dq, dk, dv] = bwd.call(attention_operand(grads[0], version), s[0], s[1], s[2], s[3], s[4],
                                 ctx->saved_data["causal"].toBool(),
                                 ctx->saved_data["scale"].toDouble(), version,
                                 ctx->saved_data["bottom_right"].toBool(), present(s[5]),
                                 present(s[6]), present(s[7]),
                                 ctx->saved_data["rope_interleaved"].toBool(),
                                 ctx->saved_data["rope_offset"].toInt());
    // q, k, v, then none for causal, scale, version, bottom_right, kv_lens and the rope arguments
    return {dq, dk, dv, Tensor(), Tensor(), Tensor(), Tensor(), Tensor(), Tensor(), Tensor(),
            Tensor(), Tensor()};
  }
};

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale,
                 int64_t version, bool bottom_right, const std::optional<Tensor>& kv_lens,
                 const std::optional<Tensor>& rope_cos, const std::optional<Tensor>& rope_sin,
                 bool rope_interleaved, int64_t rope_offset) {
  return call<Attention>(q, k, v, causal, scale, version, bottom_right, kv_lens, rope_cos,
                         rope_sin, rope_interleaved, rope_offset);
}

// ------------------------------------------------------------------------------- mlp --
// The GEMM ops take any strides and make the layout their version needs themselves
// (mlp_binding.cpp's k_major), so nothing here copies an operand.

using Matmul = Tensor(const Tensor&, const Tensor&, const std::optional<Tensor>&, bool, bool, int64_t);
using MatmulGeluGrad = Tensor(const Tensor&, const Tensor&, const Tensor&, int64_t);
using ColumnSum = Tensor(const Tensor&, bool, int64_t);
using MlpFwd = std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&,
                                                 const Tensor&, const Tensor&, int64_t, int64_t);

// t (..., K) as the (M, K) matrix a GEMM takes: a view whenever the strides allow it.
inline Tensor matrix(const Tensor& t) { return t.reshape({-1, t.size(-1)}); }

// A GEMM's (M, N) output as x's leading dimensions (..., N).
inline Tensor with_leading_dims_of(const Tensor& x, const Tensor& out) {
  std::vector<int64_t> shape = sizes_of(x);
  shape.back() = out.size(-1);
  return at::_unsafe_view(out, shape);
}

inline Tensor gemm(const Tensor& a, const Tensor& b, int64_t version) {  // a @ b
  static auto matmul = op<Matmul>("levels_cuda::gemm_matmul");
  return matmul.call(a, b, std::nullopt, false, false, version);
}

inline Tensor column_sum(const Tensor& x, int64_t version) {
  static auto sum = op<ColumnSum>("levels_cuda::gemm_column_sum");
  return sum.call(x, false, version);
}

struct Mlp : public torch::autograd::Function<Mlp> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& w1, const Tensor& b1,
                        const Tensor& w2, const Tensor& b2, int64_t version) {
    static auto fwd = op<MlpFwd>("levels_cuda::mlp_fwd");
    BelowAutograd guard;
    const Tensor x2 = matrix(x);
    // tile 0: each GEMM's tile from its size (only the bench's sweep pins one, calling
    // mlp_fwd itself: cuda_kernels/mlp.py mlp_forward)
    auto [out, pre, act] = fwd.call(x2, w1, b1.contiguous(), w2, b2.contiguous(), version, 0);
    ctx->save_for_backward({x2, w1, w2, pre, act});
    ctx->saved_data["version"] = version;
    ctx->saved_data["shape"] = sizes_of(x);
    return with_leading_dims_of(x, out);
  }

  // dW2 = dYᵀ G, db2 = Σ dY, dH = (dY W2) ⊙ GELU'(H) (the derivative in the GEMM's epilogue),
  // dX = dH W1, dW1 = dHᵀ X, db1 = Σ dH: five GEMMs and two column sums, each only if needed.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static auto gelu_grad = op<MatmulGeluGrad>("levels_cuda::gemm_matmul_gelu_grad");
    BelowAutograd guard;
    const auto s = ctx->get_saved_variables();
    const Tensor &x2 = s[0], &w1 = s[1], &w2 = s[2], &pre = s[3], &act = s[4];
    const int64_t v = ctx->saved_data["version"].toInt();
    const Tensor dy = matrix(grads[0]);
    Tensor dx, dw1, db1, dw2, db2;
    if (ctx->needs_input_grad(3)) dw2 = gemm(dy.t(), act, v);
    if (ctx->needs_input_grad(4)) db2 = column_sum(dy, v);
    if (ctx->needs_input_grad(0) || ctx->needs_input_grad(1) || ctx->needs_input_grad(2)) {
      const Tensor dh = gelu_grad.call(dy, w2, pre, v);
      if (ctx->needs_input_grad(0))
        dx = at::_unsafe_view(gemm(dh, w1, v), ctx->saved_data["shape"].toIntVector());
      if (ctx->needs_input_grad(1)) dw1 = gemm(dh.t(), x2, v);
      if (ctx->needs_input_grad(2)) db1 = column_sum(dh, v);
    }
    return {dx, dw1, db1, dw2, db2, Tensor()};
  }
};

Tensor mlp(const Tensor& x, const Tensor& w1, const Tensor& b1, const Tensor& w2, const Tensor& b2,
           int64_t version) {
  return call<Mlp>(x, w1, b1, w2, b2, version);
}

// ------------------------------------------------------------------------------ lstm --

using LstmFwd = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor>(
    const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
    const Tensor&, const Tensor&, bool, bool, int64_t);
using LstmBwd = std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&,
                                                   const Tensor&, const Tensor&, const Tensor&,
                                                   const Tensor&, bool, int64_t);

// x (B, T, I) as the (rows, I) operand of the input projection, and whether its rows are
// time-major (t*B + b): a view when (B, T) flatten in either order, else one copy
// (cuda_kernels/lstm.py's _rows).
inline std::pair<Tensor, bool> lstm_rows(const Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), I = x.size(2);
  const int64_t sb = x.stride(0), st = x.stride(1);
  if (B == 1 || T == 1 || sb == st * T) return {x.reshape({B * T, I}), false};
  if (st == sb * B) return {x.transpose(0, 1).reshape({T * B, I}), true};
  return {x.reshape({B * T, I}), false};
}

// h_{t-1} of every step, in dz's row order: h0, then out[:, :-1] (one copy, B*T*H).
inline Tensor previous_h(const Tensor& h0, const Tensor& out, bool time_major) {
  const int64_t T = out.size(1);
  const Tensor earlier = out.narrow(1, 0, T - 1);
  if (time_major) return at::cat({h0.unsqueeze(0), earlier.transpose(0, 1)}, 0).reshape({-1, h0.size(1)});
  return at::cat({h0.unsqueeze(1), earlier}, 1).reshape({-1, h0.size(1)});
}

struct Lstm : public torch::autograd::Function<Lstm> {
  static variable_list forward(AutogradContext* ctx, const Tensor& x, const Tensor& h0,
                               const Tensor& c0, const Tensor& w_ih, const Tensor& w_hh,
                               const Tensor& b_ih, const Tensor& b_hh, int64_t version,
                               int64_t gemm_version, bool save) {
    static auto fwd = op<LstmFwd>("levels_cuda::lstm_fwd");
    static auto matmul = op<Matmul>("levels_cuda::gemm_matmul");
    BelowAutograd guard;
    ctx->saved_data["shape"] = sizes_of(x);
    if (x.size(0) == 0) {
      // A batch of 0 sequences, as nn.LSTM: empty outputs and final states, no kernel (the
      // ops take T from x2's B*T rows, which B = 0 cannot say). Backward: zero gradients.
      ctx->save_for_backward({w_ih, w_hh});
      ctx->saved_data["empty"] = true;
      const int64_t H = w_hh.size(1);
      return {at::empty({0, x.size(1), H}, h0.options()), at::empty({1, 0, H}, h0.options()),
              at::empty({1, 0, H}, h0.options())};
    }
    ctx->saved_data["empty"] = false;
    auto [x2, time_major] = lstm_rows(x);
    const Tensor h0c = h0.select(0, 0).contiguous(), c0c = c0.select(0, 0).contiguous();
    const Tensor w_hh_c = w_hh.contiguous(), b_ih_c = b_ih.contiguous(), b_hh_c = b_hh.contiguous();
    // Every step's input projection at once, in fp32 (the recurrence adds to it).
    const Tensor xp = matmul.call(x2, w_ih.t(), b_ih_c, false, true, gemm_version);
    auto [out, h_n, c_n, gates, cs] =
        fwd.call(x2, w_ih, b_ih_c, xp, h0c, c0c, w_hh_c, b_hh_c, time_major, save, version);
    if (save) ctx->save_for_backward({x2, w_ih, h0c, c0c, w_hh_c, out, gates, cs});
    ctx->saved_data["time_major"] = time_major;
    ctx->saved_data["version"] = version;
    ctx->saved_data["gemm_version"] = gemm_version;
    ctx->saved_data["save"] = save;
    const int64_t B = h_n.size(0), H = h_n.size(1);
    return {out, at::_unsafe_view(h_n, {1, B, H}), at::_unsafe_view(c_n, {1, B, H})};
  }

  // The recurrence backwards through time in lstm_bwd (dz: every step's gate pre-activation
  // gradients, dh0, dc0); what does not recur is this level's GEMMs over all B*T rows:
  // dx = dz W_ih, dW_ih = dzᵀ x, dW_hh = dzᵀ h_{t-1}, both biases' gradient Σ dz.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static auto bwd = op<LstmBwd>("levels_cuda::lstm_bwd");
    if (ctx->saved_data["empty"].toBool()) return no_sequences(ctx);
    TORCH_CHECK(ctx->saved_data["save"].toBool(),
                "levels_cuda::lstm ran without keeping its activations (nothing required grad "
                "when it was called), so it has no backward");
    BelowAutograd guard;
    const auto s = ctx->get_saved_variables();
    const Tensor &x2 = s[0], &w_ih = s[1], &h0 = s[2], &c0 = s[3], &w_hh = s[4], &out = s[5];
    const bool time_major = ctx->saved_data["time_major"].toBool();
    const int64_t v = ctx->saved_data["gemm_version"].toInt();
    const int64_t B = h0.size(0), H = h0.size(1);
    // Unused outputs' gradients come as zeros (materialized); an expanded `.sum()` gradient
    // has stride 0: the kernels index densely, so each is made dense here (B*T*H at most).
    const Tensor d_out = grads[0].contiguous();
    const Tensor d_hn = grads[1].reshape({B, H}).contiguous();
    const Tensor d_cn = grads[2].reshape({B, H}).contiguous();
    auto [dz, dh0, dc0] = bwd.call(d_out, d_hn, d_cn, c0, w_hh, s[6], s[7], time_major,
                                   ctx->saved_data["version"].toInt());
    Tensor dx, dw_ih, dw_hh, db_ih, db_hh;
    if (ctx->needs_input_grad(0)) {
      const std::vector<int64_t> shape = ctx->saved_data["shape"].toIntVector();  // (B, T, I)
      const Tensor dx2 = gemm(dz, w_ih, v);
      dx = time_major ? dx2.view({shape[1], shape[0], shape[2]}).transpose(0, 1)
                      : dx2.view({shape[0], shape[1], shape[2]});
    }
    if (ctx->needs_input_grad(3)) dw_ih = gemm(dz.t(), x2, v);
    if (ctx->needs_input_grad(4)) dw_hh = gemm(dz.t(), previous_h(h0, out, time_major), v);
    if (ctx->needs_input_grad(5) || ctx->needs_input_grad(6)) {
      const Tensor db = column_sum(dz, v);
      if (ctx->needs_input_grad(5)) db_ih = db;
      if (ctx->needs_input_grad(6)) db_hh = ctx->needs_input_grad(5) ? db.clone() : db;
    }
    return {dx, ctx->needs_input_grad(1) ? dh0.unsqueeze(0) : Tensor(),
            ctx->needs_input_grad(2) ? dc0.unsqueeze(0) : Tensor(), dw_ih, dw_hh, db_ih, db_hh,
            Tensor(), Tensor(), Tensor()};
  }

  // The gradients of a batch of 0 sequences: dx, dh0, dc0 empty; the weights' and biases',
  // sums over no row, zeros (never at::empty's garbage).
  static variable_list no_sequences(AutogradContext* ctx) {
    const auto s = ctx->get_saved_variables();
    const Tensor &w_ih = s[0], &w_hh = s[1];
    const std::vector<int64_t> shape = ctx->saved_data["shape"].toIntVector();  // (0, T, I)
    const int64_t H = w_hh.size(1);
    auto wanted = [&](int i, Tensor t) { return ctx->needs_input_grad(i) ? t : Tensor(); };
    return {wanted(0, at::zeros(shape, w_ih.options())),
            wanted(1, at::zeros({1, 0, H}, w_hh.options())),
            wanted(2, at::zeros({1, 0, H}, w_hh.options())), wanted(3, at::zeros_like(w_ih)),
            wanted(4, at::zeros_like(w_hh)), wanted(5, at::zeros({4 * H}, w_ih.options())),
            wanted(6, at::zeros({4 * H}, w_ih.options())), Tensor(), Tensor(), Tensor()};
  }
};

std::tuple<Tensor, Tensor, Tensor> lstm(const Tensor& x, const Tensor& h0, const Tensor& c0,
                                        const Tensor& w_ih, const Tensor& w_hh, const Tensor& b_ih,
                                        const Tensor& b_hh, int64_t version, int64_t gemm_version) {
  // Inside the Function grad mode is off, so decide here whether backward's activations (the
  // gates and c of every step, fp32) are kept at all.
  bool save = false;
  if (at::GradMode::is_enabled())
    for (const Tensor* t : {&x, &h0, &c0, &w_ih, &w_hh, &b_ih, &b_hh}) save = save || t->requires_grad();
  auto outs = Lstm::apply(x, h0, c0, w_ih, w_hh, b_ih, b_hh, version, gemm_version, save);
  return {outs[0], outs[1], outs[2]};
}

// --------------------------------------------------------------------------- conv_bn --

using ConvBnEvalFwd = std::tuple<Tensor, Tensor, Tensor, Tensor>(
    const Tensor&, const Tensor&, const std::optional<Tensor>&, const Tensor&, const Tensor&,
    const Tensor&, const Tensor&, at::IntArrayRef, at::IntArrayRef, double, int64_t);
using ConvBnTrainFwd = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>(
    const Tensor&, const Tensor&, const std::optional<Tensor>&, const Tensor&, const Tensor&,
    const Tensor&, const Tensor&, at::IntArrayRef, at::IntArrayRef, double, double, int64_t);
using ConvBnEvalBwd = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor>(
    const Tensor&, const Tensor&, const Tensor&, const Tensor&, const std::optional<Tensor>&,
    const Tensor&, const Tensor&, const Tensor&, at::IntArrayRef, at::IntArrayRef, int64_t, bool);
using ConvBnTrainBwd = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor>(
    const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
    const Tensor&, const Tensor&, at::IntArrayRef, at::IntArrayRef, int64_t, bool);

inline bool b_defined(const std::optional<Tensor>& t) { return t.has_value() && t->defined(); }

// t in `dtype`: itself when it already is (Tensor::to would return it too, but as an op
// that, dispatched below autograd, a dispatch mode sees returning its own input).
inline Tensor as_dtype(const Tensor& t, at::ScalarType dtype) {
  return t.scalar_type() == dtype ? t : t.to(dtype);
}

inline std::optional<Tensor> maybe(const std::optional<Tensor>& t) {
  return t.has_value() && t->defined() ? std::optional<Tensor>(t->contiguous()) : std::nullopt;
}

// The Function returns the NHWC output already viewed as (N, C_out, H_out, W_out)
// channels_last: the permute runs below autograd, so the result is a plain output of this one
// node (no view autograd tracks, no second node to run backward: that was a PermuteBackward
// per call), and an in-place op on it (a ReLU(inplace=True)) is a plain in-place op.
struct ConvBn : public torch::autograd::Function<ConvBn> {
  // conv_bias is optional: without one it is no input of the node (an undefined tensor
  // cannot be one), and the gradients returned line up with the arguments all the same.
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& conv_weight,
                        const std::optional<Tensor>& conv_bias, const Tensor& bn_weight,
                        const Tensor& bn_bias,
                        const Tensor& running_mean, const Tensor& running_var,
                        std::vector<int64_t> stride, std::vector<int64_t> padding, double eps,
                        double momentum, bool training, int64_t version) {
    static auto eval_fwd = op<ConvBnEvalFwd>("levels_cuda::conv_bn_eval_fwd");
    static auto train_fwd = op<ConvBnTrainFwd>("levels_cuda::conv_bn_train_fwd");
    ctx->saved_data["has_bias"] = b_defined(conv_bias);
    ctx->saved_data["bn_dtype"] = static_cast<int64_t>(bn_weight.scalar_type());
    ctx->saved_data["empty"] = x.size(0) == 0;
    if (x.size(0) == 0) {
      // A batch of 0 images, in either mode, as torch's batch_norm: nothing to convolve, no
      // statistics to compute or track (running_mean and running_var are left as they are),
      // no kernel. The NHWC output is empty; backward: zero gradients (no_images).
      ctx->save_for_backward({x, conv_weight});
      const int64_t H_out = (x.size(2) + 2 * padding[0] - conv_weight.size(2)) / stride[0] + 1;
      const int64_t W_out = (x.size(3) + 2 * padding[1] - conv_weight.size(3)) / stride[1] + 1;
      return at::empty({0, conv_weight.size(0), H_out, W_out},
                       x.options().memory_format(at::MemoryFormat::ChannelsLast));
    }
    Tensor out, new_mean, new_var;
    {
      BelowAutograd guard;
      // x as NHWC (a no-op for a channels_last x, one copy otherwise); the weight viewed as
      // (C_out, kH, kW, C_in): eval folds it as it lies into the K-major w' its convolution
      // reads, training's convolution reads it K-major (a copy of the small weight unless
      // stored that way); the 1-D parameters contiguous.
      const Tensor x_nhwc = x.contiguous(at::MemoryFormat::ChannelsLast).permute({0, 2, 3, 1});
      const Tensor w_view = conv_weight.permute({0, 2, 3, 1});
      const std::optional<Tensor> b = maybe(conv_bias);
      // BatchNorm's tensors in float32 beside a 16-bit x (autocast's mixed precision): the
      // kernels take one dtype, so they get x's; the running statistics stay float32 below.
      const auto dtype = x.scalar_type();
      const Tensor gamma = as_dtype(bn_weight, dtype).contiguous(),
                   beta = as_dtype(bn_bias, dtype).contiguous();
      const Tensor rm = as_dtype(running_mean, dtype).contiguous(),
                   rv = as_dtype(running_var, dtype).contiguous();
      if (training) {
        const Tensor w_k = w_view.contiguous();
        auto [o, y, mean, invstd, nm, nv] = train_fwd.call(x_nhwc, w_k, b, gamma, beta, rm, rv,
                                                           stride, padding, eps, momentum, version);
        ctx->save_for_backward({x_nhwc, conv_weight, w_k, y, mean, invstd, gamma});
        out = o.permute({0, 3, 1, 2}), new_mean = nm, new_var = nv;
        if (running_mean.scalar_type() != dtype) {
          // BatchNorm2d's update in float32, from this batch's float32 statistics, so the
          // statistics keep float32's precision: the kernels' mean is that of the convolution
          // without its bias (which cancels in the normalization; conv_bn.cu's
          // stats_finalize_kernel adds it back for the running mean, so here too), and the
          // biased variance is 1/invstd^2 - eps.
          const double n = static_cast<double>(o.size(0) * o.size(1) * o.size(2));
          const Tensor batch_mean = b.has_value() ? mean.add(b->to(at::kFloat)) : mean;
          new_mean = running_mean.mul(1.0 - momentum).add(batch_mean, momentum);
          new_var = running_var.mul(1.0 - momentum).add(invstd.pow(-2).sub(eps),
                                                         momentum * n / (n - 1.0));
        }
      } else {
        auto [o, w_folded, scale, invstd] = eval_fwd.call(x_nhwc, w_view, b, gamma, beta, rm,
                                                          rv, stride, padding, eps, version);
        ctx->save_for_backward(
            {x_nhwc, conv_weight, w_folded, b.value_or(Tensor()), rm, scale, invstd});
        out = o.permute({0, 3, 1, 2});
      }
    }
    if (training) {
      // BatchNorm2d's in-place update, through the caller's buffers (views included) and
      // nothing else; outside the guard, so their version counters move as with any write.
      running_mean.copy_(new_mean);
      running_var.copy_(new_var);
    }
    ctx->saved_data["stride"] = stride;
    ctx->saved_data["padding"] = padding;
    ctx->saved_data["training"] = training;
    ctx->saved_data["version"] = version;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static auto eval_bwd = op<ConvBnEvalBwd>("levels_cuda::conv_bn_eval_bwd");
    static auto train_bwd = op<ConvBnTrainBwd>("levels_cuda::conv_bn_train_bwd");
    if (ctx->saved_data["empty"].toBool()) return no_images(ctx);
    BelowAutograd guard;
    const auto s = ctx->get_saved_variables();
    const auto stride = ctx->saved_data["stride"].toIntVector();
    const auto padding = ctx->saved_data["padding"].toIntVector();
    const int64_t version = ctx->saved_data["version"].toInt();
    // the kernels read dout as a (P, C_out) matrix: a copy only if it is not channels_last
    // already; the weight (saved as the caller's, so that autograd sees it modified in place)
    // viewed as (C_out, kH, kW, C_in): dw comes back in its layout
    const Tensor dout = grads[0].contiguous(at::MemoryFormat::ChannelsLast).permute({0, 2, 3, 1});
    const Tensor w_view = s[1].permute({0, 2, 3, 1});
    // x that needs no gradient (a network's input images) costs no dgrad: the op skips it
    const bool need_dx = ctx->needs_input_grad(0);
    Tensor dx, dw, db, dgamma, dbeta;
    if (ctx->saved_data["training"].toBool()) {
      std::tie(dx, dw, db, dgamma, dbeta) = train_bwd.call(dout, s[0], w_view, s[2], s[3], s[4],
                                                           s[5], s[6], stride, padding, version,
                                                           need_dx);
    } else {
      const std::optional<Tensor> b = s[3].defined() ? std::optional<Tensor>(s[3]) : std::nullopt;
      std::tie(dx, dw, db, dgamma, dbeta) = eval_bwd.call(
          dout, s[0], w_view, s[2], b, s[4], s[5], s[6], stride, padding, version, need_dx);
    }
    // back from NHWC and (C_out, kH, kW, C_in) to the caller's dimension order, and the
    // BatchNorm weights' gradients to their dtype (float32 beside a 16-bit x)
    const auto bn_dtype = static_cast<at::ScalarType>(ctx->saved_data["bn_dtype"].toInt());
    return {need_dx ? dx.permute({0, 3, 1, 2}) : Tensor(), dw.permute({0, 3, 1, 2}),
            ctx->saved_data["has_bias"].toBool() ? db : Tensor(), as_dtype(dgamma, bn_dtype),
            as_dtype(dbeta, bn_dtype), Tensor(),
            Tensor(), Tensor(), Tensor(), Tensor(), Tensor(), Tensor(), Tensor()};
  }

  // The gradients of a batch of 0 images: dx empty, every parameter's a sum over no pixel:
  // zeros (never at::empty's garbage), each in its parameter's dtype, in the caller's order.
  static variable_list no_images(AutogradContext* ctx) {
    const auto s = ctx->get_saved_variables();
    const Tensor &x = s[0], &w = s[1];
    const int64_t C_out = w.size(0);
    const auto bn_dtype = static_cast<at::ScalarType>(ctx->saved_data["bn_dtype"].toInt());
    const auto bn = x.options().dtype(bn_dtype);
    return {at::zeros(x.sizes(), x.options()), at::zeros(w.sizes(), w.options()),
            ctx->saved_data["has_bias"].toBool() ? at::zeros({C_out}, x.options()) : Tensor(),
            at::zeros({C_out}, bn), at::zeros({C_out}, bn), Tensor(),
            Tensor(), Tensor(), Tensor(), Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

Tensor conv_bn(const Tensor& x, const Tensor& conv_weight, const std::optional<Tensor>& conv_bias,
               const Tensor& bn_weight, const Tensor& bn_bias, const Tensor& running_mean,
               const Tensor& running_var, at::IntArrayRef stride, at::IntArrayRef padding,
               double eps, double momentum, bool training, int64_t version) {
  return call<ConvBn>(x, conv_weight, conv_bias, bn_weight, bn_bias, running_mean, running_var,
                      stride.vec(), padding.vec(), eps, momentum, training, version);
}

}  // namespace levels_cuda_autograd

TORCH_LIBRARY_FRAGMENT(levels_cuda, m) {
  m.def("layer_norm(Tensor x, Tensor weight, Tensor bias, float eps, int version, int path=0) "
        "-> Tensor");
  m.def("attention(Tensor q, Tensor k, Tensor v, bool causal, float scale, int version, "
        "bool bottom_right=False, Tensor? kv_lens=None, Tensor? rope_cos=None, "
        "Tensor? rope_sin=None, bool rope_interleaved=False, int rope_offset=0) -> Tensor");
  m.def("mlp(Tensor x, Tensor w1, Tensor b1, Tensor w2, Tensor b2, int version) -> Tensor");
  m.def("lstm(Tensor x, Tensor h0, Tensor c0, Tensor w_ih, Tensor w_hh, Tensor b_ih, Tensor b_hh, "
        "int version, int gemm_version) -> (Tensor, Tensor, Tensor)");
  m.def("conv_bn(Tensor x, Tensor conv_weight, Tensor? conv_bias, Tensor bn_weight, "
        "Tensor bn_bias, Tensor(a!) running_mean, Tensor(b!) running_var, int[2] stride, "
        "int[2] padding, float eps, float momentum, bool training, int version) -> Tensor");
}

// One kernel per op for every backend: the Functions record autograd when it is on and run
// plain forwards when it is off (no_grad, inference mode), so the same code serves the
// dispatch at the Autograd key and below it.
TORCH_LIBRARY_IMPL(levels_cuda, CompositeImplicitAutograd, m) {
  m.impl("layer_norm", &levels_cuda_autograd::layer_norm);
  m.impl("attention", &levels_cuda_autograd::attention);
  m.impl("mlp", &levels_cuda_autograd::mlp);
  m.impl("lstm", &levels_cuda_autograd::lstm);
  m.impl("conv_bn", &levels_cuda_autograd::conv_bn);
}
