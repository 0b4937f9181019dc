"""Each index op on its own against the reference, on the shapes a whole step
does not reach: strided and wide top-k, large batches (the GPU's large-batch
configuration), unaligned outputs (the vector-store head and tail), SWA-only
decode, maximal and long HCA sections, and the decode-metadata edge cases;
the compress ops with the row-space layout's block strides too (k, or k plus
an envelope's other rows) and the paged ops with its SWA row constants."""
import random
from types import SimpleNamespace

import pytest
import torch

import ukv_torch
from support.devices import DEVICES
from support.index_cases import SENTINEL, make_decode_step, make_prefill_step, output_buffer, reference_buffer
from ukv_torch.testing import index_reference as ref


def unaligned_output(length, offset, device):
    """A sentinel output that starts `offset` int32s into its storage."""
    return torch.full((length + offset,), SENTINEL, dtype=torch.int32, device=device)[offset:]


def decode_indptrs(step):
    return ref.decode_metadata(step.positions, step.batch_id, step.n_csa, step.n_hca, step.window, step.index_topk)


# The compress ops' block stride: None (k), or k plus this many rows.
STRIDE_EXTRA = [None, 0, 37]


def stride_of(extra, k):
    return None if extra is None else k + extra


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["contiguous", "row_padded", "column_major"])
@pytest.mark.parametrize("offset", [0, 1, 2, 3])
@pytest.mark.parametrize("extra", STRIDE_EXTRA)
def test_csa_translate_pack_decode(device, layout, offset, extra):
    rng = random.Random(offset)
    step = make_decode_step(rng, contexts=[1, 2, 3, 4, 17, 900, 5000, 9000], q_lens=[1, 1, 1, 2, 1, 3, 1, 2],
                            num_padding=2, index_topk=1200, unified=offset % 2 == 0)
    x = step.tensors(device)
    topk, table = x.topk, x.csa_table
    if layout == "row_padded":
        topk = torch.cat([topk, torch.full_like(topk[:, :5], 77)], dim=1)[:, : step.index_topk]
    elif layout == "column_major":  # the table too: the kernels' strided-column path
        topk, table = topk.t().contiguous().t(), table.t().contiguous().t()
    _, csa_ptr, _ = decode_indptrs(step)
    out = unaligned_output(csa_ptr[-1] + 6, offset, device)
    stride = stride_of(extra, step.csa_k)
    ukv_torch.csa_translate_pack(topk, table, x.positions, x.batch_id, torch.tensor(csa_ptr, dtype=torch.int32,
                                 device=device), out, compress_base=step.compress_base, window=step.window,
                                 block_size=step.block_size, block_stride=stride)
    expected = reference_buffer(csa_ptr)
    ref.csa_translate_pack(expected, step.topk, step.csa_table, step.positions, step.batch_id, csa_ptr, None,
                           step.window, step.compress_base, step.csa_k, stride)
    assert out.tolist() == expected


@pytest.mark.parametrize("device", DEVICES)
def test_csa_translate_pack_zero_valid_topk(device):
    """Positions 0..2 see no committed CSA entry: nothing is written for them."""
    rng = random.Random(1)
    step = make_decode_step(rng, contexts=[1, 2, 3], index_topk=8)
    x = step.tensors(device)
    _, csa_ptr, _ = decode_indptrs(step)
    assert all(step.csa_valid_k(t) == 0 for t in range(3))
    out = output_buffer(csa_ptr, device)
    ukv_torch.csa_translate_pack(x.topk, x.csa_table, x.positions, x.batch_id,
                                 torch.tensor(csa_ptr, dtype=torch.int32, device=device), out, compress_base=0,
                                 window=step.window, block_size=step.block_size)
    assert out.tolist() == reference_buffer(csa_ptr)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("offset", [0, 3])
