"""KvStepOps inside torch.compile(fullgraph=True) and, on a GPU, a captured
CUDA graph replayed over new staged tables: its methods only call the ops
with the plan's constants, so they trace and capture like the ops."""
import pytest
import torch

from support.transfer_pools import MODEL, Pool, prefilled
from ukv_torch import KvManager, KvStepOps, allocate_unified_kv

BACKENDS = ["aot_eager", "inductor"]


def decode_program(ops, tables, positions, batch_id, slots, indptr, out):
    ops.swa_slot_mapping(positions, batch_id, slots, ratio=0, tables=tables)
    ops.paged_decode_indices(positions, batch_id, indptr, out, tables=tables)
    return slots.sum() + out.sum()


def decode_inputs(device, contexts):
    positions = torch.tensor(contexts, dtype=torch.int64, device=device)
    batch_id = torch.arange(len(contexts), dtype=torch.int32, device=device)
    indptr = torch.arange(0, 128 * (len(contexts) + 1), 128, dtype=torch.int32, device=device)
    return (positions, batch_id, torch.empty(len(contexts), dtype=torch.int32, device=device), indptr,
            torch.full((128 * len(contexts),), -7, dtype=torch.int32, device=device))


@pytest.mark.parametrize("backend", BACKENDS)
def test_compiled_fullgraph(backend):
    pool = Pool("row_space")
    prefilled(pool, 1, 600)
    prefilled(pool, 2, 300)
    pool.mgr.stage([1, 2])
    pool.mgr.upload(2)
    ops = KvStepOps(pool.plan, pool.kv, pool.mgr)
    eager = decode_inputs("cpu", [600, 300])
    decode_program(ops, pool.mgr.tables[:2], *eager)
    torch._dynamo.reset()
    compiled = torch.compile(lambda *x: decode_program(ops, *x), fullgraph=True, backend=backend)
    traced = decode_inputs("cpu", [600, 300])
    compiled(pool.mgr.tables[:2], *traced)
    assert all(torch.equal(a, b) for a, b in zip(eager, traced)) and (traced[-1] >= 0).all()


@pytest.mark.gpu
def test_replayed_in_a_cuda_graph_over_new_tables():
    plan = Pool("row_space").plan
    kv = allocate_unified_kv(plan, device="cuda")
    mgr = KvManager(plan, device="cuda")
    ops = KvStepOps(plan, kv, mgr)
    for seq_id, n in ((1, 600), (2, 300)):
        mgr.allocate(seq_id, list(range(seq_id, seq_id + n)))
        mgr.ensure_for_tokens([seq_id], [n])
        mgr.commit_prefill([seq_id], [n], [5])
    static = decode_inputs("cuda", [600, 300])

    tables = mgr.tables

    def program():
        ops.apply_row_copies()
        return decode_program(ops, tables, *static)

    mgr.stage([1, 2])
    mgr.upload(2)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        program()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        program()
    for step in range(1, 40):
        mgr.append([1, 2], 1)
        mgr.stage([1, 2])
        mgr.upload(2)
        static[0].copy_(torch.tensor([600 + step - 1, 300 + step - 1]))
        graph.replay()
        expected = decode_inputs("cuda", [600 + step - 1, 300 + step - 1])
        decode_program(ops, tables, *expected)
        torch.cuda.synchronize()
        assert all(torch.equal(a, b) for a, b in zip(expected, static)), step
        mgr.commit_decode([1, 2], [1, 1], [5, 5])
    assert MODEL.layer_ratios[0] == 0  # the dense class the program maps
