"""One layout under one workload: a small scheduler loop around the real
KvManager, with the model emulated by tag writes and every step's indices
checked (integrity.py).

Per step: decode sequences get room for one token (can_append; the most
recently admitted are preempted until it says yes), then prefill chunks of
running requests and new admissions fill the token budget (chunked prefill),
the batch is staged and uploaded, the "model" writes its KV tags, the indices
are built and checked, and the step is committed. Finished turns free their
sequence; follow-up turns arrive later with the whole history as prompt.

With KV tiers (backends given to the Server, searched in order), admissions
load what continues their HBM hit from them, the loaded rows are written before the
step's forward (so the check reads them), and every block the step published
is saved to it (ukv_torch.tiers.TierCache).
"""
from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch

from .. import KvManager, ServeConfig, swa_slot_mapping, table_index
from ..plan.planning import KvPlan
from ..tiers import TierBackend, TierCache
from .content_tags import TokenTags
from .integrity import IntegrityChecker, Token, ragged
from .tagged_kv import TaggedKv
from .workload import VOCAB, Conversation, Workload, first_prompt, next_prompt


@dataclass
class ServerConfig:
    """The demo's own options; the engine's (block size, window, batch limits) are `serve`,
    the ServeConfig the plan was made for."""
    ratios: List[int]
    serve: ServeConfig
    index_topk: int = 1024
    max_steps: int = 2000
    device: str = "cpu"
    seed: int = 0
    inject_fault_step: Optional[int] = None  # damage one staged table entry at this step (the check must fail)
    check_integrity: bool = True        # False: capacity studies that only need the accounting
    cuda_graph: bool = True             # on CUDA, decode indices come from one captured graph's replays


@dataclass
class Request:
    rid: int
    conv: Conversation
    turn: int
    tags: TokenTags
    target_len: int
    seq_id: int = -1
    computed: int = 0
    decoding: bool = False


