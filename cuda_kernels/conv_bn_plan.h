// conv_bn_plan.h — which block tile and how many K slices conv_bn's version 5 forward (and
// version 6's dgrad) runs, from the problem's size alone. Plain C++ (no CUDA): conv_bn.cu's
// launcher calls it, and the CPU tests (tests/test_cuda_conv_bn.py) compile it with g++ and
// check its choices, so the rule is read and tested in one place.
//
// The forward is an implicit GEMM out (P, C_out) = im2col(x) (P, K) . w^T (K, C_out). A block
// computes a BM x BN tile of it; the GPU runs `slots` blocks at once (SMs x blocks per SM).
// What a tile costs and buys:
//   * a bigger tile reads less per multiply-add (a BM x BN tile reads BM + BN rows of K for
//     BM * BN outputs): 128 x 128 is the cheapest per flop, 64 x 64 the dearest (2x the bytes);
//   * a tile wider than the problem is wasted work: with C_out <= 64 half of a 128-wide tile
//     multiplies zeros, so no 128-wide N tile is considered there;
//   * too few blocks leave SMs idle, which no per-flop saving repays: ResNet-50's 3x3 at 14x14
//     (P = 6272, C_out = 256) is 98 blocks of 128 x 128 on 132 SMs (a third of the 264 slots).
// The rule: the first tile of 128x128, 128x64, 64x64 (128x128 only when C_out > 64) whose
// blocks fill at least 90% of its slots (a whole wave: once the GPU is full, the biggest tile
// is the cheapest). No 64x128: it makes as many blocks as 128x64 (cdiv(P, 64) cdiv(C_out, 128)
// against cdiv(P, 128) cdiv(C_out, 64)), so it would fill the GPU exactly when 128x64 does,
// and it would be 4 more kernels to build.
// When even 64 x 64 does not (7x7 layers: P = 1568), the reduction K can be cut into `splits`
// slices, each block one (tile, slice) pair writing an fp32 partial; a small finish kernel
// adds the slices in order (deterministic, no atomics) and applies the bias. How many: the s
// with the least estimated time of the busiest SM (cb_split_cost), which weighs three things:
//   * the busiest SM gets U = ceil(blocks * s / sms) units of ceil(k_tiles / s) k-tiles and
//     runs them blocks_per_sm at a time; an SM with fewer blocks resident runs below its rate
//     (CB_SM_RATE_PCT: one 4-warp block cannot hide ldmatrix and copy latencies alone), so
//     finer units help where blocks are few per SM...
//   * ...but a remainder costs: ResNet's 7x7 layer's 200 blocks in 2 slices are 400 units for
//     132 SMs x 3, and 4 SMs run a fourth unit alone after the rest ("fill the slots", s =
//     slots / blocks rounded up, is what not to do);
//   * each slice's fp32 partial is written and read back (CB_OUTPUTS_PER_KTILE converts).
// Ties go to fewer slices; every slice keeps at least CB_MIN_SLICE_TILES k-tiles (the
// pipeline's fill amortized), and there are at most CB_MAX_SPLITS. The rates are estimates
// for the H100; scripts/device_conv_bn6.py's sweep times the plans they choose between.
//
// Version 6's dgrad runs each stride phase of dx as a forward convolution on the same kernels
// (conv_bn.cu: "v6"), so the same rule picks its tile and slices (cb_dgrad_plan: M = the
// phase's input pixels, N = C_in, K = its taps x C_out), with one more tile for N <= 16.
#pragma once

#include <cstdint>

