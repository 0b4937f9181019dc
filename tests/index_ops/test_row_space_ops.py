"""The row-space layout's ops and arguments: swa_slot_mapping, apply_row_copies,
the SWA row constants of the paged ops and the compress block strides, each
against hand-computed rows and the reference
(ukv_torch/testing/index_reference.py), eager and under torch.compile."""
import random

import pytest
import torch

import ukv_torch
from support.devices import DEVICES
from support.index_cases import SENTINEL, make_decode_step, make_prefill_step, random_row_space
from support.index_steps import op_decode, op_prefill, reference_decode, reference_prefill
from support.row_copies import (copies_tensor, expected_bytes, fresh_case, plane_bytes, random_copy_case,
                                random_planes, run_and_compare)
from ukv_torch.testing import index_reference as ref


def i32(values, device):
    return torch.tensor(values, dtype=torch.int32, device=device)


# A small hand-checked layout: pages of 4 tokens, units of 30 rows, and three
# layer classes in them: dense rows 0..3 of the unit, CSA two groups of 2 rows
# 5 apart from row 12, HCA one row a group from row 25.
TABLE = [[2, -1, 5], [7, 1, 0]]
DENSE, CSA, HCA = [4, 30, 0, 4, 4], [4, 30, 12, 2, 5], [4, 30, 25, 1, 1]


@pytest.mark.parametrize("device", DEVICES)
def test_swa_slot_mapping_by_hand(device):
    # sequence 0: position 9 is page 2 (unit 5), q = 1; 5 is page 1 (not held); 0 is page 0 (unit 2)
    # sequence 1: position 7 is page 1 (unit 1), q = 3; 12 is past the 3 pages of the table
    positions = [9, 5, 0, 7, 12, -1, 3]
    batch_id = [0, 0, 0, 1, 1, 1, 2]
    # position -1 and batch id 2 (past the table) are -1 everywhere
    expected = {
        None: [2 * 128 + 9, 2 * 128 + 5, 2 * 128, 7 * 128 + 7, 7 * 128 + 12, -1, -1],  # one 128-token page each
        "dense": [5 * 30 + 1, -1, 2 * 30, 30 + 3, -1, -1, -1],
        "csa": [5 * 30 + 12 + 1, -1, 2 * 30 + 12, 30 + 12 + 5 + 1, -1, -1, -1],
        "hca": [5 * 30 + 25 + 1, -1, 2 * 30 + 25, 30 + 25 + 3, -1, -1, -1],
    }
    for name, rows in ((None, None), ("dense", DENSE), ("csa", CSA), ("hca", HCA)):
        for dtype in (torch.int32, torch.int64):
            out = torch.full((len(positions),), SENTINEL, dtype=torch.int32, device=device)
            ukv_torch.swa_slot_mapping(i32(TABLE, device), torch.tensor(positions, dtype=dtype, device=device),
                                       i32(batch_id, device), out, block_size=128, swa_rows=rows)
            assert out.tolist() == expected[name], name
            assert out.tolist() == ref.swa_slot_mapping(TABLE, positions, batch_id, 128, rows)


@pytest.mark.parametrize("device", DEVICES)
def test_swa_slot_mapping_past_the_table_is_minus_one(device):
    """Regression: a position whose page lies past the table's columns used to
    be mapped through the last column, to the row of another position of that
    page (rows 172 and 254 for positions 300 and 2**40 here), where an SWA
    writer would overwrite live KV."""
    out = torch.full((4,), SENTINEL, dtype=torch.int32, device=device)
    ukv_torch.swa_slot_mapping(i32([[0, 1]], device), torch.tensor([5, 255, 300, 2**40], device=device),
                               i32([0, 0, 0, 0], device), out, block_size=128)
    assert out.tolist() == [5, 128 + 127, -1, -1]


