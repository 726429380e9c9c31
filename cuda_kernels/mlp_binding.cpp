// mlp_binding.cpp — fragment appended to binding.cpp's prelude (no includes of its own):
// the GEMM ops of gemm.cu (`gemm_*`, reusable by other components) and the MLP forward
// (`mlp_fwd`). The MLP backward is a composition of the gemm_* ops, in C++ with its autograd
// node (autograd.cpp, struct Mlp).
//
// Matrices are passed with their element strides, as they come; what versions 4-8 need
// (rows contiguous along K, 16-byte aligned; version 6 also their transposes) is arranged by
// matmul_into below (k_major copies), and a launcher that cannot run a layout says so
// (LEVELS_UNSUPPORTED) instead of guessing.
// In the gemm_* ops, `b` is the (K, N) matrix of C = A·B; pass `w.t()` for an nn.Linear
// weight w (a view: for version 4 that is exactly the K-major layout it wants).

extern "C" int levels_gemm_matmul(int dtype, int version, int v4_tile, const void* a, int64_t stride_am,
                                  int64_t stride_ak, const void* b, int64_t stride_bk, int64_t stride_bn, void* c,
                                  int64_t stride_cm, int64_t stride_cn, int c_fp32, const void* bias,
                                  int64_t stride_bias, void* aux, int64_t stride_xm, int64_t stride_xn,
                                  int epilogue, int accumulate, int64_t M, int64_t N, int64_t K,
                                  cudaStream_t stream);
extern "C" int levels_gemm_column_sum(int dtype, int version, const void* x, int64_t stride_xm,
                                      int64_t stride_xn, void* out, int out_fp32, int64_t M, int64_t N,
                                      cudaStream_t stream);

