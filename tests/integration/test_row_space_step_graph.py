"""A row-space serving run whose every step is one captured CUDA graph,
replayed step after step: the row copies the manager staged, the SWA writes
of the step's new tokens through swa_slot_mapping, the decode and prefill
index ops, and the reads through the indices they built. The pools are tight
enough that the row space moves live units, so the copies matter.

KV is tagged: the row of position a of a layer of class c holds the hash of
the tokens [0, a] and c, written by the token that computed it. Every read
must find the tag of the position the index stands for: each decode token's
window in its SWA, CSA and HCA slices, each prefill token's SWA prefix in all
three. The same step with the row copies left out, or applied after the
reads, must read wrong rows: that is what this test exists to catch. On the
CPU the same steps run as eager calls."""
import random
from dataclasses import dataclass, field
from typing import Dict, List

import pytest
import torch

import ukv_torch
from ukv_torch import KvManager, ModelKvSpec, ServeConfig, allocate_unified_kv, plan_kv_layout, table_index
from ukv_torch.demo.captured_decode import capture
from support.devices import DEVICES

CONFIG = ServeConfig(layout="row_space", swa_page_tokens=32, window=128, mtp_k=0, compress_ratios=(4, 128),
                     max_num_seqs=6, max_num_batched_tokens=256, max_blocks_per_seq=16)
# One layer of each class: dense (0), CSA (4), HCA (128); rows of 16 + 8 bytes.
MODEL = ModelKvSpec(layer_ratios=(0, 4, 128), head_dim=16, kv_elem_bytes=1, rope_head_dim=4, rope_elem_bytes=2,
                    indexer_bytes_per_block=64)
CLASSES = (0, 4, 128)
BUDGET = 60_000  # about 2,500 rows: three or four requests live, units moved to make room
WINDOW, TOKENS, ROWS = CONFIG.window, CONFIG.max_num_batched_tokens, CONFIG.max_num_seqs
HASH_MASK = (1 << 40) - 1


def tag(prefix_hash: int, class_index: int) -> int:
    return (prefix_hash << 2) | class_index


@dataclass
class Request:
    tokens: List[int]
    output_left: int
    decoding: bool = False
    hashes: List[int] = field(default_factory=list)  # hashes[a]: of tokens [0, a]

    def hash_at(self, a: int) -> int:
        while len(self.hashes) <= a:
            prev = self.hashes[-1] if self.hashes else 0
            self.hashes.append((prev * 1000003 + self.tokens[len(self.hashes)] + 1) & HASH_MASK)
        return self.hashes[a]


