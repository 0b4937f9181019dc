"""The soak's short CI version: a few hundred thousand allocator operations
of ukv_torch/testing/allocator_soak.py (benchmarks/soak.py runs 10M+), with sampled
invariant checks, every row free at the end and no RSS growth."""
from ukv_torch.testing.allocator_soak import run_soak

RSS_SLACK = 2 << 20  # malloc noise; leaking 8 bytes per operation would add 2.3 MiB


def test_short_soak_leaks_nothing():
    r = run_soak(300_000, seed=1, check_every=10_000)
    assert r["ops"] >= 300_000 and r["checks"] >= 29
    assert min(r["refusals"], r["preemptions"], r["evictions"], r["borrows"]) > 0  # every pressure path ran
    assert r["rss"]["end"] - r["rss"]["start"] < RSS_SLACK
