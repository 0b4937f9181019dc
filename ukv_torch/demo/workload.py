"""Serving workloads: conversations of one or more turns arriving over time.

A conversation has an optional shared system prompt, then turns of (user
tokens, output tokens). A follow-up turn arrives `think_steps` after the
previous one finished, with the whole history (earlier prompts and outputs)
as its prompt prefix, so it can hit the prefix cache. Shared system prompts
give cross-request hits.

JSONL input (one conversation per line):
    {"arrival": 0, "system": 2, "turns": [[600, 64], [120, 32]], "think_steps": 5}
`system` is a shared prompt id (or -1 for none); system prompt lengths come
from an optional first line {"system_prompts": [len0, len1, ...]}.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

import numpy as np

VOCAB = 32000


@dataclass
class Conversation:
    cid: int
    arrival: int
    system: int  # index into Workload.system_prompts, -1 for none
    turns: List[Tuple[int, int]]  # (user tokens, output tokens)
    think_steps: int = 4


@dataclass
class Workload:
    system_prompts: List[np.ndarray]
    conversations: List[Conversation]
    seed: int = 0
    user_tokens: dict = field(default_factory=dict)

    def user_turn(self, cid: int, turn: int) -> np.ndarray:
        """The user's tokens of a turn: fixed per (conversation, turn) and seed."""
        key = (cid, turn)
        if key not in self.user_tokens:
            rng = np.random.default_rng([self.seed, cid, turn])
            length = self.conversations[cid].turns[turn][0]
            self.user_tokens[key] = rng.integers(0, VOCAB, length, dtype=np.int64)
        return self.user_tokens[key]

    def total_turns(self) -> int:
        return sum(len(c.turns) for c in self.conversations)


def synthetic(seed: int, num_conversations: int = 48, steps_span: int = 120, long_frac: float = 0.35,
              long_range: Sequence[int] = (2048, 6144), short_range: Sequence[int] = (64, 512),
              output_range: Sequence[int] = (16, 160), num_system: int = 3,
              system_range: Sequence[int] = (256, 1024), followup_prob: float = 0.4) -> Workload:
    """A mix of long and short prompts, shared system prompts, multi-turn
    conversations and varied output lengths, arriving over `steps_span` steps."""
    rng = np.random.default_rng(seed)
    systems = [rng.integers(0, VOCAB, int(rng.integers(*system_range)), dtype=np.int64) for _ in range(num_system)]
    conversations = []
    for cid in range(num_conversations):
        turns = []
        while True:
            long = rng.random() < long_frac and not turns
            user = int(rng.integers(*(long_range if long else short_range)))
            turns.append((user, int(rng.integers(*output_range))))
            if rng.random() >= followup_prob or len(turns) >= 3:
                break
        system = int(rng.integers(-1, num_system))
        arrival = int(rng.integers(0, steps_span))
        conversations.append(Conversation(cid, arrival, system, turns, int(rng.integers(2, 10))))
    conversations.sort(key=lambda c: (c.arrival, c.cid))
    for i, c in enumerate(conversations):
        c.cid = i
    return Workload(systems, conversations, seed)


def load_jsonl(path: str, seed: int) -> Workload:
    rng = np.random.default_rng(seed)
    systems: List[np.ndarray] = []
    conversations: List[Conversation] = []
    with open(path) as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            item = json.loads(line)
            if "system_prompts" in item:
                systems = [rng.integers(0, VOCAB, int(n), dtype=np.int64) for n in item["system_prompts"]]
                continue
            try:
                turns = [(int(u), int(o)) for u, o in item["turns"]]
                system = int(item.get("system", -1))
                conv = Conversation(len(conversations), int(item.get("arrival", 0)), system, turns,
                                    int(item.get("think_steps", 4)))
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{path}:{line_no}: bad conversation record ({exc})") from None
            if system >= len(systems) or any(u <= 0 or o <= 0 for u, o in turns) or not turns:
                raise ValueError(f"{path}:{line_no}: turns need positive lengths and system must be -1 or "
                                 f"< {len(systems)}")
            conversations.append(conv)
    conversations.sort(key=lambda c: (c.arrival, c.cid))
    for i, c in enumerate(conversations):
        c.cid = i
    return Workload(systems, conversations, seed)


def first_prompt(w: Workload, conv: Conversation) -> np.ndarray:
    parts = ([w.system_prompts[conv.system]] if conv.system >= 0 else []) + [w.user_turn(conv.cid, 0)]
    return np.concatenate(parts)


def next_prompt(w: Workload, conv: Conversation, history: np.ndarray, turn: int) -> Optional[np.ndarray]:
    if turn >= len(conv.turns):
        return None
    return np.concatenate([history, w.user_turn(conv.cid, turn)])
