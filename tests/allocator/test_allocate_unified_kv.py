"""allocate_unified_kv sizes every layer through the C++ sizing ops."""
import pytest
import torch

import ukv_torch

RATIOS = [0, 4, 128, 4, 128, 0]


@pytest.mark.parametrize("unified", [True, False])
def test_rows_come_from_layer_rows(unified):
    layers = ukv_torch.allocate_unified_kv(RATIOS, 5, 16, num_compress_blocks=37, unified=unified)
    assert [t.shape for t in layers.kv] == [
        (torch.ops.ukv.layer_rows(r, 5, 37, 128, unified), 16) for r in RATIOS]
    assert layers.rope == [None] * len(RATIOS)
    assert all(t.dtype == torch.bfloat16 and not t.any() for t in layers.kv)


def test_unified_rows_match_the_slot_counts():
    n_csa, n_hca = torch.ops.ukv.slot_counts(5, 37, [4, 128], 128)
    layers = ukv_torch.allocate_unified_kv([4, 128, 0], 5, 8, num_compress_blocks=37)
    assert [t.shape[0] for t in layers.kv] == [n_csa * 128, n_hca * 128, 5 * 128]


def test_rope_planes_share_the_rows():
    layers = ukv_torch.allocate_unified_kv(RATIOS, 5, 16, num_compress_blocks=37, dtype=torch.float8_e4m3fn,
                                           rope_head_dim=64)
    for kv, rope in zip(layers.kv, layers.rope):
        assert kv.dtype == torch.float8_e4m3fn and rope.dtype == torch.bfloat16
        assert rope.shape == (kv.shape[0], 64)


def test_type_slots_plan():
    layers = ukv_torch.allocate_unified_kv([4, 128, 0], 5, 8, type_slots={4: 20, 128: 7})
    assert [t.shape[0] for t in layers.kv] == [
        torch.ops.ukv.layer_rows_for_slots(4, 20, 5, 128), torch.ops.ukv.layer_rows_for_slots(128, 7, 5, 128),
        5 * 128]


@pytest.mark.parametrize("kwargs,exc,match", [
    ({}, ValueError, "exactly one of num_compress_blocks and type_slots"),
    ({"num_compress_blocks": 3, "type_slots": {4: 9}}, ValueError, "exactly one"),
    ({"type_slots": {4: 9}, "unified": False}, ValueError, "pass unified=True"),
    ({"type_slots": {128: 9}}, ValueError, "no entry for compress ratio 4"),
    ({"type_slots": {4: 2}}, ValueError, "must cover the 5 shared SWA slots"),
    ({"num_compress_blocks": -1}, ValueError, "num_compress_blocks must be >= 0"),
    ({"num_compress_blocks": 3, "rope_head_dim": 0}, ValueError, "rope_head_dim must be > 0"),
])
def test_bad_arguments(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        ukv_torch.allocate_unified_kv([4], 5, 8, **kwargs)


def test_bad_ratio_and_head_dim():
    with pytest.raises(ValueError, match="compress_ratio 3 must divide block_size 128"):
        ukv_torch.allocate_unified_kv([3], 5, 8, num_compress_blocks=4)
    with pytest.raises(ValueError, match="head_dim must be > 0"):
        ukv_torch.allocate_unified_kv([4], 5, 0, num_compress_blocks=4)
