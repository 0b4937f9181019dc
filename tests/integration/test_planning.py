"""plan_kv_layout against a direct re-derivation of the byte arithmetic."""
import math

import pytest
import torch

import ukv_torch
from ukv_torch import MODEL_PRESETS, plan_kv_layout

BS = 128


def row_bytes(head_dim=512, kv=1, rope=64, rope_b=2):
    return head_dim * kv + rope * rope_b


def expected_swa_blocks(max_num_seqs, window=128, mtp_k=0, max_num_batched_tokens=None, bs=BS):
    chunk_blocks = 64 if max_num_batched_tokens is None else math.ceil(max_num_batched_tokens / bs)
    return max_num_seqs * (math.ceil((window + mtp_k) / bs) + 1) + chunk_blocks


def tensor_bytes(plan, ratios, rb=row_bytes()):
    n_csa = sum(r == 4 for r in ratios)
    return sum(plan.layer_rows) * rb + n_csa * 32 * 144 * plan.num_logical_blocks


@pytest.mark.parametrize("preset", sorted(MODEL_PRESETS))
@pytest.mark.parametrize("budget_gib", [2, 8, 40])
def test_static_and_upstream_follow_the_upstream_formulas(preset, budget_gib):
    ratios = MODEL_PRESETS[preset]
    budget = budget_gib << 30
    rb = row_bytes()
    swa = expected_swa_blocks(64)
    swa_block = len(ratios) * BS * rb
    cblock = sum({4: 32, 128: 1, 0: 0}[r] * rb + (32 * 144 if r == 4 else 0) for r in ratios)
    nb = (budget - swa * swa_block) // cblock
    static = plan_kv_layout(budget, ratios, max_num_seqs=64, mode="static")
    assert (static.num_swa_blocks, static.num_logical_blocks) == (swa, nb)
    assert static.swa_block_bytes == swa_block and static.compressed_block_bytes == cblock
    for r, rows in zip(ratios, static.layer_rows):
        assert rows == swa * BS + {4: 32, 128: 1, 0: 0}[r] * nb
    assert static.total_bytes == tensor_bytes(static, ratios) <= budget
    up = plan_kv_layout(budget, ratios, max_num_seqs=64, mode="upstream")
    # Slot rounding may cost a few blocks; never more than one CSA slot's worth.
    assert nb - 4 <= up.num_logical_blocks <= nb
    assert up.type_slots == (swa + math.ceil(up.num_logical_blocks / 4), swa + math.ceil(up.num_logical_blocks / 128))
    assert up.total_bytes == tensor_bytes(up, ratios) <= budget
    assert up.unified and not static.unified
    # Only elastic sizing needs compress to borrow SWA slots SWA never used: the
    # elastic layout, which neither plan's configuration has.
    assert (up.config.layout, static.config.layout) == ("upstream", "static")


def test_elastic_covers_every_physical_compress_block_and_fits():
    ratios = MODEL_PRESETS["v4-flash"]
    budget = 8 << 30
    config = ukv_torch.ServeConfig(layout="elastic", full_retain=True, swa_budget_frac=0.3, max_num_seqs=4,
                                   max_blocks_per_seq=8)
    plan = plan_kv_layout(budget, ratios, config)
    csa_capacity = plan.type_slots[0] * 4
    hca_capacity = plan.type_slots[1] * 128
    assert plan.num_logical_blocks == min(csa_capacity, hca_capacity)
    assert plan.total_bytes == tensor_bytes(plan, ratios) <= budget
    upstream = plan_kv_layout(budget, ratios, config.replace(layout="upstream"))
    assert plan.num_logical_blocks > upstream.num_logical_blocks  # idle SWA memory can serve compress
    # The manager accepts the plan as is, with the configuration it was made for.
    m = ukv_torch.KvManager(plan)
    assert m.stats()["free_logical_blocks"] == plan.num_logical_blocks
    assert m.config == config and m.config.layout == "elastic"  # compress borrows never-used SWA slots


@pytest.mark.parametrize("mode", ["static", "upstream", "elastic"])
@pytest.mark.parametrize("seqs, tokens, window, mtp_k, bs", [
    (32, 2048, 128, 0, 128),   # the demo's step: 32 x 2 + 16
    (8, 1, 128, 0, 128),       # a single token still spans a block
    (64, 8193, 256, 2, 128),   # windows of 3 blocks, a partial last chunk block
    (16, 4096, 128, 0, 256),   # blocks of 256 rows
])
def test_swa_pool_follows_the_step_token_budget(mode, seqs, tokens, window, mtp_k, bs):
    plan = plan_kv_layout(1 << 30, [4, 128, 0], max_num_seqs=seqs, max_num_batched_tokens=tokens, window=window,
                          mtp_k=mtp_k, block_size=bs, mode=mode)
    assert plan.num_swa_blocks == expected_swa_blocks(seqs, window, mtp_k, tokens, bs)


def test_upstreams_fixed_chunk_allowance_is_8192_tokens_at_block_128():
    for mode in ("static", "upstream", "elastic"):
        default = plan_kv_layout(1 << 30, [4, 128, 0], max_num_seqs=32, mode=mode)
        assert default.num_swa_blocks == 32 * 2 + 64
        step = plan_kv_layout(1 << 30, [4, 128, 0], max_num_seqs=32, max_num_batched_tokens=8192, mode=mode)
        assert step.config.swa_sizing == "step"  # all else the same plan
        assert step.replace(config=default.config) == default


def test_a_smaller_step_budget_frees_rows_for_compress():
    big = plan_kv_layout(64 << 20, [0, 4, 4, 128, 128], max_num_seqs=32, mode="elastic")
    small = plan_kv_layout(64 << 20, [0, 4, 4, 128, 128], max_num_seqs=32, max_num_batched_tokens=2048,
                           mode="elastic")
    assert small.num_swa_blocks == big.num_swa_blocks - 48
    assert small.num_logical_blocks > big.num_logical_blocks
    assert small.total_bytes <= 64 << 20


def test_rows_agree_with_the_sizing_ops():
    ratios = [4, 128, 0]
    plan = plan_kv_layout(1 << 30, ratios, mode="upstream", max_num_seqs=8)
    for r, rows in zip(ratios, plan.layer_rows):
        assert rows == torch.ops.ukv.layer_rows(r, plan.num_swa_blocks, plan.num_logical_blocks, BS, True)


@pytest.mark.parametrize("kwargs, message", [
    (dict(budget_bytes=0), "budget_bytes"),
    (dict(compress_ratios=[]), "ModelKvSpec.layer_ratios"),
    (dict(compress_ratios=[3]), "ServeConfig.compress_ratios"),
    (dict(mode="dynamic"), "ServeConfig.layout must be one of"),
    (dict(budget_bytes=1 << 20), "SWA region"),
    (dict(swa_budget_frac=1.5, full_retain=True), "ServeConfig.swa_budget_frac"),
    (dict(max_num_batched_tokens=0), "ServeConfig.max_num_batched_tokens"),
    (dict(max_num_batched_tokens=-128), "ServeConfig.max_num_batched_tokens"),
])
def test_bad_arguments_name_the_argument(kwargs, message):
    args = dict(budget_bytes=1 << 30, compress_ratios=[4, 128])
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        plan_kv_layout(args.pop("budget_bytes"), args.pop("compress_ratios"), **args)