@pytest.mark.parametrize("device", DEVICES)
def test_paged_decode_rows_differ_per_class(device):
    """One decode token at position 9 with a window of 4 (positions 6..9,
    pages 1 and 2 of sequence 0): each output gets its class's rows."""
    ptr = i32([0, 4], device)
    outs = [torch.full((6,), SENTINEL, dtype=torch.int32, device=device) for _ in range(3)]
    ukv_torch.paged_decode_indices(i32(TABLE, device), i32([9], device), i32([0], device), ptr, outs[0], ptr, outs[1],
                                   ptr, outs[2], window=4, block_size=128, swa_rows=DENSE, csa_swa_rows=CSA,
                                   hca_swa_rows=HCA)
    # page 1 is -1 (read as unit 0): positions 6, 7 are q = 2, 3 of unit 0; 8, 9 are q = 0, 1 of unit 5
    assert outs[0].tolist()[:4] == [2, 3, 150, 151]
    assert outs[1].tolist()[:4] == [12 + 5, 12 + 5 + 1, 150 + 12, 150 + 13]
    assert outs[2].tolist()[:4] == [25 + 2, 25 + 3, 150 + 25, 150 + 26]
    assert all(o.tolist()[4:] == [SENTINEL] * 2 for o in outs)


@pytest.mark.parametrize("device", DEVICES)
def test_swa_only_decode_ignores_the_other_classes_units(device):
    """Regression: an SWA-only call (no CSA/HCA outputs, an MTP draft layer) of
    pages other than block_size was refused for the default CSA/HCA constants
    it does not use ("csa_swa_rows must have swa_rows' page tokens and unit
    rows (4, 30), got (128, 128)"). Written outputs still must agree."""
    table, ptr = i32(TABLE, device), i32([0, 4], device)
    expected = [2, 3, 150, 151]
    for other in (None, [8, 16, 0, 8, 8]):
        out = torch.full((4,), SENTINEL, dtype=torch.int32, device=device)
        ukv_torch.paged_decode_indices(table, i32([9], device), i32([0], device), ptr, out, window=4, block_size=128,
                                       swa_rows=DENSE, csa_swa_rows=other, hca_swa_rows=other)
        assert out.tolist() == expected
    out = torch.full((4,), SENTINEL, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match=r"^paged_decode_indices: hca_swa_rows must have swa_rows' page tokens"):
        ukv_torch.paged_decode_indices(table, i32([9], device), i32([0], device), ptr, out, None, None, ptr,
                                       out.clone(), window=4, block_size=128, swa_rows=DENSE, csa_swa_rows=None)
    assert out.tolist() == [SENTINEL] * 4


@pytest.mark.parametrize("device", DEVICES)
def test_compress_block_stride_by_hand(device):
    """row = compress_base + table[b][e // k] * stride + e % k."""
    table = i32([[3, 0, 2]], device)
    out = torch.full((8,), SENTINEL, dtype=torch.int32, device=device)
    ukv_torch.hca_decode_indices(table, i32([0], device), i32([6], device), i32([0, 6], device), out,
                                 compress_base=1000, compress_ratio=64, block_size=128, block_stride=50)
    assert out.tolist() == [1150, 1151, 1000, 1001, 1100, 1101, SENTINEL, SENTINEL]
    topk = i32([[5, 0, 3, 77]], device)  # lane 3 is past valid_k = 4 - 1 (one window row)
    out = torch.full((4,), SENTINEL, dtype=torch.int32, device=device)
    ukv_torch.csa_translate_pack(topk, table, i32([0], device), i32([0], device), i32([0, 4], device), out,
                                 compress_base=7, window=1, compress_ratio=64, block_size=128, block_stride=2**31 - 1)
    assert out.tolist() == [ref.as_int32(7 + 2 * (2**31 - 1) + 1), ref.as_int32(7 + 3 * (2**31 - 1)),
                            ref.as_int32(7 + 1), SENTINEL]


# --------------------------------------------------------- whole row-space steps --
def decode_shape(rng, n):
    return {"contexts": [rng.randint(1, 4000) for _ in range(n)], "q_lens": [rng.choice([1, 2, 3]) for _ in range(n)],
            "index_topk": rng.choice([8, 512])}