@pytest.mark.parametrize("extra", STRIDE_EXTRA)
def test_large_decode_batch(device, offset, extra):
    """More tokens than the small-batch threshold: the GPU's bandwidth configuration."""
    rng = random.Random(2)
    contexts = [rng.randint(4000, 9000) for _ in range(700)]
    step = make_decode_step(rng, contexts=contexts, num_padding=20, index_topk=1024, unified=False)
    x = step.tensors(device, torch.int32)
    swa_ptr, csa_ptr, hca_ptr = (torch.tensor(p, dtype=torch.int32, device=device) for p in decode_indptrs(step))
    csa = unaligned_output(int(csa_ptr[-1]) + 6, offset, device)
    hca = unaligned_output(int(hca_ptr[-1]) + 6, offset, device)
    csa_stride, hca_stride = stride_of(extra, step.csa_k), stride_of(extra, step.hca_k)
    ukv_torch.csa_translate_pack(x.topk, x.csa_table, x.positions, x.batch_id, csa_ptr, csa,
                                 compress_base=step.compress_base, window=step.window, block_size=step.block_size,
                                 block_stride=csa_stride)
    ukv_torch.hca_decode_indices(x.hca_table, x.batch_id, x.n_hca, hca_ptr, hca, compress_base=step.compress_base,
                                 block_size=step.block_size, block_stride=hca_stride)
    expected_csa, expected_hca = reference_buffer(csa_ptr.tolist()), reference_buffer(hca_ptr.tolist())
    ref.csa_translate_pack(expected_csa, step.topk, step.csa_table, step.positions, step.batch_id, csa_ptr.tolist(),
                           None, step.window, step.compress_base, step.csa_k, csa_stride)
    ref.hca_decode_indices(expected_hca, step.hca_table, step.batch_id, step.n_hca, hca_ptr.tolist(),
                           step.compress_base, step.hca_k, hca_stride)
    assert csa.tolist() == expected_csa
    assert hca.tolist() == expected_hca


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("row_space", [False, True], ids=["slots", "row_space"])
def test_paged_decode_swa_only(device, row_space):
    """SWA-only (MTP draft) layers pass no CSA/HCA buffers."""
    rng = random.Random(3)
    step = make_decode_step(rng, contexts=[1, 50, 128, 129, 1000], num_padding=3, window=128, row_space=row_space)
    x = step.tensors(device)
    swa_ptr, _, _ = decode_indptrs(step)
    out = output_buffer(swa_ptr, device)
    ukv_torch.paged_decode_indices(x.swa_table, x.positions, x.batch_id,
                                   torch.tensor(swa_ptr, dtype=torch.int32, device=device), out, window=step.window,
                                   block_size=step.block_size, swa_rows=step.swa_rows_of("swa"))
    expected = reference_buffer(swa_ptr)
    ref.paged_decode_indices([(swa_ptr, expected)], step.swa_table, step.positions, step.batch_id, step.window,
                             step.block_size, [step.swa_rows_of("swa")])
    assert out.tolist() == expected


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("offset", [0, 1, 2, 3])
@pytest.mark.parametrize("extra", STRIDE_EXTRA)
def test_hca_decode_maximal_and_long(device, offset, extra):
    """Every table column committed (n_hca == table width), at a small and a long
    table (the GPU splits a long section over several blocks at small batches)."""
    rng = random.Random(4)
    for cols in (3, 2000):
        step = make_decode_step(rng, contexts=[cols * 128, cols * 128 - 1, 128], table_cols=cols,
                                unified=offset % 2 == 1)
        assert step.n_hca[0] == cols
        x = step.tensors(device)
        _, _, hca_ptr = decode_indptrs(step)
        out = unaligned_output(hca_ptr[-1] + 6, offset, device)
        stride = stride_of(extra, step.hca_k)
        ukv_torch.hca_decode_indices(x.hca_table, x.batch_id, x.n_hca,
                                     torch.tensor(hca_ptr, dtype=torch.int32, device=device), out,
                                     compress_base=step.compress_base, block_size=step.block_size,
                                     block_stride=stride)
        expected = reference_buffer(hca_ptr)
        ref.hca_decode_indices(expected, step.hca_table, step.batch_id, step.n_hca, hca_ptr, step.compress_base,
                               step.hca_k, stride)
        assert out.tolist() == expected


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("row_space", [False, True], ids=["slots", "row_space"])
def test_prefill_long_chunk_at_long_prefix(device, row_space):
    """A chunk late in a long context: long HCA runs after the SWA prefix head."""
    rng = random.Random(5)
    step = make_prefill_step(rng, prefixes=[20000, 0], chunk_lens=[300, 130], index_topk=64, unified=False,
                             row_space=row_space)
    from support.index_steps import op_prefill, reference_prefill
    assert op_prefill(step, device, strided_tables=True) == reference_prefill(step)


