"""Values the validation cannot see (they live in device memory) never make an
op write outside a token's own slice or outside its output, and batch ids past
the table act as padding. Each case gives one token t0 a bad value and checks
that every cell outside t0's slices is what it is when t0 is padding; the
outputs are views into larger buffers whose tail must stay untouched."""
import random

import pytest
import torch

import ukv_torch
from support.devices import DEVICES
from support.index_cases import SENTINEL, make_decode_step, make_prefill_step
from ukv_torch.testing import index_reference as ref

T0 = 2
GUARD = 16


def guarded_outputs(indptrs, device):
    """Sentinel outputs, each a view of a buffer GUARD cells longer."""
    bases = [torch.full((p[-1] + GUARD,), SENTINEL, dtype=torch.int32, device=device) for p in indptrs]
    return bases, [b[: p[-1]] for b, p in zip(bases, indptrs)]


def assert_confined(bad, padded, indptrs, t0=T0):
    for bad_cells, pad_cells, ptr in zip(bad, padded, indptrs):
        lo, hi = ptr[t0], ptr[t0 + 1]
        assert bad_cells[:lo] == pad_cells[:lo] and bad_cells[hi:] == pad_cells[hi:]
        assert bad_cells[ptr[-1]:] == [SENTINEL] * GUARD


def decode_step(rng):
    step = make_decode_step(rng, contexts=[300, 900, 1000, 2000], num_padding=2, index_topk=64)
    return step, [list(p) for p in ref.decode_metadata(step.positions, step.batch_id, step.n_csa, step.n_hca,
                                                       step.window, step.index_topk)]


def run_decode_ops(step, indptrs, device, edit):
    """paged_decode + csa + hca decode with `edit(tensors)` applied to the inputs."""
    x = step.tensors(device)
    edit(x)
    ptrs = [torch.tensor(p, dtype=torch.int32, device=device) for p in indptrs]
    bases, (swa, csa, hca) = guarded_outputs(indptrs, device)
    ukv_torch.paged_decode_indices(x.swa_table, x.positions, x.batch_id, ptrs[0], swa, ptrs[1], csa, ptrs[2], hca,
                                   window=step.window, block_size=step.block_size)
    ukv_torch.csa_translate_pack(x.topk, x.csa_table, x.positions, x.batch_id, ptrs[1], csa,
                                 compress_base=step.compress_base, window=step.window, block_size=step.block_size)
    ukv_torch.hca_decode_indices(x.hca_table, x.batch_id, x.n_hca, ptrs[2], hca, compress_base=step.compress_base,
                                 block_size=step.block_size)
    return [b.tolist() for b in bases]


def pad_t0(x):
    x.batch_id[T0] = -1


DECODE_EDITS = {
    "huge_position": lambda x: x.positions.__setitem__(T0, 2**40),
    "int32_max_position": lambda x: x.positions.__setitem__(T0, 2**31 - 1),
    "negative_position": lambda x: x.positions.__setitem__(T0, -(2**40)),
    "garbage_topk": lambda x: x.topk[T0].copy_(torch.randint(-(2**31), 2**31 - 1, x.topk[T0].shape)),
    "huge_n_committed_hca": lambda x: x.n_hca.__setitem__(int(x.batch_id[T0]), 2**31 - 1),
    "negative_n_committed_hca": lambda x: x.n_hca.__setitem__(int(x.batch_id[T0]), -5),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("edit", list(DECODE_EDITS), ids=list(DECODE_EDITS))
def test_decode_bad_values_stay_in_slice(device, edit):
    step, indptrs = decode_step(random.Random(0))
    bad = run_decode_ops(step, indptrs, device, DECODE_EDITS[edit])
    assert_confined(bad, run_decode_ops(step, indptrs, device, pad_t0), indptrs)


@pytest.mark.parametrize("device", DEVICES)
def test_decode_slices_shorter_than_needed(device):
    """An indptr that reserves less than the formulas need: the token's rows are
    cut at its own slice instead of spilling into its neighbours'."""
    step, indptrs = decode_step(random.Random(1))
    short = [p[: T0 + 1] + [v - 5 for v in p[T0 + 1:]] for p in indptrs]
    bad = run_decode_ops(step, short, device, lambda x: None)
    padded = run_decode_ops(step, short, device, pad_t0)
    assert_confined(bad, padded, short)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bid", [4, 10**6])
def test_batch_id_past_the_table_is_padding(device, bid):
    step, indptrs = decode_step(random.Random(2))
    assert step.num_seqs == 4
    outside = run_decode_ops(step, indptrs, device, lambda x: x.batch_id.__setitem__(T0, bid))
    assert outside == run_decode_ops(step, indptrs, device, pad_t0)
    x = step.tensors(device)
    x.batch_id[T0] = bid
    ptrs = [torch.zeros(len(step.positions) + 1, dtype=torch.int32, device=device) for _ in range(3)]
    ukv_torch.decode_index_metadata(x.positions, x.batch_id, x.n_csa, x.n_hca, *ptrs, window=step.window,
                                    index_topk=step.index_topk)
    assert all(int(p[T0 + 1]) == int(p[T0]) for p in ptrs)


def prefill_step(rng):
    # t0 is the only token of sequence 1 in this forward, so a bad per-sequence
    # value of that sequence affects t0 alone.
    step = make_prefill_step(rng, prefixes=[0, 500, 3000], chunk_lens=[2, 1, 5], num_padding=1)
    assert step.batch_id.count(step.batch_id[T0]) == 1
    metadata = ref.prefill_metadata(step.positions, step.batch_id, step.chunk_start, step.n_csa, step.n_hca,
                                    step.window, step.index_topk)
    return step, [list(p) for p in metadata[:4]]


def run_prefill(step, indptrs, device, edit):
    x = step.tensors(device)
    edit(x)
    ptrs = [torch.tensor(p, dtype=torch.int32, device=device) for p in indptrs]
    bases, outs = guarded_outputs(indptrs, device)
    ukv_torch.paged_prefill_indices(x.positions, x.batch_id, x.chunk_start, x.query_start, x.n_hca, x.swa_table,
                                    x.hca_table, *ptrs, *outs, compress_base=step.compress_base, window=step.window,
                                    block_size=step.block_size)
    return [b.tolist() for b in bases]


def seq_of_t0(x):
    return int(x.batch_id[T0])


PREFILL_EDITS = {
    "chunk_start_after_position": lambda x: x.chunk_start.__setitem__(seq_of_t0(x), 2**31 - 1),
    "negative_chunk_start": lambda x: x.chunk_start.__setitem__(seq_of_t0(x), -(2**31)),
    "huge_position": lambda x: x.positions.__setitem__(T0, 2**40),
    "huge_n_committed_hca": lambda x: x.n_hca.__setitem__(seq_of_t0(x), 2**31 - 1),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("edit", list(PREFILL_EDITS), ids=list(PREFILL_EDITS))
def test_prefill_bad_values_stay_in_slice(device, edit):
    step, indptrs = prefill_step(random.Random(3))
    bad = run_prefill(step, indptrs, device, PREFILL_EDITS[edit])
    assert_confined(bad, run_prefill(step, indptrs, device, pad_t0), indptrs)
