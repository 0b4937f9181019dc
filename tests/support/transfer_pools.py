"""Small KV pools of one model (fp8 NoPE, bf16 RoPE and a CSA indexer, so every
plane a transfer moves is there) in any layout, and a prefilled sequence in
them: what the transfer tests move between."""
import torch

import ukv_torch
from ukv_torch import KvManager, ModelKvSpec, ServeConfig, allocate_unified_kv, plan_kv_layout

MODEL = ModelKvSpec(layer_ratios=(0, 4, 128, 4), head_dim=16, kv_elem_bytes=1, rope_head_dim=8, rope_elem_bytes=2,
                    indexer_bytes_per_block=32 * 8)
BS = 128


class Pool:
    """A plan of 2 MiB in `layout` (SWA pages of `page` tokens in the row space),
    its KV tensors on the host and a KvManager without a device."""

    def __init__(self, layout, page=32, model=MODEL, max_num_batched_tokens=512):
        config = ServeConfig(layout=layout, window=128, mtp_k=2, max_num_seqs=4, max_blocks_per_seq=8,
                             max_num_batched_tokens=max_num_batched_tokens,
                             swa_page_tokens=page if layout == "row_space" else 0)
        self.plan = plan_kv_layout(2 << 20, model, config)
        self.kv = allocate_unified_kv(self.plan)
        self.mgr = KvManager(self.plan)

    def tensors(self):
        """Every tensor that holds KV: the planes, or the per-layer tensors and indexer caches."""
        return list(self.kv.planes) or [t for t in self.kv.kv + self.kv.rope + list(self.kv.indexer) if t is not None]

    def swa_row(self, export, ratio, p):
        """The row of position p in the layers of class `ratio`, through the export's SWA units."""
        rows = torch.empty(1, dtype=torch.int32)
        ukv_torch.swa_slot_mapping(export.swa_units.view(1, -1), torch.tensor([p]), torch.zeros(1, dtype=torch.int32),
                                   rows, block_size=BS, swa_rows=list(self.plan.swa_rows(ratio)))
        return int(rows)

    def compress_row(self, export, ratio, block):
        """The first compressed row of a block in the layers of class `ratio`."""
        args = self.plan.compress_args(ratio)
        table = export.phys[0 if self.plan.config.layout == "row_space" else self.plan.config.type_of_ratio(ratio)]
        return args["compress_base"] + int(table[block]) * args["block_stride"]

    def indexer_block(self, export, block):
        """Where a block's CSA indexer entries are: its envelope (row space) or logical block."""
        return int((export.phys[0] if self.plan.config.layout == "row_space" else export.logical)[block])


def raw(t):
    """A KV tensor's bytes, one row per row (an indexer cache flattened per block)."""
    return t.view(torch.uint8) if t.dim() == 2 else t.reshape(t.shape[0], -1).view(torch.uint8)


def prefilled(pool, seq_id, n):
    """Admit n tokens (seeded by n) with no prefix hit, prefill them in one chunk and sample: decoding."""
    toks = torch.randint(0, 32000, (n,), generator=torch.Generator().manual_seed(n)).tolist()
    assert pool.mgr.allocate(seq_id, toks) == 0
    pool.mgr.ensure_for_tokens([seq_id], [n])
    pool.mgr.commit_prefill([seq_id], [n], [5])