namespace levels_conv_bn {

// The tiles version 5 is instantiated for (conv_bn.cu: mma_conv::conv_kernel): CB_TILES of them
// for the forward; version 6's dgrad also has CB_128x16 (CB_DGRAD_TILES in all), the tile for
// a GEMM whose N is at most CB_NARROW_N (the stem's dgrad: N = C_in = 3).
enum CbTile : int { CB_128x128 = 0, CB_128x64 = 1, CB_64x64 = 2, CB_TILES = 3, CB_128x16 = 3,
                    CB_DGRAD_TILES = 4 };

struct CbTileShape {
  int bm, bn;           // block tile
  int warps_m, warps_n;  // warp grid: each warp a (bm / warps_m) x (bn / warps_n) tile
  int stages;           // cp.async pipeline depth
  int blocks_per_sm;    // what its shared memory and registers let run at once (see conv_bn.cu)
};

// 128x128: 8 warps of 64x32, 3 stages x 32 KB = 96 KB, 2 blocks per SM;
// 128x64: 4 warps of 64x32, 3 stages x 24 KB = 72 KB; 64x64: 4 warps of 32x32, 4 stages x 16 KB
// = 64 KB; both 3 blocks per SM (shared memory: 3 x 73 of the H100's 228 KB; registers:
// ptxas gives them 168 and 117 of the 168 that 3 x 128 threads may have, no spills).
// 128x16 (version 6's dgrad only): 4 warps of 32x16 (one ldmatrix of B per two of A: the
// gather of A is what such a GEMM costs anyway), 4 stages x 18 KB = 72 KB, 3 blocks per SM.
constexpr CbTileShape cb_tile_shape(int tile) {
  switch (tile) {
    case CB_128x128: return {128, 128, 2, 4, 3, 2};
    case CB_128x64: return {128, 64, 2, 2, 3, 3};
    case CB_128x16: return {128, 16, 4, 1, 4, 3};
    default: return {64, 64, 2, 2, 4, 3};
  }
}

constexpr int CB_BK = 64;               // k per pipeline stage: 64 16-bit values = 128 bytes
constexpr int CB_MIN_SLICE_TILES = 8;   // k-tiles per K slice at least (512 of K)
constexpr int CB_MAX_SPLITS = 8;
constexpr int CB_NARROW_N = 16;         // N at most this: version 6's dgrad takes 128x16
// Outputs whose fp32 partial (4 bytes written, 4 read by the finish) take as long to move as an
// SM takes for one k-tile of 3 resident 64x64 blocks (3 x 64 x 64 x 64 x 2 flops, ~0.56 us at
// ~2.8 TFLOP/s an SM: about 60% of mma.sync's rate): 8 bytes each at ~3 TB/s.
constexpr int64_t CB_OUTPUTS_PER_KTILE = 210000;
// An SM's rate with b = 1, 2, 3 blocks of 4 warps resident, in % of its rate with 3.
constexpr int CB_SM_RATE_PCT[4] = {0, 50, 85, 100};

inline int64_t cb_cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The estimated time of the busiest SM for `units` (tile, slice) units of k k-tiles each over
// `sms` SMs, bps at a time, plus the partials of `splits` slices of P x C_out; in hundredths of
// the time an SM takes for one k-tile of bps resident blocks.
inline int64_t cb_split_cost(int64_t units, int64_t sms, int bps, int64_t k, int64_t splits,
                             int64_t P, int64_t C_out) {
  const int64_t U = cb_cdiv(units, sms), full = U / bps, rem = U % bps;
  int64_t t = full * k * 100;  // whole batches of bps blocks: k k-tiles at the full rate
  if (rem > 0) {
    const int rate = bps <= 3 ? CB_SM_RATE_PCT[rem] : 100;
    t += k * rem * 10000 / (bps * rate);  // rem blocks alone: rem/bps of the work at rate%
  }
  return t + (splits - 1) * P * C_out * 100 / CB_OUTPUTS_PER_KTILE;
}

// The slices s in [1, most] (most >= 1) with the least cb_split_cost for `blocks` tiles of
// shape `shape` over a reduction of k_tiles, whose partials are P x C_out each; ties go to
// fewer slices.
inline int64_t cb_best_splits(int64_t blocks, int sms, const CbTileShape& shape, int64_t k_tiles,
                              int64_t most, int64_t P, int64_t C_out) {
  int64_t best = 0, splits = 1;
  for (int64_t sp = 1; sp <= most; ++sp) {
    const int64_t per = cb_cdiv(k_tiles, sp), slices = cb_cdiv(k_tiles, per);
    const int64_t cost = cb_split_cost(blocks * slices, sms, shape.blocks_per_sm, per, slices, P, C_out);
    if (sp == 1 || cost < best) {
      best = cost;
      splits = sp;
    }
  }
  return splits;
}

struct CbPlan {
  int tile;          // CbTile
  int splits;        // K slices (1: no split, the kernel applies the bias itself)
  int tiles_per_split;  // k-tiles of CB_BK per slice (the last slice may have fewer)
  int64_t blocks;    // output tiles (the grid is blocks x splits)
};

// The rule for the tiles [first, last] (biggest first, `last` the fallback), for a GEMM of
// P rows, C_out columns and a reduction K; the forward's and the dgrad's rules below call it.
// force_tile in [0, n_tiles) pins the tile, force_splits > 0 the slices (tests and sweeps:
// $LEVELS_CONV_BN_V5_PLAN, $LEVELS_CONV_BN_V6_DGRAD_PLAN); both are clamped to what can run:
// splits <= k-tiles, so that no slice is empty.
inline CbPlan cb_plan_among(int64_t P, int64_t C_out, int64_t K, int sms, int force_tile,
                            int force_splits, int first, int last, int n_tiles) {
  const int64_t k_tiles = cb_cdiv(K, CB_BK);
  CbPlan plan{last, 1, static_cast<int>(k_tiles), 0};
  bool chosen = false;
  if (force_tile >= 0 && force_tile < n_tiles) {
    plan.tile = force_tile;
    chosen = true;
  }
  for (int i = first; i <= last && !chosen; ++i) {
    const CbTileShape s = cb_tile_shape(i);  // biggest first
    if (s.bn == 128 && C_out <= 64) continue;  // half of every tile would be zeros
    const int64_t blocks = cb_cdiv(P, s.bm) * cb_cdiv(C_out, s.bn);
    if (10 * blocks >= 9 * static_cast<int64_t>(sms) * s.blocks_per_sm) {
      plan.tile = i;
      chosen = true;
    }
  }
  const CbTileShape s = cb_tile_shape(plan.tile);
  plan.blocks = cb_cdiv(P, s.bm) * cb_cdiv(C_out, s.bn);
  int64_t splits = 1;
  if (force_splits > 0) {
    splits = force_splits;
  } else if (!chosen && plan.blocks > 0 && sms > 0 && k_tiles > 0) {  // the smallest tile leaves
    // slots empty (and there is a K to split: a dgrad phase without taps has none)
    int64_t most = k_tiles / CB_MIN_SLICE_TILES;
    if (most > CB_MAX_SPLITS) most = CB_MAX_SPLITS;
    splits = cb_best_splits(plan.blocks, sms, s, k_tiles, most > 1 ? most : 1, P, C_out);
  }
  if (splits > k_tiles) splits = k_tiles;
  if (splits < 1) splits = 1;
  // whole k-tiles per slice, recounted so that no slice is empty
  plan.tiles_per_split = static_cast<int>(k_tiles > 0 ? cb_cdiv(k_tiles, splits) : 0);
  plan.splits = plan.tiles_per_split > 0 ? static_cast<int>(cb_cdiv(k_tiles, plan.tiles_per_split)) : 1;
  return plan;
}

// Version 5's forward: P output pixels, C_out channels, K = kH * kW * C_in, sms on the GPU;
// the tiles 128x128, 128x64, 64x64.
inline CbPlan cb_plan(int64_t P, int64_t C_out, int64_t K, int sms, int force_tile = -1,
                      int force_splits = 0) {
  return cb_plan_among(P, C_out, K, sms, force_tile, force_splits, CB_128x128, CB_64x64, CB_TILES);
}

// Version 6's dgrad, one stride phase: M of its input pixels, C_in channels (the GEMM's N),
// Kp = its taps x C_out. The forward's rule, with one more tile: where C_in <= CB_NARROW_N a
// 64-wide tile would be at least 3/4 zeros (the stem's C_in = 3: 61 of 64 columns), and the
// product is bound by gathering dy (the A operand: M x Kp, the same bytes whatever the tile's
// width), so the narrow 128x16 tile is the only candidate: 13 of 16 columns wasted instead of
// 61 of 64, 4x the blocks of a 128x64 tile's grid to fill the GPU (split-K as the forward's
// when even they do not).
inline CbPlan cb_dgrad_plan(int64_t M, int64_t C_in, int64_t Kp, int sms, int force_tile = -1,
                            int force_splits = 0) {
  const bool narrow = C_in <= CB_NARROW_N;
  return cb_plan_among(M, C_in, Kp, sms, force_tile, force_splits, narrow ? CB_128x16 : CB_128x128,
                       narrow ? CB_128x16 : CB_64x64, CB_DGRAD_TILES);
}

// Version 6's wgrad: G (C_out, K) = dy^T im2col(x), the reduction over the P pixels (64 a
// k-tile), cut into pixel splits whose fp32 partials wgrad_finish_kernel adds in order. The
// GEMM is small (C_out x K: 9 64x64 tiles at ResNet's 64-channel 3x3) and its reduction long
// (100352 pixels there), so the splits fill the GPU, not the tile: the tile is 128x64 where
// C_out > 64, else 64x64 (128 rows would be half zeros), and the splits the s <= max_splits
// (the caller's workspace) with the least cb_split_cost, each split at least
// CB_MIN_SLICE_TILES k-tiles (512 pixels): the forward's cost model, whose partial term
// (s - 1) C_out K is what stops the splitting. No 128x128: the wgrad kernel keeps each copied
// row's pixel in registers, and at 2 blocks per SM (128 registers) its 64 accumulators spill.
inline CbPlan cb_wgrad_plan(int64_t C_out, int64_t K, int64_t P, int sms, int64_t max_splits,
                            int force_tile = -1, int force_splits = 0) {
  const int64_t k_tiles = cb_cdiv(P, CB_BK);
  int tile = C_out > 64 ? CB_128x64 : CB_64x64;
  if (force_tile == CB_128x64 || force_tile == CB_64x64) tile = force_tile;
  const CbTileShape s = cb_tile_shape(tile);
  CbPlan plan{tile, 1, static_cast<int>(k_tiles), cb_cdiv(C_out, s.bm) * cb_cdiv(K, s.bn)};
  int64_t splits = 1;
  if (force_splits > 0) {
    splits = force_splits;
  } else if (plan.blocks > 0 && sms > 0 && k_tiles > 0) {
    int64_t most = k_tiles / CB_MIN_SLICE_TILES;
    if (most > max_splits) most = max_splits;
    splits = cb_best_splits(plan.blocks, sms, s, k_tiles, most > 1 ? most : 1, C_out, K);
  }
  if (splits > max_splits) splits = max_splits;  // the workspace holds no more partials
  if (splits > k_tiles) splits = k_tiles;
  if (splits < 1) splits = 1;
  plan.tiles_per_split = static_cast<int>(k_tiles > 0 ? cb_cdiv(k_tiles, splits) : 0);
  plan.splits = plan.tiles_per_split > 0 ? static_cast<int>(cb_cdiv(k_tiles, plan.tiles_per_split)) : 1;
  return plan;
}

}  // namespace levels_conv_bn
