// rope.cu — rotary position embeddings, forward and backward, as a short ladder.
//
//   y[b, h, n, lo(i)] = x1 cos[n, i] - x2 sin[n, i],   y[b, h, n, hi(i)] = x2 cos + x1 sin,
//   x1 = x[b, h, n, lo(i)], x2 = x[b, h, n, hi(i)],   i < D/2,
//   lo(i), hi(i) = i, i + D/2 (half-split: GPT-NeoX, HF Llama) or 2i, 2i + 1 (interleaved:
//   the RoPE paper, Meta's Llama).
//
// The backward is the same kernel: a rotation's inverse is its transpose, the rotation by
// -theta, so dx = rotate(dy, cos, -sin) (`sign` = -1). cos and sin are tables (never
// differentiated). x (or dy) is read through all four of its strides, so q sliced out of a
// fused qkv projection, or an expanded gradient of stride 0, needs no copy; the tables
// through theirs; y is contiguous (B, H, N, D). Every version computes in fp32.
//
// Versions (LEVELS_CUDA_VERSION_ROPE=1|2|3):
//   v1  one thread per pair over a flat index: three divisions per pair to find (b, h, n, i),
//       the tables re-read by every head from L2. Costs: the divisions (a 64-bit division is
//       a few dozen instructions), and nothing else: it is already coalesced along i.
//   v2  a block per (row block, head) as Level 4's program: threadIdx.x walks the pairs of a
//       row, threadIdx.y the rows, divisions once per block; each thread handles ROWS rows,
//       issuing all their loads before any arithmetic, so that more bytes are in flight per
//       thread (memory-level parallelism is what a memory-bound kernel lives on). The pair
//       loop is rope_rotate (rope.cuh), the device function attention can call.
//   v3  16-byte vectors (4 fp32 or 8 bf16/fp16 per load and store: ld.global.v4), the step
//       that took layer_norm from 0.47x to 0.98x a copy. A thread owns a chunk of VEC
//       elements of a row: half-split, VEC pairs (a vector of x1, one of x2, one of cos, one of
//       sin); interleaved, VEC/2 pairs inside one vector of x (cos and sin then VEC/2 scalar
//       loads: they are L1/L2-resident, B*H times smaller than x). The 256 threads of a block
//       are split into rows of `chunks` threads, v3_rows() rows a thread, loads first as in v2.
//       Costs: it needs what vectors need (a unit last stride, every other stride and the
//       pointers 16-byte aligned, D/2 (half-split) or D (interleaved) a multiple of VEC, at
//       most 256 chunks a row), so v3 FALLS BACK to v2 otherwise, which says nothing: the
//       result is the same, only slower. q sliced out of a fused qkv buffer qualifies.
#include "common.cuh"
#include "rope.cuh"

namespace levels_rope {

struct Strides {
  int64_t xb, xh, xn, xd;  // x (or dy), in elements
  int64_t cn, cd, sn, sd;  // cos, sin
};

template <typename T>
__global__ void rope_v1(const T* __restrict__ x, const T* __restrict__ cos,
                        const T* __restrict__ sin, T* __restrict__ y, int64_t H, int64_t N,
                        int64_t half, int64_t pairs, Strides st, float sign, bool interleaved) {
  for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < pairs;
       p += (int64_t)gridDim.x * blockDim.x) {
    const int64_t i = p % half, row = p / half;  // row = (b * H + h) * N + n
    const int64_t n = row % N, bh = row / N;
    const int64_t b = bh / H, h = bh % H;
    const int64_t lo = interleaved ? 2 * i : i, hi = interleaved ? 2 * i + 1 : i + half;
    const T* xr = x + b * st.xb + h * st.xh + n * st.xn;
    float y1, y2;
    rope_rotate(to_f32(xr[lo * st.xd]), to_f32(xr[hi * st.xd]), to_f32(cos[n * st.cn + i * st.cd]),
                sign * to_f32(sin[n * st.sn + i * st.sd]), y1, y2);
    T* yr = y + row * 2 * half;
    yr[lo] = from_f32<T>(y1);
    yr[hi] = from_f32<T>(y2);
  }
}

