"""Takes a row-space manager's state into the pure-Python model.

Which cached unit the row space evicts to make room depends on where units
lie, which the model does not predict (ukv_torch.testing.row_space_model).
After a call in which the manager evicted one, a test carries on from the
manager's own state (follow_evictions): adopt() decodes its serialized
state (KvManager::to_state, csrc/core/manager/kv_manager_state.cpp) and sets the
model's from it, so the model predicts the next calls from where the
manager is.
"""
from ukv_torch.manager.prefix_hashing import key_from_words
from ukv_torch.plan.records import PoolSizes, ServeConfig, _read_fields
from ukv_torch.testing.kv_events_model import REMOVED, STORED
from ukv_torch.testing.kv_manager_model import _Seq
from ukv_torch.testing.slot_pools_model import OrderedIds

_HEADER = 3  # magic, kind, format version
_U64 = (1 << 64) - 1
STAT_ORDER = ["admissions", "admission_refusals", "appends", "append_refusals", "prefix_query_blocks",
              "compressed_hit_blocks", "prefix_hit_blocks", "reclaimed_slots", "reclaimed_blocks",
              "compress_evictions", "whole_chunks"]


class Reader:
    def __init__(self, values):
        self.values, self.pos = values, _HEADER
        self.prefix_hash = "xxh64"  # the manager's, once its ServeConfig is read

    def next(self):
        self.pos += 1
        return self.values[self.pos - 1]

    def take(self, n):
        self.pos += n
        return self.values[self.pos - n:self.pos]

    def vec(self):
        return self.take(self.next())

    def key(self):
        """A cache key (two words in the state) as the model holds it."""
        return key_from_words(*self.take(2), self.prefix_hash)

    def record(self, cls):
        self.pos, fields = _read_fields(cls._fields, self.values, self.pos)
        return cls(**fields)


def read_ids(r, width):
    """(ref, hash or None, tokens or None) per id of a content-addressed pool."""
    ids = []
    for _ in range(r.next()):
        ref, has_hash, h = r.next(), r.next(), r.key()
        ids.append((ref, h if has_hash else None, tuple(r.take(width)) if has_hash else None))
    return ids


def read_hash_map(r):
    by_hash = {}
    for _ in range(r.next()):
        h, i = r.key(), r.next()
        by_hash[h] = i
    return by_hash


def read_row_space(r):
    """Per kind (envelope, SWA unit): the bound owners, the cached ones coldest first, evictions."""
    r.take(4)  # rows, envelope rows, unit rows, max copies
    kinds = [(set(o for o in r.vec() if o >= 0), r.vec()) for _ in range(2)]
    r.take(5 * r.next())  # the pending copies: source, destination, rows, phase, chain link
    r.vec(), r.vec()       # each owner's copy
    counters = r.take(6)   # binds, evictions, moves of each kind
    r.next()               # moved rows
    return [(bound, cached, counters[3 * k + 1]) for k, (bound, cached) in enumerate(kinds)]


def read_sequence(r, ppb):
    sid, s = r.next(), _Seq([], 0)
    s.tokens = list(r.vec())
    (s.num_prompt, s.num_computed, s.swa_written_lo, s.swa_freed_upto, s.swa_quota, s.scheduled,
     s.extra_pages, s.ensured, s.write_lo) = r.take(9)
    s.logical = list(r.vec())
    s.swa = list(r.take(len(s.logical) * ppb))
    s.hashes = [r.key() for _ in range(r.next())]
    s.salt = r.next() & _U64
    r.take(2)  # its admission's generation and cached prefix (transfers check them; the model has no transfers)
    return sid, s


def read_events(r):
    """The pending events, as the model's event log holds them."""
    raw = [(r.take(3), r.key(), r.key(), r.take(4)) for _ in range(r.next())]
    tokens = r.vec()
    events = []
    for (kind, role, seq_no), h, parent, (has_parent, salt, begin, n) in raw:
        if kind == STORED:
            events.append((kind, seq_no, role, h, parent if has_parent else None,
                           tuple(tokens[begin:begin + n]), n, (salt & _U64) or None))
        elif kind == REMOVED:
            events.append((kind, seq_no, role, h, None, None, None, None))
        else:
            events.append((kind, seq_no, None, None, None, None, None, None))
    return events


def set_kind(kind, bound, cached, evictions, unbound_free):
    kind.bound, kind.cached, kind.evictions = bound, OrderedIds(cached), evictions
    kind.unbound_free = OrderedIds(unbound_free)


def adopt(model, state):
    """Sets the row-space model from the manager's serialized state (a list of ints)."""
    r = Reader(state)
    serve, pools = r.record(ServeConfig), r.record(PoolSizes)
    r.prefix_hash = serve.prefix_hash
    assert serve.layout == "row_space", "adopt() reads the row-space layout's state only"
    (env_bound, env_cached, env_ev), (swa_bound, swa_cached, swa_ev) = read_row_space(r)
    set_kind(model.rows.env, env_bound, env_cached, env_ev, r.vec())
    r.next()  # the copies this step's appends added (the copy list's decode share)
    blocks = read_ids(r, serve.block_size)
    model.ref = [ref for ref, _, _ in blocks]
    model.hash = [h for _, h, _ in blocks]
    model.block_tokens = [toks for _, _, toks in blocks]
    model.free = OrderedIds(r.vec())
    model.by_hash = read_hash_map(r)
    if model.swa:
        pages = read_ids(r, serve.swa_page)
        model.swa.by_hash = read_hash_map(r)
        model.swa.ref = [ref for ref, _, _ in pages]
        model.swa.hash = [h for _, h, _ in pages]
        model.swa.tokens = [toks for _, _, toks in pages]
        model.swa.lru = OrderedIds(r.vec())
        set_kind(model.rows.swa, swa_bound, swa_cached, swa_ev, r.vec())
    ppb = serve.block_size // serve.swa_page
    model.seqs = dict(read_sequence(r, ppb) for _ in range(r.next()))
    for s in model.seqs.values():
        s.phys = [list(s.logical) for _ in range(model.num_types)]
    model.rows.reserved = sum(1 for s in model.seqs.values() for b in s.logical if b not in env_bound)
    model.events.next_seq_no = r.next()
    model.events.events = read_events(r)
    model.stat = dict(zip(STAT_ORDER, r.take(len(STAT_ORDER))))
    assert r.next() == 0, "the manager has row copies made by KV tier loads, which the model does not make"
    model.whole_chunks = r.next() == 1
    model.swa_reserved = sum(s.swa_quota for s in model.seqs.values()) + model._checkpoint_reserve() + \
        model._chunk_reserve(model._extra_pages())
    assert r.pos == len(state), "the manager's state has more than adopt() reads"
    assert pools.total_rows == model.rows.total_rows


def follow_evictions(model, manager):
    """Where the row space evicted cached units to make room (its eviction
    counters passed the model's), the model takes the manager's state.
    Returns how many evictions it took over."""
    if model.rows is None:
        return 0
    stats = manager.stats()
    missed = stats["envelope_evictions"] + stats["swa_unit_evictions"] - \
        model.rows.env.evictions - model.rows.swa.evictions
    if missed:
        adopt(model, list(manager.torch_object.__getstate__()[0][0]))
    return missed
