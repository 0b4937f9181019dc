"""A plain pure-Python model of the KV manager (torch.classes.ukv.KvManager).

Needs xxhash (`pip install xxhash`) for xxh64 block hashes; it is imported
where a hash is computed, so importing the module does not need it.

Written from upstream's BlockManager and SlidingWindowPool semantics, ukv's
fixes to them and the rules the C++ header documents, without looking at how
the C++ computes them:

- Logical blocks: ref counts, a FIFO free list (the longest-freed block is
  reused first), chained block hashes (prefix_keys_model: xxh64, or sha256 /
  blake2b keys as 16 bytes) with a token-equality check, lazy
  eviction (a freed block keeps its hash until it is reused), KV events
  (kv_events_model) for every change of the compress and SWA caches.
- A request's salt (an int, or bytes standing for their BLAKE2b-64 value)
  seeds block 0's hash, so only requests with the same salt share blocks.
- Layouts: the static split (logical == physical compress ids, a private SWA
  pool), the unified slot layouts (compress_bindings_model, slot_pools_model)
  and the row space (row_space_model: envelopes and SWA units counted in
  rows; admission reserves a block's envelope and the chunk that writes the
  block binds it; where units lie is not modelled).
- SWA pages (swa_pages_model) of swa_page_tokens positions (a block in the
  slot layouts, smaller in the row space): content-addressed, -1
  placeholders, the trailing-window hit gate, the chunk's last window always
  and its whole span where the pools have room beyond every promise,
  freeing with the computed length, sparse checkpoints pinned in an LRU.
  Whole chunks (set_whole_chunks, for a KV tier): every chunk's span from a
  reserve kept apart for a step's chunks, beyond it only where there is room.
  Only fully written pages are published, and blocks only up to a boundary
  whose SWA tail was written (a later request can hit exactly those).
- Admission is a promise: each live sequence holds an SWA quota (in pages),
  the reserved total never exceeds what SWA can still get, and compress
  demand is checked jointly with it. A refusal says NOT_NOW (live sequences
  hold what it needs, or max_num_seqs are live) or NEVER_FITS (it would not
  fit with no sequence live).

The model is deliberately slow and obvious: dicts as ordered sets, lists as
tables. It raises AssertionError on calls a correct engine never makes; the
tests compare it with the C++ on valid calls only.
"""
from __future__ import annotations

import hashlib
from typing import Dict, List, Optional, Sequence

from .allocator_model import ceil_div
from .compress_bindings_model import CompressBindings
from .row_space_model import RowSpaceCounts, RowSpaceSwaSource
from .slot_pools_model import OrderedIds, SharedSwaSpace, SlotPool
from .kv_events_model import ALL_CLEARED, COMPRESS, REMOVED, STORED, EventLog
from .prefix_keys_model import Key, block_hash, page_hash
from .swa_pages_model import SwaPool

NOT_NOW, NEVER_FITS = -1, -2
# Stats of the row space that depend on where units lie (moves), not modelled.
PLACEMENT_STATS = ("envelope_moves", "swa_unit_moves", "moved_rows")

__all__ = ["KvManagerModel", "block_hash", "salt_value", "STORED", "REMOVED", "ALL_CLEARED", "NOT_NOW",
           "NEVER_FITS", "PLACEMENT_STATS"]


def salt_value(salt) -> int:
    """None: 0 (no salt); an int: itself; bytes: their 8-byte BLAKE2b digest, little-endian."""
    if salt is None:
        return 0
    if isinstance(salt, (bytes, bytearray)):
        return int.from_bytes(hashlib.blake2b(bytes(salt), digest_size=8).digest(), "little")
    return salt


def span(w: int, unit: int) -> int:
    """Most units of `unit` positions that any w consecutive positions touch."""
    return 0 if w <= 0 else ceil_div(w - 1, unit) + 1


def per_sequence(counts, n):
    """One count per sequence: an int is every sequence's."""
    return [counts] * n if isinstance(counts, int) else list(counts)


