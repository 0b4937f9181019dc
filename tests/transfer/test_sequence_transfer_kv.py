"""gather_sequence / scatter_sequence over every plane a model has: a
sequence's NoPE (fp8) and RoPE (bf16) rows and its CSA indexer entries arrive
in the importing pool at the rows its own tables give for the same positions
and blocks, across layouts; buffer and model mismatches are refused by name."""
import pytest
import torch

import ukv_torch
from ukv_torch import KvManager, ModelKvSpec, ServeConfig, allocate_unified_kv, plan_kv_layout

MODEL = ModelKvSpec(layer_ratios=(0, 4, 128, 4), head_dim=16, kv_elem_bytes=1, rope_head_dim=8, rope_elem_bytes=2,
                    indexer_bytes_per_block=32 * 8)
BS = 128


class Pool:
    def __init__(self, layout, page=32, model=MODEL):
        config = ServeConfig(layout=layout, window=128, mtp_k=2, max_num_seqs=4, max_blocks_per_seq=8,
                             max_num_batched_tokens=512, swa_page_tokens=page if layout == "row_space" else 0)
        self.plan = plan_kv_layout(2 << 20, model, config)
        self.kv = allocate_unified_kv(self.plan)
        self.mgr = KvManager(self.plan)

    def tensors(self):
        return list(self.kv.planes) or [t for t in self.kv.kv + self.kv.rope + list(self.kv.indexer) if t is not None]

    def swa_row(self, export, ratio, p):
        rows = torch.empty(1, dtype=torch.int32)
        ukv_torch.swa_slot_mapping(export.swa_units.view(1, -1), torch.tensor([p]), torch.zeros(1, dtype=torch.int32),
                                   rows, block_size=BS, swa_rows=list(self.plan.swa_rows(ratio)))
        return int(rows)

    def compress_row(self, export, ratio, block):
        args = self.plan.compress_args(ratio)
        table = export.phys[0 if self.plan.config.layout == "row_space" else self.plan.config.type_of_ratio(ratio)]
        return args["compress_base"] + int(table[block]) * args["block_stride"]

    def indexer_block(self, export, block):
        return int((export.phys[0] if self.plan.config.layout == "row_space" else export.logical)[block])


def raw(t):
    return t.view(torch.uint8) if t.dim() == 2 else t.reshape(t.shape[0], -1).view(torch.uint8)


def prefilled(pool, seq_id, n):
    toks = torch.randint(0, 32000, (n,), generator=torch.Generator().manual_seed(n)).tolist()
    assert pool.mgr.allocate(seq_id, toks) == 0
    pool.mgr.ensure_for_tokens([seq_id], [n])
    pool.mgr.commit_prefill([seq_id], [n], [5])


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