constexpr int V2_ROWS = 4;  // rows per thread, their loads issued together

template <typename T>
__global__ void rope_v2(const T* __restrict__ x, const T* __restrict__ cos,
                        const T* __restrict__ sin, T* __restrict__ y, int64_t H, int64_t N,
                        int64_t half, int64_t row_blocks, Strides st, float sign,
                        bool interleaved) {
  const int64_t bh = blockIdx.x / row_blocks, rb = blockIdx.x % row_blocks;
  const int64_t b = bh / H, h = bh % H;
  const int64_t rows_per_block = (int64_t)blockDim.y * V2_ROWS;
  const int64_t n0 = rb * rows_per_block + threadIdx.y;
  const T* xh = x + b * st.xb + h * st.xh;
  T* yh = y + bh * N * 2 * half;
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    const int64_t lo = interleaved ? 2 * i : i, hi = interleaved ? 2 * i + 1 : i + half;
    float x1[V2_ROWS], x2[V2_ROWS], c[V2_ROWS], s[V2_ROWS];
#pragma unroll
    for (int r = 0; r < V2_ROWS; ++r) {  // every load first ...
      const int64_t n = n0 + r * (int64_t)blockDim.y;
      const bool ok = n < N;
      x1[r] = ok ? to_f32(xh[n * st.xn + lo * st.xd]) : 0.0f;
      x2[r] = ok ? to_f32(xh[n * st.xn + hi * st.xd]) : 0.0f;
      c[r] = ok ? to_f32(cos[n * st.cn + i * st.cd]) : 0.0f;
      s[r] = ok ? sign * to_f32(sin[n * st.sn + i * st.sd]) : 0.0f;
    }
#pragma unroll
    for (int r = 0; r < V2_ROWS; ++r) {  // ... then the arithmetic and the stores
      const int64_t n = n0 + r * (int64_t)blockDim.y;
      if (n >= N) continue;
      float y1, y2;
      rope_rotate(x1[r], x2[r], c[r], s[r], y1, y2);
      yh[n * 2 * half + lo] = from_f32<T>(y1);
      yh[n * 2 * half + hi] = from_f32<T>(y2);
    }
  }
}

// VEC elements that travel as one 16-byte load/store (as layer_norm.cu's Vec).
template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Vec {
  T v[VEC];
};

// Rows per thread, their loads issued together: 64 bytes of x a row in flight either way
// (4 fp32 vectors or 2 16-bit ones, half-split). 4 rows of bf16 took 145 registers a thread
// (one 256-thread block an SM; bounding it to 128 spilled), 2 rows take 80 (ptxas -v, sm_90a).
template <typename T>
constexpr int v3_rows() { return sizeof(T) == 4 ? 4 : 2; }
constexpr int V3_THREADS = 256;

