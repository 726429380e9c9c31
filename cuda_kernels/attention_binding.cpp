// attention_binding.cpp — the attention part of the one torch-facing unit (a fragment:
// build.py appends it to binding.cpp's prelude, so torch's headers are already in and
// levels_cuda::{stream, dtype_code, check, in, out} exist).
//
// Ops (validated in Python first: levels/contract.py, then cuda_kernels/attention.py, which
// hands over q, k, v with stride 1 along D and, for versions 3-7 in 16 bits, 16-byte
// aligned rows):
//   attention_fwd(q, k, v, causal, scale, version, bottom_right, kv_lens,
//                 rope_cos, rope_sin, rope_interleaved, rope_offset) -> (out, lse)
//       out (B, H, Nq, D) contiguous; lse (B, H, Nq) fp32, base 2: log2 sum_j 2^(scale log2(e) q.k_j)
//       (+inf for a query that sees no key: its out is 0)
//   attention_bwd(dout, q, k, v, out, lse, causal, scale, version, bottom_right, kv_lens,
//                 rope_cos, rope_sin, rope_interleaved, rope_offset) -> (dq, dk, dv), contiguous
// RoPE fused (ROPE_API.md): rope_cos, rope_sin None, or (P, D/2) tables of q's dtype, any
// strides; q and k are rotated as the kernels read them (key j at table row j, query i at
// row i + rope_offset) and dq, dk turned back before they are stored.
// k and v may have H_kv heads, H_kv dividing H (grouped-query attention); kv_lens is None or
// a contiguous (B,) int32 tensor (cuda_kernels/autograd.cpp converts it).
// The checks below refuse what the kernels cannot read (they never read outside a view):
// a strided last dimension, or (versions 3-7, 16-bit) rows that are not 16-byte chunks.

#include <algorithm>
#include <limits>
#include <optional>

extern "C" int levels_attention_fwd(int dtype, int version,
                                    const void* q, int64_t sqb, int64_t sqh, int64_t sqn,
                                    const void* k, int64_t skb, int64_t skh, int64_t skn,
                                    const void* v, int64_t svb, int64_t svh, int64_t svn,
                                    void* out, float* lse, float* scratch,
                                    int64_t B, int64_t H, int64_t Hkv, int64_t Nq, int64_t Nk, int64_t D,
                                    int causal, int bottom_right, const int* kv_lens, float scale,
                                    const void* rope_cos, int64_t scr, int64_t scc,
                                    const void* rope_sin, int64_t ssr, int64_t ssc,
                                    int64_t rope_qoff, int rope_interleaved,
                                    cudaStream_t stream);
extern "C" int levels_attention_bwd(int dtype, int version,
                                    const void* dout, int64_t sdb, int64_t sdh, int64_t sdn,
                                    const void* q, int64_t sqb, int64_t sqh, int64_t sqn,
                                    const void* k, int64_t skb, int64_t skh, int64_t skn,
                                    const void* v, int64_t svb, int64_t svh, int64_t svn,
                                    const void* out, int64_t sob, int64_t soh, int64_t son,
                                    const float* lse, float* delta, void* dq, void* dk, void* dv, float* dq_accum,
                                    int64_t B, int64_t H, int64_t Hkv, int64_t Nq, int64_t Nk, int64_t D,
                                    int causal, int bottom_right, const int* kv_lens, float scale,
                                    const void* rope_cos, int64_t scr, int64_t scc,
                                    const void* rope_sin, int64_t ssr, int64_t ssc,
                                    int64_t rope_qoff, int rope_interleaved,
                                    cudaStream_t stream);

