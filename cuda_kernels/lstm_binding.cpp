// lstm_binding.cpp — fragment appended to binding.cpp's prelude (no includes of its own): the
// two ops of the LSTM recurrence (cuda_kernels/lstm.cu).
//
//   lstm_fwd(x2, w_ih, b_ih, xp, h0, c0, w_hh, b_hh, time_major, save, version)
//       -> (out (B, T, H), h_n (B, H), c_n (B, H), gates (rows, 4H) fp32, cs (rows, H) fp32)
//   lstm_bwd(dout, dh_n, dc_n, c0, w_hh, gates, cs, time_major, version)
//       -> (dz (rows, 4H), dh0 (B, H), dc0 (B, H))
//
// xp = x2 · w_ihᵀ + b_ih in fp32 is made BEFORE lstm_fwd by part A's GEMM (cuda_kernels/lstm.py):
// lstm_fwd does not read x2, w_ih, b_ih. They are its arguments so that the autograd formula
// registered for lstm_fwd (lstm.py) receives them and returns their gradients (dx = dz·W_ih,
// dW_ih = dzᵀ·x2, db = column sums: GEMMs over all steps). Only their shapes are checked here.
// The rows of xp, x2, gates, cs and dz are (batch b, step t) at b*T + t (time_major false)
// or t*B + b (time_major true: x was a time-major view, whose rows the GEMM reads as they are).
// gates and cs are saved for backward only when `save` (else 0-element tensors).
// version: 1 or 2, or 0 = the plan lstm.py asks for when the caller chose no version (v2 where
// it fits this GPU, else v1; decided in lstm.cu's launch_fwd / launch_bwd).

extern "C" int levels_lstm_fwd(int dtype, int version, const float* xp, const void* h0, const void* c0,
                               const void* w_hh, const void* b_hh, void* out, void* h_n, void* c_n,
                               float* gates, float* cs, float* c_buf, unsigned* sync, int64_t B, int64_t T,
                               int64_t H, int64_t rs_b, int64_t rs_t, cudaStream_t stream);
extern "C" int levels_lstm_bwd(int dtype, int version, const void* dout, const void* dh_n, const void* dc_n,
                               const void* c0, const void* wt, const float* gates, const float* cs, void* dz,
                               void* dh0, void* dc0, float* dc_buf, unsigned* sync, int64_t B, int64_t T,
                               int64_t H, int64_t rs_b, int64_t rs_t, cudaStream_t stream);