@pytest.mark.parametrize("device", DEVICES)
def test_decode_metadata_many_tokens(device):
    """More tokens than one block scans: on the GPU each block sums every token before its segment."""
    rng = random.Random(6)
    contexts = [rng.randint(1, 3000) for _ in range(1500)]
    step = make_decode_step(rng, contexts=contexts, q_lens=[rng.randint(1, 3) for _ in contexts], num_padding=77)
    x = step.tensors(device)
    num_tokens = len(step.positions)
    ptrs = [torch.full((num_tokens + 1,), -1, dtype=torch.int32, device=device) for _ in range(3)]
    ukv_torch.decode_index_metadata(x.positions, x.batch_id, x.n_csa, x.n_hca, *ptrs, window=step.window,
                                    index_topk=step.index_topk)
    assert [p.tolist() for p in ptrs] == list(decode_indptrs(step))


@pytest.mark.parametrize("device", DEVICES)
def test_prefill_metadata_many_tokens(device):
    rng = random.Random(7)
    step = make_prefill_step(rng, prefixes=[0, 129, 5000], chunk_lens=[1000, 900, 600], num_padding=30)
    x = step.tensors(device)
    num_tokens = len(step.positions)
    ptrs = [torch.full((num_tokens + 1,), -1, dtype=torch.int32, device=device) for _ in range(4)]
    prefix = torch.full((num_tokens,), -1, dtype=torch.int32, device=device)
    ukv_torch.prefill_index_metadata(x.positions, x.batch_id, x.chunk_start, x.n_csa, x.n_hca, *ptrs, prefix,
                                     window=step.window, index_topk=step.index_topk)
    expected = ref.prefill_metadata(step.positions, step.batch_id, step.chunk_start, step.n_csa, step.n_hca,
                                    step.window, step.index_topk)
    assert [p.tolist() for p in ptrs] + [prefix.tolist()] == list(expected)


# One block up to 1024 tokens (128-thread blocks up to 128), then one block per
# 1024 tokens, each summing every token before its segment; past 128 blocks
# (131072 tokens) a block scans its segment in several passes.
METADATA_SIZES = [1, 63, 64, 65, 128, 129, 1000, 1024, 1025, 4096, 4097, 16384, 40000, 140000]


def metadata_inputs(num_tokens, seed, positions_dtype):
    """Sorted batch ids with a padded tail (-1) and scattered padding (-1 and
    past the last sequence), positions anywhere, per-sequence counts with a
    few negative values; prefill's chunk_start too."""
    g = torch.Generator().manual_seed(seed)
    num_seqs = max(1, num_tokens // 3)
    batch_id = torch.randint(0, num_seqs, (num_tokens,), generator=g).sort().values
    batch_id[torch.rand(num_tokens, generator=g) < 0.03] = -1
    batch_id[torch.rand(num_tokens, generator=g) < 0.01] = num_seqs + 5
    batch_id[num_tokens - num_tokens // 10:] = -1
    counts = lambda hi: torch.randint(-3, hi, (num_seqs,), generator=g, dtype=torch.int32)
    return SimpleNamespace(
        positions=torch.randint(-2, 300000, (num_tokens,), generator=g).to(positions_dtype),
        batch_id=batch_id.to(torch.int32), n_csa=counts(70000), n_hca=counts(2400), chunk_start=counts(300000))


def run_metadata(x, device, prefill):
    """The metadata op's outputs for x on device, as CPU tensors."""
    x = SimpleNamespace(**{k: v.to(device) for k, v in vars(x).items()})
    num_tokens = x.batch_id.shape[0]
    num_indptrs = 4 if prefill else 3
    ptrs = [torch.full((num_tokens + 1,), SENTINEL, dtype=torch.int32, device=device) for _ in range(num_indptrs)]
    if prefill:
        prefix = torch.full((num_tokens,), SENTINEL, dtype=torch.int32, device=device)
        ukv_torch.prefill_index_metadata(x.positions, x.batch_id, x.chunk_start, x.n_csa, x.n_hca, *ptrs, prefix,
                                         window=128, index_topk=512)
        ptrs.append(prefix)
    else:
        ukv_torch.decode_index_metadata(x.positions, x.batch_id, x.n_csa, x.n_hca, *ptrs, window=128, index_topk=512)
    return [p.cpu() for p in ptrs]


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("prefill", [False, True], ids=["decode", "prefill"])
@pytest.mark.parametrize("num_tokens", METADATA_SIZES)
@pytest.mark.parametrize("positions_dtype", [torch.int64, torch.int32])
def test_metadata_gpu_matches_cpu(device, num_tokens, prefill, positions_dtype):
    """The multi-block GPU scan against the CPU op, at every launch shape."""
    x = metadata_inputs(num_tokens, num_tokens, positions_dtype)
    for got, want in zip(run_metadata(x, device, prefill), run_metadata(x, "cpu", prefill)):
        assert torch.equal(got, want)
