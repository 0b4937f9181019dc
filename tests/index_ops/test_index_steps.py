"""Whole decode and prefill steps through the ops == the per-token reference,
and every reserved cell written (the slices reserve exactly the cells the
builders write: a top-k lane past valid_k is never written, so a larger
reservation would leave stale cells); in the slot layouts and with random row-space arguments (each
output class's SWA rows, the compress block strides)."""
import random

import pytest
import torch

from support.devices import DEVICES
from support.index_cases import SENTINEL, SLACK, make_decode_step, make_prefill_step
from support.index_steps import PREFILL_BUFFERS, op_decode, op_prefill, reference_decode, reference_prefill


def assert_every_reserved_cell_written(result, buffers):
    for name in buffers:
        end = result[name + "_indptr"][-1]
        cells = result[name]
        assert SENTINEL not in cells[:end], f"{name}: a reserved cell was not written"
        assert cells[end:] == [SENTINEL] * SLACK, f"{name}: written past the last slice"


def random_contexts(rng, n, max_ctx):
    edge = [1, 2, 3, 4, 5, 127, 128, 129, 255, 256, 257]
    return [rng.choice(edge) if rng.random() < 0.4 else rng.randint(1, max_ctx) for _ in range(n)]


ROW_SPACE = [False, True]
ROW_SPACE_IDS = ["slots", "row_space"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("unified", [True, False], ids=["unified", "static"])
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("row_space", ROW_SPACE, ids=ROW_SPACE_IDS)
def test_decode_step(device, unified, seed, row_space):
    rng = random.Random(seed)
    n = rng.randint(1, 12)
    step = make_decode_step(rng, contexts=random_contexts(rng, n, 4000), q_lens=[rng.choice([1, 1, 2, 3])
                            for _ in range(n)], num_padding=rng.randint(0, 5), index_topk=rng.choice([16, 64, 1024]),
                            window=rng.choice([128, 20]), unified=unified, row_space=row_space)
    result = op_decode(step, device, positions_dtype=rng.choice([torch.int32, torch.int64]),
                       strided_tables=rng.random() < 0.5)
    assert result == reference_decode(step)
    assert_every_reserved_cell_written(result, ("swa", "csa", "hca"))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("unified", [True, False], ids=["unified", "static"])
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("row_space", ROW_SPACE, ids=ROW_SPACE_IDS)
def test_prefill_step(device, unified, seed, row_space):
    rng = random.Random(100 + seed)
    n = rng.randint(1, 5)
    prefixes = [rng.choice([0, 0, 1, 100, 127, 128, 129, rng.randint(1, 3000)]) for _ in range(n)]
    chunk_lens = [rng.choice([1, 2, rng.randint(1, 300)]) for _ in range(n)]
    step = make_prefill_step(rng, prefixes=prefixes, chunk_lens=chunk_lens, num_padding=rng.randint(0, 4),
                             index_topk=rng.choice([16, 64, 1024]), window=rng.choice([128, 20]), unified=unified,
                             row_space=row_space)
    result = op_prefill(step, device, positions_dtype=rng.choice([torch.int32, torch.int64]),
                        strided_tables=rng.random() < 0.5)
    assert result == reference_prefill(step)
    assert_every_reserved_cell_written(result, PREFILL_BUFFERS)


@pytest.mark.parametrize("device", DEVICES)
def test_decode_block_size_256(device):
    """V4-Flash-DSpark blocks: CSA k = 64, HCA k = 2."""
    rng = random.Random(7)
    step = make_decode_step(rng, contexts=[1, 300, 700, 1024, 2049], block_size=256, index_topk=64)
    result = op_decode(step, device)
    assert result == reference_decode(step)
    assert_every_reserved_cell_written(result, ("swa", "csa", "hca"))


@pytest.mark.parametrize("device", DEVICES)
def test_prefill_block_size_256(device):
    rng = random.Random(8)
    step = make_prefill_step(rng, prefixes=[0, 600], chunk_lens=[300, 200], block_size=256, index_topk=64)
    result = op_prefill(step, device)
    assert result == reference_prefill(step)
    assert_every_reserved_cell_written(result, PREFILL_BUFFERS)


# Block size 384 makes every divisor of the index arithmetic a non-power of two
# (block 384, CSA k = 96, HCA k = 3), where the kernels' division by
# reciprocal multiplication differs most from a shift.
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("unified", [True, False], ids=["unified", "static"])
@pytest.mark.parametrize("row_space", ROW_SPACE, ids=ROW_SPACE_IDS)
def test_decode_non_power_of_two_block_size(device, unified, row_space):
    rng = random.Random(11)
    step = make_decode_step(rng, contexts=[1, 383, 384, 385, 1000, 5000], q_lens=[1, 2, 1, 3, 1, 2], num_padding=2,
                            block_size=384, index_topk=1024, unified=unified, row_space=row_space)
    result = op_decode(step, device, strided_tables=True)
    assert result == reference_decode(step)
    assert_every_reserved_cell_written(result, ("swa", "csa", "hca"))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("unified", [True, False], ids=["unified", "static"])
@pytest.mark.parametrize("row_space", ROW_SPACE, ids=ROW_SPACE_IDS)
def test_prefill_non_power_of_two_block_size(device, unified, row_space):
    rng = random.Random(12)
    step = make_prefill_step(rng, prefixes=[0, 383, 1500], chunk_lens=[400, 300, 130], num_padding=1,
                             block_size=384, index_topk=64, unified=unified, row_space=row_space)
    result = op_prefill(step, device)
    assert result == reference_prefill(step)
    assert_every_reserved_cell_written(result, PREFILL_BUFFERS)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_tokens", [0, 1])
def test_tiny_steps(device, num_tokens):
    rng = random.Random(9)
    decode = make_decode_step(rng, contexts=[500][:num_tokens] or [1], q_lens=[1] if num_tokens else [0])
    assert op_decode(decode, device) == reference_decode(decode)
    prefill = make_prefill_step(rng, prefixes=[300], chunk_lens=[num_tokens])
    assert op_prefill(prefill, device) == reference_prefill(prefill)


@pytest.mark.parametrize("device", DEVICES)
def test_all_padding(device):
    rng = random.Random(10)
    step = make_decode_step(rng, contexts=[300], q_lens=[0], num_padding=6)
    result = op_decode(step, device)
    assert result == reference_decode(step)
    assert result["csa_indptr"] == [0] * 7
