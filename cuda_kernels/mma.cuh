// mma.cuh — the PTX wrappers of Level 5's tensor-core kernels (gemm.cu versions 4-5,
// attention.cu versions 3-4, lstm.cu): one copy, so every kernel that feeds mma.sync says it
// the same way. Pure CUDA, no torch header. Each wrapper is one instruction; the comments
// say what the instruction does that plain C++ cannot.
#pragma once

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

#include <type_traits>

namespace levels_mma {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared without passing through registers. src_bytes < 16 reads only
// that many bytes and fills the rest with zeros: the masked edges (M, N, K tails) cost
// no branch in the main loop and never read outside the operand.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Four 8x8 b16 matrices from shared memory into the mma fragment layout: lanes 8i..8i+7
// give the row addresses of matrix i; register i of every lane receives its part of it.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// D = A(16x16, row) · B(16x8, col) + D, fp32 accumulators.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}


// ---- added for attention.cu (append-only: the wrappers above are gemm.cu's) ----

// ldmatrix with .trans: each 8x8 matrix is transposed on the way into registers, so a
// tile stored [k][n] (n contiguous: V of P·V, dO and Q in the attention backward) arrives
// as the "col" B operand of mma.sync without a transpose through shared memory. Lane
// addresses follow the same pattern as ldmatrix_x4 for an A tile (rows k, lane & 15;
// chunk lane >> 4); registers 0..3 are then b0, b1 of n8 tile 0 and b0, b1 of n8 tile 1.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// 4 bytes global -> shared (cp.async.ca: sizes below 16 must go through L1); src_bytes 0
// writes a zero. For small fp32 vectors whose rows are not 16-byte aligned (the
// attention backward's log-sum-exp and delta rows).
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}

// 2^x in one MUFU instruction (relative error ~2^-22, -inf -> +0, flushes denormal
// results): the softmax of the 16-bit attention paths, whose P is rounded to 8 or 11
// mantissa bits right after. The exact-fp32 paths use exp2f.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Two fp32 values as one 32-bit register of two 16-bit values (lo in the low half): an
// mma.sync A/B operand register, built from accumulators without a trip through memory.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}

// A warp's MT x NT m16n8 accumulator tiles into an fp32 tile in shared memory (rows ld floats
// apart), its corner at (row0, col0): lane l holds rows l/4 and l/4 + 8 and columns 2 (l % 4)
// and +1 of each m16n8 tile, stored as float2. An epilogue then reads the tile back by rows
// (bias, activation, 16-byte stores) in whatever order coalesces; ld = BN + 8 floats puts a
// half-warp's float2 stores (rows g..g+3) in distinct banks.
template <int MT, int NT>
__device__ __forceinline__ void stage_acc(float* tile, int ld, const float (&acc)[MT][NT][4], int row0,
                                          int col0, int lane) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = row0 + mt * 16 + (lane >> 2) + h * 8;
        const int col = col0 + nt * 8 + (lane & 3) * 2;
        *reinterpret_cast<float2*>(tile + r * ld + col) = make_float2(acc[mt][nt][2 * h], acc[mt][nt][2 * h + 1]);
      }
}

}  // namespace levels_mma