@dataclass
class LayoutResult:
    name: str
    plan: KvPlan
    steps: int = 0
    completed: int = 0
    tokens_served: int = 0    # completed requests' prompt (cached prefix included) and output tokens
    tokens_computed: int = 0  # tokens the model ran: prefill chunks (recomputation included) and decodes
    prefill_tokens_computed: int = 0  # of which prefill chunks
    loaded_tokens: int = 0    # prompt tokens admitted as loaded from a KV tier
    tier: Dict[str, int] = field(default_factory=dict)  # the TierCache's stats at the end
    preemptions: int = 0
    refusals: int = 0
    unservable: int = 0
    first_refusal_util: Optional[float] = None         # rows in use / all rows
    first_refusal_tensor_util: Optional[float] = None  # the fullest layer tensor
    first_refusal_budget_in_use: Optional[float] = None  # bytes of live KV / the byte budget
    moved_rows: int = 0                                 # rows the row space moved so far
    stranded_rows_at_refusals: List[int] = field(default_factory=list)
    series: Dict[str, List[float]] = field(default_factory=lambda: collections.defaultdict(list))
    stats: Dict[str, int] = field(default_factory=dict)
    checked_indices: int = 0
    decode_graph_replays: int = 0  # decode steps whose indices came from the captured graph
    mismatches: list = field(default_factory=list)

    def summary(self) -> Dict[str, object]:
        s = self.stats
        q = max(1, s.get("prefix_query_blocks", 0))
        steps = max(1, self.steps)
        util = self.series["util"]
        return {
            "layout": self.name,
            "logical_blocks": self.plan.num_logical_blocks,
            "swa_blocks": self.plan.num_swa_blocks,
            "steps": self.steps,
            "requests_completed": self.completed,
            # Served work per step: equal totals whenever every layout completes
            # the workload, so it is the inverse of the steps taken; computed
            # tokens also count the prefix hits a layout missed and recomputation.
            "tokens_served": self.tokens_served,
            "tokens_per_step": round(self.tokens_served / max(1, self.steps), 1),
            "computed_tokens_per_step": round(self.tokens_computed / max(1, self.steps), 1),
            "prefill_tokens_per_step": round(self.prefill_tokens_computed / max(1, self.steps), 1),
            "peak_swa_rows": int(max(self.series["swa_rows"], default=0)),
            "mean_swa_rows": round(float(np.mean(self.series["swa_rows"])) if util else 0.0, 1),
            "peak_compress_rows": int(max(self.series["compress_rows"], default=0)),
            "mean_compress_rows": round(float(np.mean(self.series["compress_rows"])) if util else 0.0, 1),
            "mean_util": round(float(np.mean(util)) if util else 0.0, 4),
            "util_at_first_refusal": None if self.first_refusal_util is None else round(self.first_refusal_util, 4),
            "budget_in_use_at_first_refusal": None if self.first_refusal_budget_in_use is None
            else round(self.first_refusal_budget_in_use, 4),
            "mean_budget_in_use": round(float(np.mean(self.series["budget_in_use"])) if util else 0.0, 4),
            "peak_budget_in_use": round(float(max(self.series["budget_in_use"], default=0.0)), 4),
            "moved_bytes_per_step_max": int(max(self.series["moved_bytes"], default=0)),
            "moved_bytes_per_step_mean": round(float(np.mean(self.series["moved_bytes"])) if util else 0.0, 1),
            # Relocated bytes over the live KV bytes of the same step, averaged over steps.
            "moved_fraction_mean": round(float(np.mean([m / l for m, l in zip(self.series["moved_bytes"],
                                                                                self.series["live_bytes"]) if l]))
                                         if util else 0.0, 6),
            "fullest_tensor_at_first_refusal": None if self.first_refusal_tensor_util is None
            else round(self.first_refusal_tensor_util, 4),
            "prefix_hit_rate": round(s.get("prefix_hit_blocks", 0) / q, 4),
            # Prompt blocks served from HBM or loaded from a tier, over those looked up.
            "hit_rate_with_tier": round((s.get("prefix_hit_blocks", 0) + self.tier.get("loaded_blocks", 0)) / q, 4),
            "loaded_tokens": self.loaded_tokens,
            "tier_saved_bytes_per_step": round(self.tier.get("saved_bytes", 0) / steps, 1),
            "tier_loaded_bytes_per_step": round(self.tier.get("loaded_bytes", 0) / steps, 1),
            "borrows": sum(v for k, v in s.items() if k.endswith("_borrows")),
            "swa_evictions": s.get("swa_evictions", 0),
            "reclaimed_slots": s.get("reclaimed_slots", 0),
            "compress_evictions": s.get("compress_evictions", 0),
            "preemptions": self.preemptions,
            "admission_refusals": self.refusals,
            "unservable_requests": self.unservable,
            "mean_stranded_rows_at_refusal": round(float(np.mean(self.stranded_rows_at_refusals)), 1)
            if self.stranded_rows_at_refusals else 0.0,
            "checked_indices": self.checked_indices,
            "decode_graph_replays": self.decode_graph_replays,
            "mismatches": len(self.mismatches),
        }


def corrupt_entry(tables: torch.Tensor, swa_table: int):
    """Point row 0's last SWA table entry above 0 (past it: padding zeros, or
    -1 for pages not held) at the next unit; returns its index."""
    used = (tables[0, swa_table] > 0).nonzero()
    index = (0, swa_table, int(used[-1]) if len(used) else 0)
    tables[index] += 1
    return index


