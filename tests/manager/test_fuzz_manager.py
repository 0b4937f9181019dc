"""Property-based fuzzing of every KvManager method, and its exception safety.

Each case starts from a serving run of the model-based test (Serving of
support/serving.py: the C++ manager and the pure-Python model driven in lock
step, some sequences prefilling, some decoding, tables staged), then
makes random calls of any method, on the torch class or through the Python
wrapper, with arguments of every kind: live, unknown, repeated and extreme
sequence ids; counts around each sequence's remaining tokens; token ids out of
range; admissions under cache salts (none, ints to 2^64 - 1, bytes); per-sequence speculative widths outside [1, 1 + mtp_k], or one count
too few or too many; batch tensors of any dtype, rank, device, stride or
length.

  * A refused call raises ValueError / TypeError / RuntimeError whose message
    names what was wrong, and leaves the manager exactly as before: its
    serialized state, its stats and its staged tables. A batch that cannot be
    served as a whole (an append past can_append, a prefill batch with one bad
    entry) changes nothing: multi-block operations are all-or-nothing.
  * An accepted call gives the model's result, stats and KV events, and
    check_invariants() passes afterwards.
"""
import random
import re
from collections import Counter

import pytest
import torch
from hypothesis import given, strategies as st

from support.fuzz_support import ACCEPTED_ID_LAYOUTS, ACCEPTED_TOKEN_LAYOUTS, ID_LAYOUTS, fuzz_settings, in_layout
from support.serving import CONFIGS, Serving, config
from ukv_torch import KvManager, staged_tables_shape
from ukv_torch.manager.prefix_hashing import salt_arg

UNKNOWN_IDS = [-1, 10**6, 2**63 - 1, -(2**63)]
# Valid salts: the torch class takes each as int64 (salt_arg); bad ones are
# test_kv_manager's (test_a_bad_salt_is_refused_naming_it).
SALTS = [None, 0, 7, 2**63, 2**64 - 1, b"tenant-b"]


def serving(config, seed, steps):
    """Both managers after `steps` engine steps, mid-run (nothing released)."""
    run = Serving(CONFIGS[config], seed)
    for _ in range(steps):
        run.step()
    return run


def snapshot(m):
    """All a failing call must leave unchanged."""
    o = m.torch_object
    return o.__getstate__(), dict(o.stats()), o.host_tables().clone()


def same_snapshot(a, b):
    return a[0] == b[0] and a[1] == b[1] and torch.equal(a[2], b[2])


