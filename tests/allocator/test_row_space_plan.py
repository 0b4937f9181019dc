"""The row-space plan and its tensors, against the geometry stated directly.

Every layer's compress rows, every CSA layer's indexer bytes and every SWA
row a class's constants produce are located in the planes through the views
and ops an engine uses (bind_compress_view, the indexer views,
swa_slot_mapping), and must partition the row space: envelope p is rows
[p*E, (p+1)*E), holding each compress layer's block once and the indexer
blocks after them; SWA unit u is rows [base + u*U, base + (u+1)*U), holding
each layer's position of every page once.
"""
import pytest
import torch

import ukv_torch
from ukv_torch import MODEL_PRESETS, ModelKvSpec, ServeConfig, plan_kv_layout

BS = 128
DEMO_LAYERS = [0, 4, 128, 4, 128]  # the demo's model: 1 dense, 2 CSA, 2 HCA layers


def config(page, **kw):
    return ServeConfig(layout="row_space", swa_page_tokens=page, window=128, max_num_seqs=4, **kw)


def small_plan(page, budget=3 << 20, layers=DEMO_LAYERS):
    return plan_kv_layout(budget, layers, config(page))


def absolute_rows(view, plane):
    """The plane row of every [p, s] of a [N, k, width] view into the plane."""
    width = plane.shape[1]
    p = torch.arange(view.shape[0]).view(-1, 1)
    s = torch.arange(view.shape[1]).view(1, -1)
    first = view.storage_offset() + p * view.stride(0) + s * view.stride(1)
    assert bool((first % width == 0).all())
    return first // width


def indexer_rows(view, plane):
    """The first and last plane row of each block of an indexer view."""
    row_bytes = plane.shape[1] * plane.element_size()
    start = view.storage_offset() + torch.arange(view.shape[0]) * view.stride(0)
    return start // row_bytes, (start + view.shape[1] * view.shape[2] - 1) // row_bytes


