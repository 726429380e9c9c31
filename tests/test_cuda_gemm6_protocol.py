"""gemm.cu version 6's mbarrier pipeline, modelled on the CPU (no GPU runs it in CI).

The riskiest part of version 6 is bookkeeping, not arithmetic: which parity each wait names,
how many arrivals complete a phase, when a stage goes back to the producer. A mistake there is
a hang or a stage overwritten while the tensor cores still read it, on the GPU only. This
file runs the same program text as a model: mbarriers with PTX's semantics (a phase completes
when its pending arrivals reach 0 and its transaction bytes are all in; try_wait.parity p is
true once the phase of parity p has completed, i.e. while the current phase's parity is not
p), one producer thread, eight consumer warps and in-flight TMA copies, interleaved at random.
It checks: no deadlock, every consumer reads the k-tile it expects, no copy lands in a stage
whose MMAs are still in flight. The kernel's own lines are matched first, so that editing
them without this model fails here.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

GEMM_CU = Path(__file__).resolve().parents[1] / "cuda_kernels" / "gemm.cu"
CONSUMER_WARPS = 8  # two consumer warpgroups
STAGE_PARTS = 2  # the TMA boxes per stage (A, B; SwiGLU: 3, the same byte total)


def test_the_model_is_the_kernel():
    text = GEMM_CU.read_text()
    for line in ("mbar_init(&full[s], 1);", "mbar_init(&empty[s], 8);",
                 "if (kt >= STAGES) mbar_wait(&empty[s], (kt / STAGES - 1) & 1);",
                 "mbar_expect_tx(&full[s], STAGE_BYTES);",
                 "mbar_wait(&full[s], (kt / STAGES) & 1);",
                 "wgmma_wait<1>();",
                 "if (warp_leader) mbar_arrive(&empty[(kt - 1) % STAGES]);"):
        assert line in text, line
    assert re.search(r"constexpr int v6_stages\(\) \{ return BN == 256 \? 4 : 6; \}", text)


class MBarrier:
    def __init__(self, count):
        self.count, self.pending, self.tx, self.completed = count, count, 0, 0

    def _settle(self):
        if self.pending == 0 and self.tx == 0:
            self.completed += 1
            self.pending = self.count

    def arrive(self):
        assert self.pending > 0
        self.pending -= 1
        self._settle()

    def expect_tx(self, nbytes):  # mbarrier.arrive.expect_tx: raise the count, then arrive
        self.tx += nbytes
        self.arrive()

    def complete_tx(self, nbytes):
        self.tx -= nbytes
        assert self.tx >= 0, "more bytes landed than were announced"
        self._settle()

    def try_wait_parity(self, parity):
        return (self.completed & 1) != parity



def tma(in_flight, reading, smem, full, rng):
    """The Tensor Memory Accelerator: lands the copies in flight in any order, each into its
    stage (`smem[s] = what`) and completing that stage's `full` barrier; a copy landing
    where MMAs still read fails the model (shared with the version 7 and 8 models)."""
    while True:
        if in_flight:
            s, what = in_flight.pop(rng.randrange(len(in_flight)))
            assert reading[s] == 0, f"{what} landed in stage {s} under running MMAs"
            smem[s] = what
            full[s].complete_tx(1)
        yield


def consume_tile(tile, KT, it, stages, who):
    """One consumer warp's k-loop over `tile` (gemm.cu v7's and v8's consume): each stage
    waited full and read, one wgmma group left in flight (wgmma_wait<1>), the stage before
    given back. `stages`: dict of full, empty, smem, reading, released, STAGES. Yields wherever
    another actor may run; returns (the iteration counter, the groups still in flight)."""
    full, empty, smem, reading = stages["full"], stages["empty"], stages["smem"], stages["reading"]
    released, STAGES = stages["released"], stages["STAGES"]
    groups = []
    for kt in range(KT):
        s = it % STAGES
        while not full[s].try_wait_parity((it // STAGES) & 1):
            yield
        assert smem[s] == (tile, kt), f"{who} read stage {s} for {(tile, kt)}, it holds {smem[s]}"
        reading[s] += 1
        groups.append((s, (tile, kt)))
        yield  # the MMAs run; anything may happen meanwhile
        while len(groups) > 1:  # wgmma_wait<1>
            gs, gk = groups.pop(0)
            assert smem[gs] == gk, f"stage {gs} overwritten under the MMAs of {gk}"
            reading[gs] -= 1
        if kt > 0:
            empty[(it - 1) % STAGES].arrive()
            released[(tile, kt - 1)] = released.get((tile, kt - 1), 0) + 1
        it += 1
        yield
    return it, groups


def finish_tile(tile, KT, it, groups, stages, release_last):
    """After a tile's k-loop: wgmma_wait<0> (the last groups' stages checked intact), then,
    if release_last, its last stage given back."""
    for gs, gk in groups:
        assert stages["smem"][gs] == gk, f"stage {gs} overwritten under the MMAs of {gk}"
        stages["reading"][gs] -= 1
    if KT > 0 and release_last:
        stages["empty"][(it - 1) % stages["STAGES"]].arrive()
        stages["released"][(tile, KT - 1)] = stages["released"].get((tile, KT - 1), 0) + 1


def schedule(actors, copier, rng, max_steps, case):
    """Run the warps (generators: one step per next()) and the copier in a random
    interleaving until every warp has finished; a run that does not finish is a deadlock."""
    steps = 0
    while actors:
        steps += 1
        assert steps < max_steps, f"deadlock ({case})"
        i = rng.randrange(len(actors) + 1)
        if i == len(actors):
            next(copier)
            continue
        try:
            next(actors[i])
        except StopIteration:
            actors.pop(i)

def run(KT, STAGES, seed, producer_parity=lambda kt, S: (kt // S - 1) & 1, release_lag=1):
    """One interleaving; producer_parity (the producer's wait on `empty`) and release_lag (a
    consumer gives back the stage of k-tile kt - release_lag) are the kernel's unless a test
    breaks them on purpose."""
    rng = random.Random(seed)
    full = [MBarrier(1) for _ in range(STAGES)]
    empty = [MBarrier(CONSUMER_WARPS) for _ in range(STAGES)]
    smem = [None] * STAGES          # which k-tile a stage holds
    reading = [0] * STAGES          # warps whose MMAs on the stage are in flight
    in_flight = []                  # TMA boxes issued, not landed: (stage, kt)

    def producer():
        for kt in range(KT):
            s = kt % STAGES
            if kt >= STAGES:
                while not empty[s].try_wait_parity(producer_parity(kt, STAGES)):
                    yield
            full[s].expect_tx(STAGE_PARTS)
            in_flight.extend([(s, kt)] * STAGE_PARTS)
            yield

    def consumer():
        groups = []  # committed, not yet waited-for MMA groups: (stage, kt)
        for kt in range(KT):
            s = kt % STAGES
            while not full[s].try_wait_parity((kt // STAGES) & 1):
                yield
            assert smem[s] == kt, f"read stage {s} for k-tile {kt}, it holds {smem[s]}"
            reading[s] += 1
            groups.append((s, kt))
            yield  # the MMAs run; anything may happen meanwhile
            while len(groups) > 1:  # wgmma_wait<1>: all but the newest group are done
                gs, gk = groups.pop(0)
                assert smem[gs] == gk, f"stage {gs} overwritten under the MMAs of k-tile {gk}"
                reading[gs] -= 1
            if kt >= release_lag:
                empty[(kt - release_lag) % STAGES].arrive()
            yield
        for gs, gk in groups:  # wgmma_wait<0>
            assert smem[gs] == gk
            reading[gs] -= 1

    actors = [producer()] + [consumer() for _ in range(CONSUMER_WARPS)]
    schedule(actors, tma(in_flight, reading, smem, full, rng), rng, 200_000,
             f"KT={KT}, STAGES={STAGES}, seed={seed}")
    assert not in_flight and all(r == 0 for r in reading)


@pytest.mark.parametrize("STAGES", [4, 6])  # v6_stages: BN = 256, BN = 128
@pytest.mark.parametrize("KT", [0, 1, 2, 3, 4, 5, 6, 7, 13, 25])
def test_pipeline_never_deadlocks_or_overwrites(KT, STAGES):
    for seed in range(20):
        run(KT, STAGES, seed)


@pytest.mark.parametrize("wrong", ["the round's own parity", "release before the MMAs are done"])
def test_the_model_catches_a_broken_protocol(wrong):
    """Not vacuous: the producer waiting on the parity of the round it is about to fill (not
    the previous round's), or consumers giving a stage back before its MMAs are done, is
    caught (a stage refilled under running MMAs, or read holding the wrong k-tile)."""
    kw = ({"producer_parity": lambda kt, S: (kt // S) & 1} if wrong.startswith("the round")
          else {"release_lag": 0})
    with pytest.raises(AssertionError, match="overwritten|landed|holds|deadlock"):
        for seed in range(20):
            run(13, 4, seed, **kw)