# ----------------------------------------------------------------- arguments --
class Draw:
    """Argument strategies bound to one run (its live sequences and limits)."""

    def __init__(self, data, run):
        self.data, self.run = data, run
        self.live = sorted(run.model.seqs)

    def pick(self, strategy, label):
        return self.data.draw(strategy, label=label)

    def often(self, label):
        """True 4 times in 5: most arguments are valid, so calls get past the first check."""
        return self.pick(st.integers(0, 4), label) > 0

    def seq_id(self):
        if self.live and self.often("live id"):
            return self.pick(st.sampled_from(self.live), "seq_id")
        return self.pick(st.one_of(st.sampled_from(UNKNOWN_IDS), st.integers(0, 40)), "seq_id")

    def seq_ids(self, phase=None):
        """Mostly distinct live sequences (of the phase the method serves, when it
        has one); sometimes one repeated, unknown or extreme id."""
        model = self.run.model
        def in_phase(s):
            if phase == "scheduled":
                return s.scheduled > 0
            return (len(s.tokens) > s.num_prompt) == (phase == "decode")
        pool = [sid for sid in self.live if phase is None or self.often("in phase") and in_phase(model.seqs[sid])]
        ids = self.pick(st.lists(st.sampled_from(pool), unique=True, max_size=4), "seq_ids") if pool else []
        if not self.often("clean batch"):  # one id that spoils the batch: a repeat, or an unknown id
            bad = self.pick(st.sampled_from(ids), "repeat") if ids and self.often("repeat") else \
                self.pick(st.sampled_from(UNKNOWN_IDS), "unknown id")
            ids.insert(self.pick(st.integers(0, len(ids)), "at"), bad)
        return ids

    def fresh_id(self):
        """Mostly the lowest id not live (an extreme live id leaves room below it)."""
        if self.often("fresh id"):
            return min(set(range(len(self.live) + 1)) - set(self.live))
        return self.seq_id()

    def left(self, sid):
        s = self.run.model.seqs.get(sid)
        return len(s.tokens) - s.num_computed if s else 0

    def counts(self, ids, decode):
        """Per sequence: a chunk of its remaining tokens (decode: of the positions
        append scheduled), or a boundary / bad count."""
        def count(sid):
            s = self.run.model.seqs.get(sid)
            low, high = (1, s.scheduled if s else 0) if decode else (0, self.left(sid))
            if high >= low and self.often("chunk"):
                return self.pick(st.integers(low, high), "count")
            return self.pick(st.sampled_from([-1, 0, high + 1, self.run.bs, 2**62, 2**63 - 1]), "bad count")
        return [count(sid) for sid in ids]

    def sampled(self, ids, counts):
        """The token sampled after a chunk that completes its prompt, else -1; sometimes a bad one."""
        def one(sid, count):
            if self.often("sampled"):
                return 7 if count == self.left(sid) else -1
            return self.pick(st.sampled_from([-2, 7, 2**31]), "bad sampled")
        return [one(sid, count) for sid, count in zip(ids, counts)]

    def tokens(self, n=None):
        n = self.pick(st.sampled_from([0, 1, 5, self.run.bs, 3 * self.run.bs + 7]), "length") if n is None else n
        rng = random.Random(self.pick(st.integers(0, 2**16), "token seed"))
        values = [rng.randrange(1, 1 << 20) for _ in range(n)]
        if values and not self.often("good tokens"):
            values[rng.randrange(n)] = self.pick(st.sampled_from([-1, 2**31, 2**40]), "bad value")
        return values

    def width(self):
        mtp = self.run.mtp_k
        if self.often("width"):
            return self.pick(st.integers(1, 1 + mtp), "num_new_tokens")
        return self.pick(st.sampled_from([2 + mtp, 0, -1, 2**63 - 1]), "bad num_new_tokens")

    def widths(self, ids):
        """One width per sequence; sometimes one count too few or too many."""
        out = [self.width() for _ in ids]
        if not self.often("one per sequence"):
            out = out[:-1] if out and self.often("fewer") else out + [1]
        return out

    def layout(self, accepted):
        """A tensor layout; "list" means: call through the Python wrapper with lists."""
        layout = self.pick(st.sampled_from(["list", "contiguous"] if self.often("plain") else ID_LAYOUTS), "layout")
        return layout, layout == "list" or layout in accepted


# Per method: the argument kinds, and what a refusal must mention.
STATE_WORDS = r"No free|decoding|max_blocks_per_seq|max_num_seqs|twice|already allocated|unknown sequence"
METHODS = {
    "can_allocate": ("Ts", r"tokens|token"),
    "allocate": ("iTs", r"tokens|token|sequence"),
    "ensure_for_tokens": ("IC", r"seq_ids|counts|sequence|same length|chunk"),
    "commit_prefill": ("ICS", r"seq_ids|counts|sampled|sequence|same length"),
    "can_append": ("IW", r"seq_ids|num_new_tokens|sequence"),
    "append": ("IW", r"seq_ids|num_new_tokens|sequence"),
    "commit_decode": ("ICD", r"seq_ids|counts|tokens|sequence|same length"),
    "deallocate": ("I", r"seq_ids|sequence"),
    "stage": ("I", r"seq_ids|sequence|stage"),
    "has_sequence": ("i", r"seq_id"), "num_computed": ("i", r"sequence"), "num_tokens": ("i", r"sequence"),
    "logical_table": ("i", r"sequence"), "swa_table": ("i", r"sequence"), "phys_table": ("it", r"sequence|type"),
    "upload": ("r", r"rows"), "clear_cache": ("", r"^$"), "take_events": ("", r"^$"), "stats": ("", r"^$"),
    "num_sequences": ("", r"^$"), "check_invariants": ("", r"^$"), "invalidate_staging": ("", r"^$"),
    "mark_uploaded": ("", r"^$"),
}
PHASE = {"ensure_for_tokens": "prefill", "commit_prefill": "prefill", "can_append": "decode", "append": "decode",
         "commit_decode": "scheduled"}