template <typename T, bool INTERLEAVED>
__global__ void rope_v3(const T* __restrict__ x, const T* __restrict__ cos,
                        const T* __restrict__ sin, T* __restrict__ y, int64_t H, int64_t N,
                        int64_t half, int64_t row_blocks, int chunks, Strides st, float sign) {
  constexpr int VEC = 16 / sizeof(T);
  constexpr int V3_ROWS = v3_rows<T>();
  using V = Vec<T, VEC>;
  const int rows_per_pass = V3_THREADS / chunks;
  const int row = threadIdx.x / chunks, chunk = threadIdx.x % chunks;
  if (row >= rows_per_pass) return;  // the block's leftover threads (no barrier follows)
  const int64_t bh = blockIdx.x / row_blocks, rb = blockIdx.x % row_blocks;
  const int64_t b = bh / H, h = bh % H;
  const int64_t n0 = rb * rows_per_pass * V3_ROWS + row;
  const T* xh = x + b * st.xb + h * st.xh;
  T* yh = y + bh * N * 2 * half;
  // half-split: pairs [i, i + VEC), x1 at i, x2 at half + i; interleaved: elements
  // [e, e + VEC) of the row, pairs [e / 2, e / 2 + VEC / 2)
  const int64_t e = (int64_t)chunk * VEC;
  // Raw vectors (and raw table elements) stay in the input dtype until the arithmetic.
  V a[V3_ROWS], b2[V3_ROWS], cv[V3_ROWS], sv[V3_ROWS];  // interleaved: x, -, cos, sin
#pragma unroll
  for (int r = 0; r < V3_ROWS; ++r) {  // every load first ...
    const int64_t n = n0 + (int64_t)r * rows_per_pass;
    if (n >= N) continue;
    const T* xr = xh + n * st.xn;
    a[r] = *reinterpret_cast<const V*>(xr + e);
    if (INTERLEAVED) {
#pragma unroll
      for (int k = 0; k < VEC / 2; ++k) {
        cv[r].v[k] = cos[n * st.cn + (e / 2 + k) * st.cd];
        sv[r].v[k] = sin[n * st.sn + (e / 2 + k) * st.sd];
      }
    } else {
      b2[r] = *reinterpret_cast<const V*>(xr + half + e);
      cv[r] = *reinterpret_cast<const V*>(cos + n * st.cn + e);
      sv[r] = *reinterpret_cast<const V*>(sin + n * st.sn + e);
    }
  }
#pragma unroll
  for (int r = 0; r < V3_ROWS; ++r) {  // ... then the arithmetic and the stores
    const int64_t n = n0 + (int64_t)r * rows_per_pass;
    if (n >= N) continue;
    T* yr = yh + n * 2 * half;
    if (INTERLEAVED) {
      V out;
#pragma unroll
      for (int k = 0; k < VEC / 2; ++k) {
        float y1, y2;
        rope_rotate(to_f32(a[r].v[2 * k]), to_f32(a[r].v[2 * k + 1]), to_f32(cv[r].v[k]),
                    sign * to_f32(sv[r].v[k]), y1, y2);
        out.v[2 * k] = from_f32<T>(y1);
        out.v[2 * k + 1] = from_f32<T>(y2);
      }
      *reinterpret_cast<V*>(yr + e) = out;
    } else {
      V out1, out2;
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        float y1, y2;
        rope_rotate(to_f32(a[r].v[k]), to_f32(b2[r].v[k]), to_f32(cv[r].v[k]),
                    sign * to_f32(sv[r].v[k]), y1, y2);
        out1.v[k] = from_f32<T>(y1);
        out2.v[k] = from_f32<T>(y2);
      }
      *reinterpret_cast<V*>(yr + e) = out1;
      *reinterpret_cast<V*>(yr + half + e) = out2;
    }
  }
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// Whether v3's vectors can read these operands (see the file's header); `elems` the
// number of elements a vector holds.
inline bool v3_fits(const void* x, const void* cos, const void* sin, int64_t B, int64_t H,
                    int64_t N, int64_t half, const Strides& st, bool interleaved, int elems) {
  const int64_t width = interleaved ? 2 * half : half;  // what a row's chunks cover
  if (width % elems != 0 || width / elems > V3_THREADS) return false;
  if (st.xd != 1 || !aligned16(x)) return false;
  const bool strides_ok = (B == 1 || st.xb % elems == 0) && (H == 1 || st.xh % elems == 0) &&
                          (N == 1 || st.xn % elems == 0) && (interleaved || half % elems == 0);
  if (!strides_ok) return false;
  if (interleaved) return true;  // the tables are read element by element
  return st.cd == 1 && st.sd == 1 && aligned16(cos) && aligned16(sin) &&
         (N == 1 || (st.cn % elems == 0 && st.sn % elems == 0));
}

