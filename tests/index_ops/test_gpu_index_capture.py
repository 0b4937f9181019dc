"""GPU-only: the index ops inside CUDA graphs and torch.compile.

A decode step (metadata builder + the three decode ops + the SWA slots of
each layer class) and a prefill step (metadata builder +
paged_prefill_indices + csa_translate_pack + the SWA slots) are captured once
on static buffers and replayed with new contents each time, in the slot
layouts and with row-space arguments; every replay must equal the reference.
The same steps run under torch.compile with fullgraph=True and with
mode="reduce-overhead" (CUDA graphs through inductor), which fails if an op
launches on the wrong stream or cannot be captured. apply_row_copies is
captured once and replayed with new copies and phase counts in device memory."""
import random

import pytest
import torch

import ukv_torch
from support.index_cases import SENTINEL, RowSpaceArgs, make_decode_step, make_prefill_step, swa_rows_kwargs
from support.index_steps import PREFILL_BUFFERS, SWA_CLASSES, reference_decode, reference_prefill, reference_slots
from support.row_copies import CopyCase, expected_bytes, plane_bytes, random_copy_case

pytestmark = pytest.mark.gpu

NUM_SEQS, TABLE_COLS, WINDOW, TOPK, BLOCK_SIZE = 6, 40, 128, 256, 128
DECODE_TOKENS = NUM_SEQS + 3
PREFILL_TOKENS = 96
CAPACITY = 1 << 16
# The row-space arguments of the captured steps: pages of 64 tokens in units of
# 200 rows, each class its own rows; envelopes past k for both compress types.
ROW_SPACE = RowSpaceArgs([64, 200, 0, 64, 64], [64, 200, 64, 32, 40], [64, 200, 150, 1, 1], csa_stride=32 + 50,
                         hca_stride=1 + 300, page=64)
LAYOUTS = [None, ROW_SPACE]
LAYOUT_IDS = ["slots", "row_space"]


