"""A randomized serving run on one torch.classes.ukv.Coordinator through its
batch APIs, for the soak (benchmarks/soak.py: 10M+ operations) and its short
CI version (tests/integration/test_soak.py).

Sequences are admitted with a prefill of several blocks (SWA window blocks
and one compress block per type per logical block, after a joint admission
check), decode one block per step in batches (a new SWA block and compress
blocks; the block that leaves the window is freed), and finish or are
preempted when the pool is full. Compress borrows the slots SWA frees, so
evictions happen throughout. Every id handed out or taken back is one
operation. The C++ invariant checker and an ownership check of sampled held
ids run every `check_every` operations; at the end every sequence is freed and
every row of every tensor must be free again.
"""
import random
import resource
import time
from collections import deque

import torch

import ukv_torch

NUM_SWA, NUM_BLOCKS, RATIOS, BLOCK_SIZE = 512, 4096, [4, 128], 128
KS = [BLOCK_SIZE // r for r in RATIOS]  # rows per compress block of each type
WINDOW_BLOCKS = 2      # SWA blocks a sequence keeps: a 128-token window straddles two
MAX_BLOCKS = 96        # a sequence finishes at this length
PAGE = resource.getpagesize()


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class Seq:
    def __init__(self, swa, blocks):
        self.swa = deque(swa)
        self.blocks = blocks  # per compress type: held block ids


class Soak:
    def __init__(self, seed):
        self.rng = random.Random(seed)
        self.slots = ukv_torch.slot_counts(NUM_SWA, NUM_BLOCKS, RATIOS, BLOCK_SIZE)
        self.coord = torch.classes.ukv.Coordinator(NUM_SWA, RATIOS, self.slots, BLOCK_SIZE)
        self.live = []
        self.swa_used = set()  # SWA slots taken at least once
        self.ops = self.steps = self.refusals = self.preemptions = self.evictions = self.checks = 0

    # --- allocation and freeing: every id is one operation ---
    def take(self, n_swa, n_blocks):
        swa = self.coord.alloc_swa_n(n_swa).tolist()
        self.swa_used.update(swa)
        blocks = [self.coord.alloc_compress_n(t, n_blocks).tolist() for t in range(len(KS))]
        self.ops += n_swa + n_blocks * len(KS)
        return swa, blocks

    def free_swa(self, slots):
        self.coord.free_swa_many(torch.tensor(slots, dtype=torch.int64))
        self.ops += len(slots)

    def finish(self, seqs):
        gone = set(map(id, seqs))
        self.free_swa([s for seq in seqs for s in seq.swa])
        for t in range(len(KS)):
            ids = [b for seq in seqs for b in seq.blocks[t]]
            self.coord.free_compress_many(t, torch.tensor(ids, dtype=torch.int64))
            self.ops += len(ids)
        self.live = [seq for seq in self.live if id(seq) not in gone]

    # --- one serving step ---
    def admit(self):
        for _ in range(self.rng.randrange(0, 8)):
            n = self.rng.randrange(1, 48)
            n_swa = min(n, WINDOW_BLOCKS)
            headroom = len(self.live)  # room for the next decode step of every running sequence too
            if not self.coord.can_allocate_jointly(n_swa + headroom, [n + headroom] * len(KS)):
                self.refusals += 1
                return
            swa, blocks = self.take(n_swa, n)
            self.live.append(Seq(swa, blocks))

    def decode(self):
        batch = [seq for seq in self.live if self.rng.random() < 0.9]
        while batch and not self.coord.can_allocate_jointly(len(batch), [len(batch)] * len(KS)):
            victim = batch.pop(self.rng.randrange(len(batch)))  # preempt: free it, as an engine would
            self.finish([victim])
            self.preemptions += 1
        if not batch:
            return
        swa, blocks = self.take(len(batch), len(batch))
        leaving = []
        for i, seq in enumerate(batch):
            seq.swa.append(swa[i])
            if len(seq.swa) > WINDOW_BLOCKS:
                leaving.append(seq.swa.popleft())
            for t in range(len(KS)):
                seq.blocks[t].append(blocks[t][i])
        self.free_swa(leaving)

    def step(self):
        self.admit()
        self.decode()
        self.finish([seq for seq in self.live if len(seq.blocks[0]) >= MAX_BLOCKS or self.rng.random() < 0.01])
        self.evictions += len(self.coord.take_evicted_swa())
        self.steps += 1

    # --- checks ---
    def check(self):
        """The C++ invariant checker, and held ids of sampled sequences owned as this run recorded."""
        self.coord.check_invariants()
        for seq in self.rng.sample(self.live, min(4, len(self.live))):
            for slot in seq.swa:
                assert not self.coord.is_free_swa(slot), f"held SWA slot {slot} reported free"
            for t, k in enumerate(KS):
                for b in seq.blocks[t][-3:]:
                    assert self.coord.owner(t, b * k // BLOCK_SIZE) == "compress", f"type {t} block {b}"
        self.checks += 1

    def check_all_rows_free(self):
        """Nothing leaked: every SWA slot free, every compress block free, no slot owned. A shared
        slot SWA never took (a short run) stays reserved in every pool: compress borrows released ones only."""
        assert self.coord.free_swa_slots() == NUM_SWA
        for t, k in enumerate(KS):
            owners = [self.coord.owner(t, s) for s in range(self.slots[t])]
            expected = ["free" if s >= NUM_SWA or s in self.swa_used else "reserved" for s in range(self.slots[t])]
            assert owners == expected, f"type {t} leaked a slot"
            assert self.coord.free_compress_blocks(t) == owners.count("free") * (BLOCK_SIZE // k), \
                f"type {t} leaked blocks"
        self.coord.check_invariants()


def run_soak(ops, seed=0, check_every=100_000):
    """Runs until `ops` operations; returns the figures, RSS at the start, at
    the middle and at the end. The start is sampled before the loop and again
    after the first check (allocations that only warm up are done by then), so
    a run shorter than one check interval still has one."""
    soak = Soak(seed)
    rss, next_check, started = {"start": rss_bytes()}, check_every, time.perf_counter()
    warmed_up = False
    while soak.ops < ops:
        soak.step()
        if soak.ops >= next_check:
            soak.check()
            next_check += check_every
            if not warmed_up:
                rss["start"], warmed_up = rss_bytes(), True
        if "middle" not in rss and soak.ops >= ops // 2:
            rss["middle"] = rss_bytes()
    soak.finish(list(soak.live))
    soak.check_all_rows_free()
    rss["end"] = rss_bytes()
    return dict(ops=soak.ops, seconds=time.perf_counter() - started, steps=soak.steps, checks=soak.checks,
                refusals=soak.refusals, preemptions=soak.preemptions, evictions=soak.evictions,
                borrows=sum(dict(soak.coord.counters())[f"type{t}_borrows"] for t in range(len(KS))), rss=rss)
