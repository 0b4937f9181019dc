"""The layout's constants through KvStepOps instead of by hand. By hand, a
forgotten row-space constant gave wrong rows silently: swa_slot_mapping -1 for
every token (no KV written), paged_decode_indices wrong rows, a compress view
with the slot stride. KvStepOps gives the plan's rows (checked here against
the documented formulas), refuses parts of another plan, and the raw ops
refuse the constants they can tell do not belong together."""
import pytest
import torch

import ukv_torch
from support.transfer_pools import MODEL, Pool, prefilled
from ukv_torch import KvStepOps


def staged(pool, ids):
    pool.mgr.stage(ids)
    pool.mgr.upload(len(ids))
    return pool.mgr.tables[: len(ids)]


def documented_swa_row(plan, unit, position, ratio):
    """The guide's formula: unit * unit_rows + offset + (q // group) * group_stride + q % group."""
    page, unit_rows, offset, group, stride = plan.swa_rows(ratio)
    q = position % page
    return unit * unit_rows + offset + (q // group) * stride + q % group


@pytest.mark.parametrize("layout", ["row_space", "elastic", "static"])
def test_the_slot_mapping_is_the_plans_in_every_layout(layout):
    pool = Pool(layout)
    prefilled(pool, 1, 600)
    ops = KvStepOps(pool.plan, pool.kv, pool.mgr)
    tables = staged(pool, [1])
    positions = torch.arange(600 - 127, 600)
    swa = tables[0, ukv_torch.table_index(pool.plan.config, "swa")]
    page = pool.plan.config.swa_page
    for ratio in sorted(set(MODEL.layer_ratios)):
        out = torch.empty(len(positions), dtype=torch.int32)
        ops.swa_slot_mapping(positions, torch.zeros(len(positions), dtype=torch.int32), out, ratio=ratio,
                             tables=tables)
        expected = [documented_swa_row(pool.plan, int(swa[p // page]), p, ratio) for p in positions.tolist()]
        assert out.tolist() == expected
        assert min(expected) >= 0


def test_the_compress_view_has_the_envelope_stride():
    pool = Pool("row_space")
    ops = KvStepOps(pool.plan, pool.kv, pool.mgr)
    envelope, head_dim = pool.plan.pools.envelope_rows, MODEL.head_dim
    for layer, ratio in enumerate(MODEL.layer_ratios):
        if ratio:
            view = ops.compress_view(layer)
            assert view.stride() == (envelope * head_dim, head_dim, 1)
            assert view.data_ptr() == pool.kv.kv[layer].data_ptr()
            rope = ops.compress_view(layer, rope=True)
            assert rope.stride()[0] == envelope * MODEL.rope_head_dim


def test_the_decode_indices_are_the_raw_ops_with_the_plans_constants():
    pool = Pool("row_space")
    prefilled(pool, 1, 600)
    prefilled(pool, 2, 300)
    ops = KvStepOps(pool.plan, pool.kv, pool.mgr)
    tables = staged(pool, [1, 2])
    cfg = pool.plan.config
    positions, batch_id = torch.tensor([600, 300]), torch.tensor([0, 1], dtype=torch.int32)
    indptr = torch.tensor([0, 128, 256], dtype=torch.int32)
    mine, raw = torch.full((256,), -7, dtype=torch.int32), torch.full((256,), -7, dtype=torch.int32)
    ops.paged_decode_indices(positions, batch_id, indptr, mine, tables=tables)
    ukv_torch.paged_decode_indices(tables[:, ukv_torch.table_index(cfg, "swa")], positions, batch_id, indptr, raw,
                                   window=cfg.window, block_size=cfg.block_size,
                                   swa_rows=list(pool.plan.swa_rows(0)))
    assert torch.equal(mine, raw) and (mine >= 0).all()


def test_parts_of_another_plan_are_refused():
    pool, other = Pool("row_space"), Pool("row_space", page=64)
    with pytest.raises(ValueError, match=r"^manager must be KvManager\(plan\) of this plan"):
        KvStepOps(pool.plan, pool.kv, other.mgr)
    with pytest.raises(ValueError, match=r"^kv was allocated for another plan"):
        KvStepOps(pool.plan, other.kv, pool.mgr)
    with pytest.raises(ValueError, match=r"^tables must have the staged tables' shape"):
        KvStepOps(pool.plan, pool.kv, tables=pool.mgr.tables[:, :2])
    with pytest.raises(ValueError, match="the plan's model has no layer of ratio 16"):
        KvStepOps(pool.plan, pool.kv, pool.mgr).swa_slot_mapping(
            torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32),
            ratio=16)


@pytest.mark.parametrize("rows, fragment", [
    ([48, 192, 0, 48, 48], "the page of 48 tokens must divide block_size 128"),
    ([32, 31, 0, 32, 64], r"a page's rows \(1 groups of 32, 64 rows apart: 32 rows\) must fit in a unit of 31 rows"),
    ([32, 60, 0, 1, 2], r"a page's rows \(32 groups of 1, 2 rows apart: 63 rows\) must fit in a unit of 60 rows")])
def test_raw_constants_that_cannot_belong_together_are_refused(rows, fragment):
    """A page not tiling the blocks, a page wider than its unit, groups that overlap."""
    pool = Pool("row_space")
    table = torch.zeros(1, 8, dtype=torch.int32)
    out = torch.empty(1, dtype=torch.int32)
    with pytest.raises(ValueError, match=f"^swa_slot_mapping: swa_rows: {fragment}"):
        ukv_torch.swa_slot_mapping(table, torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int32), out,
                                   block_size=pool.plan.config.block_size, swa_rows=rows)


def decode_args(pool, contexts):
    positions = torch.tensor(contexts, dtype=torch.int64)
    batch_id = torch.arange(len(contexts), dtype=torch.int32)
    indptr = torch.arange(0, 128 * (len(contexts) + 1), 128, dtype=torch.int32)
    return positions, batch_id, indptr, torch.full((128 * len(contexts),), -7, dtype=torch.int32)


@pytest.mark.parametrize("op", ["swa_slot_mapping", "paged_decode_indices", "hca_decode_indices",
                                "csa_translate_pack"])
def test_a_forgotten_row_space_constant_with_the_managers_tables_is_refused(op):
    """swa_slot_mapping returned -1 for every token, paged_decode_indices built 128
    of 128 wrong rows, the compress ops read blocks k rows apart instead of an
    envelope apart. A copy of the tables cannot be checked (only int32 ids)."""
    pool = Pool("row_space")
    prefilled(pool, 1, 600)
    tables = staged(pool, [1])
    cfg = pool.plan.config
    positions, batch_id, indptr, out = decode_args(pool, [600])
    bs = cfg.block_size

    def call(t):
        if op == "swa_slot_mapping":
            ukv_torch.swa_slot_mapping(t[:, ukv_torch.table_index(cfg, "swa")], positions, batch_id,
                                       torch.empty(1, dtype=torch.int32), block_size=bs)
        elif op == "paged_decode_indices":
            ukv_torch.paged_decode_indices(t[:, ukv_torch.table_index(cfg, "swa")], positions, batch_id, indptr,
                                           out, window=cfg.window, block_size=bs)
        elif op == "hca_decode_indices":
            ukv_torch.hca_decode_indices(t[:, ukv_torch.table_index(cfg, 128)], batch_id,
                                         torch.tensor([4], dtype=torch.int32), indptr, out, compress_base=0,
                                         compress_ratio=128, block_size=bs)
        else:
            ukv_torch.csa_translate_pack(torch.zeros(1, 8, dtype=torch.int32), t[:, ukv_torch.table_index(cfg, 4)],
                                         positions, batch_id, indptr, out, compress_base=0, window=cfg.window,
                                         block_size=bs)

    page_or_stride = (r"is a KV manager's staged table of 32-token SWA pages, but swa_rows is None" if "swa" in op
                      or "paged" in op else rf"is a row-space KV manager's staged table of "
                      rf"{pool.plan.pools.envelope_rows}-row envelopes, but block_stride is \d+ \(None: k\)")
    with pytest.raises(ValueError, match=rf"^{op}: \w+ {page_or_stride}"):
        call(tables)
    call(tables.clone())  # not the manager's buffer: only ids, not checked (documented)