@pytest.mark.parametrize("page", [32, 64, 128])
def test_sizes_follow_the_row_budget(page):
    plan = small_plan(page)
    m, pools = plan.model, plan.pools
    row_bytes = m.head_dim * m.kv_elem_bytes + m.rope_head_dim * m.rope_elem_bytes
    assert pools.total_rows == plan.budget_bytes // row_bytes
    ratios = m.layer_ratios
    kv_rows = sum(BS // r for r in ratios if r)
    assert pools.envelope_rows >= kv_rows
    assert pools.swa_unit_rows == page * len(ratios)  # a page of every layer, dense ones included
    assert pools.num_logical_blocks == pools.total_rows // pools.envelope_rows
    assert pools.num_swa_blocks == pools.total_rows // pools.swa_unit_rows
    assert plan.swa_base_row + pools.num_swa_blocks * pools.swa_unit_rows == pools.total_rows
    assert plan.total_bytes == pools.total_rows * row_bytes <= plan.budget_bytes


@pytest.mark.parametrize("page", [32, 64, 128])
def test_envelopes_hold_every_compress_block_and_the_indexer_once(page):
    plan = small_plan(page)
    kv = ukv_torch.allocate_unified_kv(plan)
    nope = kv.planes[0]
    E, N = plan.pools.envelope_rows, plan.pools.num_logical_blocks
    owner = torch.full((N * E,), -1, dtype=torch.int64)
    compress_rows = 0
    for layer, ratio in enumerate(plan.model.layer_ratios):
        assert kv.kv[layer].data_ptr() == nope[plan.layer_base_rows[layer]:].data_ptr()
        if ratio == 0:
            continue
        view = torch.ops.ukv.bind_compress_view(kv.kv[layer], block_size=BS, compress_ratio=ratio,
                                                 **plan.compress_args(ratio))
        # The view spans every whole block the layer's tensor holds; the
        # manager gives out the first N (the envelopes the row space holds).
        assert view.shape[0] >= N and view.shape[1] == BS // ratio
        rows = absolute_rows(view[:N], nope)
        envelope = torch.arange(N).view(-1, 1)
        assert bool(((rows >= envelope * E) & (rows < (envelope + 1) * E)).all()), "a block outside its envelope"
        assert bool((owner[rows.flatten()] == -1).all()), f"layer {layer} overlaps another layer's rows"
        owner[rows.flatten()] = layer
        compress_rows += BS // ratio
    # The indexer blocks follow the compress rows inside each envelope, and
    # never share bytes: each CSA layer's block is contiguous in one plane.
    spans = {}
    for layer, view in enumerate(kv.indexer):
        if view is None:
            continue
        plane = kv.planes[plan.layer_indexer_planes[layer]]
        assert view.shape[0] == N and view.shape[1] * view.shape[2] == plan.model.indexer_bytes_per_block
        first, last = indexer_rows(view, plane)
        envelope = torch.arange(N)
        assert bool((first >= envelope * E + compress_rows).all() and (last < (envelope + 1) * E).all())
        start = view.storage_offset()
        spans.setdefault(plan.layer_indexer_planes[layer], []).append((start, start + view.shape[1] * view.shape[2]))
    for plane_spans in spans.values():
        plane_spans.sort()
        assert all(a[1] <= b[0] for a, b in zip(plane_spans, plane_spans[1:])), "indexer blocks overlap"
    csa_layers = plan.model.layer_ratios.count(4)
    assert sum(len(v) for v in spans.values()) == csa_layers
    for p in (0, N - 1):
        assert int((owner[p * E:(p + 1) * E] >= 0).sum()) == compress_rows


def test_indexer_rows_are_the_fewest_that_hold_every_csa_block():
    plan = small_plan(32, budget=64 << 20, layers=MODEL_PRESETS["v4-pro"])
    m = plan.model
    csa = m.layer_ratios.count(4)
    indexer_rows_per_envelope = plan.pools.envelope_rows - sum(BS // r for r in m.layer_ratios if r)
    nope, rope = m.head_dim * m.kv_elem_bytes, m.rope_head_dim * m.rope_elem_bytes
    ib = m.indexer_bytes_per_block

    def blocks_in(rows):  # whole blocks, each within one plane
        return rows * nope // ib + rows * rope // ib

    assert blocks_in(indexer_rows_per_envelope) >= csa > blocks_in(indexer_rows_per_envelope - 1)


@pytest.mark.parametrize("page", [32, 64, 128])
def test_swa_units_hold_every_layers_page_once(page):
    plan = small_plan(page)
    U, units, base = plan.pools.swa_unit_rows, plan.pools.num_swa_blocks, plan.swa_base_row
    positions = torch.arange(units * page, dtype=torch.int64)
    table = torch.arange(units, dtype=torch.int32).view(1, -1)
    batch = torch.zeros(units * page, dtype=torch.int32)
    owner = torch.full((plan.pools.total_rows,), -1, dtype=torch.int64)
    for layer, ratio in enumerate(plan.model.layer_ratios):
        out = torch.empty(units * page, dtype=torch.int32)
        ukv_torch.swa_slot_mapping(table, positions, batch, out, block_size=BS, swa_rows=list(plan.swa_rows(ratio)))
        rows = out.to(torch.int64) + plan.layer_base_rows[layer]
        unit = positions // page
        assert bool(((rows >= base + unit * U) & (rows < base + (unit + 1) * U)).all()), "a row outside its unit"
        assert bool((owner[rows] == -1).all()), f"layer {layer} overlaps another layer's SWA rows"
        owner[rows] = layer
    assert bool((owner[base:] >= 0).all()) and bool((owner[:base] == -1).all())


def test_a_budget_below_one_sequence_names_budget_bytes():
    with pytest.raises(ValueError, match="budget_bytes .* fewer than one sequence needs"):
        plan_kv_layout(64 << 10, MODEL_PRESETS["v4-pro"], config(32))


def test_rows_past_int32_name_budget_bytes():
    tiny = ModelKvSpec(layer_ratios=(4, 128), head_dim=1, kv_elem_bytes=1, rope_head_dim=0,
                       indexer_bytes_per_block=0)
    plan = plan_kv_layout((1 << 31) - 1, tiny, config(32))
    assert plan.pools.total_rows == (1 << 31) - 1
    with pytest.raises(ValueError, match="budget_bytes .*int32 row limit"):
        plan_kv_layout(1 << 31, tiny, config(32))


@pytest.mark.parametrize("page, why", [(48, "block"), (16, "rows per block"), (256, "block")])
def test_pages_the_layout_cannot_use_name_swa_page_tokens(page, why):
    with pytest.raises(ValueError, match="swa_page_tokens"):
        config(page)