class StepGraph:
    """The step's device work on static buffers. `order` is "copies first" (correct), "no copies" or
    "copies last" (after the reads)."""

    def __init__(self, plan, mgr: KvManager, kv, device, order: str):
        self.mgr, self.order, self.device = mgr, order, device
        i32, i64 = dict(dtype=torch.int32, device=device), dict(dtype=torch.int64, device=device)
        self.planes = list(kv.planes)
        self.tags = [kv.kv[CLASSES.index(c)].view(torch.int64)[:, 0] for c in CLASSES]  # column 0 of each layer
        self.swa_rows = {c: list(plan.swa_rows(c)) for c in CLASSES}
        self.hca_stride = plan.compress_args(128)["block_stride"]
        self.x = {"new_pos": torch.zeros(TOKENS, **i64), "new_bid": torch.full((TOKENS,), -1, **i32),
                  "new_hash": torch.zeros(TOKENS, **i64),
                  "dec_pos": torch.zeros(ROWS, **i64), "dec_bid": torch.full((ROWS,), -1, **i32),
                  "pre_pos": torch.zeros(TOKENS, **i64), "pre_bid": torch.full((TOKENS,), -1, **i32),
                  "chunk_start": torch.zeros(ROWS, **i32), "query_start": torch.zeros(ROWS, **i32),
                  "zeros": torch.zeros(ROWS, **i32)}
        self.slots = torch.zeros(TOKENS, **i32)
        self.dec_ptr = [torch.zeros(ROWS + 1, **i32) for _ in range(3)]
        self.dec_out = [torch.full((ROWS * WINDOW,), -1, **i32) for _ in range(3)]
        self.pre_ptr = [torch.zeros(TOKENS + 1, **i32) for _ in range(4)]
        self.prefix = torch.zeros(TOKENS, **i32)
        self.pre_out = [torch.full((TOKENS * WINDOW,), -1, **i32) for _ in range(4)]
        self.dec_read = [torch.zeros(ROWS * WINDOW, **i64) for _ in range(3)]
        self.pre_read = [torch.zeros(TOKENS * WINDOW, **i64) for _ in range(4)]
        self.graph = capture(self.step, device) if device.type == "cuda" else None

    def copies(self):
        ukv_torch.apply_row_copies(self.planes, self.mgr.row_copies, self.mgr.row_copy_counts)

    def write_swa(self):
        x, swa = self.x, self.mgr.tables[:, table_index(CONFIG, "swa")]
        for c, (cls, column) in enumerate(zip(CLASSES, self.tags)):
            ukv_torch.swa_slot_mapping(swa, x["new_pos"], x["new_bid"], self.slots, block_size=CONFIG.block_size,
                                       swa_rows=self.swa_rows[cls])
            valid = self.slots >= 0
            rows = torch.where(valid, self.slots, 0).long()
            # Adds tag - old on each written row (rows are distinct) and 0 on row 0 for the
            # others, so every write lands whatever the order of the additions.
            delta = torch.where(valid, x["new_hash"] * 4 + c - column[rows], 0)
            column.scatter_add_(0, rows, delta)

    def build_indices(self):
        x, tables = self.x, self.mgr.tables
        swa, hca = tables[:, table_index(CONFIG, "swa")], tables[:, table_index(CONFIG, 128)]
        ukv_torch.decode_index_metadata(x["dec_pos"], x["dec_bid"], x["zeros"], x["zeros"], *self.dec_ptr,
                                        window=WINDOW, index_topk=64)
        ukv_torch.paged_decode_indices(swa, x["dec_pos"], x["dec_bid"], self.dec_ptr[0], self.dec_out[0],
                                       self.dec_ptr[1], self.dec_out[1], self.dec_ptr[2], self.dec_out[2],
                                       window=WINDOW, block_size=CONFIG.block_size, swa_rows=self.swa_rows[0],
                                       csa_swa_rows=self.swa_rows[4], hca_swa_rows=self.swa_rows[128])
        ukv_torch.prefill_index_metadata(x["pre_pos"], x["pre_bid"], x["chunk_start"], x["zeros"], x["zeros"],
                                         *self.pre_ptr, self.prefix, window=WINDOW, index_topk=64)
        ukv_torch.paged_prefill_indices(x["pre_pos"], x["pre_bid"], x["chunk_start"], x["query_start"], x["zeros"],
                                        swa, hca, *self.pre_ptr, *self.pre_out, compress_base=0, window=WINDOW,
                                        block_size=CONFIG.block_size, swa_rows=self.swa_rows[0],
                                        csa_swa_rows=self.swa_rows[4], hca_swa_rows=self.swa_rows[128],
                                        hca_block_stride=self.hca_stride)

    def read(self):
        columns = [self.tags[0], self.tags[1], self.tags[2]]
        for out, read, column in zip(self.dec_out, self.dec_read, columns):
            torch.index_select(column, 0, out.clamp(min=0).long(), out=read)
        for out, read, column in zip(self.pre_out, self.pre_read, [self.tags[0]] + columns):
            torch.index_select(column, 0, out.clamp(min=0).long(), out=read)

    def step(self):
        if self.order == "copies first":
            self.copies()
        self.write_swa()
        self.build_indices()
        self.read()
        if self.order == "copies last":
            self.copies()

    def run(self):
        if self.graph is not None:
            self.graph.replay()
            torch.cuda.synchronize(self.device)
        else:
            self.step()