BATCH_METHODS = ("allocate", "ensure_for_tokens", "commit_prefill", "append", "commit_decode", "deallocate", "stage")
QUERIES = {"can_allocate", "can_append", "has_sequence", "num_computed", "num_tokens", "logical_table",
           "swa_table", "phys_table", "stats", "num_sequences", "check_invariants", "upload", "mark_uploaded"}


def schedule_a_decode_step(run):
    """Both managers append to every decoding sequence that fits, so commit_decode has positions to commit."""
    decoding = [sid for sid, s in run.model.seqs.items() if len(s.tokens) > s.num_prompt and s.scheduled == 0]
    served = run.both("can_append", decoding, 1)
    run.both("append", decoding[:served], 1)


def draw_call(draw, name):
    """(values per argument: python lists / ints, layout, whether every argument is well-formed)."""
    if name == "commit_decode" and not any(s.scheduled for s in draw.run.model.seqs.values()):
        schedule_a_decode_step(draw.run)
    values = []
    phase = PHASE.get(name)
    for kind in METHODS[name][0]:
        if kind == "I":
            values.append(draw.seq_ids(phase))
        elif kind == "C":
            values.append(draw.counts(values[0], decode=phase == "scheduled"))
        elif kind == "S":
            values.append(draw.sampled(values[0], values[1]))
        elif kind == "D":  # one token per position counted, sometimes one too many or few
            total = sum(c for c in values[1] if 0 <= c < 2**20)
            off = 0 if draw.often("exact tokens") else draw.pick(st.sampled_from([1, -1]), "off by")
            values.append(draw.tokens(max(0, total + off)))
        elif kind == "T":
            values.append(draw.tokens())
        elif kind == "i":
            values.append(draw.fresh_id() if name == "allocate" else draw.seq_id())
        elif kind == "W":
            values.append(draw.widths(values[0]))
        elif kind == "s":
            values.append(draw.pick(st.sampled_from(SALTS), "salt"))
        elif kind == "t":
            values.append(draw.pick(st.sampled_from([-1, 0, 1, 2, 2**63 - 1]), "type"))
        else:  # "r": staging rows
            rows = draw.run.cfg["max_num_seqs"]
            values.append(draw.pick(st.sampled_from([-1, 0, 1, rows, rows + 1]), "rows"))
    tensors = [v for kind, v in zip(METHODS[name][0], values) if kind in "ICSDTW"]
    if not tensors:
        return values, "list", True
    layout, well_formed = draw.layout(ACCEPTED_TOKEN_LAYOUTS if "T" in METHODS[name][0] else ACCEPTED_ID_LAYOUTS)
    if layout == "int32" and not all(-(2**31) <= x < 2**31 for v in tensors for x in v):
        return values, "contiguous", True  # values past int32 arrive as int64
    return values, layout, well_formed


def torch_arguments(name, values, layout):
    """The call's tensor arguments (ids, counts, tokens) in `layout`, int64 based, and its salt as int64."""
    return [in_layout(v, layout) if kind in "ICSDTW" else salt_arg(v) if kind == "s" else v
            for kind, v in zip(METHODS[name][0], values)]


def make_call(run, name, values, layout):
    if layout == "list":  # the wrapper takes the salt by keyword
        target = run.cpp if hasattr(run.cpp, name) else run.cpp.torch_object
        kinds = METHODS[name][0]
        args = [v for kind, v in zip(kinds, values) if kind != "s"]
        salt = {"salt": v for kind, v in zip(kinds, values) if kind == "s"}
        return lambda: getattr(target, name)(*args, **salt)
    args = torch_arguments(name, values, layout)
    return lambda: getattr(run.cpp.torch_object, name)(*args)


