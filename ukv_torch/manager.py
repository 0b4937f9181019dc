"""`ukv_torch.KvManager`: the Python face of `torch.classes.ukv.KvManager`.

The C++ manager owns the logical blocks and prefix cache, the sliding-window
pool and the unified coordinator (or the static split), and the persistent
staging tables. This wrapper only names the constructor options and converts
Python sequences to the 1-D CPU tensors the torch class takes; pass tensors
directly (int64 ids and counts, int32/int64 tokens) on hot paths.

Table layout: `tables` is [max_num_seqs, 2 + num_types, max_blocks_per_seq]
int32 on the manager's device (or on the host without one); `tables[:, 0]` is
the logical table, `[:, 1]` the SWA table (-1 written as 0), `[:, 2 + t]` the
physical table of compress type t (the logical ids in the static split).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch

__all__ = ["KvManager", "KvEventKind"]

IntsLike = Union[torch.Tensor, Sequence[int]]


class KvEventKind:
    STORED = 0
    REMOVED = 1
    ALL_CLEARED = 2


def _ids(x: IntsLike) -> torch.Tensor:
    return x if isinstance(x, torch.Tensor) else torch.tensor(list(x), dtype=torch.int64)


def _tokens(x: IntsLike) -> torch.Tensor:
    # int64, which the torch class narrows to int32 checking each value, so an
    # out-of-range token is refused naming the argument instead of failing
    # the conversion here with an anonymous overflow error.
    return x if isinstance(x, torch.Tensor) else torch.tensor(list(x), dtype=torch.int64)


class KvManager:
    """Sequence-level KV manager of the unified pool.

    Args mirror the C++ KvManagerConfig: `num_logical_blocks` (logical compress
    blocks, shared by every compressed layer and the indexer), `num_swa_blocks`
    (slots of the shared SWA space), `window` (tokens; 0 = no SWA pool),
    `mtp_k` (speculative tokens per decode step), `unified` (False = the
    upstream static split), `compress_ks` (rows per block of each compress
    type, CSA 32 and HCA 1 by default), `type_slots` (slots of each type's
    tensor; default from `slot_counts`), `borrow_unreleased_swa` (unified:
    compress may also borrow SWA slots SWA never used, which the elastic
    layout needs; admission stays a promise), `full_retain`, `retention_interval`
    and `checkpoint_frac` (sparse SWA checkpoints), `max_num_seqs` x
    `max_blocks_per_seq` (staging), and `device` (where the staged tables are
    mirrored; pinned host staging when it is a GPU).
    """

    def __init__(self, *, num_logical_blocks: int, num_swa_blocks: int, block_size: int = 128,
                 window: int = 128, mtp_k: int = 0, max_num_batched_tokens: int = 8192,
                 enable_prefix_caching: bool = True, unified: bool = True,
                 compress_ks: Sequence[int] = (32, 1), type_slots: Optional[Sequence[int]] = None,
                 borrow_unreleased_swa: bool = False, full_retain: bool = False, retention_interval: int = 0, checkpoint_frac: float = 0.5,
                 max_num_seqs: int = 256, max_blocks_per_seq: int = 1024,
                 device: Optional[Union[str, torch.device]] = None):
        options = {
            "num_logical_blocks": num_logical_blocks, "num_swa_blocks": num_swa_blocks,
            "block_size": block_size, "window": window, "mtp_k": mtp_k,
            "max_num_batched_tokens": max_num_batched_tokens,
            "enable_prefix_caching": int(enable_prefix_caching), "unified": int(unified),
            "borrow_unreleased_swa": int(borrow_unreleased_swa),
            "full_retain": int(full_retain), "retention_interval": retention_interval,
            "max_num_seqs": max_num_seqs, "max_blocks_per_seq": max_blocks_per_seq,
        }
        self.torch_object = torch.classes.ukv.KvManager(
            options, list(compress_ks), list(type_slots or []), float(checkpoint_frac),
            "" if device is None else str(torch.device(device)))
        self.num_types = len(compress_ks)

    @classmethod
    def from_torch_object(cls, obj) -> "KvManager":
        self = cls.__new__(cls)
        self.torch_object = obj
        self.num_types = len(obj.compress_ks())
        return self

    # --- admission ---
    def can_allocate(self, tokens: IntsLike) -> int:
        """Cached prefix length in blocks, or -1 when the request cannot be admitted now."""
        return self.torch_object.can_allocate(_tokens(tokens))

    def allocate(self, seq_id: int, tokens: IntsLike) -> int:
        """Admit a request; returns its cached tokens, or -1 (nothing changed) if it does not fit."""
        return self.torch_object.allocate(seq_id, _tokens(tokens))

    # --- prefill ---
    def ensure_for_tokens(self, seq_ids: IntsLike, counts: IntsLike) -> None:
        """Materialise the SWA blocks of each sequence's next prefill chunk."""
        self.torch_object.ensure_for_tokens(_ids(seq_ids), _ids(counts))

    def commit_prefill(self, seq_ids: IntsLike, counts: IntsLike, sampled: Optional[IntsLike] = None) -> None:
        """Chunks computed; sampled[i] is the token sampled after a prompt's last chunk, -1 for none."""
        ids = _ids(seq_ids)
        samp = torch.full((ids.numel(),), -1, dtype=torch.int32) if sampled is None else _tokens(sampled)
        self.torch_object.commit_prefill(ids, _ids(counts), samp)

    # --- decode ---
    def can_append(self, seq_ids: IntsLike, num_new_tokens: int = 1) -> int:
        """Length of the longest prefix of seq_ids that append() can serve (preempt the rest)."""
        return self.torch_object.can_append(_ids(seq_ids), num_new_tokens)

    def append(self, seq_ids: IntsLike, num_new_tokens: int = 1) -> None:
        self.torch_object.append(_ids(seq_ids), num_new_tokens)

    def commit_decode(self, seq_ids: IntsLike, counts: IntsLike, tokens: IntsLike) -> None:
        """counts[i] positions of sequence i were computed; tokens are their new token ids, concatenated."""
        self.torch_object.commit_decode(_ids(seq_ids), _ids(counts), _tokens(tokens))

    def deallocate(self, seq_ids: Union[int, IntsLike]) -> None:
        self.torch_object.deallocate(_ids([seq_ids] if isinstance(seq_ids, int) else seq_ids))

    def clear_cache(self) -> None:
        self.torch_object.clear_cache()

    # --- inspection ---
    def has_sequence(self, seq_id: int) -> bool:
        return self.torch_object.has_sequence(seq_id)

    def num_computed(self, seq_id: int) -> int:
        return self.torch_object.num_computed(seq_id)

    def num_tokens(self, seq_id: int) -> int:
        return self.torch_object.num_tokens(seq_id)

    def logical_table(self, seq_id: int) -> torch.Tensor:
        return self.torch_object.logical_table(seq_id)

    def swa_table(self, seq_id: int) -> torch.Tensor:
        return self.torch_object.swa_table(seq_id)

    def phys_table(self, seq_id: int, type_index: int) -> torch.Tensor:
        return self.torch_object.phys_table(seq_id, type_index)

    def stats(self) -> Dict[str, int]:
        return dict(self.torch_object.stats())

    def config(self) -> Dict[str, int]:
        return dict(self.torch_object.config())

    def take_events(self) -> List[Tuple[int, int, int, bool]]:
        """KV events since the last call: (kind, block_hash, parent_hash, has_parent)."""
        return self.torch_object.take_events()

    def check_invariants(self) -> None:
        self.torch_object.check_invariants()

    # --- graph-safe staging ---
    def stage(self, seq_ids: IntsLike) -> None:
        """Write the batch's rows (row i = seq_ids[i]) into the pinned host tables.
        Waits first until the previous upload no longer reads them."""
        self.torch_object.stage(_ids(seq_ids))

    def upload(self, rows: int) -> None:
        """Non-blocking copy of rows [0, rows) to the device tables on the current stream
        (may be captured in a CUDA graph; then call mark_uploaded() after each replay)."""
        self.torch_object.upload(rows)

    def mark_uploaded(self) -> None:
        self.torch_object.mark_uploaded()

    @property
    def tables(self) -> torch.Tensor:
        """[max_num_seqs, 2 + num_types, max_blocks_per_seq] int32 tables the kernels read."""
        return self.torch_object.tables()

    @property
    def host_tables(self) -> torch.Tensor:
        return self.torch_object.host_tables()

    def table(self, name: Union[str, int]) -> torch.Tensor:
        """One table as a [max_num_seqs, max_blocks_per_seq] view: 'logical', 'swa', or a compress type index."""
        index = {"logical": 0, "swa": 1}.get(name, None) if isinstance(name, str) else 2 + name
        if index is None:
            raise ValueError(f"table name must be 'logical', 'swa' or a compress type index, got {name!r}")
        return self.tables[:, index]

    def __getstate__(self):
        return {"torch_object": self.torch_object, "num_types": self.num_types}

    def __setstate__(self, state):
        self.__dict__.update(state)