def swa_cols(row_space):
    """The SWA table's columns: one per block, or per page of the row space (plus one)."""
    return TABLE_COLS if row_space is None else -(-TABLE_COLS * BLOCK_SIZE // row_space.page) + 1


def decode_case(seed, unified, row_space=None):
    rng = random.Random(seed)
    contexts = [rng.choice([1, 3, 128, 129, rng.randint(1, TABLE_COLS * BLOCK_SIZE)]) for _ in range(NUM_SEQS)]
    return make_decode_step(rng, contexts=contexts, num_padding=DECODE_TOKENS - NUM_SEQS, table_cols=TABLE_COLS,
                            index_topk=TOPK, window=WINDOW, block_size=BLOCK_SIZE, unified=unified,
                            row_space=row_space)


def prefill_case(seed, unified, row_space=None):
    rng = random.Random(seed)
    chunk_lens = [rng.randint(1, 30) for _ in range(3)]
    prefixes = [rng.choice([0, 127, rng.randint(0, 3000)]) for _ in range(3)]
    step = make_prefill_step(rng, prefixes=prefixes, chunk_lens=chunk_lens,
                             num_padding=PREFILL_TOKENS - sum(chunk_lens), index_topk=TOPK, window=WINDOW,
                             block_size=BLOCK_SIZE, unified=unified, row_space=row_space)
    # Same table shape every time, so the captured graph can be reused.
    for table, cols in ((step.swa_table, swa_cols(row_space)), (step.csa_table, TABLE_COLS),
                        (step.hca_table, TABLE_COLS)):
        for row in table:
            row.extend([0] * (cols - len(row)))
    return step


def sentinel(n):
    return torch.full((n,), SENTINEL, dtype=torch.int32, device="cuda")


def slot_mappings(row_space, swa_table, positions, batch_id):
    """The SWA slots of the forward's tokens, one tensor per layer class."""
    slots = []
    for name in SWA_CLASSES:
        out = sentinel(batch_id.shape[0])
        ukv_torch.swa_slot_mapping(swa_table, positions, batch_id, out, block_size=BLOCK_SIZE,
                                   swa_rows=None if row_space is None else row_space.swa_rows_of(name))
        slots.append(out)
    return slots


def make_decode_program(row_space=None):
    stride = {} if row_space is None else {"csa": row_space.csa_stride, "hca": row_space.hca_stride}

    def decode_program(base, positions, batch_id, swa_table, csa_table, hca_table, n_csa, n_hca, topk, **_):
        """The decode step; returns (indptrs..., buffers..., slots...)."""
        n = batch_id.shape[0]
        ptrs = [torch.empty(n + 1, dtype=torch.int32, device="cuda") for _ in range(3)]
        outs = [sentinel(CAPACITY) for _ in range(3)]
        ukv_torch.decode_index_metadata(positions, batch_id, n_csa, n_hca, *ptrs, window=WINDOW, index_topk=TOPK)
        ukv_torch.paged_decode_indices(swa_table, positions, batch_id, ptrs[0], outs[0], ptrs[1], outs[1], ptrs[2],
                                       outs[2], window=WINDOW, block_size=BLOCK_SIZE, **swa_rows_kwargs(row_space))
        ukv_torch.csa_translate_pack(topk, csa_table, positions, batch_id, ptrs[1], outs[1], compress_base=base,
                                     window=WINDOW, block_size=BLOCK_SIZE, block_stride=stride.get("csa"))
        ukv_torch.hca_decode_indices(hca_table, batch_id, n_hca, ptrs[2], outs[2], compress_base=base,
                                     block_size=BLOCK_SIZE, block_stride=stride.get("hca"))
        return (*ptrs, *outs, *slot_mappings(row_space, swa_table, positions, batch_id))
    return decode_program


def make_prefill_program(row_space=None):
    stride = {} if row_space is None else {"csa": row_space.csa_stride, "hca": row_space.hca_stride}

    def prefill_program(base, positions, batch_id, swa_table, csa_table, hca_table, n_csa, n_hca, chunk_start,
                        query_start, topk):
        """The prefill step; returns (indptrs..., prefix_swa_count, buffers..., slots...)."""
        n = batch_id.shape[0]
        ptrs = [torch.empty(n + 1, dtype=torch.int32, device="cuda") for _ in range(4)]
        prefix = torch.empty(n, dtype=torch.int32, device="cuda")
        outs = [sentinel(CAPACITY) for _ in range(4)]
        ukv_torch.prefill_index_metadata(positions, batch_id, chunk_start, n_csa, n_hca, *ptrs, prefix,
                                         window=WINDOW, index_topk=TOPK)
        ukv_torch.paged_prefill_indices(positions, batch_id, chunk_start, query_start, n_hca, swa_table, hca_table,
                                        *ptrs, *outs, compress_base=base, window=WINDOW, block_size=BLOCK_SIZE,
                                        hca_block_stride=stride.get("hca"), **swa_rows_kwargs(row_space))
        ukv_torch.csa_translate_pack(topk, csa_table, positions, batch_id, ptrs[2], outs[2], compress_base=base,
                                     skip_per_token=prefix, block_size=BLOCK_SIZE, block_stride=stride.get("csa"))
        return (*ptrs, prefix, *outs, *slot_mappings(row_space, swa_table, positions, batch_id))
    return prefill_program


decode_program = make_decode_program()
prefill_program = make_prefill_program()


def slots_expected(step):
    slots = reference_slots(step)
    return [slots[f"{name}_slots"] for name in SWA_CLASSES]


def decode_expected(step):
    r = reference_decode(step)
    return [r["swa_indptr"], r["csa_indptr"], r["hca_indptr"], r["swa"], r["csa"], r["hca"]] + slots_expected(step)


def prefill_expected(step):
    r = reference_prefill(step)
    return ([r[n + "_indptr"] for n in PREFILL_BUFFERS] + [r["prefix_swa_count"]] + [r[n] for n in PREFILL_BUFFERS]
            + slots_expected(step))


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


KINDS = {"decode": (decode_case, make_decode_program, decode_expected),
         "prefill": (prefill_case, make_prefill_program, prefill_expected)}


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("unified", [True, False], ids=["unified", "static"])
@pytest.mark.parametrize("row_space", LAYOUTS, ids=LAYOUT_IDS)
def test_graph_replay_with_new_contents(kind, unified, row_space):
    make_case, make_program, expected = KINDS[kind]
    case = lambda seed, unified: make_case(seed, unified, row_space)  # noqa: E731
    program = make_program(row_space)
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
@pytest.mark.parametrize("row_space", LAYOUTS, ids=LAYOUT_IDS)
def test_compiled(kind, mode, row_space):
    make_case, make_program, expected = KINDS[kind]
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(make_program(row_space), fullgraph=True, mode=mode)
    for seed in range(3):
        step = make_case(seed, True, row_space)
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


# ------------------------------------------------------------ apply_row_copies --
PLANE_ROWS, MAX_COPIES, NUM_PHASES = 512, 700, 4


def new_planes(seed):
    """NoPE / RoPE / indexer-like planes of random bytes: bf16 of 576 and 64 columns, fp8 of 132."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (PLANE_ROWS, width * 2 if dtype == torch.bfloat16 else width), dtype=torch.uint8,
                          generator=g).view(dtype).to("cuda")
            for width, dtype in ((576, torch.bfloat16), (64, torch.bfloat16), (132, torch.float8_e4m3fn))]


def padded_case(seed):
    """A random case of NUM_PHASES phases, its copies padded to MAX_COPIES (zero-row entries, skipped)."""
    case = random_copy_case(random.Random(seed), PLANE_ROWS, num_phases=NUM_PHASES, max_copies=150, max_rows=8)
    assert len(case.copies) <= MAX_COPIES
    return CopyCase(case.copies + [[0, 0, 0]] * (MAX_COPIES - len(case.copies)), case.counts)


def test_row_copies_graph_replay_with_new_copies_and_counts():
    """Captured once; each replay reads the copies and the phase counts the
    device buffers hold then (nothing is baked in at capture)."""
    planes = new_planes(0)
    copies = torch.zeros(MAX_COPIES, 3, dtype=torch.int32, device="cuda")
    counts = torch.zeros(NUM_PHASES, dtype=torch.int32, device="cuda")
    first = padded_case(0)
    copies.copy_(torch.tensor(first.copies, dtype=torch.int32))
    counts.copy_(torch.tensor(first.counts, dtype=torch.int32))
    warmup = torch.cuda.Stream()
    warmup.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warmup):
        ukv_torch.apply_row_copies(planes, copies, counts)
    torch.cuda.current_stream().wait_stream(warmup)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ukv_torch.apply_row_copies(planes, copies, counts)
    for seed in range(1, 8):
        case = padded_case(seed)
        for plane, fresh in zip(planes, new_planes(seed)):
            plane.copy_(fresh)
        expected = expected_bytes(planes, case)
        copies.copy_(torch.tensor(case.copies, dtype=torch.int32))
        counts.copy_(torch.tensor(case.counts, dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        assert [plane_bytes(p) for p in planes] == expected, seed


def test_row_copies_compiled():
    def program(planes, copies, counts):
        ukv_torch.apply_row_copies(planes, copies, counts)

    torch._dynamo.reset()
    compiled = torch.compile(program, fullgraph=True)
    for seed in range(3):
        planes, case = new_planes(seed), padded_case(seed)
        expected = expected_bytes(planes, case)
        compiled(planes, torch.tensor(case.copies, dtype=torch.int32, device="cuda"),
                 torch.tensor(case.counts, dtype=torch.int32, device="cuda"))
        torch.cuda.synchronize()
        assert [plane_bytes(p) for p in planes] == expected
