"""gather_sequence / scatter_sequence over every plane a model has: a
sequence's NoPE (fp8) and RoPE (bf16) rows and its CSA indexer entries arrive
in the importing pool at the rows its own tables give for the same positions
and blocks, across layouts; buffer and model mismatches are refused by name."""
import pytest
import torch

import ukv_torch
from support.transfer_pools import BS, MODEL, Pool, prefilled, raw

def move(a, b, seq_id=1, n=700):
    """Prefill on a (its KV random bytes), move to b (idle): (a's export, b's export)."""
    for t in a.tensors():
        raw(t).random_(0, 256, generator=torch.Generator().manual_seed(t.numel()))
    prefilled(a, seq_id, n)
    export = a.mgr.describe_sequence(seq_id)
    assert b.mgr.import_sequence(9, export) == 0
    b.mgr.stage([9])
    b.mgr.upload(1)
    if b.kv.planes:
        ukv_torch.apply_row_copies(list(b.kv.planes), b.mgr.row_copies, b.mgr.row_copy_counts)
    buffer = torch.empty(ukv_torch.transfer_bytes(a.plan, a.kv, export), dtype=torch.uint8)
    ukv_torch.gather_sequence(a.plan, a.kv, export, buffer, manager=a.mgr)
    mine = b.mgr.describe_sequence(9)
    ukv_torch.scatter_sequence(b.plan, b.kv, mine, buffer, manager=b.mgr)
    return export, mine


@pytest.mark.parametrize("a_layout, b_layout, b_page", [("static", "row_space", 32), ("row_space", "upstream", 0),
                                                        ("row_space", "row_space", 64), ("elastic", "static", 0)])
def test_every_plane_and_the_indexer_arrive_at_the_same_positions(a_layout, b_layout, b_page):
    a, b = Pool(a_layout), Pool(b_layout, page=b_page)
    ea, eb = move(a, b)
    assert eb.num_computed == ea.num_computed == 700 and eb.swa_begin == ea.swa_begin == 700 - 127
    blocks = -(-700 // BS)
    for layer, ratio in enumerate(MODEL.layer_ratios):
        for planes_a, planes_b in ((a.kv.kv, b.kv.kv), (a.kv.rope, b.kv.rope)):
            ta, tb = raw(planes_a[layer]), raw(planes_b[layer])
            for p in range(ea.swa_begin, 700):
                assert torch.equal(ta[a.swa_row(ea, ratio, p)], tb[b.swa_row(eb, ratio, p)]), (layer, p)
            if ratio:
                k = BS // ratio
                for block in range(blocks):
                    ra, rb = a.compress_row(ea, ratio, block), b.compress_row(eb, ratio, block)
                    assert torch.equal(ta[ra: ra + k], tb[rb: rb + k]), (layer, block)
        if ratio == 4:
            for block in range(blocks):
                assert torch.equal(a.kv.indexer[layer][a.indexer_block(ea, block)],
                                   b.kv.indexer[layer][b.indexer_block(eb, block)]), (layer, block)


def test_bad_buffers_and_other_models_are_refused():
    a, b = Pool("row_space"), Pool("elastic")
    prefilled(a, 1, 300)
    export = a.mgr.describe_sequence(1)
    nbytes = ukv_torch.transfer_bytes(a.plan, a.kv, export)
    good = torch.zeros(nbytes, dtype=torch.uint8)
    for bad in (torch.zeros(nbytes - 1, dtype=torch.uint8), torch.zeros(nbytes, dtype=torch.int8),
                torch.zeros(1, nbytes, dtype=torch.uint8)):
        with pytest.raises(ValueError, match=f"buffer must be a 1-D uint8 tensor of transfer_bytes\\(\\) = {nbytes}"):
            ukv_torch.gather_sequence(a.plan, a.kv, export, bad, manager=a.mgr)
    assert not good.any()
    wider = Pool("row_space", model=MODEL.replace(head_dim=32))
    with pytest.raises(ValueError, match=r"kv.planes\[0\] must be the plan's \[\d+, 16\] tensor"):
        ukv_torch.gather_sequence(a.plan, wider.kv, export, good, manager=a.mgr)
    with pytest.raises(ValueError, match=r"kv has 3 layers \(4 rope entries\), the plan.s model 4"):
        ukv_torch.gather_sequence(a.plan, a.kv._replace(kv=a.kv.kv[:3]), export, good, manager=a.mgr)
    with pytest.raises(ValueError, match="exported with window=64"):
        ukv_torch.scatter_sequence(b.plan, b.kv, export._replace(config=export.config.replace(window=64)), good,
                                   manager=b.mgr)
    with pytest.raises(TypeError, match="export must be a SequenceExport"):
        ukv_torch.gather_sequence(a.plan, a.kv, tuple(export), good, manager=a.mgr)
    assert not good.any()