template <typename T>
int launch(int version, const T* x, const T* cos, const T* sin, T* y, int64_t B, int64_t H,
           int64_t N, int64_t half, const Strides& st, float sign, bool interleaved,
           cudaStream_t stream) {
  if (version == 1) {
    const int64_t pairs = B * H * N * half;
    const int threads = 256;
    const int64_t blocks = levels_cdiv(pairs, threads) < 65536 * 16 ? levels_cdiv(pairs, threads)
                                                                    : 65536 * 16;
    rope_v1<T><<<(unsigned)blocks, threads, 0, stream>>>(x, cos, sin, y, H, N, half, pairs, st,
                                                          sign, interleaved);
    return levels_launch_status();
  }
  constexpr int VEC = 16 / sizeof(T);
  if (version == 3 && v3_fits(x, cos, sin, B, H, N, half, st, interleaved, VEC)) {
    const int chunks = (int)((interleaved ? 2 * half : half) / VEC);
    const int64_t rows_per_block = (int64_t)(V3_THREADS / chunks) * v3_rows<T>();
    const int64_t row_blocks = levels_cdiv(N, rows_per_block);
    const int64_t blocks = B * H * row_blocks;
    if (blocks > 2147483647LL) return LEVELS_UNSUPPORTED;
    if (interleaved) {
      rope_v3<T, true><<<(unsigned)blocks, V3_THREADS, 0, stream>>>(x, cos, sin, y, H, N, half,
                                                                   row_blocks, chunks, st, sign);
    } else {
      rope_v3<T, false><<<(unsigned)blocks, V3_THREADS, 0, stream>>>(x, cos, sin, y, H, N, half,
                                                                    row_blocks, chunks, st, sign);
    }
    return levels_launch_status();
  }
  // v2 (and v3 where vectors cannot read the operands): threadIdx.x over pairs (a warp's worth at least, up to 128), threadIdx.y over rows,
  // 256 threads a block
  const int tx = half >= 128 ? 128 : (half >= 64 ? 64 : 32);
  const int ty = 256 / tx;
  const int64_t row_blocks = levels_cdiv(N, (int64_t)ty * V2_ROWS);
  const int64_t blocks = B * H * row_blocks;
  if (blocks > 2147483647LL) return LEVELS_UNSUPPORTED;
  rope_v2<T><<<(unsigned)blocks, dim3(tx, ty), 0, stream>>>(x, cos, sin, y, H, N, half,
                                                            row_blocks, st, sign, interleaved);
  return levels_launch_status();
}

}  // namespace levels_rope

// =====================================================================================
// extern "C" launcher
// =====================================================================================

// y = x rotated by sign * theta. x: (B, H, N, 2 * half) with element strides stride_x[4];
// cos, sin: (N, half) with strides stride_cos[2], stride_sin[2]; y: contiguous (B, H, N,
// 2 * half). B, H, N, half >= 1.
extern "C" int levels_rope_rotate(int dtype, int version, const void* x, const void* cos,
                                  const void* sin, void* y, int64_t B, int64_t H, int64_t N,
                                  int64_t half, const int64_t* stride_x,
                                  const int64_t* stride_cos, const int64_t* stride_sin,
                                  float sign, int interleaved, cudaStream_t stream) {
  using namespace levels_rope;
  if (version < 1 || version > 3) return LEVELS_BAD_VERSION;
  const Strides st{stride_x[0], stride_x[1], stride_x[2], stride_x[3],
                   stride_cos[0], stride_cos[1], stride_sin[0], stride_sin[1]};
  LEVELS_DISPATCH(dtype, T, {
    return launch<T>(version, static_cast<const T*>(x), static_cast<const T*>(cos),
                     static_cast<const T*>(sin), static_cast<T*>(y), B, H, N, half, st, sign,
                     interleaved != 0, stream);
  });
  return LEVELS_OK;  // not reached
}
