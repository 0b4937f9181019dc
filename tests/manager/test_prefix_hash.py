"""ServeConfig.prefix_hash: the prefix cache keyed by xxh64 (the default),
or by 128 bits of SHA-256 or BLAKE2b.

The digests are checked against Python's hashlib (the C++ unit test reads
the vectors digest_vectors.py writes with hashlib; here the file is proven to
be hashlib's), the key chains against the pure-Python model's hashlib chain
(ukv_torch.testing.prefix_keys_model). A strong hash changes the keys and
nothing else: the same workload gets the same hits as under xxh64, the
events carry the strong keys (16 bytes), a router's index predicts every
hit, and a state or an export made under one hash is refused under another.
"""
import collections
import importlib.util
import pathlib
import pickle
import random

import pytest
import torch

import ukv_torch
from support.manager_steps import BS, LAYOUTS, pair, prefill, state, tokens
from support.routed_serving import RoutedServing
from support.serving import CONFIGS, Serving
from ukv_torch import KvEventKind, KvManager, KvRole, ServeConfig
from ukv_torch.manager.prefix_hashing import swa_page_key_tensor
from ukv_torch.testing.prefix_keys_model import block_hash, page_hash

STRONG = ["sha256", "blake2b"]
ALL = ["xxh64"] + STRONG
DATA = pathlib.Path(__file__).resolve().parents[1] / "cpp" / "data"


def test_the_cpp_digest_vectors_are_hashlibs():
    spec = importlib.util.spec_from_file_location("digest_vectors", DATA / "digest_vectors.py")
    vectors = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(vectors)
    assert (DATA / "digest_vectors.txt").read_text() == "\n".join(vectors.lines()) + "\n"


