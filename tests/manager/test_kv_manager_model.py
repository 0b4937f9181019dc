"""Model-based randomized tests of whole serving runs through ukv_torch.KvManager.

A small engine drives the C++ manager and the pure-Python model
(ukv_torch/testing/kv_manager_model.py) with the same calls: admission with prefix reuse
(shared system prompts, repeats, multi-turn re-admission of prompt +
generated tokens), chunked prefill with random chunk sizes, decode with
speculative tokens and random accepted counts, preemption when can_append
says no, finishing, and forced eviction (small pools, unique long fillers) so
physical ids diverge from logical ones.

After every call the test compares results, stats and KV events with the
model and runs check_invariants(); every step it stages the running batch
and compares the staged rows with the model's tables. A simulated device
memory records which token prefix was written to which rows (SWA rows in
every layer tensor, compress rows per type), so every read checks that a
sequence - cache hits included - reads exactly the content it expects, and
a table-level ownership check finds rows claimed by two owners.
"""
import pytest

from support.serving import CONFIGS, Serving, config


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_serving_run_matches_model(name, seed):
    run = Serving(CONFIGS[name], seed)
    run.run(steps=150)
    assert run.calls > 300


# Tiny elastic pools: a few blocks per shared slot, every admission near the
# limit, so cached blocks stand in for fresh ones in most runs. Many short
# runs find the rare orders in which a choice could break a promise.
TINY_ELASTIC = config(True, num_logical_blocks=16, num_swa_blocks=12, compress_ks=[64], type_slots=[12 + 2],
                      max_num_seqs=3, max_blocks_per_seq=6)
# No own region and one block per slot: compress lives in lent SWA slots, and
# SWA takes back the slots of cached blocks (a reclaim) when no fresh block
# needs them, which stand-ins make rare (about one run in two here).
TINY_RECLAIM = config(True, num_logical_blocks=8, num_swa_blocks=8, compress_ks=[128], type_slots=[8],
                      max_num_seqs=3, max_blocks_per_seq=6, borrow_unreleased_swa=True)


@pytest.mark.parametrize("lend", [False, True], ids=["upstream-borrowing", "borrow-unreleased"])
@pytest.mark.parametrize("seeds", [range(0, 50), range(50, 100)], ids=["seeds0-49", "seeds50-99"])
def test_tiny_elastic_pools_keep_every_promise(seeds, lend):
    evicted = lent = 0
    for seed in seeds:
        run = Serving(dict(TINY_ELASTIC, borrow_unreleased_swa=lend), seed)
        run.run(steps=40)
        evicted += run.model.stat["compress_evictions"]
        lent += run.model.space.unreleased_borrows
    assert evicted > 0
    assert (lent > 0) == lend


@pytest.mark.parametrize("seeds", [range(0, 50), range(50, 100)], ids=["seeds0-49", "seeds50-99"])
def test_reclaiming_slots_from_cached_blocks_keeps_every_promise(seeds):
    reclaimed = evicted = 0
    for seed in seeds:
        run = Serving(TINY_RECLAIM, seed)
        run.run(steps=40)
        reclaimed += run.model.stat["reclaimed_slots"]
        evicted += run.model.stat["compress_evictions"]
    assert reclaimed > 0 and evicted > 0


# Whole chunks, as a KV tier runs them: every chunk's pages below its window
# come from a reserve while the step's chunks stay within it, and beyond it
# (this engine's steps may exceed max_num_batched_tokens) only from room
# beyond every promise; the model predicts which, and every read checks
# what the chunk wrote.
@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("name", ["unified-bs128", "static-bs128", "unified-window256-mtp3", "unified-elastic-lend"])
def test_serving_run_with_whole_chunks_matches_model(name, seed):
    run = Serving(dict(CONFIGS[name], max_num_batched_tokens=512), seed, whole_chunks=True)
    run.run(steps=150)
    assert run.calls > 300
    assert run.model.stat["whole_chunks"] > 0
