// layer_norm_plan.h — which kernel layer_norm's version 4 runs, from the sizes and the layout
// alone. Plain C++ (no CUDA): layer_norm.cu's launchers call it, and the CPU tests
// (tests/test_cuda_layer_norm.py) compile it with g++ and check its choices, so the rule is
// read and tested in one place.
//
// The rule (why each threshold is where it is: layer_norm.cu's header):
//   * 16-byte loads (`vec`) when every row of every operand starts on a 16-byte boundary
//     (the caller says so: `aligned`); otherwise element loads, the row STILL in registers.
//   * ROWS: the row in the registers of G threads, E elements each, the smallest E of the
//     list that fits the row in at most 512 threads. G <= 32 (narrow rows): G is a power of
//     two >= 4, a group of lanes inside a warp, R = 256 / G rows per block, sums by shuffles
//     (no barrier). G > 32: a block per row (R = 1), sums through shared memory.
//   * SPLIT: a row wider than ROWS can hold (or few rows and a wide width: too few blocks to
//     fill the GPU), split over a cluster of C <= 8 blocks (sm_90), seg columns each, the
//     row sums exchanged through distributed shared memory.
//   * LOOP: what is left (no clusters on this GPU and too wide for ROWS, or wider than 8
//     blocks of 8192): version 3's looped forward, version 2's backward.
#pragma once

#include <cstdint>