def prefill_shape(rng, n):
    return {"prefixes": [rng.choice([0, 1, 127, rng.randint(0, 3000)]) for _ in range(n)],
            "chunk_lens": [rng.randint(1, 200) for _ in range(n)], "index_topk": 64}


STEPS = {"decode": (make_decode_step, decode_shape, op_decode, reference_decode),
         "prefill": (make_prefill_step, prefill_shape, op_prefill, reference_prefill)}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", list(STEPS))
@pytest.mark.parametrize("block_size", [128, 256, 384])
@pytest.mark.parametrize("seed", range(6))
def test_steps_with_random_row_space(device, kind, block_size, seed):
    make, shape, run, reference = STEPS[kind]
    rng = random.Random(1000 * (kind == "decode") + seed)
    step = make(rng, **shape(rng, rng.randint(1, 6)), num_padding=rng.randint(0, 3), block_size=block_size,
                window=rng.choice([128, 20]), unified=seed % 2 == 0, row_space=True)
    assert run(step, device, positions_dtype=rng.choice([torch.int32, torch.int64]),
               strided_tables=seed % 3 == 0) == reference(step)


@pytest.mark.parametrize("device", DEVICES)
def test_every_class_has_its_own_rows(device):
    """The three outputs' SWA parts differ when the classes' constants do (the
    op writes each class's rows, not one row for all)."""
    rng = random.Random(5)
    rows = random_row_space(rng, 128, 32, 1, page=64)
    rows.swa_rows, rows.csa_swa_rows, rows.hca_swa_rows = ([64, 200, 0, 64, 64], [64, 200, 64, 32, 40],
                                                           [64, 200, 150, 1, 1])
    step = make_decode_step(rng, contexts=[300, 900], window=128, row_space=rows)
    result = op_decode(step, device)
    assert result == reference_decode(step)
    tails = {name: result[name][result[name + "_indptr"][1] - 128: result[name + "_indptr"][1]]
             for name in ("swa", "csa", "hca")}
    assert tails["swa"] != tails["csa"] != tails["hca"] != tails["swa"]
    slots = list(zip(*(result[f"{n}_slots"] for n in ("swa", "csa", "hca"))))
    held = [s for s in slots if s[0] >= 0]  # tokens whose page the table holds
    assert held and all(len(set(s)) == 3 for s in held)


