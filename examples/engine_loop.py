"""A complete serving loop on ukv_torch, following docs/serving-loop.md, with
every index the attention would read checked.

The engine: a FIFO of requests (shared system prompts, exact repeats and
follow-up turns, so the prefix cache hits), continuous batching with chunked
prefill packed into a per-step token budget, MTP decode with a random number
of drafts per sequence and a random number of them accepted, and preemption
when can_append says no. The model is tagged_model.TaggedModel: its KV rows
hold content tags, and every index the step's ops build (attention_metadata.py)
must read the tag its position expects.

    python examples/engine_loop.py [--layout static|upstream|elastic|row_space] [--device cpu|cuda]
                                   [--tier none|host|mooncake [--mooncake-master HOST:PORT ...]]

With a tier (ukv_torch.tiers), every block the prefix cache publishes is
written through to it, and an admission loads the blocks that continue its
HBM hit from it; the tag check covers every read of restored rows. mooncake:
a host tier, then a Mooncake Store that other engine processes may share
(a local mooncake_master is started when no --mooncake-master is given).

Prints one line (PASS or FAIL and the run's counts); exits 1 on any mismatch.
"""
from __future__ import annotations

import argparse
import collections
import random
import sys
import time
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import numpy as np
import torch

from attention_metadata import AttentionMetadata, Chunk
from tagged_model import TaggedModel, Work, extend_tags
from ukv_torch import (KvManager, KvStepOps, ModelKvSpec, SequenceExport, ServeConfig, allocate_unified_kv,
                       plan_kv_layout, table_index)
from ukv_torch.tiers import HostTier, TierCache
from ukv_torch.tiers.mooncake_master import MooncakeMaster

LAYERS = (0, 4, 128, 4, 128)  # one dense (SWA only), two CSA and two HCA layers
VOCAB = 32000
# Budgets under which memory runs short (waits, preemptions, evictions, row moves). The slot
# layouts keep max_num_seqs windows of SWA rows in every layer tensor whatever is live, so
# they need more bytes for the same load.
BUDGET_KIB = {"static": 280, "upstream": 300, "elastic": 272, "row_space": 80}


@dataclass
class Request:
    rid: int               # also its sequence id in the manager
    prompt: List[int]
    target: int            # finished once it knows this many tokens
    tokens: List[int] = field(default_factory=list)  # known tokens: the prompt, then generated ones
    tags: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # tags[p]: tokens[0..p]'s tag
    computed: int = 0      # positions whose KV is computed (the manager's num_computed)
    decoding: bool = False  # the prompt is computed and the token after it sampled
    drafts: List[int] = field(default_factory=list)  # this step's draft tokens

    def __post_init__(self):
        self.learn(self.prompt)

    def learn(self, tokens: List[int]) -> None:
        self.tokens += tokens
        self.tags = extend_tags(self.tags, tokens)


class Workload:
    """Requests on shared system prompts; a finished request may come back as a
    follow-up turn (its whole history as prompt) or as an exact repeat."""

    def __init__(self, rng: random.Random, total: int, max_len: int):
        self.rng, self.total, self.max_len, self.made = rng, total, max_len, 0
        self.systems = [self.tokens(rng.randrange(256, 512)) for _ in range(2)]

    def tokens(self, n: int) -> List[int]:
        return [self.rng.randrange(VOCAB) for _ in range(n)]

    def first(self, count: int) -> List[Request]:
        return [self.make(self.rng.choice(self.systems) + self.tokens(self.rng.randrange(1, 100)))
                for _ in range(count)]

    def after(self, done: Request) -> Optional[Request]:
        kind = self.rng.random()
        if kind < 0.4:
            return self.make(done.tokens + self.tokens(self.rng.randrange(1, 200)))
        if kind < 0.7:
            return self.make(list(done.prompt))
        return self.first(1)[0] if self.made < self.total else None

    def make(self, prompt: List[int]) -> Optional[Request]:
        if self.made >= self.total:
            return None
        output = self.rng.randrange(400, 1000)
        prompt = prompt[: self.max_len - output]
        self.made += 1
        return Request(self.made - 1, prompt, len(prompt) + output)