namespace levels_cuda_attention {

inline std::string what(const char* op, const char* name) {
  return std::string("levels_cuda::") + op + ": '" + name + "'";
}

// t must be (B, H, N, D) of q's dtype and device, with stride 1 along D (H: q's heads, or
// k's for k and v).
inline void check_operand(const at::Tensor& t, const at::Tensor& q, const char* op, const char* name,
                          int64_t N, int64_t H) {
  const int64_t B = q.size(0), D = q.size(3);
  LEVELS_CHECK(t.dim() == 4 && t.size(0) == B && t.size(1) == H && t.size(2) == N && t.size(3) == D,
               what(op, name) + " must be (" + std::to_string(B) + ", " + std::to_string(H) + ", " +
                   std::to_string(N) + ", " + std::to_string(D) + "); got " + levels_cuda::shape(t));
  LEVELS_CHECK(t.scalar_type() == q.scalar_type() && t.device() == q.device(),
               what(op, name) + " must be " + c10::toString(q.scalar_type()) + " on q's device; got " +
                   c10::toString(t.scalar_type()));
  LEVELS_CHECK(D == 1 || t.stride(3) == 1,
               what(op, name) + " must have stride 1 in its last dimension (D); got strides of " +
                   levels_cuda::shape(t) + " with stride(3) = " + std::to_string(t.stride(3)));
  for (int d = 0; d < 3; ++d)
    LEVELS_CHECK(t.stride(d) >= 0, what(op, name) + " has a negative stride");
}

// Versions 3-7 on 16-bit inputs read rows in 16-byte chunks (cp.async / uint4): the base
// 16-byte aligned and the stride of every dimension longer than 1 a multiple of 8 elements.
inline bool tensor_cores(const at::Tensor& q, int64_t version) {
  return version >= 3 && version <= 7 && q.scalar_type() != at::kFloat;
}

// Version 7's backward adds dQ into an fp32 workspace with atomics (attention.cu, "v7's
// backward"): where it runs its fused kernel (16-bit, a head size the tensor cores take).
inline bool fused_backward(const at::Tensor& q, int64_t version) {
  const int64_t D = q.size(3);
  return version == 7 && q.scalar_type() != at::kFloat && (D == 16 || D == 32 || D == 64 || D == 128);
}

inline void check_chunks(const at::Tensor& t, const char* op, const char* name, int64_t version) {
  bool ok = reinterpret_cast<uintptr_t>(t.const_data_ptr()) % 16 == 0;
  for (int d = 0; d < 3; ++d) ok = ok && (t.size(d) == 1 || t.stride(d) % 8 == 0);
  LEVELS_CHECK(ok, what(op, name) + " (version " + std::to_string(version) +
                       ", tensor cores) must start on a 16-byte boundary with batch, head and row "
                       "strides that are multiples of 8 elements (cuda_kernels/attention.py copies "
                       "such a tensor); got strides of " + levels_cuda::shape(t));
}

// k's heads divide q's (grouped-query attention).
inline int64_t kv_heads(const at::Tensor& q, const at::Tensor& k, const char* op) {
  const int64_t H = q.size(1), Hkv = k.size(1);
  LEVELS_CHECK(Hkv > 0 && H % Hkv == 0, what(op, "k") + " must have a number of heads dividing q's " +
                                            std::to_string(H) + "; got " + levels_cuda::shape(k));
  return Hkv;
}

// kv_lens: None, or (B,) int32, contiguous, on q's device. Its pointer, or null.
inline const int* lengths(const std::optional<at::Tensor>& kv_lens, const at::Tensor& q, const char* op) {
  if (!kv_lens.has_value() || !kv_lens->defined()) return nullptr;
  const at::Tensor& t = *kv_lens;
  LEVELS_CHECK(t.dim() == 1 && t.size(0) == q.size(0) && t.scalar_type() == at::kInt &&
                   t.is_contiguous() && t.device() == q.device(),
               what(op, "kv_lens") + " must be a contiguous int32 (B,) tensor on q's device; got " +
                   c10::toString(t.scalar_type()) + " " + levels_cuda::shape(t));
  return static_cast<const int*>(levels_cuda::in(t));
}

// The RoPE tables: both or neither; (P, D/2) of q's dtype and device, P covering every
// position (keys 0..Nk-1, queries offset..offset+Nq-1), D even, offset >= 0.
struct RopeArgs {
  const void* cos = nullptr;
  const void* sin = nullptr;
  int64_t csr = 0, csc = 0, ssr = 0, ssc = 0;
};

inline RopeArgs rope_tables(const std::optional<at::Tensor>& cos, const std::optional<at::Tensor>& sin,
                            int64_t offset, const at::Tensor& q, int64_t Nk, const char* op) {
  RopeArgs r;
  const bool has_cos = cos.has_value() && cos->defined(), has_sin = sin.has_value() && sin->defined();
  LEVELS_CHECK(has_cos == has_sin, what(op, "rope_cos") + " and 'rope_sin' must be given together");
  if (!has_cos) return r;
  const int64_t D = q.size(3), Nq = q.size(2);
  LEVELS_CHECK(D % 2 == 0, what(op, "q") + " must have an even head dimension D with rope (it rotates "
                                           "pairs of features); got " + levels_cuda::shape(q));
  LEVELS_CHECK(offset >= 0, what(op, "rope_offset") + " must be >= 0; got " + std::to_string(offset));
  const int64_t P = std::max(Nk, Nq + offset);
  for (const at::Tensor* t : {&*cos, &*sin}) {
    const char* name = t == &*cos ? "rope_cos" : "rope_sin";
    LEVELS_CHECK(t->dim() == 2 && t->size(0) >= P && t->size(1) == D / 2,
                 what(op, name) + " must be (P, " + std::to_string(D / 2) + ") with P >= " + std::to_string(P) +
                     "; got " + levels_cuda::shape(*t));
    LEVELS_CHECK(t->scalar_type() == q.scalar_type() && t->device() == q.device(),
                 what(op, name) + " must be " + c10::toString(q.scalar_type()) + " on q's device; got " +
                     c10::toString(t->scalar_type()));
    LEVELS_CHECK(t->stride(0) >= 0 && t->stride(1) >= 0, what(op, name) + " has a negative stride");
  }
  r.cos = levels_cuda::in(*cos);
  r.sin = levels_cuda::in(*sin);
  r.csr = cos->stride(0);
  r.csc = cos->stride(1);
  r.ssr = sin->stride(0);
  r.ssc = sin->stride(1);
  return r;
}

std::tuple<at::Tensor, at::Tensor> fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                       bool causal, double scale, int64_t version, bool bottom_right,
                                       const std::optional<at::Tensor>& kv_lens,
                                       const std::optional<at::Tensor>& rope_cos,
                                       const std::optional<at::Tensor>& rope_sin, bool rope_interleaved,
                                       int64_t rope_offset) {
  const char* op = "attention_fwd";
  LEVELS_CHECK(q.dim() == 4, what(op, "q") + " must be 4-D (B, H, Nq, D); got " + levels_cuda::shape(q));
  LEVELS_CHECK(k.dim() == 4, what(op, "k") + " must be 4-D (B, H_kv, Nk, D); got " + levels_cuda::shape(k));
  const int64_t B = q.size(0), H = q.size(1), Nq = q.size(2), D = q.size(3), Nk = k.size(2);
  const int64_t Hkv = kv_heads(q, k, op);
  check_operand(q, q, op, "q", Nq, H);
  check_operand(k, q, op, "k", Nk, Hkv);
  check_operand(v, q, op, "v", Nk, Hkv);
  const int* lens = lengths(kv_lens, q, op);
  const RopeArgs rope = rope_tables(rope_cos, rope_sin, rope_offset, q, Nk, op);
  if (tensor_cores(q, version)) {
    check_chunks(q, op, "q", version);
    check_chunks(k, op, "k", version);
    check_chunks(v, op, "v", version);
  }
  const c10::DeviceGuard guard(q.device());
  at::Tensor out = at::empty({B, H, Nq, D}, q.options());
  at::Tensor lse = at::empty({B, H, Nq}, q.options().dtype(at::kFloat));
  if (out.numel() == 0) return {out, lse};  // no launch with an empty grid
  if (Nk == 0) {  // no key to see: out = 0 (as SDPA), lse = +inf (the kernels' convention)
    out.zero_();
    lse.fill_(std::numeric_limits<float>::infinity());
    return {out, lse};
  }
  // Version 1 writes every score to global memory: B*H*Nq*Nk fp32 (4.3 GB at B4 H16
  // N4096), from torch's caching allocator, freed on return (ordered with the stream).
  at::Tensor scratch;
  if (version == 1) scratch = at::empty({B * H * Nq * Nk}, q.options().dtype(at::kFloat));
  const int status = levels_attention_fwd(
      levels_cuda::dtype_code(q), static_cast<int>(version),
      levels_cuda::in(q), q.stride(0), q.stride(1), q.stride(2),
      levels_cuda::in(k), k.stride(0), k.stride(1), k.stride(2),
      levels_cuda::in(v), v.stride(0), v.stride(1), v.stride(2),
      levels_cuda::out(out), static_cast<float*>(levels_cuda::out(lse)),
      version == 1 ? static_cast<float*>(levels_cuda::out(scratch)) : nullptr,
      B, H, Hkv, Nq, Nk, D, causal ? 1 : 0, bottom_right ? 1 : 0, lens, static_cast<float>(scale),
      rope.cos, rope.csr, rope.csc, rope.sin, rope.ssr, rope.ssc, rope_offset, rope_interleaved ? 1 : 0,
      levels_cuda::stream());
  levels_cuda::check(status, op, version);
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd(const at::Tensor& dout, const at::Tensor& q,
                                                   const at::Tensor& k, const at::Tensor& v,
                                                   const at::Tensor& out, const at::Tensor& lse,
                                                   bool causal, double scale, int64_t version,
                                                   bool bottom_right,
                                                   const std::optional<at::Tensor>& kv_lens,
                                                   const std::optional<at::Tensor>& rope_cos,
                                                   const std::optional<at::Tensor>& rope_sin,
                                                   bool rope_interleaved, int64_t rope_offset) {
  const char* op = "attention_bwd";
  LEVELS_CHECK(q.dim() == 4, what(op, "q") + " must be 4-D (B, H, Nq, D); got " + levels_cuda::shape(q));
  LEVELS_CHECK(k.dim() == 4, what(op, "k") + " must be 4-D (B, H_kv, Nk, D); got " + levels_cuda::shape(k));
  const int64_t B = q.size(0), H = q.size(1), Nq = q.size(2), D = q.size(3), Nk = k.size(2);
  const int64_t Hkv = kv_heads(q, k, op);
  check_operand(q, q, op, "q", Nq, H);
  check_operand(k, q, op, "k", Nk, Hkv);
  check_operand(v, q, op, "v", Nk, Hkv);
  check_operand(out, q, op, "out", Nq, H);
  check_operand(dout, q, op, "dout", Nq, H);
  const int* lens = lengths(kv_lens, q, op);
  const RopeArgs rope = rope_tables(rope_cos, rope_sin, rope_offset, q, Nk, op);
  LEVELS_CHECK(lse.dim() == 3 && lse.size(0) == B && lse.size(1) == H && lse.size(2) == Nq &&
                   lse.scalar_type() == at::kFloat && lse.is_contiguous(),
               what(op, "lse") + " must be a contiguous float32 (B, H, Nq) tensor (the forward's); got " +
                   c10::toString(lse.scalar_type()) + " " + levels_cuda::shape(lse));
  if (tensor_cores(q, version)) {
    check_chunks(q, op, "q", version);
    check_chunks(k, op, "k", version);
    check_chunks(v, op, "v", version);
    check_chunks(dout, op, "dout", version);  // out is read by the preprocess only, element-wise
  }
  const c10::DeviceGuard guard(q.device());
  at::Tensor dq = at::empty({B, H, Nq, D}, q.options());
  at::Tensor dk = at::empty({B, Hkv, Nk, D}, q.options());
  at::Tensor dv = at::empty({B, Hkv, Nk, D}, q.options());
  if (dq.numel() == 0 || dk.numel() == 0) {  // no query or no key: zero gradients, no launch
    dq.zero_();
    dk.zero_();
    dv.zero_();
    return {dq, dk, dv};
  }
  at::Tensor delta = at::empty({B * H * Nq}, q.options().dtype(at::kFloat));  // rowsum(dO * O)
  // v7: every key block adds its share of dQ into this (zeros first; 4 bytes per element of q)
  at::Tensor dq_accum;
  if (fused_backward(q, version)) dq_accum = at::empty({B, H, Nq, D}, q.options().dtype(at::kFloat)).zero_();
  const int status = levels_attention_bwd(
      levels_cuda::dtype_code(q), static_cast<int>(version),
      levels_cuda::in(dout), dout.stride(0), dout.stride(1), dout.stride(2),
      levels_cuda::in(q), q.stride(0), q.stride(1), q.stride(2),
      levels_cuda::in(k), k.stride(0), k.stride(1), k.stride(2),
      levels_cuda::in(v), v.stride(0), v.stride(1), v.stride(2),
      levels_cuda::in(out), out.stride(0), out.stride(1), out.stride(2),
      static_cast<const float*>(levels_cuda::in(lse)), static_cast<float*>(levels_cuda::out(delta)),
      levels_cuda::out(dq), levels_cuda::out(dk), levels_cuda::out(dv),
      dq_accum.defined() ? static_cast<float*>(levels_cuda::out(dq_accum)) : nullptr,
      B, H, Hkv, Nq, Nk, D, causal ? 1 : 0, bottom_right ? 1 : 0, lens, static_cast<float>(scale),
      rope.cos, rope.csr, rope.csc, rope.sin, rope.ssr, rope.ssc, rope_offset, rope_interleaved ? 1 : 0,
      levels_cuda::stream());
  levels_cuda::check(status, op, version);
  return {dq, dk, dv};
}

}  // namespace levels_cuda_attention

TORCH_LIBRARY_FRAGMENT(levels_cuda, m) {
  m.def("attention_fwd(Tensor q, Tensor k, Tensor v, bool causal, float scale, int version, "
        "bool bottom_right=False, Tensor? kv_lens=None, Tensor? rope_cos=None, "
        "Tensor? rope_sin=None, bool rope_interleaved=False, int rope_offset=0) -> (Tensor, Tensor)");
  m.def("attention_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
        "bool causal, float scale, int version, bool bottom_right=False, Tensor? kv_lens=None, "
        "Tensor? rope_cos=None, Tensor? rope_sin=None, bool rope_interleaved=False, "
        "int rope_offset=0) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(levels_cuda, CUDA, m) {
  m.impl("attention_fwd", &levels_cuda_attention::fwd);
  m.impl("attention_bwd", &levels_cuda_attention::bwd);
}