# ----------------------------------------------------------- swa_slot_mapping --
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", range(8))
def test_swa_slot_mapping_random(device, seed):
    """Random tables with pages not held, padding batch ids (-1, past the table,
    int32 extremes), negative positions and positions past the table, in
    int32 and int64; enough tokens for several GPU blocks."""
    rng = random.Random(seed)
    num_seqs, block_size = rng.randint(1, 6), rng.choice([128, 256, 384])
    rows = random_row_space(rng, block_size, block_size // 4, block_size // 128).csa_swa_rows
    page = rows[0] if rows else block_size
    cols = rng.randint(1, 12)
    table = [[-1 if rng.random() < 0.2 else rng.randrange(300) for _ in range(cols)] for _ in range(num_seqs)]
    num_tokens = rng.choice([0, 1, 5, 127, 129, 700])
    batch_id = [rng.choice([-1, num_seqs, 2**31 - 1, -(2**31)]) if rng.random() < 0.15 else rng.randrange(num_seqs)
                for _ in range(num_tokens)]
    positions = [rng.choice([-1, -(2**31), cols * page, cols * page + 5, 2**31 - 1]) if rng.random() < 0.15
                 else rng.randrange(cols * page) for _ in range(num_tokens)]
    dtype = rng.choice([torch.int32, torch.int64])
    table_t = i32(table, device)
    if seed % 2:
        table_t = table_t.t().contiguous().t()  # column-major: any strides
    out = torch.full((num_tokens,), SENTINEL, dtype=torch.int32, device=device)
    ukv_torch.swa_slot_mapping(table_t, torch.tensor(positions, dtype=dtype, device=device), i32(batch_id, device), out,
                               block_size=block_size, swa_rows=rows)
    assert out.tolist() == ref.swa_slot_mapping(table, positions, batch_id, block_size, rows)


@pytest.mark.parametrize("device", DEVICES)
def test_swa_slot_mapping_int64_positions_past_int32(device):
    out = torch.full((3,), SENTINEL, dtype=torch.int32, device=device)
    ukv_torch.swa_slot_mapping(i32([[4] * 8], device), torch.tensor([2**40, -(2**40), 2**31], device=device),
                               i32([0, 0, 0], device), out, block_size=128, swa_rows=[128, 300, 1, 128, 128])
    assert out.tolist() == [-1, -1, -1]


# ----------------------------------------------------------- apply_row_copies --
@pytest.mark.parametrize("device", DEVICES)
def test_apply_row_copies_phases_run_in_order(device):
    """Phase 1 reads the rows phase 0 wrote and overwrites a row phase 0 read;
    phase 2's count runs past the list, which has one entry left for it."""
    tens = torch.arange(10, dtype=torch.int64, device=device).reshape(10, 1) * 10
    wide = torch.arange(40, dtype=torch.float32, device=device).reshape(10, 4)
    copies = i32([[0, 5, 2],   # phase 0: rows 0, 1 -> 5, 6
                  [5, 8, 2],   # phase 1: rows 5, 6 (phase 0's copies of rows 0, 1) -> 8, 9
                  [7, 0, 1],   # phase 1: row 7 -> 0, a row phase 0 read
                  [2, 3, 1]],  # phase 2 (count 7): the one entry left
                 device)
    ukv_torch.apply_row_copies([tens, wide], copies, i32([1, 2, 7], device))
    source = [7, 1, 2, 2, 4, 0, 1, 7, 0, 1]  # the original row each row holds now
    assert tens.flatten().tolist() == [10 * r for r in source]
    assert wide.tolist() == [[4.0 * r + j for j in range(4)] for r in source]


@pytest.mark.gpu
def test_apply_row_copies_skips_entries_outside_the_planes_on_the_device():
    plane = torch.arange(8, dtype=torch.int32, device="cuda").reshape(8, 1)
    copies = i32([[6, 0, 3], [0, 6, 3], [-1, 0, 1], [0, -1, 1], [0, 1, 0], [1, 0, -2], [2**31 - 1, 0, 1],
                  [0, 0, 2**31 - 1], [6, 0, 2]], "cuda")
    ukv_torch.apply_row_copies([plane], copies, i32([9], "cuda"))
    assert plane.flatten().tolist() == [6, 7, 2, 3, 4, 5, 6, 7]


@pytest.mark.gpu
def test_apply_row_copies_skips_an_entry_whose_ranges_overlap_on_the_device():
    """A parallel copy of overlapping ranges has no defined result: skipped,
    while a touching but disjoint pair of ranges is copied."""
    plane = torch.arange(8, dtype=torch.int32, device="cuda").reshape(8, 1)
    ukv_torch.apply_row_copies([plane], i32([[0, 2, 3], [3, 1, 3], [4, 4, 1], [0, 6, 2]], "cuda"), i32([4], "cuda"))
    assert plane.flatten().tolist() == [0, 1, 2, 3, 4, 5, 0, 1]


@pytest.mark.parametrize("entry", [[6, 0, 3], [-1, 0, 1], [0, -1, 1], [0, 1, 0], [1, 0, -2], [2**31 - 1, 0, 1],
                                   [0, 0, 2**31 - 1], [0, 2, 3]])
def test_apply_row_copies_refuses_a_bad_entry_on_the_host(entry):
    """Outside the planes, no rows, or overlapping itself: refused naming the entry, nothing copied."""
    plane = torch.arange(8, dtype=torch.int32).reshape(8, 1)
    with pytest.raises(ValueError, match=r"apply_row_copies: copies\[1\] = \(" + f"{entry[0]}, {entry[1]}"):
        ukv_torch.apply_row_copies([plane], i32([[4, 5, 1], entry], "cpu"), i32([2], "cpu"))
    assert plane.flatten().tolist() == list(range(8))
    ukv_torch.apply_row_copies([plane], i32([[3, 1, 2], [6, 5, 1]], "cpu"), i32([2], "cpu"))  # touching, disjoint: copied
    assert plane.flatten().tolist() == [0, 3, 4, 3, 4, 6, 6, 7]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("counts", [[], [0], [0, 0, 0], [-5, 2], [2**31 - 1], [-(2**31), 2**31 - 1], [1, -1, 1]])
def test_apply_row_copies_counts(device, counts):
    """Negative counts are empty phases, counts past the list are clamped."""
    plane = torch.arange(6, dtype=torch.int32, device=device).reshape(6, 1)
    copies = [[0, 3, 1], [1, 4, 1]]
    expected = [[r] for r in range(6)]
    ref.apply_row_copies([expected], copies, counts)
    ukv_torch.apply_row_copies([plane], i32(copies, device), i32(counts, device))
    assert plane.tolist() == expected


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", range(16))
def test_apply_row_copies_random(device, seed):
    """1 to 4 planes of random dtypes and widths (1..128 elements: rows of
    whole 16-byte groups and not), random phases of disjoint copies with
    out-of-range entries, clamped and negative counts."""
    rng = random.Random(seed)
    num_rows = rng.choice([1, 2, 17, 64, 300])
    planes = random_planes(rng, num_rows, device)
    for invalid in (True, False):  # on the host an invalid list is refused: a valid one must run too
        run_and_compare(planes, random_copy_case(rng, num_rows, max_copies=rng.choice([1, 8, 40]), invalid=invalid),
                        device)


@pytest.mark.parametrize("device", DEVICES)
def test_apply_row_copies_many_copies_and_long_rows(device):
    """More entries than the GPU's blocks of a phase (each block takes several),
    copies of many rows, 16-byte rows and odd ones, a plane not 16-byte aligned."""
    rng = random.Random(99)
    num_rows = 4096
    planes = random_planes(rng, num_rows, device, num_planes=3, widths=(16, 64, 7))
    storage = torch.zeros(num_rows * 33 + 1, dtype=torch.uint8, device=device)
    planes.append(storage[1:].view(num_rows, 33))  # starts one byte into its storage
    planes[-1].copy_(torch.randint(0, 256, (num_rows, 33), dtype=torch.uint8).to(device))
    many = random_copy_case(rng, num_rows, num_phases=3, max_copies=3000, max_rows=3)
    assert min(many.counts) > 256  # a block takes several entries of a phase
    run_and_compare(planes, many, device)
    run_and_compare(planes, random_copy_case(rng, num_rows, num_phases=3, max_copies=40, max_rows=400,
                                             invalid=False), device)


@pytest.mark.parametrize("device", DEVICES)
def test_apply_row_copies_leaves_other_bytes_alone(device):
    """Planes that are views into a larger buffer: nothing around them changes."""
    rng = random.Random(3)
    storage = torch.randint(0, 256, (4096,), dtype=torch.uint8).to(device)
    before = storage.clone()
    plane = storage[100:100 + 20 * 12].view(20, 12)
    case = random_copy_case(rng, 20, num_phases=3)
    run_and_compare([plane], case, device)
    assert torch.equal(storage[:100], before[:100]) and torch.equal(storage[340:], before[340:])


@pytest.mark.parametrize("device", DEVICES)
def test_apply_row_copies_empty_inputs(device):
    plane = torch.arange(4, dtype=torch.int32, device=device).reshape(4, 1)
    ukv_torch.apply_row_copies([plane], torch.zeros(0, 3, dtype=torch.int32, device=device), i32([3], device))
    ukv_torch.apply_row_copies([plane], i32([[0, 1, 1]], device), torch.zeros(0, dtype=torch.int32, device=device))
    assert plane.flatten().tolist() == [0, 1, 2, 3]


@pytest.mark.gpu
def test_apply_row_copies_gpu_matches_the_reference_on_any_list():
    """Random lists, bad entries and counts among them (which the host
    refuses and the GPU skips), against the reference."""
    for seed in range(6):
        planes, case = fresh_case(seed, 257, "cuda", max_copies=60)
        run_and_compare(planes, case, "cuda")


@pytest.mark.gpu
def test_apply_row_copies_gpu_spreads_large_copies_over_chunks():
    """What the GPU cuts into chunks of its whole grid: copies of thousands of
    rows (many chunks each, the last one partial), rows wider than a chunk,
    and a phase of more entries than a scan pass holds, against the CPU."""
    rng = random.Random(7)
    for widths, num_rows, max_rows, max_copies in (((448, 128), 60000, 9000, 6), ((40000,), 64, 5, 8),
                                                   ((16, 7), 5000, 3, 700)):
        planes = [torch.randint(0, 256, (num_rows, w), dtype=torch.uint8) for w in widths]
        case = random_copy_case(rng, num_rows, num_phases=2, max_copies=max_copies, max_rows=max_rows, invalid=False)
        on_gpu = [p.cuda() for p in planes]
        counts = torch.tensor(case.counts, dtype=torch.int32)
        torch.ops.ukv.apply_row_copies.default(planes, copies_tensor(case, "cpu"), counts)
        torch.ops.ukv.apply_row_copies.default(on_gpu, copies_tensor(case, "cuda"), counts.cuda())
        assert all(torch.equal(g.cpu(), c) for g, c in zip(on_gpu, planes)), (widths, case.counts)


@pytest.mark.gpu
def test_new_ops_allocate_nothing_and_do_not_sync():
    """The GPU calls enqueue kernels only: no allocation, and they run while
    the stream is captured (a host sync there raises)."""
    planes, case = fresh_case(1, 64, "cuda")
    copies, counts = copies_tensor(case, "cuda"), torch.tensor(case.counts, dtype=torch.int32, device="cuda")
    table = i32(TABLE, "cuda")
    positions, batch_id = i32([9, 5, 0, 7], "cuda"), i32([0, 0, 0, 1], "cuda")
    out = torch.empty(4, dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()
    allocated = torch.cuda.memory_allocated()
    ukv_torch.apply_row_copies(planes, copies, counts)
    ukv_torch.swa_slot_mapping(table, positions, batch_id, out, block_size=128, swa_rows=CSA)
    assert torch.cuda.memory_allocated() == allocated
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ukv_torch.apply_row_copies(planes, copies, counts)
        ukv_torch.swa_slot_mapping(table, positions, batch_id, out, block_size=128, swa_rows=CSA)
    torch.cuda.synchronize()


# ------------------------------------------------------------- torch.compile --
BACKENDS = ["aot_eager", "inductor"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_swa_slot_mapping_compiled(backend):
    def program(table, positions, batch_id):
        out = torch.empty(positions.shape[0], dtype=torch.int32, device=positions.device)
        ukv_torch.swa_slot_mapping(table, positions, batch_id, out, block_size=128, swa_rows=CSA)
        return out + 0

    torch._dynamo.reset()
    compiled = torch.compile(program, fullgraph=True, backend=backend)
    for positions, batch_id in (([9, 5, 0, 7, 12], [0, 0, 0, 1, 1]), ([3, 2, 1], [1, -1, 0])):
        got = compiled(i32(TABLE, "cpu"), torch.tensor(positions), i32(batch_id, "cpu"))
        assert got.tolist() == ref.swa_slot_mapping(TABLE, positions, batch_id, 128, CSA)


@pytest.mark.parametrize("backend", BACKENDS)
def test_apply_row_copies_compiled(backend):
    def program(a, b, copies, counts):
        ukv_torch.apply_row_copies([a, b], copies, counts)
        return a.sum() + b.float().sum()

    torch._dynamo.reset()
    compiled = torch.compile(program, fullgraph=True, backend=backend)
    for seed in range(3):
        rng = random.Random(seed)
        planes = random_planes(rng, 40, "cpu", num_planes=2)
        planes = [planes[0].view(torch.uint8).contiguous(), torch.randn(40, 3)]
        case = random_copy_case(rng, 40, num_phases=3, invalid=False)
        expected = expected_bytes(planes, case)
        compiled(*planes, copies_tensor(case, "cpu"), torch.tensor(case.counts, dtype=torch.int32))
        assert [plane_bytes(p) for p in planes] == expected


def sentinel_outputs(indptrs, slack=6):
    return [torch.full((p[-1] + slack,), SENTINEL, dtype=torch.int32) for p in indptrs]


@pytest.mark.parametrize("backend", BACKENDS)
def test_row_space_decode_compiled(backend):
    """A decode step's paged ops with row-space arguments (and the SWA slots of
    each class) in one torch.compile(fullgraph=True) graph."""
    step = make_decode_step(random.Random(7), contexts=[300, 1000, 5], q_lens=[1, 2, 1], num_padding=2,
                            index_topk=16, row_space=True)
    expected = reference_decode(step)
    x = step.tensors("cpu")
    names = ("swa", "csa", "hca")
    ptrs = [i32(expected[f"{n}_indptr"], "cpu") for n in names]

    def program(outs, slots):
        ukv_torch.paged_decode_indices(x.swa_table, x.positions, x.batch_id, ptrs[0], outs[0], ptrs[1], outs[1],
                                       ptrs[2], outs[2], window=step.window, block_size=step.block_size,
                                       **step.swa_rows_kwargs())
        ukv_torch.csa_translate_pack(x.topk, x.csa_table, x.positions, x.batch_id, ptrs[1], outs[1],
                                     compress_base=step.compress_base, window=step.window,
                                     block_size=step.block_size, block_stride=step.csa_stride)
        ukv_torch.hca_decode_indices(x.hca_table, x.batch_id, x.n_hca, ptrs[2], outs[2],
                                     compress_base=step.compress_base, block_size=step.block_size,
                                     block_stride=step.hca_stride)
        for name, out in zip(names, slots):
            ukv_torch.swa_slot_mapping(x.swa_table, x.positions, x.batch_id, out, block_size=step.block_size,
                                       swa_rows=step.swa_rows_of(name))
        return [o + 0 for o in outs + slots]

    torch._dynamo.reset()
    outs = sentinel_outputs([expected[f"{n}_indptr"] for n in names])
    slots = [torch.full((len(step.positions),), SENTINEL, dtype=torch.int32) for _ in names]
    got = torch.compile(program, fullgraph=True, backend=backend)(outs, slots)
    assert [g.tolist() for g in got] == [expected[n] for n in names] + [expected[f"{n}_slots"] for n in names]


@pytest.mark.parametrize("backend", BACKENDS)
def test_row_space_prefill_compiled(backend):
    step = make_prefill_step(random.Random(8), prefixes=[0, 500, 3000], chunk_lens=[20, 7, 130], num_padding=1,
                             index_topk=16, row_space=True)
    expected = reference_prefill(step)
    x = step.tensors("cpu")
    names = ("extend", "swa", "csa", "hca")
    ptrs = [i32(expected[f"{n}_indptr"], "cpu") for n in names]
    prefix = i32(expected["prefix_swa_count"], "cpu")

    def program(outs):
        ukv_torch.paged_prefill_indices(x.positions, x.batch_id, x.chunk_start, x.query_start, x.n_hca, x.swa_table,
                                        x.hca_table, *ptrs, *outs, compress_base=step.compress_base,
                                        window=step.window, block_size=step.block_size,
                                        hca_block_stride=step.hca_stride, **step.swa_rows_kwargs())
        ukv_torch.csa_translate_pack(x.topk, x.csa_table, x.positions, x.batch_id, ptrs[2], outs[2],
                                     compress_base=step.compress_base, skip_per_token=prefix,
                                     block_size=step.block_size, block_stride=step.csa_stride)
        return [o + 0 for o in outs]

    torch._dynamo.reset()
    got = torch.compile(program, fullgraph=True, backend=backend)(
        sentinel_outputs([expected[f"{n}_indptr"] for n in names]))
    assert [g.tolist() for g in got] == [expected[n] for n in names]
