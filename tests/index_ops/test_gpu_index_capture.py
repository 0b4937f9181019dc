"""GPU-only: the index ops inside CUDA graphs and torch.compile.

A decode step (metadata builder + the three decode ops) and a prefill step
(metadata builder + paged_prefill_indices + csa_translate_pack) are captured
once on static buffers and replayed with new contents each time; every replay
must equal the reference. The same steps run under torch.compile with
fullgraph=True and with mode="reduce-overhead" (CUDA graphs through inductor),
which fails if an op launches on the wrong stream or cannot be captured."""
import random

import pytest
import torch

import ukv_torch
from support.index_cases import SENTINEL, make_decode_step, make_prefill_step
from support.index_steps import PREFILL_BUFFERS, reference_decode, reference_prefill

pytestmark = pytest.mark.gpu

NUM_SEQS, TABLE_COLS, WINDOW, TOPK, BLOCK_SIZE = 6, 40, 128, 256, 128
DECODE_TOKENS = NUM_SEQS + 3
PREFILL_TOKENS = 96
CAPACITY = 1 << 16


def decode_case(seed, unified):
    rng = random.Random(seed)
    contexts = [rng.choice([1, 3, 128, 129, rng.randint(1, TABLE_COLS * BLOCK_SIZE)]) for _ in range(NUM_SEQS)]
    return make_decode_step(rng, contexts=contexts, num_padding=DECODE_TOKENS - NUM_SEQS, table_cols=TABLE_COLS,
                            index_topk=TOPK, window=WINDOW, block_size=BLOCK_SIZE, unified=unified)


def prefill_case(seed, unified):
    rng = random.Random(seed)
    chunk_lens = [rng.randint(1, 30) for _ in range(3)]
    prefixes = [rng.choice([0, 127, rng.randint(0, 3000)]) for _ in range(3)]
    step = make_prefill_step(rng, prefixes=prefixes, chunk_lens=chunk_lens,
                             num_padding=PREFILL_TOKENS - sum(chunk_lens), index_topk=TOPK, window=WINDOW,
                             block_size=BLOCK_SIZE, unified=unified)
    # Same table shape every time, so the captured graph can be reused.
    for table in (step.swa_table, step.csa_table, step.hca_table):
        for row in table:
            row.extend([0] * (TABLE_COLS - len(row)))
    return step


def sentinel(n):
    return torch.full((n,), SENTINEL, dtype=torch.int32, device="cuda")


def decode_program(base, positions, batch_id, swa_table, csa_table, hca_table, n_csa, n_hca, topk, **_):
    """The decode step; returns (indptrs..., buffers...)."""
    n = batch_id.shape[0]
    ptrs = [torch.empty(n + 1, dtype=torch.int32, device="cuda") for _ in range(3)]
    outs = [sentinel(CAPACITY) for _ in range(3)]
    ukv_torch.decode_index_metadata(positions, batch_id, n_csa, n_hca, *ptrs, window=WINDOW, index_topk=TOPK)
    ukv_torch.paged_decode_indices(swa_table, positions, batch_id, ptrs[0], outs[0], ptrs[1], outs[1], ptrs[2],
                                   outs[2], window=WINDOW, block_size=BLOCK_SIZE)
    ukv_torch.csa_translate_pack(topk, csa_table, positions, batch_id, ptrs[1], outs[1], compress_base=base,
                                 window=WINDOW, block_size=BLOCK_SIZE)
    ukv_torch.hca_decode_indices(hca_table, batch_id, n_hca, ptrs[2], outs[2], compress_base=base,
                                 block_size=BLOCK_SIZE)
    return (*ptrs, *outs)


def prefill_program(base, positions, batch_id, swa_table, csa_table, hca_table, n_csa, n_hca, chunk_start,
                    query_start, topk):
    """The prefill step; returns (indptrs..., prefix_swa_count, buffers...)."""
    n = batch_id.shape[0]
    ptrs = [torch.empty(n + 1, dtype=torch.int32, device="cuda") for _ in range(4)]
    prefix = torch.empty(n, dtype=torch.int32, device="cuda")
    outs = [sentinel(CAPACITY) for _ in range(4)]
    ukv_torch.prefill_index_metadata(positions, batch_id, chunk_start, n_csa, n_hca, *ptrs, prefix, window=WINDOW,
                                     index_topk=TOPK)
    ukv_torch.paged_prefill_indices(positions, batch_id, chunk_start, query_start, n_hca, swa_table, hca_table, *ptrs,
                                    *outs, compress_base=base, window=WINDOW, block_size=BLOCK_SIZE)
    ukv_torch.csa_translate_pack(topk, csa_table, positions, batch_id, ptrs[2], outs[2], compress_base=base,
                                 skip_per_token=prefix, block_size=BLOCK_SIZE)
    return (*ptrs, prefix, *outs)


def decode_expected(step):
    r = reference_decode(step)
    return [r["swa_indptr"], r["csa_indptr"], r["hca_indptr"], r["swa"], r["csa"], r["hca"]]


def prefill_expected(step):
    r = reference_prefill(step)
    return ([r[n + "_indptr"] for n in PREFILL_BUFFERS] + [r["prefix_swa_count"]] + [r[n] for n in PREFILL_BUFFERS])


def assert_matches(results, expected):
    for got, want in zip(results, expected):
        got = got.tolist()
        assert got[: len(want)] == want
        assert set(got[len(want):]) <= {SENTINEL}


def load(static, step):
    """Copy a step's contents into the captured graph's input tensors."""
    fresh = step.tensors("cuda")
    for name, t in vars(static).items():
        t.copy_(getattr(fresh, name))


KINDS = {"decode": (decode_case, decode_program, decode_expected),
         "prefill": (prefill_case, prefill_program, prefill_expected)}


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("unified", [True, False], ids=["unified", "static"])
def test_graph_replay_with_new_contents(kind, unified):
    case, program, expected = KINDS[kind]
    first = case(0, unified)
    static = first.tensors("cuda")
    warmup = torch.cuda.Stream()
    warmup.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warmup):
        program(first.compress_base, **vars(static))
    torch.cuda.current_stream().wait_stream(warmup)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        results = program(first.compress_base, **vars(static))
    for seed in range(1, 8):
        step = case(seed, unified)
        load(static, step)
        for out in results:
            out.fill_(SENTINEL)
        graph.replay()
        torch.cuda.synchronize()
        assert_matches(results, expected(step))


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_compiled(kind, mode):
    case, program, expected = KINDS[kind]
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(program, fullgraph=True, mode=mode)
    for seed in range(3):
        step = case(seed, unified=True)
        results = compiled(step.compress_base, **vars(step.tensors("cuda")))
        torch.cuda.synchronize()
        assert_matches([r.clone() for r in results], expected(step))
    if mode == "reduce-overhead":
        assert torch._dynamo.utils.counters["inductor"].get("cudagraph_skips", 0) == 0


def test_eager_on_a_side_stream():
    step = decode_case(3, unified=False)
    x = step.tensors("cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        results = decode_program(step.compress_base, **vars(x))
    side.synchronize()
    assert_matches(results, decode_expected(step))