namespace levels_layer_norm {

enum LnPath : int { LN_NONE = 0, LN_ROWS = 1, LN_SPLIT = 2, LN_LOOP = 3 };
// `force`: 0 lets the rule choose; 1, 2, 3 force that path; + LN_FORCE_ELEMENTS forces element
// loads where 16-byte ones would do. A forced path that cannot run these sizes is LN_NONE.
constexpr int LN_FORCE_ELEMENTS = 4;

struct LnPlan {
  int path;     // LnPath
  int vec;      // 1: 16-byte vector loads and stores; 0: one element per load
  int E;        // row elements per thread
  int G;        // threads per row (ROWS), or per block of the row (SPLIT)
  int R;        // rows per block (ROWS; 1 for SPLIT and LOOP)
  int C;        // blocks per row, one cluster (SPLIT; else 1)
  int64_t seg;  // columns per block of a SPLIT row (a multiple of the vector width if vec)
};

constexpr int LN_GROUP_BLOCK = 256;  // threads of a ROWS block with several rows (G <= 32)
constexpr int LN_MAX_THREADS = 512;  // threads of one row (ROWS, G > 32) or one SPLIT block
constexpr int LN_MAX_CLUSTER = 8;    // the portable cluster size
constexpr int LN_SPLIT_E = 16;       // elements per thread of a SPLIT block: 8192 columns a block
constexpr int LN_SPLIT_MIN_COLS = 2048;  // a SPLIT for few rows gives each block >= this many

inline int64_t ln_cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- version 6: rows through shared memory, copied there by the copy engine (sm_90) ----
// A block (or each block of a cluster of C) owns `seg` columns of every row it visits and a
// ring of `stages` shared-memory buffers, each holding that piece of one row (the backward:
// of x and of dy). The piece of a row `stages` ahead is always on its way (one bulk copy,
// no registers held), so a block's reductions and barriers never leave the memory system
// idle. The weight's (and bias's) piece sits in shared memory for the whole kernel.
// Sizes: a buffer of about LN6_STAGE_BYTES (the fewest blocks a row, at most 8, that keep
// it there; wider rows make it bigger), as many buffers as fit beside the resident pieces in
// a block's share of shared memory, LN6_SMEM_BYTES[i] for the most blocks an SM (3, 2, 1:
// the first that leaves room for 2 buffers). Several blocks an SM because one block's rows
// are a chain (wait, sum, barriers, squares, barriers, store): with one block an SM the
// chain, not DRAM, set the pace (0.26-0.39x copy at 4096-8192 bf16 columns). The backward's
// dw/db partial sums live in registers, at most LN6_VPT 16-byte vectors' worth of columns a
// thread. The bulk copy wants 16-byte addresses and sizes: misaligned rows are copied with
// the 16-byte granules around them (a buffer one vector longer).
constexpr int LN6_THREADS = 256;
constexpr int64_t LN6_STAGE_BYTES = 16 * 1024;
constexpr int64_t LN6_SMEM_BYTES[3] = {72 * 1024, 110 * 1024, 200 * 1024};  // of the H100's 227 KB an SM
constexpr int LN6_MAX_STAGES = 8;
constexpr int LN6_VPT = 4;

struct Ln6Plan {
  bool ok;
  int C;          // blocks per row (one cluster)
  int64_t seg;    // columns per block, a multiple of the vector width; (C - 1) * seg < N
  int stages;     // buffers in the ring
  int64_t smem;   // dynamic shared memory per block, bytes
};

// aligned: the rows load as 16-byte vectors (ln_rows_aligned). Otherwise each buffer holds a
// piece with the 16-byte granules around it: one vector more (layer_norm.cu's version 6).
inline Ln6Plan ln_v6_plan(bool backward, int64_t N, int elem_size, bool aligned = true) {
  Ln6Plan p{false, 0, 0, 0, 0};
  const int64_t vec = 16 / elem_size, arrays = backward ? 2 : 1, resident = backward ? 1 : 2;
  if (N < 1 || (aligned && N % vec)) return p;
  int64_t C = ln_cdiv(N * arrays * elem_size, LN6_STAGE_BYTES);
  if (C > LN_MAX_CLUSTER) C = LN_MAX_CLUSTER;
  if (C < 1) C = 1;
  p.seg = ln_cdiv(ln_cdiv(N, C), vec) * vec;
  p.C = (int)ln_cdiv(N, p.seg);  // rounding seg up may leave a block with nothing: drop it
  if (backward && p.seg > (int64_t)LN6_VPT * vec * LN6_THREADS) return p;
  const int64_t slot = (p.seg + (aligned ? 0 : vec)) * elem_size;
  const int64_t stage = arrays * slot, kept = resident * slot;
  for (const int64_t budget : LN6_SMEM_BYTES) {
    const int64_t fit = (budget - kept) / stage;
    if (fit < 2) continue;
    p.stages = (int)(fit < LN6_MAX_STAGES ? fit : LN6_MAX_STAGES);
    p.smem = kept + p.stages * stage;
    p.ok = true;
    return p;
  }
  return p;
}

// Where version 6 takes its copy-engine path when nobody forces it (elsewhere it is version
// 5), read off the H100 sweep in reports/layer-norm-v6-2026-11-27/ (fraction of copy, bf16
// unless said, copy-engine kernel against version 5 in the same run):
//   forward, 16-bit rows wider than 12288 and fp32 rows wider than 16384: 16384 1.00 vs 0.77,
//     32768 0.99 vs 0.55, 65536 0.96 vs 0.50; fp32 32768 0.88 vs 0.78, 65536 0.85 vs 0.76.
//     Narrower, version 3's or 4's registers win (8192 1.02 vs 1.12, 12288 0.96 vs 1.06,
//     fp32 16384 0.90 vs 0.94).
//   backward, rows wider than 4096: 12288 0.85 vs 0.81, 32768 0.84 vs 0.78, 65536 0.78 vs
//     0.74; fp32 4096-32768 0.86-0.92 vs 0.75-0.88; 6144-8192 bf16 within 3% either way.
//   misaligned rows (odd widths, views) wider than 8192, but fp32 backwards (call 7, the
//     element-by-element kernel against version 4's element loads): 8193 0.50 / 0.57 vs
//     0.38 / 0.49, 16385 0.56 / 0.61 vs 0.31 / 0.52, fp32 8193 forward 0.74 vs 0.64. At
//     4097 version 4 wins (0.68 / 0.64 vs 0.61 / 0.55; fp32 0.95 / 0.88 vs 0.66 / 0.74), and
//     in fp32 backwards (8193: 0.84 vs 0.79): one element a shared-memory load costs more
//     instructions than a 16-byte one, and the kernel is then bound by them.
inline bool ln_v6_bulk(bool backward, int64_t N, int elem_size, bool rows_aligned) {
  if (!rows_aligned) return N > 8192 && !(backward && elem_size == 4);
  if (backward) return N > 4096;
  return N > (elem_size == 2 ? 12288 : 16384);
}

// The version a call runs when nobody chose one (the ops' version 0), measured on the H100
// (bf16, fraction of copy bandwidth forward / backward, reports/h100-sweep-layer-norm.json,
// both versions in one run): version 3's forward where its fast path runs (in version 5,
// whose backward takes R rows an iteration: reports/layer-norm-v5-2026-11-27/), 16-byte rows
// of 256-8192 columns (8192: 1.13 / 0.78 against version 4's 0.41 / 0.81; 768: 0.99 / 0.81 against
// 0.80 / 0.79); version 4 everywhere else, where version 3 falls to a loop that re-reads the
// row (1023 columns: 0.88 / 0.86 against 0.29 / 0.41; 64: 0.92 / 0.73 against 0.32 / 0.27;
// 4097: 0.52 / 0.64 against 0.36 / 0.28; past 8192 the backward, 16384: 0.66 against 0.30).
// Now version 6 (below) for 256 columns or more, whose kernel is decided at the launch
// because it reads x's address: a rule in Python would have to read data_ptr(), which
// torch.compile cannot trace.
// rows_aligned: x starts on 16 bytes, N is a whole number of 16-byte vectors, and so is the
// row stride (or there is one row).
inline bool ln_rows_aligned(uintptr_t x, int64_t M, int64_t N, int64_t stride_x, int elem_size) {
  const int64_t vec = 16 / elem_size;
  return x % 16 == 0 && N % vec == 0 && (M == 1 || stride_x % vec == 0);
}
// Misaligned rows that can still move as 16-byte vectors (layer_norm.cu's phased kernels):
// row r of x and row r of the output (contiguous, N elements a row) start at the same offset
// from a 16-byte boundary for every r, and weight and bias are aligned. Then x and y move as
// the aligned vectors that cover each row, and weight and bias, put in line with a phase
// once, serve every row of that phase. (A contiguous x with an odd width qualifies; a view
// such as x[:, 1:] does not: its rows sit one element later than the output's.) Eligible
// rows take the phased forward only where it pays (layer_norm.cu fwd_v4_ph_pays).
inline bool ln_rows_phased(uintptr_t x, uintptr_t y, uintptr_t w, uintptr_t b, int64_t M, int64_t N,
                           int64_t stride_x, int elem_size) {
  const int64_t vec = 16 / elem_size;
  if (N < 1 || w % 16 || b % 16 || (x - y) % 16 || x % elem_size || y % elem_size) return false;
  return M == 1 || (stride_x - N) % vec == 0;
}
// Version 5 is version 3's forward where version 3 runs its fast path, version 4's elsewhere,
// with a backward of its own (R rows an iteration) for aligned rows up to 8192 wide: the
// default wherever version 3 was (measured: layer_norm.cu's header).
inline int ln_v5_forward(int64_t N, bool rows_aligned) {
  return N >= 256 && N <= 8192 && rows_aligned ? 3 : 4;
}
// Version 6 is version 5 plus its copy-engine kernels for wide rows (ln_v6_bulk), and
// version 5 is version 4 wherever rows are misaligned: the default for rows of 256 columns
// or more, version 4 for narrower ones (whose lane groups version 5 hands to version 4 too).
// The width alone decides; the alignment is read inside version 6 (ln_v6_bulk) and
// version 5 (ln_v5_forward).
inline int ln_default_version(int64_t N) { return N >= 256 ? 6 : 4; }

// The elements per thread the kernels are instantiated for, smallest first (0 ends a list).
// A thread carries at least 32 bytes of the row in the forward (two 16-byte vectors: with
// one a thread, version 3's bf16 forward reached 0.90x copy instead of 0.98x, twice the
// barriers per byte); the backward holds x, dy and two fp32 partial sums a column, so it
// stops at 16.
inline const int* ln_row_widths(bool backward, int elem_size, bool vec) {
  static const int fwd_vec32[] = {8, 16, 32, 0}, fwd_vec16[] = {16, 32, 0};
  static const int fwd_el32[] = {8, 16, 0}, fwd_el16[] = {16, 0};
  static const int bwd[] = {8, 16, 0};
  if (backward) return bwd;
  if (elem_size == 4) return vec ? fwd_vec32 : fwd_el32;
  return vec ? fwd_vec16 : fwd_el16;
}

inline LnPlan ln_rows_plan(bool backward, int64_t N, int elem_size, bool vec) {
  LnPlan p{LN_NONE, vec ? 1 : 0, 0, 0, 1, 1, 0};
  for (const int* e = ln_row_widths(backward, elem_size, vec); *e; ++e) {
    if (N > (int64_t)*e * LN_MAX_THREADS) continue;
    p.path = LN_ROWS;
    p.E = *e;
    const int64_t threads = ln_cdiv(N, *e);
    if (threads <= 32) {  // groups of 4 to 32 lanes (the kernels' compile-time strides)
      int g = 4;
      while (g < threads) g <<= 1;
      p.G = g;
      p.R = LN_GROUP_BLOCK / g;
    } else {
      p.G = (int)(ln_cdiv(threads, 32) * 32);
      p.R = 1;
    }
    break;
  }
  return p;
}

// C blocks of seg columns each; every block gets at least one column.
inline LnPlan ln_split_plan(int64_t N, int C, int vec_width, bool vec) {
  LnPlan p{LN_NONE, vec ? 1 : 0, LN_SPLIT_E, 0, 1, C, 0};
  if (C < 2 || C > LN_MAX_CLUSTER) return p;
  const int64_t unit = vec ? vec_width : 1;
  p.seg = ln_cdiv(ln_cdiv(N, C), unit) * unit;
  if ((int64_t)(C - 1) * p.seg >= N || p.seg > (int64_t)LN_SPLIT_E * LN_MAX_THREADS) return p;
  p.G = (int)(ln_cdiv(ln_cdiv(p.seg, LN_SPLIT_E), 32) * 32);
  p.path = LN_SPLIT;
  return p;
}

// M rows of N elements of elem_size bytes; aligned: 16-byte loads are possible (see above);
// clusters: the GPU launches thread-block clusters (sm_90); sm_count: its multiprocessors.
inline LnPlan ln_plan(bool backward, int64_t M, int64_t N, int elem_size, bool aligned,
                      bool clusters, int sm_count, int force) {
  const int vec_width = 16 / elem_size;
  const bool vec = aligned && !(force & LN_FORCE_ELEMENTS);
  const int forced = force & 3;
  const LnPlan rows = ln_rows_plan(backward, N, elem_size, vec);
  // A split row: the fewest blocks of <= 8192 columns; for few rows, more blocks (each of at
  // least LN_SPLIT_MIN_COLS columns) so that M x C blocks come closer to filling the GPU.
  int C = (int)ln_cdiv(N, (int64_t)LN_SPLIT_E * LN_MAX_THREADS);
  const bool few_rows = M * 2 < sm_count && N >= 2 * LN_SPLIT_MIN_COLS;
  if (few_rows || forced == LN_SPLIT) {
    const int64_t more = N / LN_SPLIT_MIN_COLS;
    if (more > C) C = (int)(more < LN_MAX_CLUSTER ? more : LN_MAX_CLUSTER);
  }
  if (C < 2) C = 2;
  const LnPlan split = clusters ? ln_split_plan(N, C, vec_width, vec)
                                : LnPlan{LN_NONE, 0, 0, 0, 1, 1, 0};
  const LnPlan loop{LN_LOOP, vec ? 1 : 0, 0, 0, 1, 1, 0};
  switch (forced) {
    case LN_ROWS: return rows;
    case LN_SPLIT: return split;
    case LN_LOOP: return loop;
    default: break;
  }
  if (rows.path == LN_ROWS && !(few_rows && split.path == LN_SPLIT)) return rows;
  if (split.path == LN_SPLIT) return split;
  return loop;
}

}  // namespace levels_layer_norm
