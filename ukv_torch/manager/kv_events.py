"""KV events: what the manager's prefix cache gained and lost, for a
cache-aware router (docs/serving-loop.md, "KV events").

`KvManager.take_events()` drains them as `KvEvent` records. The torch class
hands them over as two flat tensors (one row of fields per event, and the
tokens of every Stored event concatenated), so draining a step's events costs
two copies through torchbind whatever their number; the records are built
here.
"""
from __future__ import annotations

from typing import List, NamedTuple, Optional, Tuple

import torch

from .prefix_hashing import Key, key_from_words

__all__ = ["KvEvent", "KvEventKind", "KvRole", "events_from_tensors"]

_MASK64 = (1 << 64) - 1
_FIELDS = 10  # the torch class's columns per event


class KvEventKind:
    STORED = 0       # a block became reusable: a later request with this prefix can hit it
    REMOVED = 1      # a block stopped being reusable
    ALL_CLEARED = 2  # every cached block and page was dropped (KvManager.clear_cache)


class KvRole:
    COMPRESS = 0  # a logical (compress) block: block_size tokens of every CSA/HCA layer
    SWA = 1       # a sliding-window page: swa_page tokens of every layer's window rows


class KvEvent(NamedTuple):
    """One change of the prefix cache.

    seq_no grows by one per event over the manager's life (pickling keeps it).
    Keys are what the manager's ServeConfig.prefix_hash makes: unsigned
    64-bit ints under xxh64 (the default), 16 ``bytes`` under sha256 and
    blake2b. Salts are unsigned 64-bit ints. Stored: block_hash is the
    cache key (`ukv_torch.block_hashes` for a compress block,
    `ukv_torch.swa_page_hashes` for an SWA page); parent_hash is a compress
    block's predecessor in the chain (None for block 0) or an SWA page's
    containing compress block; token_ids are the block's (or page's) tokens,
    block_size their count; salt the publishing request's (None: unsalted).
    Removed: kind, seq_no, role and block_hash only. All-cleared: kind and
    seq_no only; the other fields are None.
    """
    kind: int
    seq_no: int
    role: Optional[int]
    block_hash: Optional[Key]
    parent_hash: Optional[Key]
    token_ids: Optional[Tuple[int, ...]]
    block_size: Optional[int]
    salt: Optional[int]


def events_from_tensors(fields: torch.Tensor, tokens: torch.Tensor, prefix_hash: str = "xxh64") -> List[KvEvent]:
    """Records from the torch class's take_events(): fields int64 [n, 10] rows
    (kind, seq_no, role, hash, parent_hash, has_parent, salt, num_tokens,
    hash_hi, parent_hash_hi: the keys' low and high 64-bit words) and the
    Stored events' tokens (int32), concatenated in event order; keys as the
    manager's prefix_hash makes them."""
    assert fields.shape[1:] == (_FIELDS,), fields.shape
    toks = tokens.tolist()
    out, at = [], 0
    for kind, seq_no, role, h, parent, has_parent, salt, n, h_hi, parent_hi in fields.tolist():
        key = key_from_words(h, h_hi, prefix_hash)
        if kind == KvEventKind.STORED:
            out.append(KvEvent(kind, seq_no, role, key, key_from_words(parent, parent_hi, prefix_hash) if has_parent else None,
                               tuple(toks[at:at + n]), n, salt & _MASK64 or None))
            at += n
        elif kind == KvEventKind.REMOVED:
            out.append(KvEvent(kind, seq_no, role, key, None, None, None, None))
        else:
            out.append(KvEvent(kind, seq_no, None, None, None, None, None, None))
    return out