# ------------------------------------------------------------------ checking --
def plain(value):
    if isinstance(value, torch.Tensor):
        return value.tolist()
    return dict(value) if hasattr(value, "keys") else value


def model_result(run, name, values):
    model = run.model
    if name == "has_sequence":
        return values[0] in model.seqs
    if name == "num_sequences":
        return len(model.seqs)
    if name in ("stage", "upload", "mark_uploaded", "invalidate_staging", "check_invariants"):
        return None
    return plain(getattr(model, name)(*values))


def check_accepted(run, name, values, result):
    """An accepted call: the model agrees, and so do the stats, events and staged rows."""
    if name not in ("take_events", "stats"):
        assert plain(result) == model_result(run, name, values), f"{name}{tuple(values)}"
    elif name == "take_events":
        assert plain(result) == run.model.take_events()
    run.cpp.check_invariants()
    assert run.cpp.stats() == run.model.stats(), name
    assert run.cpp.take_events() == run.model.take_events(), name
    if name == "stage":
        width = run.cfg["max_blocks_per_seq"]
        tables = staged_tables_shape(run.cpp.config)[1]
        rows = [[[0] * width for _ in range(tables)] for _ in values[0]]
        run.model.stage_rows(values[0], rows)
        assert run.cpp.host_tables[: len(values[0])].tolist() == rows


def check_refused(name, exc, well_formed):
    assert isinstance(exc, (ValueError, TypeError, RuntimeError)), f"{name}: {type(exc).__name__}: {exc}"
    message = str(exc)
    if not well_formed:
        return
    words = METHODS[name][1] + "|" + STATE_WORDS
    assert re.search(words, message), f"{name}: the refusal {message!r} names none of {words}"


@pytest.mark.parametrize("config", ["unified-bs128", "static-bs128", "unified-bs256-mtp2", "unified-sparse-retain",
                                    "unified-elastic-mtp1"])
def test_every_method_gives_the_model_result_or_refuses_changing_nothing(config):
    outcomes = Counter()

    @fuzz_settings(150)
    @given(seed=st.integers(0, 2**16), steps=st.integers(1, 8), data=st.data())
    def case(seed, steps, data):
        run = serving(config, seed, steps)
        draw = Draw(data, run)
        for _ in range(draw.pick(st.integers(1, 12), "calls")):
            name = draw.pick(st.sampled_from(sorted(METHODS) + list(BATCH_METHODS) * 2), "method")
            values, layout, well_formed = draw_call(draw, name)
            before = snapshot(run.cpp)
            try:
                result = make_call(run, name, values, layout)()
            except Exception as exc:  # judged below: a clear error and no change
                check_refused(name, exc, well_formed)
                assert same_snapshot(snapshot(run.cpp), before), f"refused {name}{tuple(values)} changed the state"
                outcomes["refused", name] += 1
                continue
            assert well_formed, f"{name} accepted malformed arguments in layout {layout}"
            if name in QUERIES:
                assert same_snapshot(snapshot(run.cpp), before), f"query {name} changed the state"
            check_accepted(run, name, values, result)
            draw.live = sorted(run.model.seqs)
            outcomes["accepted", name] += 1

    case()
    for name in BATCH_METHODS:
        assert outcomes["refused", name] > 0 and outcomes["accepted", name] > 0, (name, sorted(outcomes.items()))


# -------------------------------------------------------------- constructor --
VALID_OPTIONS = dict(num_logical_blocks=40, num_swa_blocks=32, block_size=128, window=128, mtp_k=1,
                     max_num_batched_tokens=512, full_retain=True, retention_interval=256, checkpoint_frac=0.25,
                     max_num_seqs=4, max_blocks_per_seq=8)