def model_chain(toks, bs, salt, prefix_hash):
    keys = []
    for i in range(len(toks) // bs):
        keys.append(block_hash(toks[i * bs:(i + 1) * bs], keys[-1] if keys else None, salt, prefix_hash))
    return keys


@pytest.mark.parametrize("prefix_hash", ALL)
def test_block_and_page_keys_are_the_documented_hashlib_chain(prefix_hash):
    rng = random.Random(5)
    for bs in [1, 2, 3, 7, 8, 15, 16, 17, 31, 37]:  # 8*bs (+8, +16) bytes cross every block boundary
        for salt in [None, 5, 2**64 - 1, b"tenant"]:
            toks = [rng.randrange(1 << 31) for _ in range(4 * bs + 1)]
            keys = ukv_torch.block_hashes(toks, bs, salt, prefix_hash)
            assert keys == model_chain(toks, bs, ukv_torch.cache_salt(salt), prefix_hash)
            for ppb in [1, 2, 4]:
                pages = ukv_torch.swa_page_hashes(keys, ppb, prefix_hash)
                assert pages == [page_hash(k, j, ppb, prefix_hash) for k in keys for j in range(ppb)]
                # the page keys as the manager's locate_pages takes them, straight from the block keys'
                assert torch.equal(swa_page_key_tensor(ukv_torch.key_tensor(keys, prefix_hash), ppb, prefix_hash),
                                   ukv_torch.key_tensor(pages, prefix_hash))
    key = ukv_torch.block_hashes(toks, bs, None, prefix_hash)[0]
    assert isinstance(key, int) if prefix_hash == "xxh64" else (isinstance(key, bytes) and len(key) == 16)


def test_salted_chains_share_nothing_and_the_hashes_differ():
    toks = tokens(3 * BS, 1)
    chains = {(h, s): ukv_torch.block_hashes(toks, BS, s, h) for h in STRONG for s in [None, 1, 2, b"x"]}
    assert len({k for chain in chains.values() for k in chain}) == 3 * len(chains)


def serve(m, sid, toks, salt=None):
    cached = m.allocate(sid, toks, salt=salt)
    prefill(m, sid, toks, chunk=BS)
    m.deallocate([sid])
    return cached


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("prefix_hash", STRONG)
def test_events_carry_the_strong_keys(layout, prefix_hash):
    m, model = pair(layout, prefix_hash=prefix_hash)
    t = tokens(3 * BS + 5, 1)
    for mgr in (m, model):
        assert serve(mgr, 1, t, b"a") == 0 and serve(mgr, 2, t, b"a") == 3 * BS
    events = m.take_events()
    assert events == model.take_events()
    compress = [e for e in events if e.kind == KvEventKind.STORED and e.role == KvRole.COMPRESS]
    chain = model_chain(t, BS, ukv_torch.cache_salt(b"a"), prefix_hash)
    assert [e.block_hash for e in compress] == chain
    assert [e.parent_hash for e in compress] == [None] + chain[:-1]
    swa = [e for e in events if e.kind == KvEventKind.STORED and e.role == KvRole.SWA]
    assert swa and all(isinstance(e.block_hash, bytes) and e.parent_hash in chain for e in swa)


@pytest.mark.parametrize("prefix_hash", STRONG)
@pytest.mark.parametrize("name", ["unified-bs128", "static-bs256-mtp1", "unified-sparse-retain"])
def test_a_serving_run_under_a_strong_hash_matches_the_model(name, prefix_hash):
    """The model keys with hashlib: every event and hit agrees, every read sees its own content."""
    run = Serving(dict(CONFIGS[name], prefix_hash=prefix_hash), seed=1)
    run.run(steps=100)
    assert run.calls > 200


def routed_run(layout, seed, prefix_hash):
    m, _ = pair(layout, prefix_hash=prefix_hash)
    run = RoutedServing(m, seed)
    admitted = []
    allocate = m.allocate

    def recorded(seq_id, toks, salt=None):
        admitted.append(allocate(seq_id, toks, salt=salt))
        return admitted[-1]

    m.allocate = recorded
    for step in range(250):
        run.step()
        if step == 120:  # a pickle round trip keeps the keys
            run.m = pickle.loads(pickle.dumps(run.m))
            allocate, run.m.allocate = run.m.allocate, recorded
    run.m.check_invariants()
    stats = run.m.stats()
    return admitted, run.hits, stats


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_strong_hashes_give_the_hits_of_xxh64(layout):
    """The same randomized workload under each hash: the same admissions and
    cached prefixes, which a router replaying the events predicts each time."""
    runs = {h: routed_run(layout, 3, h) for h in ALL}
    admitted, hits, _ = runs["xxh64"]
    assert hits["hit"] > 10 and hits["miss"] > 10, hits
    for h in STRONG:
        assert runs[h] == runs["xxh64"], h


@pytest.mark.parametrize("prefix_hash", STRONG)
def test_a_state_round_trips_and_refuses_another_hash(prefix_hash):
    m, _ = pair("row_space", prefix_hash=prefix_hash)
    t = tokens(3 * BS + 5, 2)
    serve(m, 1, t)
    assert m.allocate(2, t + tokens(BS, 3)) == 3 * BS  # a live sequence with keys
    m.ensure_for_tokens([2], [BS])
    m.commit_prefill([2], [BS])
    m2 = pickle.loads(pickle.dumps(m))
    assert state(m2) == state(m) and m2.config.prefix_hash == prefix_hash
    assert m2.take_events() == m.take_events()
    (values, device), qualname = m.torch_object.__getstate__()
    at = len(m.config.encode()) - 1  # the state's config is its encoding, prefix_hash its last field
    assert values[at] == ALL.index(prefix_hash)
    for other in ALL:
        if other == prefix_hash:
            continue
        tampered = list(values)
        tampered[at] = ALL.index(other)
        fresh = torch.ScriptObject.__new__(torch.ScriptObject)
        with pytest.raises(ValueError, match=f"not the prefix_hash={other} key of its tokens"):
            fresh.__setstate__(((tampered, device), qualname))


def test_an_export_under_another_hash_is_refused():
    a, _ = pair("row_space", prefix_hash="sha256")
    b, _ = pair("row_space")
    t = tokens(3 * BS + 5, 4)
    a.allocate(1, t)
    prefill(a, 1, t)
    e = a.describe_sequence(1)
    assert e.block_hashes.shape == (3, 2) and e.block_hashes.dtype == torch.int64
    before = state(b)
    with pytest.raises(ValueError, match="exported under prefix_hash='sha256', this manager uses prefix_hash='xxh64'"):
        b.import_sequence(1, e)
    assert state(b) == before and not b.has_sequence(1)


@pytest.mark.parametrize("prefix_hash", STRONG)
def test_locate_takes_the_strong_keys(prefix_hash):
    m, _ = pair("elastic", prefix_hash=prefix_hash)
    t = tokens(3 * BS + 5, 5)
    serve(m, 1, t)
    keys = ukv_torch.block_hashes(t, BS, None, prefix_hash)
    where = m.locate_blocks(ukv_torch.key_tensor(keys, prefix_hash), torch.tensor(t[:3 * BS]))
    assert (where[:, 0] >= 0).all()
    pages = ukv_torch.swa_page_hashes(keys, 1, prefix_hash)
    assert (m.locate_pages(ukv_torch.key_tensor(pages, prefix_hash), torch.tensor(t[:3 * BS])) >= -1).all()
    before = state(m)
    with pytest.raises(ValueError, match=r"hashes must be \[n, 2\]"):
        m.locate_blocks(torch.tensor([1, 2, 3]), torch.tensor(t[:3 * BS]))
    with pytest.raises(TypeError, match="hashes must hold 16-byte"):
        ukv_torch.key_tensor([1, 2], prefix_hash)
    assert state(m) == before


@pytest.mark.parametrize("bad", ["md5", "SHA256", "", "xxh3"])
def test_a_bad_prefix_hash_is_refused_naming_it(bad):
    with pytest.raises(ValueError, match="prefix_hash must be one of xxh64, sha256, blake2b"):
        ServeConfig(prefix_hash=bad)
    with pytest.raises(ValueError, match="prefix_hash must be one of xxh64, sha256, blake2b"):
        ukv_torch.block_hashes([1, 2], 2, None, bad)
    with pytest.raises(ValueError, match="prefix_hash must be one of xxh64, sha256, blake2b"):
        ukv_torch.swa_page_hashes([1], 1, bad)
    with pytest.raises(ValueError, match="prefix_hash"):  # the dispatcher op checks it too
        torch.ops.ukv.block_hashes([1, 2], 2, 0, bad)
    encoded = ServeConfig().encode()
    encoded[-1] = 3
    with pytest.raises(ValueError, match="bad prefix_hash 3"):
        torch.ops.ukv.validate_record("ServeConfig", encoded)


def test_keys_of_another_hash_are_refused_naming_the_argument():
    with pytest.raises(TypeError, match="block_hashes must hold 16-byte sha256 keys"):
        ukv_torch.swa_page_hashes([5, 6], 2, "sha256")
    with pytest.raises(TypeError, match="block_hashes must hold ints"):
        ukv_torch.swa_page_hashes([b"x" * 16], 2, "xxh64")
    with pytest.raises(ValueError, match="block_hashes must hold 2 int64 words per sha256 key"):
        torch.ops.ukv.swa_page_hashes([1, 2, 3], 2, "sha256")


def test_xxh64_stays_the_default_everywhere():
    assert ServeConfig().prefix_hash == "xxh64"
    t = tokens(2 * BS, 6)
    assert ukv_torch.block_hashes(t, BS) == ukv_torch.block_hashes(t, BS, None, "xxh64")
    assert torch.ops.ukv.block_hashes(t, BS) == torch.ops.ukv.block_hashes(t, BS, 0, "xxh64")
    assert collections.Counter(type(k) for k in ukv_torch.block_hashes(t, BS)) == {int: 2}