class Run:
    """A small engine: decode first, then admission and prefill chunks within the token budget;
    preemption from the back when decode does not fit; finished requests leave."""

    def __init__(self, device, order, seed):
        self.rng = random.Random(seed)
        self.device = torch.device(device)
        plan = plan_kv_layout(BUDGET, MODEL, CONFIG)
        self.mgr = KvManager(plan, device=self.device if self.device.type == "cuda" else None)
        self.kv = allocate_unified_kv(plan, device=self.device)
        for p in self.kv.planes:
            p.view(torch.uint8).fill_(0xFF)  # no row holds any tag before it is written
        self.graph = StepGraph(plan, self.mgr, self.kv, self.device, order)
        prefixes = [[self.rng.randrange(1000) for _ in range(self.rng.choice((128, 256, 300)))] for _ in range(3)]
        self.waiting = [Request(self.rng.choice(prefixes) + [self.rng.randrange(1000) for _ in range(
            self.rng.randrange(20, 400))], self.rng.randrange(20, 120)) for _ in range(40)]
        self.live: Dict[int, Request] = {}
        self.next_id = 0
        self.checked = self.mismatches = self.copies = 0

    # -------------------------------------------------------------- scheduling --
    def schedule(self):
        mgr = self.mgr
        decoding = [s for s, req in self.live.items() if req.decoding]
        while decoding and mgr.can_append(decoding, 1) < len(decoding):
            self.preempt(decoding.pop())
        if decoding:
            mgr.append(decoding, 1)
        budget = TOKENS - len(decoding)
        prefilling, counts = [], []
        for s, req in list(self.live.items()):
            if s not in decoding and budget > 0:
                count = min(len(req.tokens) - mgr.num_computed(s), budget)
                prefilling.append(s)
                counts.append(count)
                budget -= count
        while self.waiting and budget > 0 and len(self.live) < ROWS:
            s, req = self.next_id, self.waiting[0]
            cached = mgr.allocate(s, req.tokens)
            if cached < 0:
                break
            self.waiting.pop(0)
            self.next_id += 1
            self.live[s] = req
            count = min(len(req.tokens) - cached, budget)
            prefilling.append(s)
            counts.append(count)
            budget -= count
        if prefilling:
            mgr.ensure_for_tokens(prefilling, counts)
        return decoding, prefilling, counts

    def preempt(self, s):
        req = self.live.pop(s)
        self.mgr.deallocate([s])
        req.decoding = False
        self.waiting.insert(0, req)

    # ------------------------------------------------------------------- a step --
    def step(self):
        decoding, prefilling, counts = self.schedule()
        batch = decoding + prefilling
        if not batch:
            return False
        self.mgr.stage(batch)
        self.mgr.upload(len(batch))
        self.copies += int(self.mgr.row_copy_counts.sum())
        new, dec, pre, chunk_start, query_start = [], [], [], [0] * ROWS, [0] * ROWS
        for row, s in enumerate(decoding):
            pos = self.mgr.num_computed(s)
            new.append((pos, row, s))
            dec.append((pos, row, s))
        query = 0
        for row, (s, count) in enumerate(zip(prefilling, counts), start=len(decoding)):
            first = self.mgr.num_computed(s)
            chunk_start[row], query_start[row] = first, query
            query += count
            for pos in range(first, first + count):
                new.append((pos, row, s))
                pre.append((pos, row, s))
        self.load(new, dec, pre, chunk_start, query_start)
        self.graph.run()
        self.check(dec, pre)
        self.commit(decoding, prefilling, counts)
        return True

    def load(self, new, dec, pre, chunk_start, query_start):
        x = self.graph.x

        def put(name, values, pad):
            host = torch.full((x[name].numel(),), pad, dtype=x[name].dtype)
            host[:len(values)] = torch.tensor(values, dtype=x[name].dtype)
            x[name].copy_(host)

        put("new_pos", [p for p, _, _ in new], 0)
        put("new_bid", [r for _, r, _ in new], -1)
        put("new_hash", [self.live[s].hash_at(p) for p, _, s in new], 0)
        put("dec_pos", [p for p, _, _ in dec], 0)
        put("dec_bid", [r for _, r, _ in dec], -1)
        put("pre_pos", [p for p, _, _ in pre], 0)
        put("pre_bid", [r for _, r, _ in pre], -1)
        put("chunk_start", chunk_start, 0)
        put("query_start", query_start, 0)

    def check(self, dec, pre):
        g = self.graph
        ptr = [p.cpu().tolist() for p in g.dec_ptr]
        reads = [r.cpu().tolist() for r in g.dec_read]
        for t, (pos, _, s) in enumerate(dec):
            n = min(pos + 1, WINDOW)
            for c in range(len(CLASSES)):
                got = reads[c][ptr[c][t + 1] - n: ptr[c][t + 1]]
                self.compare(got, [tag(self.live[s].hash_at(a), c) for a in range(pos - n + 1, pos + 1)])
        ptr = [p.cpu().tolist() for p in g.pre_ptr]
        reads = [r.cpu().tolist() for r in g.pre_read]
        prefix = g.prefix.cpu().tolist()
        for t, (pos, _, s) in enumerate(pre):
            k = prefix[t]
            want = [self.live[s].hash_at(a) for a in range(max(pos - WINDOW + 1, 0), max(pos - WINDOW + 1, 0) + k)]
            self.compare(reads[1][ptr[1][t]: ptr[1][t] + k], [tag(h, 0) for h in want])      # SWA prefix
            self.compare(reads[2][ptr[2][t + 1] - k: ptr[2][t + 1]], [tag(h, 1) for h in want])  # CSA tail
            self.compare(reads[3][ptr[3][t]: ptr[3][t] + k], [tag(h, 2) for h in want])      # HCA head

    def compare(self, got, want):
        self.checked += len(want)
        self.mismatches += sum(g != w for g, w in zip(got, want)) + abs(len(got) - len(want))

    def commit(self, decoding, prefilling, counts):
        mgr = self.mgr
        if decoding:
            tokens = [self.rng.randrange(1000) for _ in decoding]
            mgr.commit_decode(decoding, [1] * len(decoding), tokens)
            for s, tok in zip(decoding, tokens):
                self.live[s].tokens.append(tok)
                self.live[s].output_left -= 1
        if prefilling:
            sampled = []
            for s, count in zip(prefilling, counts):
                done = mgr.num_computed(s) + count == len(self.live[s].tokens)
                sampled.append(self.rng.randrange(1000) if done else -1)
            mgr.commit_prefill(prefilling, counts, sampled)
            for s, tok in zip(prefilling, sampled):
                if tok >= 0:
                    self.live[s].tokens.append(tok)
                    self.live[s].decoding = True
        finished = [s for s in decoding if self.live[s].output_left <= 0]
        if finished:
            mgr.deallocate(finished)
            for s in finished:
                del self.live[s]


def serve(device, order, seed, steps=300):
    run = Run(device, order, seed)
    for _ in range(steps):
        if not run.step():
            break
    stats = run.mgr.stats()
    return run, stats["envelope_moves"] + stats["swa_unit_moves"]


@pytest.mark.parametrize("device", DEVICES)
def test_one_graph_per_step_reads_every_row_it_wrote(device):
    run, moves = serve(device, "copies first", seed=0)
    assert moves > 0 and run.copies > 0, "the pools must be tight enough to move live units"
    assert run.checked > 100_000
    assert run.mismatches == 0, f"{run.mismatches} of {run.checked} reads found another position's KV"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("order", ["no copies", "copies last"])
def test_a_step_without_its_copies_first_reads_wrong_rows(device, order):
    run, moves = serve(device, order, seed=0)
    assert moves > 0
    assert run.mismatches > 0, f"{order}: every read matched although units moved"