# One option out of its domain at a time: (value, what the refusal names).
BAD_OPTIONS = {
    "num_logical_blocks": ([-1, 2**31, 2**63 - 1], "num_logical_blocks"),
    "num_swa_blocks": ([-1, 2**62, 2**63 - 1, 0], "num_swa_blocks"),
    "block_size": ([0, -128, 48], "block_size"),
    "window": ([-1, 0], "window"),
    "mtp_k": ([-1, -(2**63)], "mtp_k"),
    "max_num_batched_tokens": ([0, -1], "max_num_batched_tokens"),
    "max_num_seqs": ([0, -5], "max_num_seqs"),
    "max_blocks_per_seq": ([0, -1], "max_blocks_per_seq"),
    "retention_interval": ([-1], "retention_interval"),
    "checkpoint_frac": ([-0.1, 1.5, float("nan")], "checkpoint_frac"),
    "compress_ks": ([[48], [0], [256], [-32]], "compress_ks"),
    "type_slots": ([[1, 1], [-1, 33], [33]], "type_slots|compress type|num_slots"),
}


@given(option=st.sampled_from(sorted(BAD_OPTIONS)), data=st.data(), unified=st.booleans())
@fuzz_settings(150)
def test_one_bad_constructor_option_is_refused_naming_it(option, data, unified):
    values, names = BAD_OPTIONS[option]
    value = data.draw(st.sampled_from(values), label="value")
    options = {**VALID_OPTIONS, "unified": unified or option == "type_slots", option: value}
    with pytest.raises(ValueError, match=names):
        KvManager(**options)
    options.pop(option)  # the same options without the bad one build
    m = KvManager(**options, **{option: VALID_OPTIONS[option]} if option in VALID_OPTIONS else {})
    m.check_invariants()
    assert m.pools.num_logical_blocks == VALID_OPTIONS["num_logical_blocks"]


# ------------------------------------------------------------- tiny pools --
@pytest.mark.parametrize("unified", [True, False], ids=["unified", "static"])
@pytest.mark.parametrize("num_logical_blocks,num_swa_blocks", [(0, 3), (1, 1), (1, 3), (2, 2), (3, 1)])
def test_pools_of_zero_one_and_two_blocks_refuse_what_does_not_fit_and_keep_every_promise(
        unified, num_logical_blocks, num_swa_blocks):
    """Admission refuses what cannot fit (everything, with no logical block:
    never), what it admits runs to the end exactly like the model, and
    nothing leaks (Serving.run checks all three)."""
    cfg = config(unified, num_logical_blocks=num_logical_blocks, num_swa_blocks=num_swa_blocks, max_blocks_per_seq=4)
    admitted = never = 0
    for seed in range(3):
        run = Serving(cfg, seed)
        run.run(steps=25)
        admitted += run.cpp.stats()["admissions"]
        never += run.never_fits
    assert (admitted > 0) == (num_logical_blocks > 0)
    assert never > 0  # requests longer than the pools hold are refused for good, not left waiting


@pytest.mark.parametrize("num_logical_blocks", [0, 1])
def test_a_manager_without_an_swa_pool_serves_within_its_logical_blocks(num_logical_blocks):
    """window = num_swa_blocks = 0 (no sliding window): no SWA table entries,
    one logical block serves one block of tokens, then can_append says no;
    with no logical block a request never fits."""
    m = KvManager(num_logical_blocks=num_logical_blocks, num_swa_blocks=0, window=0, max_num_seqs=2,
                  max_blocks_per_seq=2)
    prompt = list(range(1, 101))
    assert m.allocate(0, prompt) == (0 if num_logical_blocks else KvManager.NEVER_FITS)
    if num_logical_blocks:
        m.ensure_for_tokens([0], [100])
        m.commit_prefill([0], [100], [7])
        while m.can_append([0]) == 1:
            m.append([0])
            m.commit_decode([0], [1], [9])
        assert m.num_computed(0) == 128 and m.swa_table(0).tolist() == [-1] and m.logical_table(0).tolist() == [0]
        m.deallocate([0])
    m.check_invariants()
    st = m.stats()
    assert (st["free_logical_blocks"], st["held_swa_slots"], st["num_sequences"]) == (num_logical_blocks, 0, 0)
