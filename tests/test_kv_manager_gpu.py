"""Graph-safe staging on a GPU: upload + a gather of table rows captured in a
CUDA graph and replayed over many steps with changing allocation states must
give what the eager path gives (ARCHITECTURE.md: one staging path, H1)."""
import random

import pytest
import torch

from ukv_torch import KvManager

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

ROWS, WIDTH = 6, 16


def gather(tables, index):
    # What an index kernel does with the tables: pick entries per (row, table).
    return torch.gather(tables[:ROWS], 2, index)


def test_captured_upload_and_gather_match_eager_across_changing_states():
    m = KvManager(num_logical_blocks=40, num_swa_blocks=32, max_num_seqs=ROWS, max_blocks_per_seq=WIDTH,
                  device="cuda")
    rng = random.Random(1)
    index = torch.randint(0, WIDTH, (ROWS, 2 + m.num_types, 8), device="cuda")
    out = torch.zeros(ROWS, 2 + m.num_types, 8, dtype=torch.int32, device="cuda")
    live, next_id = [], 0
    m.stage([])
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            m.upload(ROWS)
            out.copy_(gather(m.tables, index))
    torch.cuda.synchronize()
    replays = 0
    for step in range(150):
        if len(live) < ROWS and rng.random() < 0.5:
            toks = [rng.randrange(1, 1 << 20) for _ in range(rng.randrange(1, 600))]
            if m.allocate(next_id, toks) >= 0:
                m.ensure_for_tokens([next_id], [len(toks)])
                m.commit_prefill([next_id], [len(toks)], [5])
                live.append(next_id)
            next_id += 1
        if live:
            served = m.can_append(live)
            m.deallocate(live[served:])
            live = live[:served]
            m.append(live)
            m.commit_decode(live, [1] * len(live), [3] * len(live))
            if rng.random() < 0.1 or any(m.num_computed(s) > 1800 for s in live):
                m.deallocate([live.pop(rng.randrange(len(live)))])
        rng.shuffle(live)
        m.stage(live)  # waits until the last replay's copy no longer reads the pinned tables
        graph.replay()
        m.mark_uploaded()
        torch.cuda.synchronize()
        captured = out.clone()
        m.upload(ROWS)  # the eager step on the same buffers
        eager = gather(m.tables, index)
        torch.cuda.synchronize()
        n = len(live)
        assert torch.equal(captured[:n], eager[:n]), step
        assert torch.equal(eager[:n].cpu(), gather(m.host_tables, index.cpu())[:n]), step
        replays += 1
    assert replays == 150 and next_id > 20
