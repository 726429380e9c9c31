"""gemm.cu version 7's persistent mbarrier pipeline, modelled on the CPU (no GPU runs it in CI).

Version 7 keeps version 6's ring (tests/test_cuda_gemm6_protocol.py models one tile) but a
block now computes several tiles, and the producer runs ahead across tile boundaries. What can
go wrong is again bookkeeping: the stage and parity must come from one running k-iteration
counter on both sides (a counter reset per tile names the wrong parity once a tile's k-tiles
are not a multiple of the ring), and the consumers must give back each tile's last stage
(version 6 never did: its block ended there) — else the producer waits forever on the next
tile. The model runs the kernel's program text with PTX's mbarrier semantics (version 6's
model), one producer thread, eight consumer warps, in-flight TMA copies and the epilogue, all
interleaved at random, and checks: no deadlock, every consumer reads the k-tile it expects,
no copy lands under running MMAs, every stage use is given back exactly once.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.test_cuda_gemm6_protocol import (CONSUMER_WARPS, STAGE_PARTS, MBarrier, consume_tile,
                                            finish_tile, schedule, tma)

GEMM_CU = Path(__file__).resolve().parents[1] / "cuda_kernels" / "gemm.cu"


def test_the_model_is_the_kernel():
    text = GEMM_CU.read_text()
    v7 = text[text.index("// version 7: a persistent grid"):text.index("// version 8: ping-pong consumers")]
    for line, count in (("if (it >= STAGES) mbar_wait(&empty[s], (it / STAGES - 1) & 1);", 1),
                        ("mbar_wait(&full[s], (it / STAGES) & 1);", 1),
                        ("for (int kt = 0; kt < KT; ++kt, ++it) {", 2),
                        ("wgmma_wait<1>();", 1),
                        ("if (kt > 0) {", 1),
                        ("if (KT > 0) {  // the tile's last stage", 1),
                        ("if (warp_leader) mbar_arrive(&empty[(it - 1) % STAGES]);", 2),
                        ("int it = 0;", 2),  # once per kernel, before the tile loop: never reset
                        ("for (int64_t t = blockIdx.x; t < (tiles); t += gridDim.x)", 1)):
        assert v7.count(line) == count, (line, v7.count(line))
    assert "mbar_init(&empty[s], 8);" in text and "mbar_init(&full[s], 1);" in text


def run(tiles, KT, STAGES, seed, reset_per_tile=False, release_last=True):
    """One interleaving of one block's `tiles` tiles of KT k-tiles each. reset_per_tile and
    release_last break the kernel's protocol on purpose (the tests below)."""
    rng = random.Random(seed)
    full = [MBarrier(1) for _ in range(STAGES)]
    empty = [MBarrier(CONSUMER_WARPS) for _ in range(STAGES)]
    smem = [None] * STAGES          # which (tile, k-tile) a stage holds
    reading = [0] * STAGES
    in_flight = []
    released = {}                   # (tile, kt) -> consumer warps that gave its stage back

    def producer():
        it = 0
        for t in range(tiles):
            if reset_per_tile:
                it = 0
            for kt in range(KT):
                s = it % STAGES
                if it >= STAGES or (reset_per_tile and t > 0):
                    while not empty[s].try_wait_parity((it // STAGES - 1) & 1):
                        yield
                full[s].expect_tx(STAGE_PARTS)
                in_flight.extend([(s, (t, kt))] * STAGE_PARTS)
                it += 1
                yield

    stages = dict(full=full, empty=empty, smem=smem, reading=reading, released=released,
                  STAGES=STAGES)

    def consumer():
        it = 0
        for t in range(tiles):
            if reset_per_tile:
                it = 0
            it, groups = yield from consume_tile(t, KT, it, stages, "consumer")
            finish_tile(t, KT, it, groups, stages, release_last)
            for _ in range(rng.randrange(4)):  # the epilogue: its own shared memory, any length
                yield

    actors = [producer()] + [consumer() for _ in range(CONSUMER_WARPS)]
    schedule(actors, tma(in_flight, reading, smem, full, rng), rng, 400_000,
             f"tiles={tiles}, KT={KT}, STAGES={STAGES}, seed={seed}")
    assert not in_flight and all(r == 0 for r in reading)
    if release_last:  # every stage use given back by every consumer warp, exactly once
        assert released == {(t, kt): CONSUMER_WARPS for t in range(tiles) for kt in range(KT)}


@pytest.mark.parametrize("STAGES", [4, 6])  # v7_stages: BN = 256 and the batched kernel, BN = 128
@pytest.mark.parametrize("tiles,KT", [(1, 5), (2, 0), (2, 1), (3, 3), (3, 5), (4, 7), (2, 13), (6, 2)])
def test_persistent_pipeline_never_deadlocks_or_overwrites(tiles, KT, STAGES):
    for seed in range(10):
        run(tiles, KT, STAGES, seed)


@pytest.mark.parametrize("wrong", ["counter reset per tile", "last stage never given back"])
def test_the_model_catches_a_broken_protocol(wrong):
    """Not vacuous: resetting the k-iteration counter at each tile (the parity of a stage's
    round is then wrong once KT is not a multiple of the ring), or keeping version 6's habit of
    never giving a tile's last stage back, deadlocks or reads the wrong k-tile."""
    kw = {"reset_per_tile": True} if wrong.startswith("counter") else {"release_last": False}
    with pytest.raises(AssertionError, match="deadlock|holds|overwritten|landed"):
        for seed in range(10):
            run(3, 5, 4, seed, **kw)
