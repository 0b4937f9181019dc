"""What a cache-aware router knows: an index of a manager's prefix cache
rebuilt only from its KV events (ukv_torch.KvEvent), and the cached prefix
it predicts for a request, computed as a router would, from the request's
tokens and salt with ukv_torch.block_hashes / swa_page_hashes. Written from
the event format in docs/serving-loop.md, not from the manager's code."""
import ukv_torch
from ukv_torch import KvEventKind, KvRole


class CacheIndex:
    """(role, hash) -> (parent_hash, token_ids, salt) of every block the events
    say is cached. `tail_pages` is the SWA pages a hit needs right before its
    end (KvManager.quota_bounds()); 0 for a manager without SWA. prefix_hash:
    the manager's ServeConfig.prefix_hash."""

    def __init__(self, block_size, swa_page, tail_pages, prefix_hash="xxh64"):
        self.bs, self.page, self.tail_pages, self.prefix_hash = block_size, swa_page, tail_pages, prefix_hash
        self.ppb = block_size // swa_page
        self.entries = {}
        self.next_seq_no = 0

    def apply(self, events):
        for e in events:
            assert e.seq_no == self.next_seq_no, f"event {e.seq_no} after {self.next_seq_no - 1}: a gap or a replay"
            self.next_seq_no += 1
            if e.kind == KvEventKind.STORED:
                assert len(e.token_ids) == e.block_size == (self.bs if e.role == KvRole.COMPRESS else self.page)
                self.entries[(e.role, e.block_hash)] = (e.parent_hash, e.token_ids, e.salt)
            elif e.kind == KvEventKind.REMOVED:
                assert (e.role, e.block_hash) in self.entries, f"removed {e} was never stored"
                del self.entries[(e.role, e.block_hash)]
            else:
                assert e.kind == KvEventKind.ALL_CLEARED
                self.entries.clear()

    def _cached(self, role, h, toks, parent, salt):
        entry = self.entries.get((role, h))
        if entry is None or entry[1] != tuple(toks):
            return False
        # A key names its prefix and salt: the stored chain must agree.
        assert entry[2] == (ukv_torch.cache_salt(salt) or None), "a block hit across salts"
        assert entry[0] == parent, "a block's parent differs from the chain that hashes to it"
        return True

    def predict(self, tokens, salt=None):
        """The cached prefix in tokens an admission of this request gets: the
        longest chain of cached compress blocks (never the request's last
        block), cut back to the highest block boundary whose trailing
        tail_pages SWA pages (all pages before it, if fewer) are cached."""
        bs, n = self.bs, len(tokens)
        candidates = min(-(-n // bs) - 1, n // bs)
        hashes = ukv_torch.block_hashes(tokens[:candidates * bs], bs, salt, self.prefix_hash)
        hit = 0
        while hit < candidates and self._cached(KvRole.COMPRESS, hashes[hit], tokens[hit * bs:(hit + 1) * bs],
                                                hashes[hit - 1] if hit else None, salt):
            hit += 1
        if not self.tail_pages:
            return hit * bs
        keys = ukv_torch.swa_page_hashes(hashes[:hit], self.ppb, self.prefix_hash)
        present = [self._cached(KvRole.SWA, keys[j], tokens[j * self.page:(j + 1) * self.page],
                                hashes[j // self.ppb], salt) for j in range(hit * self.ppb)]
        for end in range(hit, 0, -1):
            if all(present[max(0, end * self.ppb - self.tail_pages):end * self.ppb]):
                return end * bs
        return 0


def index_for(manager):
    """An empty index with the manager's geometry."""
    config = manager.config
    tail = manager.quota_bounds()["tail_pages"] if config.window > 0 else 0
    return CacheIndex(config.block_size, config.swa_page, tail, config.prefix_hash)
