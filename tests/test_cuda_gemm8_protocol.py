"""gemm.cu version 8's ping-pong schedule, modelled on the CPU (no GPU runs it in CI).

Version 8 keeps version 7's producer and ring (tests/test_cuda_gemm7_protocol.py) but the two
consumer warpgroups now take turns: consumer 0 computes the block's tiles 0, 2, 4, ...,
consumer 1 tiles 1, 3, 5, ..., each a whole tile. The producer still loads every tile's
k-tiles in order on one running counter, so each consumer must skip the other's k-iterations
in its own counter; each round of a stage is read (and given back) by the 4 warps of ONE
consumer; and a "math order" (two mbarriers of 4 arrivals) starts tile i's mainloop only once
every MMA of tile i-1 is issued. That order is more than a schedule: a consumer skips the
other's rounds of a stage, and a parity wait cannot tell round r+1 from round r-1 that has
not landed yet; the order makes every earlier k-iteration land before tile i's first wait.

The model runs the kernel's program text with PTX's mbarrier semantics (version 6's model):
one producer thread, 2 x 4 consumer warps, in-flight TMA copies (landing in any order) and
the epilogues, interleaved at random. It checks: no deadlock; every consumer reads the k-tile
of its own tile that it expects; no copy lands under running MMAs; every stage use is given
back by exactly the 4 warps that read it; every tile is computed once, by the consumer of its
parity; the mainloops never overlap and run in tile order. Broken variants (no math order, a
counter that does not skip, version 7's 8-arrival empty barriers, the last stage kept) fail.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.test_cuda_gemm6_protocol import STAGE_PARTS, MBarrier, consume_tile, finish_tile, schedule, tma

GEMM_CU = Path(__file__).resolve().parents[1] / "cuda_kernels" / "gemm.cu"
WARPS = 4  # per consumer warpgroup


def _v8_text():
    text = GEMM_CU.read_text()
    return text[text.index("// version 8: ping-pong consumers"):text.index("// column sums")]


def test_the_model_is_the_kernel():
    v8 = _v8_text()
    for line, count in (
            ("mbar_init(&full[s], 1);", 1),
            ("mbar_init(&empty[s], 4);", 1),       # one consumer (4 warps) per round of a stage
            ("mbar_init(&order[0], 4);", 1),
            ("mbar_init(&order[1], 4);", 1),
            ("constexpr int V8_STAGES = v7_stages<V8_BN, V7_SLAB>();", 1),
            ("static_assert(V8_STAGES == 6", 1),
            # the producer: version 7's loop over every tile of the block, one counter
            ("int it = 0;", 1),
            ("LEVELS_V7_FOR_EACH_TILE(t, tiles) {", 1),
            ("v7_produce<T, BN, STAGES, DUAL>(sA, sB, full, empty, op, m0, n0, KT, it);", 1),
            # the consumers
            ("int it = wg * KT;", 1),
            ("for (int64_t i = wg, t = blockIdx.x + wg * (int64_t)gridDim.x; t < tiles; i += 2, t += step) {", 1),
            ("const int64_t step = 2 * (int64_t)gridDim.x;", 1),
            ("if (i > 0) mbar_wait(&order[wg], (int)((i - 1) / 2) & 1);", 1),
            ("v8_consume<T, STAGES>(sA, sB, full, empty, &order[1 - wg], KT, it, acc);", 1),
            ("it += KT;  // tile i+1 is the other consumer's", 1),
            ("for (int kt = 0; kt < KT; ++kt, ++it) {", 1),
            ("mbar_wait(&full[s], (it / STAGES) & 1);", 1),
            ("wgmma_wait<1>();", 1),
            ("if (kt > 0) {", 1),
            ("if (warp_leader) mbar_arrive(done);", 1),
            ("if (KT > 0) {  // the tile's last stage", 1),
            ("if (warp_leader) mbar_arrive(&empty[(it - 1) % STAGES]);", 2)):
        assert v8.count(line) == count, (line, v8.count(line))
    # in v8_consume, the hand-over comes after the last k-tile's MMAs are issued and before
    # the wait for them (so the next tile's MMAs queue behind them), the last release after it
    consume = v8[v8.index("__device__ __forceinline__ void v8_consume"):v8.index("__global__")]
    order = [consume.index(x) for x in ("wgmma_stage_tile<T>(sA, sB, s, acc);", "mbar_arrive(done);",
                                        "wgmma_wait<0>();", "if (KT > 0) {  // the tile's last stage")]
    assert order == sorted(order), order
    # version 7's producer is the one modelled (tests/test_cuda_gemm7_protocol.py checks its lines)
    text = GEMM_CU.read_text()
    assert text.count("if (it >= STAGES) mbar_wait(&empty[s], (it / STAGES - 1) & 1);") == 1


def run(tiles, KT, STAGES, seed, math_order=True, skip_other=True, empty_count=WARPS, release_last=True):
    """One interleaving of one block's `tiles` tiles of KT k-tiles each. The keyword arguments
    break the kernel's protocol on purpose (the tests below); the defaults are the kernel."""
    rng = random.Random(seed)
    full = [MBarrier(1) for _ in range(STAGES)]
    empty = [MBarrier(empty_count) for _ in range(STAGES)]
    order = [MBarrier(WARPS), MBarrier(WARPS)]
    smem = [None] * STAGES          # which (tile, k-tile) a stage holds
    reading = [0] * STAGES          # warps whose MMAs on the stage are in flight
    in_flight = []                  # TMA boxes issued, not landed: (stage, (tile, kt))
    released = {}                   # (tile, kt) -> warps that gave its stage back
    computed = {}                   # tile -> [consumer of each warp that finished it]
    issuing = [0, 0]                # warps of each consumer between their order wait and hand-over
    issued = {}                     # tile -> warps done issuing its MMAs

    def producer():  # v7_produce over LEVELS_V7_FOR_EACH_TILE: every tile, in order
        it = 0
        for t in range(tiles):
            for kt in range(KT):
                s = it % STAGES
                if it >= STAGES:
                    while not empty[s].try_wait_parity((it // STAGES - 1) & 1):
                        yield
                full[s].expect_tx(STAGE_PARTS)
                in_flight.extend([(s, (t, kt))] * STAGE_PARTS)
                it += 1
                yield

    stages = dict(full=full, empty=empty, smem=smem, reading=reading, released=released,
                  STAGES=STAGES)

    def consumer(wg):  # one warp of consumer warpgroup wg
        it = wg * KT
        for i in range(wg, tiles, 2):
            if i > 0 and math_order:
                while not order[wg].try_wait_parity(((i - 1) // 2) & 1):
                    yield
            if math_order:  # the mainloops alternate, in tile order
                assert issuing[1 - wg] == 0, f"tile {i}'s MMAs start beside the other consumer's"
                assert i == 0 or issued.get(i - 1, 0) == WARPS, f"tile {i} before tile {i - 1} is issued"
            issuing[wg] += 1
            # v8_consume
            it, groups = yield from consume_tile(i, KT, it, stages, f"consumer {wg}")
            issuing[wg] -= 1
            issued[i] = issued.get(i, 0) + 1
            order[1 - wg].arrive()  # mbar_arrive(done): the other consumer's turn
            yield  # this tile's last MMAs may still run under the other's first ones
            finish_tile(i, KT, it, groups, stages, release_last)
            if skip_other:
                it += KT  # tile i+1 is the other consumer's
            computed.setdefault(i, []).append(wg)
            for _ in range(rng.randrange(6)):  # the epilogue: its own slab and barrier, any length
                yield

    actors = [producer()] + [consumer(wg) for wg in (0, 1) for _ in range(WARPS)]
    schedule(actors, tma(in_flight, reading, smem, full, rng), rng, 400_000,
             f"tiles={tiles}, KT={KT}, STAGES={STAGES}, seed={seed}")
    assert not in_flight and all(r == 0 for r in reading)
    assert computed == {i: [i % 2] * WARPS for i in range(tiles)}, computed
    # every stage use given back by the 4 warps that read it, exactly once
    assert released == {(i, kt): WARPS for i in range(tiles) for kt in range(KT)}


# (tiles, KT): one tile (consumer 1 idle); an odd count (consumer 0 one tile more); KT = 0 (the
# hand-over must still happen); KT below, at and above the ring (6 stages: V8_STAGES), and
# KT = 2 or 4, where a consumer's stage was last filled for the other consumer
@pytest.mark.parametrize("tiles,KT", [(1, 5), (2, 0), (3, 0), (2, 1), (3, 2), (5, 4), (4, 3), (7, 1), (3, 6),
                                      (4, 7), (2, 13), (6, 2)])
def test_ping_pong_never_deadlocks_or_misreads(tiles, KT):
    for seed in range(10):
        run(tiles, KT, 6, seed)


def test_other_ring_depths():
    """The protocol does not depend on V8_STAGES = 6 (a shallower ring, an odd one)."""
    for STAGES in (3, 4, 5):
        for tiles, KT in ((5, 2), (4, 3), (3, 7)):
            for seed in range(4):
                run(tiles, KT, STAGES, seed)


@pytest.mark.parametrize("wrong", ["no math order", "counter does not skip", "8-warp empty barriers",
                                   "last stage kept"])
def test_the_model_catches_a_broken_protocol(wrong):
    """Not vacuous. Without the math order (its own asserts off, so only the data checks can
    see it) a consumer's parity wait passes on a round not landed yet and reads the wrong
    k-tile: with KT > the ring (K > 384, the usual case) consumer 1's first wait is for round
    1 of a stage whose round 0 (tile 0's) may still be in flight, and it passes at once; with
    a short K it happens later, under some interleavings only. A counter that does not skip
    the other consumer's k-iterations waits for the wrong rounds; empty barriers expecting
    both warpgroups (version 7's 8 arrivals) or a tile's last stage never given back starve
    the producer."""
    kw = {"no math order": {"math_order": False}, "counter does not skip": {"skip_other": False},
          "8-warp empty barriers": {"empty_count": 2 * WARPS},
          "last stage kept": {"release_last": False}}[wrong]
    for tiles, KT in ((3, 8), (5, 4)):
        with pytest.raises(AssertionError, match="deadlock|holds|overwritten|landed"):
            for seed in range(40):
                run(tiles, KT, 6, seed, **kw)