namespace levels_cuda_mlp {

// gemm.cu's Epilogue codes.
constexpr int EPI_NONE = 0, EPI_GELU = 1, EPI_GELU_SAVE = 2, EPI_GELU_GRAD = 3;

// Versions 4 and 5 read A (M, K) and B as the (N, K) matrix in 16-byte chunks along K: rows
// contiguous along K, 16-byte aligned (version 6 also reads either one transposed, as it
// lies: matmul_into). The ops are called with any strides — by the C++ autograd of the MLP,
// SwiGLU and the LSTM (autograd.cpp), torch.compile's graphs, torch.library.opcheck, a user —
// and an operand in neither layout is copied here (R*K elements once) instead of refused.
inline bool is_k_major(const at::Tensor& t) {
  return t.stride(1) == 1 && t.stride(0) % 8 == 0 && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

inline at::Tensor k_major(const at::Tensor& t) {  // t (R, K)
  if (is_k_major(t)) return t;
  const int64_t K = t.size(1), ld = (K + 7) / 8 * 8;
  at::Tensor copy = at::empty({t.size(0), ld}, t.options()).narrow(1, 0, K);
  copy.copy_(t);
  return copy;
}

// c = epilogue(a · b); aux and bias may be undefined tensors. v4_tile: gemm.cu's (0: the
// tile from the size; 1-3 pin one, what mlp_fwd's `tile` passes for the bench's sweep).
inline void matmul_into(const at::Tensor& c, const at::Tensor& a_in, const at::Tensor& b_in,
                        const std::optional<at::Tensor>& bias, const at::Tensor* aux, int epilogue,
                        bool accumulate, int64_t version, const char* op, int64_t v4_tile = 0) {
  const bool has_bias = bias.has_value() && bias->defined();
  // Empty problems launch nothing: no rows or columns (a batch of 0) leave nothing to write;
  // a sum over K = 0 terms (a weight gradient over a batch of 0 rows) is 0, written here,
  // where c would otherwise keep at::empty's garbage. Epilogues that make something of the 0
  // (a bias, an activation) still run in the kernel.
  if (c.size(0) == 0 || c.size(1) == 0) return;
  if (a_in.size(1) == 0 && epilogue == EPI_NONE && !has_bias) {
    if (!accumulate) c.zero_();
    return;
  }
  const bool tensor_cores = version >= 4 && a_in.scalar_type() != at::kFloat;
  // Version 6 reads a transposed operand as it lies (gemm.cu: MN-major tiles, imm-trans), for
  // an output of the inputs' dtype: A stored (K, M) with M contiguous (dYᵀ of a weight
  // gradient), B (K, N) with N contiguous (an activation, a weight used untransposed). The
  // backward of an MLP then copies nothing; the other versions get K-major copies.
  const bool as_lies = version == 6 && c.scalar_type() == a_in.scalar_type() && a_in.size(1) > 0;
  const bool a_as_lies = as_lies && !is_k_major(a_in) && is_k_major(a_in.t());
  const bool b_as_lies = as_lies && !is_k_major(b_in.t()) && is_k_major(b_in);
  const at::Tensor a = tensor_cores && !a_as_lies ? k_major(a_in) : a_in;
  const at::Tensor b = tensor_cores && !b_as_lies ? k_major(b_in.t()).t() : b_in;
  const int status = levels_gemm_matmul(
      levels_cuda::dtype_code(a), static_cast<int>(version), static_cast<int>(v4_tile),
      levels_cuda::in(a), a.stride(0), a.stride(1),
      levels_cuda::in(b), b.stride(0), b.stride(1),
      levels_cuda::out(c), c.stride(0), c.stride(1), c.scalar_type() == at::kFloat ? 1 : 0,
      has_bias ? levels_cuda::in(*bias) : nullptr, has_bias ? bias->stride(0) : 0,
      aux ? levels_cuda::out(*aux) : nullptr, aux ? aux->stride(0) : 0, aux ? aux->stride(1) : 0,
      epilogue, accumulate ? 1 : 0, a.size(0), b.size(1), a.size(1), levels_cuda::stream());
  levels_cuda::check(status, op, version);
}

// An (M, N) output whose rows start on 16-byte boundaries even when N is odd: the row
// stride is rounded up to 8 elements and the (M, N) view returned. Used for the hidden
// activations, which are the A operand of the next GEMM (version 4 needs aligned rows).
// cuda_kernels/mlp.py's fake implementation allocates the same way.
inline at::Tensor padded_rows(int64_t M, int64_t N, const at::TensorOptions& options) {
  const int64_t ld = (N + 7) / 8 * 8;
  at::Tensor full = at::empty({M, ld}, options);
  return ld == N ? full : full.narrow(1, 0, N);
}

at::Tensor matmul(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& bias,
                  bool gelu, bool out_fp32, int64_t version) {
  at::Tensor c = at::empty({a.size(0), b.size(1)}, a.options().dtype(out_fp32 ? at::kFloat : a.scalar_type()));
  matmul_into(c, a, b, bias, nullptr, gelu ? EPI_GELU : EPI_NONE, false, version, "gemm_matmul");
  return c;
}

std::tuple<at::Tensor, at::Tensor> matmul_gelu_save(const at::Tensor& a, const at::Tensor& b,
                                                    const std::optional<at::Tensor>& bias, int64_t version) {
  at::Tensor act = at::empty({a.size(0), b.size(1)}, a.options());
  at::Tensor pre = at::empty({a.size(0), b.size(1)}, a.options());
  matmul_into(act, a, b, bias, &pre, EPI_GELU_SAVE, false, version, "gemm_matmul_gelu_save");
  return {act, pre};
}

at::Tensor matmul_gelu_grad(const at::Tensor& a, const at::Tensor& b, const at::Tensor& pre, int64_t version) {
  at::Tensor c = at::empty({a.size(0), b.size(1)}, a.options());
  matmul_into(c, a, b, std::nullopt, &pre, EPI_GELU_GRAD, false, version, "gemm_matmul_gelu_grad");
  return c;
}

void matmul_accumulate(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b,
                       const std::optional<at::Tensor>& bias, int64_t version) {
  matmul_into(c, a, b, bias, nullptr, EPI_NONE, true, version, "gemm_matmul_accumulate");
}

at::Tensor column_sum(const at::Tensor& x, bool out_fp32, int64_t version) {
  at::Tensor out = at::empty({x.size(1)}, x.options().dtype(out_fp32 ? at::kFloat : x.scalar_type()));
  if (x.size(0) == 0) return out.zero_();  // no rows (a batch of 0): a sum of nothing, no launch
  const int status = levels_gemm_column_sum(levels_cuda::dtype_code(x), static_cast<int>(version),
                                            levels_cuda::in(x), x.stride(0), x.stride(1), levels_cuda::out(out),
                                            out_fp32 ? 1 : 0, x.size(0), x.size(1), levels_cuda::stream());
  levels_cuda::check(status, "gemm_column_sum", version);
  return out;
}

// out = GELU(x · w1ᵀ + b1) · w2ᵀ + b2 with x (M, K), w1 (hidden, K), w2 (N, hidden) as
// nn.Linear stores them; also returns the pre-activation H and the activation G = GELU(H)
// that backward needs (both written by the first GEMM's epilogue, in one pass). tile pins
// version 4's tile shape for both GEMMs (0: each GEMM's from its size; see gemm.cu).
std::tuple<at::Tensor, at::Tensor, at::Tensor> mlp_fwd(const at::Tensor& x, const at::Tensor& w1,
                                                       const at::Tensor& b1, const at::Tensor& w2,
                                                       const at::Tensor& b2, int64_t version,
                                                       int64_t tile) {
  const int64_t M = x.size(0), hidden = w1.size(0), N = w2.size(0);
  at::Tensor act = padded_rows(M, hidden, x.options());
  at::Tensor pre = padded_rows(M, hidden, x.options());
  at::Tensor out = at::empty({M, N}, x.options());
  matmul_into(act, x, w1.t(), b1, &pre, EPI_GELU_SAVE, false, version, "mlp_fwd (first GEMM)", tile);
  matmul_into(out, act, w2.t(), b2, nullptr, EPI_NONE, false, version, "mlp_fwd (second GEMM)", tile);
  return {out, pre, act};
}

}  // namespace levels_cuda_mlp

TORCH_LIBRARY_FRAGMENT(levels_cuda, m) {
  m.def("gemm_matmul(Tensor a, Tensor b, Tensor? bias, bool gelu, bool out_fp32, int version) -> Tensor");
  m.def("gemm_matmul_gelu_save(Tensor a, Tensor b, Tensor? bias, int version) -> (Tensor, Tensor)");
  m.def("gemm_matmul_gelu_grad(Tensor a, Tensor b, Tensor pre, int version) -> Tensor");
  m.def("gemm_matmul_accumulate(Tensor(a!) c, Tensor a, Tensor b, Tensor? bias, int version) -> ()");
  m.def("gemm_column_sum(Tensor x, bool out_fp32, int version) -> Tensor");
  m.def("mlp_fwd(Tensor x, Tensor w1, Tensor b1, Tensor w2, Tensor b2, int version, int tile=0) -> "
        "(Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(levels_cuda, CUDA, m) {
  m.impl("gemm_matmul", &levels_cuda_mlp::matmul);
  m.impl("gemm_matmul_gelu_save", &levels_cuda_mlp::matmul_gelu_save);
  m.impl("gemm_matmul_gelu_grad", &levels_cuda_mlp::matmul_gelu_grad);
  m.impl("gemm_matmul_accumulate", &levels_cuda_mlp::matmul_accumulate);
  m.impl("gemm_column_sum", &levels_cuda_mlp::column_sum);
  m.impl("mlp_fwd", &levels_cuda_mlp::mlp_fwd);
}
