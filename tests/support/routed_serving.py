"""A randomized serving run of one C++ KV manager, on any layout, checked
by a cache router: before every admission, an index rebuilt only from the
manager's KV events (support.kv_event_index) must predict the cached prefix."""
import collections
import random

from support.kv_event_index import index_for
from support.manager_steps import BS
from ukv_torch import KvManager


class RoutedServing:
    """A randomized serving run of one C++ manager (every layout, the row
    space's evictions included): shared system prompts, repeats and next
    turns under random salts, unique fillers that force evictions,
    preemption, deallocation and rare cache clears. Before every admission
    the router's index, fed only with the events, predicts the cached prefix."""

    SALTS = [None, None, 3, b"adapter-x"]

    def __init__(self, m, seed):
        self.m, self.rng = m, random.Random(seed)
        self.index = index_for(m)
        self.live, self.waiting, self.finished = {}, collections.deque(), []
        self.system = [self.fresh(n) for n in (2 * BS, 3 * BS + 17)]
        self.next_id = 0
        self.hits = collections.Counter()

    def fresh(self, n):
        return [self.rng.randrange(1, 1 << 20) for _ in range(n)]

    def request(self):
        r, salt = self.rng.random(), self.rng.choice(self.SALTS)
        if r < 0.35:
            toks = self.rng.choice(self.system) + self.fresh(self.rng.randrange(1, 2 * BS))
        elif r < 0.5:
            toks = self.fresh(self.rng.randrange(2 * BS, 5 * BS))
        elif r < 0.8 and self.finished:
            toks, salt = self.rng.choice(self.finished)
            toks = toks + (self.fresh(self.rng.randrange(1, BS)) if r >= 0.65 else [])
            salt = salt if self.rng.random() < 0.7 else self.rng.choice(self.SALTS)
        else:
            toks = self.fresh(self.rng.randrange(1, BS))
        return toks[:6 * BS], salt, self.rng.randrange(1, 16)

    def admit(self):
        while self.waiting:
            toks, salt, gen = self.waiting[0]
            hit = self.m.can_allocate(toks, salt=salt)
            self.index.apply(self.m.take_events())
            if hit >= 0:
                assert self.index.predict(toks, salt) == hit
                self.hits["hit" if hit else "miss"] += 1
            assert self.m.allocate(self.next_id, toks, salt=salt) == hit
            if hit == KvManager.NEVER_FITS:
                self.waiting.popleft()
                continue
            if hit < 0:
                return
            self.waiting.popleft()
            self.live[self.next_id] = dict(tokens=list(toks), salt=salt, target=len(toks) + gen, decoding=False)
            self.next_id += 1

    def prefill(self):
        for sid, s in self.live.items():
            left = len(s["tokens"]) - self.m.num_computed(sid)
            if s["decoding"]:
                continue
            n = min(left, self.rng.choice([left, BS, self.rng.randrange(1, left + 1)]))
            self.m.ensure_for_tokens([sid], [n])
            sampled = self.rng.randrange(1, 1 << 20) if n == left else -1
            self.m.commit_prefill([sid], [n], [sampled])
            if sampled >= 0:
                s["tokens"].append(sampled)
                s["decoding"] = True

    def decode(self):
        batch = [sid for sid, s in self.live.items() if s["decoding"]]
        self.rng.shuffle(batch)
        served = self.m.can_append(batch, 1)
        for sid in batch[served:]:  # preempted: resumes from its known tokens, under its salt
            s = self.live.pop(sid)
            self.m.deallocate([sid])
            self.waiting.appendleft((s["tokens"], s["salt"], 1))
        batch = batch[:served]
        if not batch:
            return
        self.m.append(batch, 1)
        new = self.fresh(len(batch))
        self.m.commit_decode(batch, [1] * len(batch), new)
        for sid, tok in zip(batch, new):
            s = self.live[sid]
            s["tokens"].append(tok)
            if len(s["tokens"]) >= s["target"]:
                self.finished.append((s["tokens"], s["salt"]))
                del self.live[sid]
                self.m.deallocate([sid])

    def step(self):
        while len(self.waiting) < 3:
            self.waiting.append(self.request())
        self.admit()
        self.prefill()
        self.decode()
        if self.rng.random() < 0.01:
            self.m.clear_cache()