class _Seq:
    def __init__(self, tokens, num_types):
        self.tokens = list(tokens)
        self.num_prompt = len(tokens)
        self.num_computed = 0
        self.logical: List[int] = []
        self.swa: List[int] = []  # one entry per page
        self.phys: List[List[int]] = [[] for _ in range(num_types)]
        self.hashes: List[int] = []
        self.salt = 0
        self.swa_written_lo = 0   # SWA rows of positions [lo, num_computed) are written
        self.swa_freed_upto = 0   # pages below are window-freed
        self.swa_quota = 0
        self.extra_pages = 0      # pages below the chunk's window held until its commit
        self.ensured = 0          # tokens the last ensure_for_tokens provisioned
        self.write_lo = 0         # the ensured chunk's SWA is written from here
        self.scheduled = 0        # positions the last append scheduled, not yet committed


_LEGACY_LAYOUT = {(False, False): "static", (True, False): "upstream", (True, True): "elastic"}


class KvManagerModel(CompressBindings):
    def __init__(self, *, num_logical_blocks=0, num_swa_blocks=0, block_size=128, window=128, mtp_k=0,
                 max_num_batched_tokens=8192, enable_prefix_caching=True, unified=True, layout=None,
                 compress_ratios=(4, 128), compress_ks=None, type_slots=None, borrow_unreleased_swa=False,
                 full_retain=False, retention_interval=0, checkpoint_frac=0.5, max_num_seqs=256,
                 max_blocks_per_seq=1024, swa_page_tokens=0, total_rows=0, envelope_rows=0, swa_unit_rows=0,
                 swa_sizing=None, swa_budget_frac=None, prefix_hash="xxh64"):
        bs = block_size
        self.layout = layout or _LEGACY_LAYOUT[(bool(unified), bool(borrow_unreleased_swa))]
        self.unified = self.layout in ("upstream", "elastic")  # the unified slot layouts
        row_space = self.layout == "row_space"
        if row_space:  # the row space holds this many of each kind
            num_logical_blocks = num_logical_blocks or total_rows // envelope_rows
            num_swa_blocks = num_swa_blocks or (total_rows // swa_unit_rows if window > 0 else 0)
        self.bs, self.window, self.mtp_k = bs, window, mtp_k
        self.page = swa_page_tokens or bs
        self.ppb = bs // self.page
        self.prefix_caching, self.full_retain = enable_prefix_caching, full_retain
        self.prefix_hash = prefix_hash
        self.num_logical, self.num_swa = num_logical_blocks, num_swa_blocks
        # Compress types by ratio (k = block_size / ratio rows per block), or by k as
        # the manager's keyword form still accepts.
        self.ks = list(compress_ks) if compress_ks is not None else [bs // r for r in compress_ratios]
        self.max_blocks_per_seq, self.max_num_seqs = max_blocks_per_seq, max_num_seqs
        self.num_types = len(self.ks)
        self._swa_geometry(max_num_batched_tokens)
        self.retention_blocks = retention_interval // bs
        sparse = full_retain and self.retention_blocks > 0
        capacity = int(num_swa_blocks * checkpoint_frac) if sparse else 0
        NB = num_logical_blocks
        self.ref = [0] * NB
        self.hash: List[Optional[Key]] = [None] * NB
        self.block_tokens: List[Optional[tuple]] = [None] * NB
        self.binding = [[-1] * NB for _ in range(self.num_types)] if self.unified else []
        self.free = OrderedIds(range(NB))
        self.by_hash: Dict[Key, int] = {}
        self.events = EventLog()
        self.swa = SwaPool(num_swa_blocks, capacity, self.events) if window > 0 else None
        self.space = self.rows = None
        self.type_slots = type_slots
        self.borrow_unreleased = self.layout == "elastic"
        if row_space:
            self.rows = RowSpaceCounts(total_rows, envelope_rows, swa_unit_rows, NB, num_swa_blocks)
            if self.swa:
                self.swa.source = RowSpaceSwaSource(self.rows, lambda page: self.swa.hash[page] is not None)
        elif self.unified:
            if type_slots is None:
                self.type_slots = [num_swa_blocks + ceil_div(NB, bs // k) for k in self.ks]
            self.pools, self.space = self._slot_pools()
            self.space.on_evict = self._on_swa_evicted
            self.owner_of = [dict() for _ in self.ks]    # [type] phys -> logical
            self.live_in_slot = [0] * num_swa_blocks     # live bindings per shared slot
            self.reclaimable = OrderedIds()              # busy shared slots with cached bindings only
            if self.swa:
                self.swa.source = self.space
        elif self.swa:
            self.swa.source = SlotPool(num_swa_blocks, 0, bs, 0)
        self.seqs: Dict[int, _Seq] = {}
        self.whole_chunks = False
        self.swa_reserved = capacity
        self.stat = dict.fromkeys(
            ["admissions", "admission_refusals", "appends", "append_refusals", "prefix_query_blocks",
             "compressed_hit_blocks", "prefix_hit_blocks", "reclaimed_slots", "reclaimed_blocks",
             "compress_evictions", "whole_chunks"], 0)

    def _swa_geometry(self, max_num_batched_tokens):
        """The trailing window a hit needs (tail_pages) and the quota bounds, in pages:
        prefilling, the previous chunk's window (or the hit's tail) plus what this
        chunk writes; decoding, the window of the first query plus two steps of
        speculative positions."""
        window, page = self.window, self.page
        self.tail_pages = self.prefill_peak = self.decode_peak = self.whole_chunk_pages = 0
        if window <= 0:
            return
        self.tail_pages = max(1, ceil_div(window + self.mtp_k - 1, page))
        chunk = span(max_num_batched_tokens if self.full_retain else window, page)
        self.prefill_peak = max(self.tail_pages, span(window, page)) + chunk
        self.decode_peak = span(window + 2 * (1 + self.mtp_k) - 1, page)
        # Whole chunks' reserve: a chunk of c tokens from position p writes
        # (p % page + c - window) // page pages below its last window, so a
        # step's chunks (max_num_batched_tokens tokens, at most max_num_seqs
        # of them) need at most this many.
        if not self.full_retain:
            self.whole_chunk_pages = (max_num_batched_tokens +
                                      self.max_num_seqs * max(0, page - 1 - window)) // page

    def _slot_pools(self, borrow_unreleased=None):
        """The unified layout's per-type pools and the shared SWA space over them, all free."""
        pools = [SlotPool(n, k, self.bs, self.num_swa) for n, k in zip(self.type_slots, self.ks)]
        borrow = self.borrow_unreleased if borrow_unreleased is None else borrow_unreleased
        return pools, SharedSwaSpace(self.num_swa, pools, lambda slot: None, borrow)

    # ------------------------------------------------------------ helpers --
    def _blocks_for(self, tokens):
        return ceil_div(tokens, self.bs)

    def _page_of(self, pos):
        return pos // self.page

    def _quota_for(self, nb, decoding):
        """SWA pages a sequence of nb blocks may hold at once."""
        return min(self.decode_peak if decoding else self.prefill_peak, nb * self.ppb) if self.swa else 0

    def _checkpoint_reserve(self):
        return self.swa.checkpoint_capacity if self.swa else 0

    def _chunk_reserve(self, extra):
        """What is reserved for pages below chunks' windows when they hold `extra`."""
        return max(self.whole_chunk_pages if self.whole_chunks else 0, extra)

    def _extra_pages(self):
        return sum(s.extra_pages for s in self.seqs.values())

    def _set_extra_pages(self, s, pages):
        before = self._chunk_reserve(self._extra_pages())
        s.extra_pages = pages
        self.swa_reserved += self._chunk_reserve(self._extra_pages()) - before

    def set_whole_chunks(self, on):
        extra = self._extra_pages()
        more = max(self.whole_chunk_pages if on else 0, extra) - self._chunk_reserve(extra)
        if more > 0 and not self._capacity_ok(more, 0):
            raise RuntimeError("set_whole_chunks: no room for the reserve")
        self.whole_chunks = on
        self.swa_reserved += more

    def _on_swa_evicted(self, slot):
        self.swa.evict(slot)

    def _forget_logical(self, b):
        h = self.hash[b]
        if h is not None and self.by_hash.get(h) == b:
            del self.by_hash[h]
            self.events.removed(COMPRESS, h)
        self.hash[b] = None

    def _take_block(self, b):
        """A true allocation of free block b: its stale hash dropped. It is live at
        once (with any binding it retains), so no reclaim can take that."""
        self.free.remove(b)
        self._forget_logical(b)
        self.ref[b] = 1
        self._live_change(b, +1)
        return b

    def _block_claimed(self, b):
        """A free (cached) block went live again through a prefix hit."""
        if self.rows:
            self.rows.env.set_cached(b, False)
        else:
            self._live_change(b, +1)

    def _block_freed(self, b):
        """Block b's last reference went: its envelope stays cached while it keeps content."""
        if self.rows:
            self.rows.release_block(b, self.hash[b] is not None)
        else:
            self._live_change(b, -1)

    def _fresh_blocks(self, count, skip, fits):
        """(blocks, demand, evicted) of a true allocation of `count` free blocks, or None."""
        if not self.rows:
            return self._slot_fresh_blocks(count, skip, fits)
        blocks, evicted = self.rows.fresh_blocks(count, skip)
        return (blocks, len(blocks), evicted) if fits(blocks, len(blocks)) else None

    def _bind_popped(self, blocks):
        """A true allocation's blocks get their compress rows: bindings (unified),
        or the row space's envelopes, which a decode step writes at once."""
        if self.unified:
            self._bind_compress(blocks)
        elif self.rows:
            self.rows.take_blocks(blocks)
            for b in blocks:
                self.rows.bind_reserved(b)

    def _capacity_ok(self, extra_quota, demand, extra_slots=()):
        """Can the live sequences' promises, extra_quota more SWA pages and `demand`
        more compress blocks (row space: live envelopes) all be kept?"""
        if self.rows:
            units = max(self.swa_reserved + extra_quota, self.rows.swa.live())
            return self.rows.fits(self.rows.promised_envelopes() + demand, units)
        outstanding = max(0, self.swa_reserved + extra_quota - (self.swa.held_slots() if self.swa else 0))
        if self.unified:
            return self.space.can_serve(outstanding if self.swa else 0, demand, list(extra_slots))
        return self.swa is None or self.swa.free_slots() >= outstanding

    def _capacity_ok_with_reclaim(self, extra_quota, demand, going_live):
        if self._capacity_ok(extra_quota, demand):
            return True
        if not self.unified:
            return False
        usable = self._reclaimable_after(going_live)
        return bool(usable) and self._capacity_ok(extra_quota, demand, usable)

    def _reclaim_until(self, extra_quota, demand):
        while not self._capacity_ok(extra_quota, demand):
            assert self.unified and len(self.reclaimable), "reclaim ran out of reclaimable slots (a broken promise)"
            self._reclaim_one()

    def _lookup(self, h, toks):
        b = self.by_hash.get(h)
        return b if b is not None and self.block_tokens[b] == tuple(toks) else -1

    def _lookup_page(self, tokens, j, hashes):
        """The cached SWA page j of a prefix whose block hashes are `hashes`, -1 if absent."""
        h = page_hash(hashes[j // self.ppb], j, self.ppb, self.prefix_hash)
        return self.swa.lookup(h, tokens[j * self.page:(j + 1) * self.page])

    # ---------------------------------------------------------- admission --
    def _bounded_hit(self, tokens, hit, hashes):
        """The highest block boundary L <= hit whose trailing tail_pages SWA pages
        (all pages before it, when there are fewer) are cached."""
        if not self.swa:
            return hit
        for end in range(hit, 0, -1):
            last = end * self.ppb
            tail = range(max(0, last - self.tail_pages), last)
            if all(self._lookup_page(tokens, j, hashes) >= 0 for j in tail):
                return end
        return 0

    def _admission(self, tokens, salt):
        bs, n = self.bs, len(tokens)
        nb = self._blocks_for(n)
        assert 0 < n and nb <= self.max_blocks_per_seq
        adm = dict(ok=False, nb=nb)
        if len(self.seqs) >= self.max_num_seqs:  # a batch of the live sequences must fit the staged tables
            return adm
        hashes, hit_ids = [], []
        if self.prefix_caching:
            for i in range(min(nb - 1, n // bs)):  # the last block is never a hit
                toks = tokens[i * bs:(i + 1) * bs]
                h = block_hash(toks, hashes[-1] if hashes else None, salt, self.prefix_hash)
                b = self._lookup(h, toks)
                if b < 0:
                    break
                hashes.append(h)
                hit_ids.append(b)
        compressed_hit = len(hit_ids)
        cached = self._bounded_hit(tokens, compressed_hit, hashes)
        hashes, hit_ids = hashes[:cached], hit_ids[:cached]
        adm.update(compressed_hit=compressed_hit, cached=cached, hashes=hashes, hit_ids=hit_ids,
                   quota=self._quota_for(nb, False))
        used_hits = sum(1 for b in hit_ids if self.ref[b] > 0)
        if len(self.free) < nb - used_hits:
            return adm
        free_hits = [b for b in hit_ids if self.ref[b] == 0]
        # Row space: a free hit's cached envelope goes live as well.
        live_hits = len(free_hits) if self.rows else 0
        fresh = self._fresh_blocks(nb - cached, set(hit_ids), lambda blocks, demand: self._capacity_ok_with_reclaim(
            adm["quota"], demand + live_hits, free_hits + blocks))
        if fresh is not None:
            adm.update(ok=True, fresh=fresh[0], demand=fresh[1], evicted=fresh[2])
        return adm

    def _fits_empty_pools(self, blocks, pages):
        """Would `blocks` logical blocks and `pages` SWA pages fit with nothing live or
        cached, and every SWA slot released (the most the slot pools can ever offer)?"""
        if blocks > self.num_logical:
            return False
        if self.rows:
            return self.rows.fits(blocks, pages)
        if not self.unified:
            return self.swa is None or pages <= self.num_swa
        return self._slot_pools(borrow_unreleased=True)[1].can_serve(pages, blocks, [])

    def _refusal(self, nb):
        pages = self._quota_for(nb, False) + self._checkpoint_reserve() + self._chunk_reserve(0)
        return NOT_NOW if self._fits_empty_pools(nb, pages) else NEVER_FITS

    def can_allocate(self, tokens, salt=None) -> int:
        a = self._admission(list(tokens), salt_value(salt))
        return a["cached"] * self.bs if a["ok"] else self._refusal(a["nb"])

    def _push(self, s, b):
        s.logical.append(b)
        s.swa.extend([-1] * self.ppb)
        for t in range(self.num_types):
            s.phys[t].append(self.binding[t][b] if self.unified else b)

    def allocate(self, seq_id, tokens, salt=None) -> int:
        tokens = list(tokens)
        assert seq_id >= 0 and seq_id not in self.seqs
        a = self._admission(tokens, salt_value(salt))
        if not a["ok"]:
            self.stat["admission_refusals"] += 1
            return self._refusal(a["nb"])
        s = _Seq(tokens, self.num_types)
        hits = a["cached"]
        for b in a["hit_ids"]:
            self.ref[b] += 1
            if self.ref[b] == 1:
                self.free.remove(b)
                self._block_claimed(b)
            self._push(s, b)
        first_hit_page = max(0, hits * self.ppb - self.tail_pages)
        for j in range(first_hit_page, hits * self.ppb if self.swa else 0):  # the hit's trailing window
            s.swa[j] = self._lookup_page(tokens, j, a["hashes"])
            self.swa.claim(s.swa[j])
        popped = [self._take_block(b) for b in a["fresh"]]
        self.stat["compress_evictions"] += a["evicted"]
        self._reclaim_until(a["quota"], a["demand"])
        if self.rows:  # the chunks that write the blocks bind their envelopes
            self.rows.take_blocks(popped)
        else:
            self._bind_popped(popped)
        for b in popped:
            self._push(s, b)
        s.hashes = list(a["hashes"])
        s.salt = salt_value(salt)
        s.num_computed = hits * self.bs
        s.swa_written_lo = first_hit_page * self.page
        s.swa_freed_upto = first_hit_page
        s.swa_quota = a["quota"]
        self.swa_reserved += a["quota"]
        self.seqs[seq_id] = s
        self.stat["admissions"] += 1
        self.stat["prefix_query_blocks"] += a["nb"]
        self.stat["compressed_hit_blocks"] += a["compressed_hit"]
        self.stat["prefix_hit_blocks"] += hits
        return hits * self.bs

    # ------------------------------------------------------------ prefill --
    def _chunk_pages(self, s, count):
        """Pages [first, last] a chunk of `count` tokens writes: all of it (full
        retain) or its last window."""
        end = s.num_computed + count
        free_before = 0 if self.full_retain else max(0, end - self.window) // self.page
        return max(self._page_of(s.num_computed), free_before), self._page_of(end - 1)

    def _alloc_missing(self, s, pages):
        missing = [j for j in pages if s.swa[j] < 0]
        for j in missing:
            s.swa[j] = self.swa.alloc()
        return len(missing)

    def _ensure_window(self, s, count):
        s.ensured, s.write_lo = count, s.num_computed
        if self.rows:  # the envelopes of the blocks the chunk writes, before its pages
            for i in range(s.num_computed // self.bs, self._blocks_for(s.num_computed + count)):
                self.rows.bind_reserved(s.logical[i])
        if count == 0 or not self.swa:
            return
        first, last = self._chunk_pages(s, count)
        self._alloc_missing(s, range(first, last + 1))
        s.write_lo = max(s.num_computed, first * self.page)

    def _ensure_whole_chunk(self, s):
        """The pages below the chunk's window: from the whole-chunk reserve while it
        lasts, beyond it when the pools have them beyond every promise (the row
        space: from rows no unit holds); they count as reserved until the commit."""
        if s.write_lo == s.num_computed:
            return False
        below = range(self._page_of(s.num_computed), self._page_of(s.write_lo))
        missing = sum(1 for j in below if s.swa[j] < 0)
        extra = self._extra_pages()
        more = self._chunk_reserve(extra + missing) - self._chunk_reserve(extra)
        if more > 0 and not self._capacity_ok(more, 0):
            return False
        if more > 0 and self.rows and self.rows.unheld_rows() < missing * self.rows.swa.rows:
            return False
        self._alloc_missing(s, below)
        self._set_extra_pages(s, s.extra_pages + missing)
        s.write_lo = s.num_computed
        return True

    def ensure_for_tokens(self, seq_ids, counts):
        for sid, n in zip(seq_ids, counts):
            s = self.seqs[sid]
            assert len(s.tokens) == s.num_prompt and 0 <= n <= len(s.tokens) - s.num_computed
        for sid, n in zip(seq_ids, counts):
            self._ensure_window(self.seqs[sid], n)
        for sid in seq_ids:
            if self._ensure_whole_chunk(self.seqs[sid]):
                self.stat["whole_chunks"] += 1

    def _is_checkpoint(self, s, i):
        rb, need = self.retention_blocks, ceil_div(self.tail_pages, self.ppb)
        prompt_blocks = s.num_prompt // self.bs  # decode blocks: the segment rule only
        return i % rb >= rb - need or prompt_blocks - need <= i < prompt_blocks

    def _hittable_blocks(self, s):
        """Blocks a later request can hit: up to the last full block if the SWA
        tail before that boundary was written, else no more than published."""
        full = s.num_computed // self.bs
        if not self.swa:
            return full
        tail_from = max(0, full * self.bs - self.tail_pages * self.page)
        return full if tail_from >= s.swa_written_lo else len(s.hashes)

    def _publish_full_blocks(self, s):
        if not self.prefix_caching:
            return
        bs = self.bs
        for i in range(len(s.hashes), self._hittable_blocks(s)):
            toks = s.tokens[i * bs:(i + 1) * bs]
            parent = s.hashes[-1] if s.hashes else None
            h = block_hash(toks, parent, s.salt, self.prefix_hash)
            b = s.logical[i]
            self.hash[b], self.block_tokens[b] = h, tuple(toks)
            self.by_hash[h] = b
            self.events.stored(COMPRESS, h, parent, toks, s.salt)
            s.hashes.append(h)
            for j in range(i * self.ppb, (i + 1) * self.ppb if self.swa else 0):
                page = s.swa[j]
                if page < 0 or j * self.page < s.swa_written_lo:  # only fully written pages may serve a hit
                    continue
                self.swa.publish(page, page_hash(h, j, self.ppb, self.prefix_hash), s.tokens[j * self.page:(j + 1) * self.page], h,
                                 s.salt)
                if self.swa.checkpoint_capacity > 0 and self._is_checkpoint(s, i):
                    self.swa.pin(page)

    def _free_out_of_window(self, s, seq_len):
        if not self.swa:
            return
        free_before = min(max(0, seq_len - self.window) // self.page, len(s.swa))
        for j in range(s.swa_freed_upto, free_before):
            if s.swa[j] >= 0:
                self.swa.release(s.swa[j])
                s.swa[j] = -1
        s.swa_freed_upto = max(s.swa_freed_upto, free_before)

    def commit_prefill(self, seq_ids, counts, sampled=None):
        sampled = [-1] * len(seq_ids) if sampled is None else sampled
        for sid, n in zip(seq_ids, counts):
            assert n == 0 or n == self.seqs[sid].ensured, "commit what ensure_for_tokens provisioned"
        for sid, n, tok in zip(seq_ids, counts, sampled):
            self._commit_chunk(self.seqs[sid], n, tok)

    def _commit_chunk(self, s, n, tok):
        start, end = s.num_computed, s.num_computed + n
        assert end <= len(s.tokens)
        if self.swa and n > 0 and s.write_lo > start:  # the chunk wrote SWA rows from write_lo on
            s.swa_written_lo = s.write_lo
        s.num_computed = end
        self._publish_full_blocks(s)
        self._free_out_of_window(s, end)  # the computed length: later chunks still need the rest
        if n > 0:  # the pages below the window were the chunk's only
            self._set_extra_pages(s, 0)
            s.ensured = 0
        if tok >= 0:
            s.tokens.append(tok)
            if self.swa:  # decoding from here on: the quota shrinks to the decode bound
                quota = self._quota_for(len(s.logical), True)
                self.swa_reserved += quota - s.swa_quota
                s.swa_quota = quota

    # ------------------------------------------------------------- decode --
    def _append_plan(self, seq_ids, counts):
        """Per sequence (need, new blocks); whether each prefix fits; and for the
        whole batch the fresh blocks (batch order), their demand and evictions
        and the extra SWA quota."""
        plan, fits = [], []
        new_blocks = extra_quota = 0
        fresh = ([], 0, 0)
        for sid, q in zip(seq_ids, counts):
            s = self.seqs[sid]
            assert len(s.tokens) > s.num_prompt and 1 <= q <= 1 + self.mtp_k
            need = self._blocks_for(s.num_computed + q)
            add = max(0, need - len(s.logical))
            dq = self._quota_for(need, True) - s.swa_quota if self.swa else 0
            plan.append((need, add))
            if add == 0 and dq <= 0:
                fits.append(True)
                continue
            new_blocks += add
            extra_quota += max(0, dq)
            quota = extra_quota
            chosen = None
            if new_blocks <= len(self.free):
                chosen = self._fresh_blocks(new_blocks, set(), lambda blocks, demand:
                                            self._capacity_ok_with_reclaim(quota, demand, blocks))
            fits.append(chosen is not None)
            if chosen is not None:
                fresh = chosen
        return plan, fits, extra_quota, fresh

    def can_append(self, seq_ids, num_new_tokens=1) -> int:
        _, fits, _, _ = self._append_plan(seq_ids, per_sequence(num_new_tokens, len(seq_ids)))
        return fits.index(False) if False in fits else len(seq_ids)

    def append(self, seq_ids, num_new_tokens=1):
        counts = per_sequence(num_new_tokens, len(seq_ids))
        plan, fits, extra_quota, (blocks, demand, evicted) = self._append_plan(seq_ids, counts)
        if False in fits:
            self.stat["append_refusals"] += 1
            raise RuntimeError("No free KV slots available")
        popped = iter([self._take_block(b) for b in blocks])
        self.stat["compress_evictions"] += evicted
        self._reclaim_until(extra_quota, demand)
        self._bind_popped(list(blocks))
        for sid, q, (need, add) in zip(seq_ids, counts, plan):
            s = self.seqs[sid]
            if self.swa:
                quota = max(s.swa_quota, self._quota_for(need, True))
                self.swa_reserved += quota - s.swa_quota
                s.swa_quota = quota
            for _ in range(add):
                self._push(s, next(popped))
            if self.swa:  # the pages of this step's positions
                self._alloc_missing(s, range(self._page_of(s.num_computed), self._page_of(s.num_computed + q - 1) + 1))
            self._free_out_of_window(s, s.num_computed + 1)
            s.scheduled = q
        self.stat["appends"] += 1

    def commit_decode(self, seq_ids, counts, tokens):
        pos = 0
        for sid, n in zip(seq_ids, counts):
            s = self.seqs[sid]
            assert s.num_computed + 1 == len(s.tokens) and 1 <= n <= s.scheduled
            s.num_computed += n
            s.scheduled = 0
            s.tokens.extend(tokens[pos:pos + n])
            pos += n
            self._publish_full_blocks(s)  # decode blocks are cacheable once full and committed

    def deallocate(self, seq_ids):
        for sid in seq_ids:
            s = self.seqs[sid]
            self.swa_reserved -= s.swa_quota
            self._set_extra_pages(s, 0)
            del self.seqs[sid]
            for b in reversed(s.logical):
                self.ref[b] -= 1
                if self.ref[b] == 0:
                    self.free.push_back(b)
                    self._block_freed(b)
            if self.swa:
                for w in reversed(s.swa):
                    if w >= 0:
                        self.swa.release(w)

    def clear_cache(self):
        self.by_hash.clear()
        for b, r in enumerate(self.ref):
            if r == 0:
                self.hash[b] = None
        if self.swa:
            self.swa.clear_cache()
        while self.rows and len(self.rows.env.cached):  # cached envelopes keep nothing a hit could use
            self.rows.env.evict(self.rows.env.cached.front())
        self.events.all_cleared()

    # ---------------------------------------------------------- inspection --
    def logical_table(self, sid):
        return list(self.seqs[sid].logical)

    def swa_table(self, sid):
        return list(self.seqs[sid].swa)

    def phys_table(self, sid, t):
        assert not self.rows, "the row space's envelopes are placed by the manager, not modelled"
        return list(self.seqs[sid].phys[t])

    def num_computed(self, sid):
        return self.seqs[sid].num_computed

    def num_tokens(self, sid):
        return len(self.seqs[sid].tokens)

    def take_events(self):
        return self.events.take()

    def stats(self) -> Dict[str, int]:
        """The manager's stats but for PLACEMENT_STATS (the row space's moves)."""
        d = dict(num_sequences=len(self.seqs), free_logical_blocks=len(self.free),
                 free_swa_slots=self.swa.free_slots() if self.swa else 0,
                 held_swa_slots=self.swa.held_slots() if self.swa else 0,
                 swa_reserved=self.swa_reserved,
                 reclaimable_slots=len(self.reclaimable) if self.unified else 0)
        d.update(self.stat)
        if self.rows:
            env, swa = self.rows.env, self.rows.swa
            d.update(live_envelopes=env.live(), cached_envelopes=len(env.cached), live_swa_units=swa.live(),
                     cached_swa_units=len(swa.cached), unheld_rows=self.rows.unheld_rows(),
                     envelope_evictions=env.evictions, swa_unit_evictions=swa.evictions)
        if self.unified:
            d["swa_evictions"] = self.space.evictions
            d["unreleased_borrows"] = self.space.unreleased_borrows
            for t, p in enumerate(self.pools):  # named by compress ratio, as the manager's stats
                d[f"ratio{self.bs // p.k}_free_blocks"] = self.space.free_blocks(t)
                d[f"ratio{self.bs // p.k}_borrows"] = p.borrows
        return d

    def stage_rows(self, seq_ids, rows):
        """Pure-Python staging of the slot layouts: rows[r] = [logical, swa (-1 kept),
        phys...] lists of max_blocks_per_seq entries each, rewritten in full."""
        width = self.max_blocks_per_seq
        for r, sid in enumerate(seq_ids):
            s = self.seqs[sid]
            pad = [0] * (width - len(s.logical))
            logical, swa, *phys = rows[r]
            logical[:] = s.logical + pad
            swa[:] = list(s.swa) + pad
            for table, blocks in zip(phys, s.phys):
                table[:] = blocks + pad
