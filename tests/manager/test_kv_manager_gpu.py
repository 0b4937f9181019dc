"""Graph-safe staging on a GPU: upload + a gather of table rows captured in a
CUDA graph and replayed over many steps with changing allocation states must
give what the eager path gives: one staging path, so a captured graph reads
the same physical tables as an eager step."""
import random

import pytest
import torch

import ukv_torch
from ukv_torch import KvManager

pytestmark = pytest.mark.gpu

ROWS, WIDTH = 6, 16


def gather(tables, index):
    # What an index kernel does with the tables: pick entries per (row, table).
    return torch.gather(tables[:ROWS], 2, index)


def test_captured_upload_and_gather_match_eager_across_changing_states():
    m = KvManager(num_logical_blocks=40, num_swa_blocks=32, max_num_seqs=ROWS, max_blocks_per_seq=WIDTH,
                  device="cuda")
    rng = random.Random(1)
    tables = ukv_torch.staged_tables_shape(m.config)[1]
    index = torch.randint(0, WIDTH, (ROWS, tables, 8), device="cuda")
    out = torch.zeros(ROWS, tables, 8, dtype=torch.int32, device="cuda")
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
            cached = m.allocate(next_id, toks)
            if cached >= 0:  # prefill the rest in one chunk
                m.ensure_for_tokens([next_id], [len(toks) - cached])
                m.commit_prefill([next_id], [len(toks) - cached], [5])
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


def decode_step_ops(m, x, out):
    """A decode step's index ops on the manager's device tables (what a captured graph replays)."""
    ops = ukv_torch.ops
    swa, csa, hca = (m.table(name)[:ROWS] for name in ("swa", 4, 128))
    bs = m.config.block_size
    ops.decode_index_metadata(x["pos"], x["bid"], x["n_csa"], x["n_hca"], out["swa_ptr"], out["csa_ptr"],
                              out["hca_ptr"], window=128, index_topk=TOPK)
    ops.paged_decode_indices(swa, x["pos"], x["bid"], out["swa_ptr"], out["swa"], out["csa_ptr"], out["csa"],
                             out["hca_ptr"], out["hca"], window=128, block_size=bs)
    ops.csa_translate_pack(x["topk"], csa, x["pos"], x["bid"], out["csa_ptr"], out["csa"], compress_base=0,
                           window=128, block_size=bs)
    ops.hca_decode_indices(hca, x["bid"], x["n_hca"], out["hca_ptr"], out["hca"], compress_base=0, block_size=bs)


TOPK = 16


def test_captured_upload_and_decode_index_ops_match_eager_across_changing_states():
    m = KvManager(num_logical_blocks=60, num_swa_blocks=32, max_num_seqs=ROWS, max_blocks_per_seq=WIDTH,
                  device="cuda")
    rng = random.Random(2)
    dev = dict(device="cuda", dtype=torch.int32)
    x = {"pos": torch.zeros(ROWS, device="cuda", dtype=torch.int64), "bid": torch.full((ROWS,), -1, **dev),
         "n_csa": torch.zeros(ROWS, **dev), "n_hca": torch.zeros(ROWS, **dev),
         "topk": torch.zeros(ROWS, TOPK, **dev)}
    cap = ROWS * (128 + WIDTH * 32 + TOPK)
    def buffers():
        return {"swa_ptr": torch.zeros(ROWS + 1, **dev), "csa_ptr": torch.zeros(ROWS + 1, **dev),
                "hca_ptr": torch.zeros(ROWS + 1, **dev), "swa": torch.full((cap,), -7, **dev),
                "csa": torch.full((cap,), -7, **dev), "hca": torch.full((cap,), -7, **dev)}
    graph_out, eager_out = buffers(), buffers()
    m.stage([])
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        decode_step_ops(m, x, graph_out)  # warm-up outside the capture
        with torch.cuda.graph(graph, stream=stream):
            m.upload(ROWS)
            decode_step_ops(m, x, graph_out)
    torch.cuda.synchronize()
    live, next_id = [], 0
    for step in range(120):
        if len(live) < ROWS and rng.random() < 0.6:
            toks = [rng.randrange(1, 1 << 20) for _ in range(rng.randrange(1, 900))]
            cached = m.allocate(next_id, toks)
            if cached >= 0:  # prefill the rest in one chunk
                m.ensure_for_tokens([next_id], [len(toks) - cached])
                m.commit_prefill([next_id], [len(toks) - cached], [5])
                live.append(next_id)
            next_id += 1
        if not live:
            continue
        served = m.can_append(live)
        m.deallocate(live[served:])
        live = live[:served]
        m.append(live)
        rng.shuffle(live)
        m.stage(live)
        n = len(live)
        pos = [m.num_computed(s) for s in live] + [0] * (ROWS - n)
        x["pos"].copy_(torch.tensor(pos))
        x["bid"].copy_(torch.tensor(list(range(n)) + [-1] * (ROWS - n), dtype=torch.int32))
        x["n_csa"].copy_(torch.tensor([(p + 1) // 4 for p in pos], dtype=torch.int32))
        x["n_hca"].copy_(torch.tensor([(p + 1) // 128 for p in pos], dtype=torch.int32))
        x["topk"].copy_(torch.randint(0, 1 << 30, (ROWS, TOPK), dtype=torch.int32) % torch.clamp(
            x["n_csa"].cpu()[:, None], min=1))
        graph.replay()
        m.mark_uploaded()
        m.upload(ROWS)
        decode_step_ops(m, x, eager_out)
        torch.cuda.synchronize()
        for key in graph_out:
            assert torch.equal(graph_out[key], eager_out[key]), (step, key)
        m.commit_decode(live, [1] * n, [3] * n)
        if rng.random() < 0.15 or any(m.num_computed(s) > 1800 for s in live):
            m.deallocate([live.pop(rng.randrange(len(live)))])
    assert next_id > 20
