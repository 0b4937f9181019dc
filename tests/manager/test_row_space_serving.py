"""Model-based serving runs on the row-space layout (support.row_space_serving).

The engine of the serving-model tests - admission with prefix reuse,
chunked prefill in chunks of any size, decode with per-sequence draft counts
and random accepted counts, preemption - runs on rows shared by envelopes
and SWA units, so tight that cached units are evicted and live ones moved
to make room. Each call is compared with the pure-Python model; the
simulated rows, moved by the manager's row copies, must give every read
exactly the content written for it.
"""
import pytest

from support.row_space_serving import RowSpaceServing, row_space_config

# Tight rows: about two prompts with their SWA quotas live at once, so
# admissions wait, decodes preempt, and binding a unit often needs another
# evicted or moved.
CONFIGS = {
    "page32-mtp2": row_space_config(32, 1800, mtp_k=2),
    "page32-one-layer-units": row_space_config(32, 2000, unit_layers=1, mtp_k=2),
    "page64-mtp1": row_space_config(64, 2500, mtp_k=1),
    "page64-one-layer-units": row_space_config(64, 2000, unit_layers=1, mtp_k=1),
}
SEEDS = (0, 1, 2, 3)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_serving_reads_what_it_wrote_through_hits_evictions_and_moves(name):
    totals = dict(moves=0, copies=0, hits=0, evictions=0, preemptions=0)
    for seed in SEEDS:
        run = RowSpaceServing(CONFIGS[name], seed)
        run.run(steps=400)
        stats = run.cpp.stats()
        totals["moves"] += stats["envelope_moves"] + stats["swa_unit_moves"]
        totals["copies"] += run.copies
        totals["hits"] += stats["prefix_hit_blocks"]
        totals["evictions"] += run.evictions
        totals["preemptions"] += run.preemptions
    assert all(totals.values()), totals


@pytest.mark.parametrize("name", ["page32-mtp2", "page64-mtp1"])
def test_whole_chunks_read_what_they_wrote_and_match_the_model(name):
    """Whole chunks (a KV tier's mode) on tight rows: their pages take rows
    that cached units give up or live ones leave by moving."""
    whole = 0
    for seed in SEEDS:
        run = RowSpaceServing(dict(CONFIGS[name], max_num_batched_tokens=512), seed, whole_chunks=True)
        run.run(steps=400)
        whole += run.cpp.stats()["whole_chunks"]
    assert whole > 0