class Server:
    def __init__(self, name: str, plan: KvPlan, workload: Workload, cfg: ServerConfig,
                 tiers: Sequence[TierBackend] = ()):
        if plan.config != cfg.serve:
            raise ValueError(f"Server: the plan was made for {plan.config}, not for cfg.serve {cfg.serve}")
        self.cfg, self.serve, self.workload, self.plan = cfg, cfg.serve, workload, plan
        self.device = torch.device(cfg.device)
        self.mgr = KvManager(plan, device=None if self.device.type == "cpu" else self.device)
        # The tags and the checker only when the run checks (a capacity study at
        # GiB budgets needs the accounting alone).
        self.kv = TaggedKv(cfg.ratios, plan, self.device) if cfg.check_integrity else None
        self.checker = IntegrityChecker(self.kv, cfg.index_topk, cfg.serve, self.device, cfg.seed) \
            if cfg.check_integrity else None
        if cfg.cuda_graph and cfg.check_integrity and self.device.type == "cuda":
            self.checker.capture_decode(self.mgr.tables)
        self.result = LayoutResult(name, plan)
        self.tiers = TierCache(plan, self.kv, tiers) if tiers else None
        self.waiting: collections.deque = collections.deque()
        self.running: List[Request] = []
        self.arrivals: Dict[int, List[Request]] = collections.defaultdict(list)
        self.next_seq_id = self.next_rid = 0
        self.open_turns = workload.total_turns()
        for conv in workload.conversations:
            self._schedule(conv, 0, first_prompt(workload, conv), conv.arrival)
        self.row_space = self.serve.layout == "row_space"
        self.layer_rows = [plan.pools.total_rows] if self.row_space else list(plan.layer_rows)
        self.layer_k = [0 if r == 0 else self.serve.block_size // r for r in cfg.ratios]
        # Where the staged tables keep the SWA table and each compress ratio's physical table.
        self.swa_table = table_index(self.serve, "swa")
        self.compress_table = {r: table_index(self.serve, r) for r in set(cfg.ratios) if r}

    # --- workload ----------------------------------------------------------
    def _schedule(self, conv: Conversation, turn: int, prompt: np.ndarray, step: int) -> None:
        limit = self.serve.max_blocks_per_seq * self.serve.block_size - 1
        out = conv.turns[turn][1]
        if len(prompt) + out > limit:  # the engine's max_model_len
            self.open_turns -= len(conv.turns) - turn
            return
        self.arrivals[step].append(Request(self.next_rid, conv, turn, TokenTags(prompt), len(prompt) + out))
        self.next_rid += 1

    def done(self) -> bool:
        return self.open_turns == 0

    # --- one step ----------------------------------------------------------
    def step(self, step: int) -> None:
        self.waiting.extend(self.arrivals.pop(step, []))
        decoding = self._decode_batch()
        chunks = self._prefill_batch(budget=self.serve.max_num_batched_tokens - len(decoding))
        if chunks:
            self.mgr.ensure_for_tokens([r.seq_id for r, _ in chunks], [n for _, n in chunks])
        batch = decoding + [r for r, _ in chunks]
        if batch:
            self._forward(step, decoding, chunks, batch)
            self._commit(step, decoding, chunks)
        self._record()

    def _decode_batch(self) -> List[Request]:
        decoding = [r for r in self.running if r.decoding]
        while decoding:
            ok = self.mgr.can_append([r.seq_id for r in decoding])
            if ok == len(decoding):
                break
            self._preempt(decoding.pop())
        if decoding:
            self.mgr.append([r.seq_id for r in decoding])
        return decoding

    def _deallocate(self, r: Request) -> None:
        self.mgr.deallocate(r.seq_id)

    def _preempt(self, r: Request) -> None:
        self._deallocate(r)
        self.running.remove(r)
        r.computed, r.decoding = 0, False
        self.waiting.appendleft(r)
        self.result.preemptions += 1

    def _prefill_batch(self, budget: int):
        chunks = []
        for r in self.running:
            if not r.decoding and budget > 0:
                n = min(len(r.tags) - r.computed, budget)
                chunks.append((r, n))
                budget -= n
        while self.waiting and budget > 0 and len(self.running) < self.serve.max_num_seqs:
            r = self.waiting[0]
            seq_id = self.next_seq_id
            cached = self._admit(seq_id, r)
            if cached == KvManager.NEVER_FITS:  # not even with nothing live: the engine rejects it
                self.waiting.popleft()
                self.result.unservable += 1
                self.open_turns -= len(r.conv.turns) - r.turn
                continue
            if cached == KvManager.NOT_NOW:  # first come, first served: wait for room
                self._refused()
                break
            self.next_seq_id += 1
            self.waiting.popleft()
            r.seq_id, r.computed = seq_id, cached
            self.running.append(r)
            n = min(len(r.tags) - cached, budget)
            chunks.append((r, n))
            budget -= n
        return chunks

    def _admit(self, seq_id: int, r: Request) -> int:
        """allocate(), through the tier when there is one."""
        tokens = torch.from_numpy(r.tags.tokens)
        if self.tiers is None:
            return self.mgr.allocate(seq_id, tokens)
        hit = self.mgr.can_allocate(tokens)
        cached = self.tiers.admit(self.mgr, seq_id, tokens)
        if cached >= 0:
            self.result.loaded_tokens += cached - hit
        return cached

    # --- memory accounting ---------------------------------------------------
    def _rows_in_use(self, stats) -> Dict[str, float]:
        """Rows and bytes the live SWA pages and logical blocks hold. Rows are
        per layer tensor in the slot layouts (and the fullest tensor is what
        ran out at a refusal); the row space is one tensor of them all."""
        live_blocks = self.plan.num_logical_blocks - stats["free_logical_blocks"]
        pages = stats["held_swa_slots"]
        in_use_bytes = pages * self.plan.swa_block_bytes + live_blocks * self.plan.compressed_block_bytes
        swa_rows = pages * self.serve.swa_page
        compress_rows = sum(live_blocks * k for k in self.layer_k)
        if self.row_space:
            used = stats["live_envelopes"] * self.plan.pools.envelope_rows + \
                stats["live_swa_units"] * self.plan.pools.swa_unit_rows
            tensor_util = used / self.layer_rows[0]
        else:
            used = swa_rows * len(self.layer_k) + compress_rows
            tensor_util = max((swa_rows + live_blocks * k) / rows for k, rows in zip(self.layer_k, self.layer_rows))
        return {"swa_rows": swa_rows, "compress_rows": compress_rows, "util": used / sum(self.layer_rows),
                "used": used, "tensor_util": tensor_util, "budget_in_use": in_use_bytes / self.plan.budget_bytes}

    def _refused(self) -> None:
        self.result.refusals += 1
        rows = self._rows_in_use(self.mgr.stats())
        self.result.stranded_rows_at_refusals.append(sum(self.layer_rows) - rows["used"])
        if self.result.first_refusal_util is None:
            self.result.first_refusal_util = rows["util"]
            self.result.first_refusal_tensor_util = rows["tensor_util"]
            self.result.first_refusal_budget_in_use = rows["budget_in_use"]

    def _record(self) -> None:
        stats = self.mgr.stats()
        rows = self._rows_in_use(stats)
        for key in ("swa_rows", "compress_rows", "util", "budget_in_use"):
            self.result.series[key].append(rows[key])
        self.result.series["running"].append(len(self.running))
        # Bytes the row space moved this step (units relocated to make room).
        moved = stats.get("moved_rows", 0) - self.result.moved_rows
        self.result.moved_rows += moved
        self.result.series["moved_bytes"].append(moved * (self.plan.total_bytes // max(1, self.plan.pools.total_rows)))
        self.result.series["live_bytes"].append(rows["budget_in_use"] * self.plan.budget_bytes)

    # --- the model: KV writes, index checks ---------------------------------
    def _forward(self, step: int, decoding: List[Request], chunks, batch: List[Request]) -> None:
        self.mgr.stage([r.seq_id for r in batch])
        self.mgr.upload(len(batch))
        tables = self.mgr.tables[: len(batch)]
        if self.kv is not None:  # the units the row space moved, before the step touches KV
            self.kv.apply_copies(self.mgr.row_copies, self.mgr.row_copy_counts)
        decode_tokens = [Token(i, r.tags.tags, r.computed, 1, f"request {r.rid} (decode)")
                         for i, r in enumerate(decoding)]
        prefill_tokens = [Token(len(decoding) + j, r.tags.tags, r.computed, n, f"request {r.rid} (prefill)")
                          for j, (r, n) in enumerate(chunks)]
        if not self.cfg.check_integrity:
            return
        self._write_kv(decode_tokens, prefill_tokens, tables)
        # The injected fault damages the staged table in place (a captured graph reads
        # it there) between the model's writes and the index check, for this step only.
        corrupt = corrupt_entry(tables, self.swa_table) if self.cfg.inject_fault_step == step else None
        self.checker.decode(decode_tokens, tables, len(batch))
        self.checker.prefill(prefill_tokens, tables, len(batch))
        if corrupt is not None:
            tables[corrupt] -= 1

    def _write_kv(self, decode_tokens: List[Token], prefill_tokens: List[Token], tables: torch.Tensor) -> None:
        """SWA writes where swa_slot_mapping gives a row (the positions the
        manager gave pages: a prefill chunk's last window, every decode
        position), and every compressed entry whose last position was computed."""
        tokens = decode_tokens + prefill_tokens
        pos = np.concatenate([np.arange(t.start, t.start + t.count) for t in tokens])
        bid = np.concatenate([np.full(t.count, t.row) for t in tokens])
        tags = torch.as_tensor(np.concatenate([t.tags[t.start: t.start + t.count] for t in tokens])).to(self.device)
        pos_t = torch.as_tensor(pos).to(self.device)
        bid_t = torch.as_tensor(bid, dtype=torch.int32).to(self.device)
        slots = torch.empty(len(pos), dtype=torch.int32, device=self.device)
        bs = self.serve.block_size
        for ratio in set(self.cfg.ratios):
            swa_slot_mapping(tables[:, self.swa_table], pos_t, bid_t, slots, block_size=bs,
                             swa_rows=self.kv.swa_rows[ratio])
            keep = slots >= 0
            self.kv.write_swa(ratio, slots[keep].long(), tags[keep])
        for ratio, table in self.compress_table.items():
            k = bs // ratio
            starts = np.array([t.start // ratio for t in decode_tokens + prefill_tokens])
            ends = np.array([(t.start + t.count) // ratio for t in decode_tokens + prefill_tokens])
            entries = ragged(starts, np.maximum(ends - starts, 0))
            if len(entries) == 0:
                continue
            owners = np.repeat(np.arange(len(starts)), np.maximum(ends - starts, 0))
            all_tokens = decode_tokens + prefill_tokens
            entry_tags = np.array([all_tokens[o].tags[ratio * e + ratio - 1] for o, e in zip(owners, entries)])
            own_rows = torch.as_tensor(np.array([all_tokens[o].row for o in owners])).to(self.device)
            ent = torch.as_tensor(entries).to(self.device)
            phys = tables[own_rows, table, ent // k].long()
            self.kv.write_compress(ratio, phys, ent % k, torch.as_tensor(entry_tags).to(self.device))

    # --- commit ----------------------------------------------------------------
    def _commit(self, step: int, decoding: List[Request], chunks) -> None:
        if decoding:
            new = [int(r.tags.tags[r.computed] % VOCAB) for r in decoding]
            self.mgr.commit_decode([r.seq_id for r in decoding], [1] * len(decoding), new)
            for r, tok in zip(decoding, new):
                r.computed += 1
                r.tags.append([tok])
            self.result.tokens_computed += len(decoding)
        if chunks:
            sampled = []
            for r, n in chunks:
                done = r.computed + n == len(r.tags)
                sampled.append(int(r.tags.tags[-1] % VOCAB) if done else -1)
            self.mgr.commit_prefill([r.seq_id for r, _ in chunks], [n for _, n in chunks], sampled)
            for (r, n), tok in zip(chunks, sampled):
                r.computed += n
                if tok >= 0:
                    r.tags.append([tok])
                    r.decoding = True
                self.result.tokens_computed += n
                self.result.prefill_tokens_computed += n
        for r in [r for r in self.running if len(r.tags) >= r.target_len]:
            self._finish(step, r)
        if self.tiers is not None:  # what the commit published, written through to the tier
            self.tiers.save(self.mgr, self.mgr.take_events())

    def _finish(self, step: int, r: Request) -> None:
        self._deallocate(r)
        self.running.remove(r)
        self.result.completed += 1
        self.result.tokens_served += len(r.tags)
        self.open_turns -= 1
        nxt = next_prompt(self.workload, r.conv, r.tags.tokens, r.turn + 1)
        if nxt is not None:
            self._schedule(r.conv, r.turn + 1, nxt, step + 1 + r.conv.think_steps)

    def finish_run(self) -> LayoutResult:
        self.result.stats = self.mgr.stats()
        if self.tiers is not None:
            self.tiers.flush()
            self.result.tier = self.tiers.stats()
        if self.checker is not None:
            self.result.checked_indices = self.checker.checked
            self.result.decode_graph_replays = self.checker.captured.replays if self.checker.captured else 0
            self.result.mismatches = self.checker.mismatches
        self.mgr.check_invariants()
        return self.result
