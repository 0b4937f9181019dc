"""The KV event log of the KV manager model (kv_manager_model): records
shaped like ukv_torch.KvEvent (kind, seq_no, role, block_hash, parent_hash,
token_ids, block_size, salt) as plain tuples, numbered from 0 for the
model's life, written from the documented event format."""
from __future__ import annotations

from typing import List, Optional, Sequence

from .prefix_keys_model import Key

STORED, REMOVED, ALL_CLEARED = 0, 1, 2
COMPRESS, SWA = 0, 1


class EventLog:
    def __init__(self):
        self.events: List[tuple] = []
        self.next_seq_no = 0

    def _push(self, *fields):
        self.events.append((fields[0], self.next_seq_no) + fields[1:])
        self.next_seq_no += 1

    def stored(self, role: int, h: Key, parent: Optional[Key], toks: Sequence[int], salt: int):
        self._push(STORED, role, h, parent, tuple(toks), len(toks), salt or None)

    def removed(self, role: int, h: Key):
        self._push(REMOVED, role, h, None, None, None, None)

    def all_cleared(self):
        self._push(ALL_CLEARED, None, None, None, None, None, None)

    def take(self) -> List[tuple]:
        out, self.events = self.events, []
        return out