namespace levels_cuda_lstm {

inline std::string dims(std::initializer_list<int64_t> shape) {
  std::string out = "[";
  bool first = true;
  for (int64_t d : shape) {
    out += (first ? "" : ", ") + std::to_string(d);
    first = false;
  }
  return out + "]";
}

// The kernels index these tensors densely (see the layouts at the top of lstm.cu): refuse any
// other shape, dtype or layout rather than read outside a view (lstm.py never sends one;
// opcheck or a direct call might).
inline void expect(const at::Tensor& t, const char* op, const char* name, std::initializer_list<int64_t> shape,
                   at::ScalarType dtype, bool dense) {
  const std::string what = std::string("levels_cuda::") + op + ": '" + name + "'";
  LEVELS_CHECK(t.is_cuda(), what + " must be a CUDA tensor");
  LEVELS_CHECK(t.sizes() == at::IntArrayRef(shape),
               what + " must have shape " + dims(shape) + "; got " + levels_cuda::shape(t));
  LEVELS_CHECK(t.scalar_type() == dtype, what + " must be " + c10::toString(dtype) + "; got " +
                                             c10::toString(t.scalar_type()));
  LEVELS_CHECK(!dense || t.is_contiguous(), what + " must be contiguous (the kernels index it densely)");
}

// Version 2's grid barrier (lstm.cu's grid_arrive / grid_wait) counts in words that must be
// zero when its kernel starts: one per block at most, and a block holds at least 4 hidden
// units, so ceil(H/4) words, zeroed by a memset on the op's stream (ordered before the
// kernel; the caching allocator keeps the memory alive until the stream has passed the
// kernel). Empty, and no memset, for version 1, which has no barrier.
inline at::Tensor barrier_words(int64_t version, int64_t H, const at::Tensor& like, const char* op) {
  at::Tensor words = at::empty({version != 1 ? (H + 3) / 4 : 0}, like.options().dtype(at::kInt));
  if (words.numel() > 0) {
    const cudaError_t err = cudaMemsetAsync(levels_cuda::out(words), 0, words.numel() * sizeof(int32_t),
                                            levels_cuda::stream());
    levels_cuda::check(static_cast<int>(err), op, version);
  }
  return words;
}

// (rs_b, rs_t): the per-step row of (b, t) is b * rs_b + t * rs_t.
inline std::pair<int64_t, int64_t> row_strides(bool time_major, int64_t B, int64_t T) {
  return time_major ? std::pair<int64_t, int64_t>{1, B} : std::pair<int64_t, int64_t>{T, 1};
}

// Version 2 refuses sizes whose W_hh cannot stay on chip: a ValueError that names w_hh and the
// way out (the message of every other status is the prelude's).
inline void check_status(int status, const char* op, int64_t version, const at::Tensor& w_hh, int64_t B) {
  if (status == -3 && version == 2) {
    TORCH_CHECK_VALUE(false, std::string("levels_cuda::") + op + " (version 2): w_hh " +
                                 levels_cuda::shape(w_hh) + " " + c10::toString(w_hh.scalar_type()) +
                                 " does not fit on chip with batch " + std::to_string(B) +
                                 ": the persistent kernel keeps 16 rows of it per block in shared "
                                 "memory and needs all ceil(hidden/4) = " +
                                 std::to_string((w_hh.size(1) + 3) / 4) +
                                 " blocks resident on this GPU at once (or the GPU cannot launch "
                                 "cooperatively). Use version 1 (version=1 or LEVELS_CUDA_VERSION_LSTM=1), "
                                 "which reads w_hh from L2 every step, or a smaller hidden size or dtype.");
  }
  levels_cuda::check(status, op, version);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> fwd(
    const at::Tensor& x2, const at::Tensor& w_ih, const at::Tensor& b_ih, const at::Tensor& xp,
    const at::Tensor& h0, const at::Tensor& c0, const at::Tensor& w_hh, const at::Tensor& b_hh, bool time_major,
    bool save, int64_t version) {
  const char* op = "lstm_fwd";
  LEVELS_CHECK(h0.dim() == 2 && w_hh.dim() == 2 && x2.dim() == 2,
               "levels_cuda::lstm_fwd: 'h0' (B, H), 'w_hh' (4H, H) and 'x2' (rows, I) must be 2-D; got " +
                   levels_cuda::shape(h0) + ", " + levels_cuda::shape(w_hh) + ", " + levels_cuda::shape(x2));
  const int64_t B = h0.size(0), H = w_hh.size(1), I = x2.size(1), rows = x2.size(0);
  LEVELS_CHECK(B > 0 && rows % B == 0, "levels_cuda::lstm_fwd: 'x2' must have B*T rows (B = " +
                                           std::to_string(B) + "); got " + levels_cuda::shape(x2));
  const int64_t T = rows / B;
  const at::ScalarType dt = h0.scalar_type();
  expect(x2, op, "x2", {rows, I}, dt, false);  // not read here: any strides
  expect(w_ih, op, "w_ih", {4 * H, I}, dt, false);
  expect(b_ih, op, "b_ih", {4 * H}, dt, false);
  expect(xp, op, "xp", {rows, 4 * H}, at::kFloat, true);
  expect(h0, op, "h0", {B, H}, dt, true);
  expect(c0, op, "c0", {B, H}, dt, true);
  expect(w_hh, op, "w_hh", {4 * H, H}, dt, true);
  expect(b_hh, op, "b_hh", {4 * H}, dt, true);
  const c10::DeviceGuard guard(h0.device());
  at::Tensor out = at::empty({B, T, H}, h0.options());
  at::Tensor h_n = at::empty({B, H}, h0.options());
  at::Tensor c_n = at::empty({B, H}, h0.options());
  const auto f32 = h0.options().dtype(at::kFloat);
  at::Tensor gates = save ? at::empty({rows, 4 * H}, f32) : at::empty({0}, f32);
  at::Tensor cs = save ? at::empty({rows, H}, f32) : at::empty({0}, f32);
  // c between the step launches of version 1 (version 2 keeps it in shared memory; the plan,
  // version 0, may run either).
  at::Tensor c_buf = at::empty({version != 2 ? B * H : 0}, f32);
  if (rows == 0 || H == 0) return {out, h_n, c_n, gates, cs};
  const at::Tensor sync = barrier_words(version, H, h0, op);
  const auto [rs_b, rs_t] = row_strides(time_major, B, T);
  const int status = levels_lstm_fwd(
      levels_cuda::dtype_code(h0), static_cast<int>(version), static_cast<const float*>(levels_cuda::in(xp)),
      levels_cuda::in(h0), levels_cuda::in(c0), levels_cuda::in(w_hh), levels_cuda::in(b_hh),
      levels_cuda::out(out), levels_cuda::out(h_n), levels_cuda::out(c_n),
      save ? static_cast<float*>(levels_cuda::out(gates)) : nullptr,
      save ? static_cast<float*>(levels_cuda::out(cs)) : nullptr,
      version != 2 ? static_cast<float*>(levels_cuda::out(c_buf)) : nullptr,
      version != 1 ? static_cast<unsigned*>(levels_cuda::out(sync)) : nullptr, B, T, H, rs_b, rs_t,
      levels_cuda::stream());
  check_status(status, op, version, w_hh, B);
  return {out, h_n, c_n, gates, cs};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd(const at::Tensor& dout, const at::Tensor& dh_n,
                                                   const at::Tensor& dc_n, const at::Tensor& c0,
                                                   const at::Tensor& w_hh, const at::Tensor& gates,
                                                   const at::Tensor& cs, bool time_major, int64_t version) {
  const char* op = "lstm_bwd";
  LEVELS_CHECK(dout.dim() == 3 && w_hh.dim() == 2,
               "levels_cuda::lstm_bwd: 'dout' (B, T, H) must be 3-D and 'w_hh' (4H, H) 2-D; got " +
                   levels_cuda::shape(dout) + ", " + levels_cuda::shape(w_hh));
  const int64_t B = dout.size(0), T = dout.size(1), H = dout.size(2), rows = B * T;
  const at::ScalarType dt = dout.scalar_type();
  expect(dout, op, "dout", {B, T, H}, dt, true);
  expect(dh_n, op, "dh_n", {B, H}, dt, true);
  expect(dc_n, op, "dc_n", {B, H}, dt, true);
  expect(c0, op, "c0", {B, H}, dt, true);
  expect(w_hh, op, "w_hh", {4 * H, H}, dt, false);  // transposed into a new tensor below
  expect(gates, op, "gates", {rows, 4 * H}, at::kFloat, true);
  expect(cs, op, "cs", {rows, H}, at::kFloat, true);
  const c10::DeviceGuard guard(dout.device());
  at::Tensor dz = at::empty({rows, 4 * H}, dout.options());
  at::Tensor dh0 = at::empty({B, H}, dout.options());
  at::Tensor dc0 = at::empty({B, H}, dout.options());
  if (rows == 0 || H == 0) return {dz, dh0, dc0};
  // dz_{t+1} · W_hh reads W_hh by columns: the kernels take W_hhᵀ (H, 4H) with contiguous
  // rows, one copy of 4H*H elements per backward call.
  at::Tensor wt = at::empty({H, 4 * H}, w_hh.options());
  wt.copy_(w_hh.t());
  at::Tensor dc_buf = at::empty({version != 2 ? B * H : 0}, dout.options().dtype(at::kFloat));
  const at::Tensor sync = barrier_words(version, H, dout, op);
  const auto [rs_b, rs_t] = row_strides(time_major, B, T);
  const int status = levels_lstm_bwd(
      levels_cuda::dtype_code(dout), static_cast<int>(version), levels_cuda::in(dout), levels_cuda::in(dh_n),
      levels_cuda::in(dc_n), levels_cuda::in(c0), levels_cuda::in(wt),
      static_cast<const float*>(levels_cuda::in(gates)), static_cast<const float*>(levels_cuda::in(cs)),
      levels_cuda::out(dz), levels_cuda::out(dh0), levels_cuda::out(dc0),
      version != 2 ? static_cast<float*>(levels_cuda::out(dc_buf)) : nullptr,
      version != 1 ? static_cast<unsigned*>(levels_cuda::out(sync)) : nullptr, B, T, H, rs_b, rs_t,
      levels_cuda::stream());
  check_status(status, op, version, w_hh, B);
  return {dz, dh0, dc0};
}

}  // namespace levels_cuda_lstm

TORCH_LIBRARY_FRAGMENT(levels_cuda, m) {
  m.def("lstm_fwd(Tensor x2, Tensor w_ih, Tensor b_ih, Tensor xp, Tensor h0, Tensor c0, Tensor w_hh, "
        "Tensor b_hh, bool time_major, bool save, int version) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def("lstm_bwd(Tensor dout, Tensor dh_n, Tensor dc_n, Tensor c0, Tensor w_hh, Tensor gates, Tensor cs, "
        "bool time_major, int version) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(levels_cuda, CUDA, m) {
  m.impl("lstm_fwd", &levels_cuda_lstm::fwd);
  m.impl("lstm_bwd", &levels_cuda_lstm::bwd);
}
