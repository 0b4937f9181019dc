"""KV pools for the disaggregation tests: a small model with every plane
(fp8 NoPE, bf16 RoPE, CSA indexer), random KV bytes, a prefilled sequence,
and the sequence's bytes as gather_sequence (the in-process path, which the
transfer engine's path must match) reads them; on the host, or on a GPU."""
from typing import NamedTuple

import torch

from ukv_torch import (KvManager, KvPlan, ModelKvSpec, ServeConfig, UnifiedKv, allocate_unified_kv, gather_sequence,
                       plan_kv_layout, transfer_bytes)

MODEL = ModelKvSpec(layer_ratios=(0, 4, 128, 4, 128), head_dim=16, kv_elem_bytes=1, rope_head_dim=8,
                    rope_elem_bytes=2, indexer_bytes_per_block=32 * 8)


class Pool(NamedTuple):
    plan: KvPlan
    kv: UnifiedKv
    mgr: KvManager

    def tensors(self):
        return list(self.kv.planes) or [t for t in self.kv.kv + self.kv.rope + list(self.kv.indexer) if t is not None]

    def snapshot(self):
        return [t.clone() for t in self.tensors()]

    def unchanged_since(self, snapshot) -> bool:
        return all(torch.equal(_bytes(a), _bytes(b)) for a, b in zip(snapshot, self.tensors()))

    def sequence_bytes(self, seq_id: int) -> torch.Tensor:
        export = self.mgr.describe_sequence(seq_id)
        buffer = torch.empty(transfer_bytes(self.plan, self.kv, export), dtype=torch.uint8,
                             device=self.tensors()[0].device)
        gather_sequence(self.plan, self.kv, export, buffer, manager=self.mgr)
        return buffer.cpu()


def pool(layout: str, page: int = 32, budget: int = 2 << 20, model: ModelKvSpec = MODEL, seed: int = 0,
         device: str = "cpu") -> Pool:
    """A pool whose KV holds random bytes (seeded), so every row is distinct, on ``device``."""
    config = ServeConfig(layout=layout, window=128, mtp_k=2, max_num_seqs=4, max_blocks_per_seq=8,
                         max_num_batched_tokens=512, swa_page_tokens=page if layout == "row_space" else 0)
    plan = plan_kv_layout(budget, model, config)
    on_gpu = device != "cpu"
    p = Pool(plan, allocate_unified_kv(plan, device=device), KvManager(plan, device=device if on_gpu else None))
    g = torch.Generator().manual_seed(seed)
    for t in p.tensors():
        _bytes(t).copy_(torch.randint(0, 256, _bytes(t).shape, dtype=torch.uint8, generator=g))
    return p


def prefill(p: Pool, seq_id: int, tokens) -> None:
    """Admit and compute a prompt (its KV is whatever the pool's rows hold) and sample one token."""
    assert p.mgr.allocate(seq_id, tokens) >= 0
    todo = len(tokens) - p.mgr.num_computed(seq_id)
    p.mgr.ensure_for_tokens([seq_id], [todo])
    p.mgr.commit_prefill([seq_id], [todo], [7])


def prompt(n: int, seed: int = 0):
    return torch.randint(0, 32000, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(t.shape[0], -1).view(torch.uint8)