class Engine:
    def __init__(self, args):
        self.args, self.rng = args, random.Random(args.seed)
        self.device = torch.device(args.device)
        config = ServeConfig(layout=args.layout, window=128, mtp_k=2, compress_ratios=(4, 128), max_num_seqs=16,
                             max_num_batched_tokens=384, max_blocks_per_seq=12, swa_sizing="step",
                             swa_page_tokens=args.swa_page_tokens if args.layout == "row_space" else 0)
        # The model's KV is one int64 tag per row: the plan counts tag rows of 8 bytes.
        model = ModelKvSpec(layer_ratios=LAYERS, head_dim=1, kv_elem_bytes=8, rope_head_dim=0,
                            indexer_bytes_per_block=0)
        self.plan = plan_kv_layout((args.budget_kib or BUDGET_KIB[args.layout]) << 10, model, config)
        self.cfg = config
        self.kv = allocate_unified_kv(self.plan, dtype=torch.int64, device=self.device)
        self.mgr = KvManager(self.plan, device=None if self.device.type == "cpu" else self.device)
        # Every op of the step through the plan: no layout constant is passed by hand.
        self.ops = KvStepOps(self.plan, self.kv, self.mgr)
        self.metadata = AttentionMetadata(self.ops, index_topk=64, device=self.device)
        self.model = TaggedModel(self.ops, self.metadata, seed=args.seed)
        self.master = None  # a mooncake_master this engine started itself
        self.tiers = None if args.tier == "none" else TierCache(self.plan, self.kv, self.tier_backends(args))
        if self.tiers and args.fault == "skip-tier-rows":  # admissions load objects but never write their rows
            self.tiers.layout.scatter = lambda *_, **__: None
        # Room for the drafts of the last step: positions up to len(tokens) - 1 + mtp_k.
        max_len = config.max_blocks_per_seq * config.block_size - 1 - config.mtp_k
        self.workload = Workload(self.rng, args.requests, max_len)
        self.waiting = collections.deque(self.workload.first(args.requests * 2 // 3))
        self.running: List[Request] = []
        self.steps = self.finished = self.rejected = self.preemptions = self.hit_tokens = self.loaded_tokens = 0
        self.problems: List[str] = []

    def tier_backends(self, args) -> list:
        backends = [HostTier(args.tier_mult * self.plan.budget_bytes)]
        if args.tier == "mooncake":
            from ukv_torch.tiers.mooncake import MooncakeTier  # the optional extra
            master, metadata, metrics = args.mooncake_master, args.mooncake_metadata, None
            if master is None:
                self.master = MooncakeMaster().start()
                master, metadata, metrics = (self.master.master_address, self.master.metadata_url,
                                             self.master.metrics_url)
            backends.append(MooncakeTier(master, metadata, args.mooncake_segment_kib << 10, metrics_url=metrics))
        return backends

    def close(self) -> None:
        for backend in self.tiers.backends if self.tiers else []:
            backend.close()
        if self.master is not None:
            self.master.stop()

    def done(self) -> bool:
        return not self.waiting and not self.running

    def failed(self) -> bool:
        return bool(self.problems or self.model.mismatches)

    # --- one step ------------------------------------------------------------------
    def step(self) -> None:
        decode = self.schedule_decode()
        prefill = self.schedule_prefill(self.cfg.max_num_batched_tokens - sum(1 + len(r.drafts) for r in decode))
        self.steps += 1
        if not decode and not prefill:
            return
        if prefill:  # SWA pages for exactly the chunks about to be computed
            # The step stays within max_num_batched_tokens and is staged: then the row space's
            # copy list always has room for the chunks' moves, and this is never refused for it.
            self.mgr.ensure_for_tokens([r.rid for r, _ in prefill], [n for _, n in prefill])
        batch = decode + [r for r, _ in prefill]
        self.mgr.stage([r.rid for r in batch])  # row i of every table is batch[i]
        self.mgr.upload(len(batch))
        if self.args.fault != "skip-row-copies":
            # Units the row space moved to make room: before anything reads or writes KV.
            self.ops.apply_row_copies()
        self.forward(decode, prefill)
        self.commit(decode, prefill)
        if self.tiers:  # what the commit published, written through (before the next step's allocations)
            self.tiers.save(self.mgr, self.mgr.take_events())

    def schedule_decode(self) -> List[Request]:
        """Every decoding sequence computes 1 + its drafts. While can_append cannot
        serve them all, the latest admitted is preempted: its memory may be what
        the others need."""
        batch = [r for r in self.running if r.decoding]
        for r in batch:
            r.drafts = [self.rng.randrange(VOCAB) for _ in range(self.rng.randint(0, self.cfg.mtp_k))]
        while batch and self.mgr.can_append([r.rid for r in batch], [1 + len(r.drafts) for r in batch]) < len(batch):
            self.preempt(batch.pop())
        if batch:
            self.mgr.append([r.rid for r in batch], [1 + len(r.drafts) for r in batch])
        return batch

    def preempt(self, r: Request) -> None:
        """Back to the queue's head with every known token; re-admission hits what the cache kept."""
        self.deallocate([r])
        self.running.remove(r)
        r.computed, r.decoding, r.drafts = 0, False, []
        self.waiting.appendleft(r)
        self.preemptions += 1

    def schedule_prefill(self, budget: int) -> List[Tuple[Request, int]]:
        """Chunks of running prefills, then new admissions, until the token budget is spent."""
        chunks = []
        for r in self.running:
            if not r.decoding and budget > 0:
                chunks.append((r, min(len(r.tokens) - r.computed, budget)))
                budget -= chunks[-1][1]
        while self.waiting and budget > 0:
            r = self.waiting[0]
            cached = self.admit(r)
            if cached == KvManager.NOT_NOW:  # live sequences hold what it needs: it waits
                break
            self.waiting.popleft()
            if cached == KvManager.NEVER_FITS:  # would not fit with nothing else live
                self.rejected += 1
                continue
            r.computed = cached  # the cached prefix: prefill starts there
            self.running.append(r)
            chunks.append((r, min(len(r.tokens) - cached, budget)))
            budget -= chunks[-1][1]
        return chunks

    def admit(self, r: Request) -> int:
        """allocate(), through the tiers when there are any: the HBM hit and the loaded prefix."""
        if not self.tiers:
            cached = self.mgr.allocate(r.rid, r.tokens)
            self.hit_tokens += max(0, cached)
            return cached
        hit = self.mgr.can_allocate(r.tokens)
        cached = self.tiers.admit(self.mgr, r.rid, r.tokens)
        if cached >= 0:
            self.hit_tokens += hit
            self.loaded_tokens += cached - hit
        return cached

    def deallocate(self, done: List[Request]) -> None:
        ids = [r.rid for r in done]
        self.mgr.deallocate(ids)

    def forward(self, decode: List[Request], prefill: List[Tuple[Request, int]]) -> None:
        """The model's step over the staged rows: decode rows first, then the prefill chunks."""
        decode_work = [Work(Chunk(i, r.computed, 1 + len(r.drafts)), extend_tags(r.tags, r.drafts))
                       for i, r in enumerate(decode)]
        prefill_work = [Work(Chunk(len(decode) + j, r.computed, n), r.tags) for j, (r, n) in enumerate(prefill)]
        tables = self.mgr.tables[: len(decode) + len(prefill)]  # the staged rows
        damaged = self.damage(tables, decode_work) if self.args.fault == "table" else None
        self.model.forward(tables, decode_work, prefill_work)
        if damaged is not None:  # the staging is incremental: the manager would not rewrite it
            tables[damaged] -= 1

    def damage(self, tables: torch.Tensor, decode_work: List[Work]):
        """Point row 0's SWA entry of its previous position at the next unit (the check must fail)."""
        if not decode_work:
            return None
        index = (0, table_index(self.cfg, "swa"), (decode_work[0].chunk.start - 1) // self.cfg.swa_page)
        tables[index] += 1
        return index

    def commit(self, decode: List[Request], prefill: List[Tuple[Request, int]]) -> None:
        if decode:  # per sequence: its accepted drafts and the bonus token
            counts, new = [], []
            for r in decode:
                accepted = r.drafts[: self.rng.randint(0, len(r.drafts))] + [self.rng.randrange(VOCAB)]
                counts.append(len(accepted))
                new += accepted
                r.learn(accepted)
                r.computed += len(accepted)
            self.mgr.commit_decode([r.rid for r in decode], counts, new)
        if prefill:  # the chunks' KV first; the token sampled after a prompt in a second call
            self.mgr.commit_prefill([r.rid for r, _ in prefill], [n for _, n in prefill])
            for r, n in prefill:
                r.computed += n
            sampled = [r for r, _ in prefill if r.computed == len(r.tokens)]
            if sampled:
                tokens = [self.rng.randrange(VOCAB) for _ in sampled]
                self.mgr.commit_prefill([r.rid for r in sampled], [0] * len(sampled), tokens)
                for r, t in zip(sampled, tokens):
                    r.learn([t])
                    r.decoding = True
        self.check_counts()
        self.finish([r for r in self.running if r.decoding and len(r.tokens) >= r.target])

    def check_counts(self) -> None:
        """The manager counts what the engine does: computed positions, and known
        tokens (a decoding sequence's last sampled token included)."""
        for r in self.running:
            counts = (self.mgr.num_computed(r.rid), self.mgr.num_tokens(r.rid))
            if counts != (r.computed, len(r.tokens)):
                self.problems.append(f"request {r.rid}: the manager counts (num_computed, num_tokens) = {counts}, "
                                     f"the engine {(r.computed, len(r.tokens))}")

    def finish(self, done: List[Request]) -> None:
        if not done:
            return
        self.deallocate(done)  # full blocks stay cached for later hits
        for r in done:
            self.running.remove(r)
            self.finished += 1
            follow_up = self.workload.after(r)
            if follow_up is not None:
                self.waiting.append(follow_up)

    # --- moving a decoding request to another engine (docs/serving-loop.md) ---------------
    # The receiver admits first; the bytes move only once it said yes; the sender frees the
    # request only after they landed. A refusal leaves the request decoding on the sender.
    def describe(self, r: Request) -> SequenceExport:
        """Sender, between steps: what the receiver admits the request from. It stays here."""
        return self.mgr.describe_sequence(r.rid)

    def admit_moved(self, r: Request, export: SequenceExport) -> int:
        """Receiver, first: admit a request another engine describes (under r.rid here). Returns
        import_sequence's answer; on a refusal nothing changed and the sender keeps the request."""
        cached = self.mgr.import_sequence(r.rid, export)
        if cached >= 0:
            # Its rows as they are now: stage it alone and apply the moves its units caused first.
            self.mgr.stage([r.rid])
            self.mgr.upload(1)
            self.ops.apply_row_copies()
        return cached

    def transfer_buffer(self, r: Request) -> torch.Tensor:
        """Receiver: the buffer the admitted request's KV travels in (the same size on both sides)."""
        return torch.empty(self.ops.transfer_bytes(r.rid), dtype=torch.uint8, device=self.device)

    def send(self, r: Request, buffer: torch.Tensor) -> None:
        """Sender: the request's KV rows into the buffer; the request stays live until release()."""
        self.ops.gather_sequence(r.rid, buffer)

    def receive(self, r: Request, buffer: torch.Tensor) -> None:
        """Receiver: the KV rows into the admitted request's rows; it decodes here from the next step."""
        self.ops.scatter_sequence(r.rid, buffer)
        r.computed, r.decoding, r.drafts = self.mgr.num_computed(r.rid), True, []
        self.running.append(r)

    def release(self, r: Request) -> None:
        """Sender, once the bytes landed: the request leaves this engine. Here both engines
        share one stream, so everything later on it runs after the scatter; across
        processes, call it once the transport reports the copy complete."""
        self.mgr.deallocate(r.rid)
        self.running.remove(r)

    # --- the outcome ------------------------------------------------------------------
    def outcome(self, seconds: float) -> Tuple[bool, str]:
        self.mgr.check_invariants()
        stats = self.mgr.stats()
        problems = self.problems + self.model.mismatches
        if not self.done():
            problems.append(f"unfinished after {self.steps} steps: {len(self.running)} running, "
                            f"{len(self.waiting)} waiting")
        elif stats["num_sequences"]:
            problems.append(f"{stats['num_sequences']} sequences still live after the last request finished")
        ok = not problems
        counts = dict(layout=self.cfg.layout, device=self.device.type, steps=self.steps, requests=self.finished,
                      refusals=stats["admission_refusals"], rejected=self.rejected, preemptions=self.preemptions,
                      hit_tokens=self.hit_tokens, loaded_tokens=self.loaded_tokens,
                      store_objects=self.tiers.counters.get("mooncake_fetched_objects", 0) if self.tiers else 0,
                      whole_chunks=stats["whole_chunks"], moved_rows=stats.get("moved_rows", 0),
                      checked_indices=self.model.checked, mismatches=len(self.model.mismatches),
                      seconds=f"{seconds:.1f}")
        line = "engine_loop: " + ("PASS" if ok else "FAIL") + " " + " ".join(f"{k}={v}" for k, v in counts.items())
        return ok, "\n".join([line] + problems[:10])


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layout", default="row_space", choices=("static", "upstream", "elastic", "row_space"))
    p.add_argument("--device", default="cpu", help="cpu, or cuda on a GPU build")
    p.add_argument("--swa-page-tokens", type=int, default=32,
                   help="row_space: tokens per SWA page (the slot layouts page by blocks)")
    p.add_argument("--requests", type=int, default=24, help="requests served in all (follow-ups and repeats included)")
    p.add_argument("--budget-kib", type=int, default=None,
                   help=f"KV byte budget in KiB, of 8-byte tag rows (default per layout: {BUDGET_KIB})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tier", default="none", choices=("none", "host", "mooncake"),
                   help="KV tiers beyond HBM: host = ukv_torch.tiers.HostTier in this process; mooncake = that, "
                        "then a Mooncake Store")
    p.add_argument("--tier-mult", type=int, default=8, help="the host tier's capacity, in multiples of the KV budget")
    p.add_argument("--mooncake-master", help="the store's mooncake_master RPC address (default: start one here)")
    p.add_argument("--mooncake-metadata", help="its metadata URL, with --mooncake-master "
                                               "(http://HOST:PORT/metadata for the master's own server)")
    p.add_argument("--mooncake-segment-kib", type=int, default=64 << 10,
                   help="host memory this process contributes to the store, KiB (at least 16 MiB)")
    p.add_argument("--linger", action="store_true",
                   help="after the run, keep this process (and the store memory it contributes) up until stdin "
                        "closes, so other engines can read what it saved")
    p.add_argument("--max-steps", type=int, default=3000)
    p.add_argument("--fault", default="none", choices=("none", "table", "skip-row-copies", "skip-tier-rows"),
                   help="table: damage a staged SWA entry in every step that decodes; skip-row-copies "
                        "(row_space): never apply the manager's row copies; skip-tier-rows (with --tier): never "
                        "write loaded prefixes into their rows. Each must make the check fail")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.device == "cpu":
        torch.set_num_threads(1)  # the step's tensors are small: intra-op threads cost more than they save
    if (args.mooncake_master is None) != (args.mooncake_metadata is None):
        raise SystemExit("--mooncake-master and --mooncake-metadata go together")
    engine = Engine(args)
    started = time.time()
    try:
        while not engine.done() and engine.steps < args.max_steps and not engine.failed():
            engine.step()
        ok, report = engine.outcome(time.time() - started)
        print(report, flush=True)
        if args.linger:  # what this engine saved stays readable from its store memory until then
            sys.stdin.read()
    finally:
        engine.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
