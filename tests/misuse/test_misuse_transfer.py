"""Misuse of the sequence transfer (gather_sequence, scatter_sequence): each
refused with an error naming the argument, before a byte is copied. Before
these checks every case here was accepted and wrote wrong KV, or none."""
import pytest
import torch

import ukv_torch
from support.transfer_pools import MODEL, Pool, prefilled, raw


def snapshot(pool):
    return [raw(t).clone() for t in pool.tensors()]


def unchanged(pool, before):
    return all(torch.equal(raw(t), b) for t, b in zip(pool.tensors(), before))


def imported(a, b, seq_id=9):
    """A prefilled on a (700 tokens, random KV), admitted by b (idle): b's export of it and a full buffer."""
    for t in a.tensors():
        raw(t).random_(0, 256, generator=torch.Generator().manual_seed(t.numel()))
    prefilled(a, 1, 700)
    export = a.mgr.describe_sequence(1)
    assert b.mgr.import_sequence(seq_id, export) == 0
    buffer = torch.empty(ukv_torch.transfer_bytes(a.plan, a.kv, export), dtype=torch.uint8)
    ukv_torch.gather_sequence(a.plan, a.kv, export, buffer, manager=a.mgr)
    return b.mgr.describe_sequence(seq_id), buffer


@pytest.mark.parametrize("cached", [10**6, 128, -1])
def test_scatter_refuses_a_cached_count_import_sequence_did_not_return(cached):
    """A too large count wrote nothing: the same as skipping the scatter."""
    a, b = Pool("row_space"), Pool("elastic")
    mine, buffer = imported(a, b)
    assert mine.cached == 0
    before = snapshot(b)
    with pytest.raises(ValueError, match=f"cached must be what import_sequence returned for sequence 9, 0, got "
                                         f"{cached}"):
        ukv_torch.scatter_sequence(b.plan, b.kv, mine, buffer, cached, manager=b.mgr)
    assert unchanged(b, before)
    ukv_torch.scatter_sequence(b.plan, b.kv, mine, buffer, 0, manager=b.mgr)
    assert not unchanged(b, before)


@pytest.mark.parametrize("other", [MODEL.replace(head_dim=32), MODEL.replace(rope_head_dim=16),
                                   MODEL.replace(kv_elem_bytes=2)])
def test_kv_tensors_of_another_model_are_refused_naming_the_tensor(other):
    """Only the buffer size was checked, and reported as a buffer size."""
    a = Pool("elastic")
    prefilled(a, 1, 300)
    export = a.mgr.describe_sequence(1)
    buffer = torch.zeros(ukv_torch.transfer_bytes(a.plan, a.kv, export), dtype=torch.uint8)
    stranger = Pool("elastic", model=other)
    with pytest.raises(ValueError, match=r"^kv\.(kv|rope)\[0\] must be the plan's \[\d+, \d+\] tensor of \d-byte "
                                         r"elements, got .*another model or plan"):
        ukv_torch.gather_sequence(a.plan, stranger.kv, export, buffer, manager=a.mgr)
    assert not buffer.any()


@pytest.mark.parametrize("layout", ["row_space", "upstream"])
def test_kv_tensors_of_another_plan_of_the_model_are_refused(layout):
    a = Pool(layout)
    prefilled(a, 1, 300)
    export = a.mgr.describe_sequence(1)
    buffer = torch.zeros(ukv_torch.transfer_bytes(a.plan, a.kv, export), dtype=torch.uint8)
    larger = ukv_torch.allocate_unified_kv(ukv_torch.plan_kv_layout(3 << 20, MODEL, a.plan.config))
    with pytest.raises(ValueError, match=r"^kv\.(kv|planes)\[\d\] must be the plan's .* another model or plan"):
        ukv_torch.gather_sequence(a.plan, larger, export, buffer, manager=a.mgr)
    if layout == "row_space":  # another page in the same budget: tensors of the same shapes
        same_shapes = Pool(layout, page=64).kv
        assert [t.shape for t in same_shapes.planes] == [t.shape for t in a.kv.planes]
        with pytest.raises(ValueError, match=r"^kv was allocated for another plan \(kv\.plan\)"):
            ukv_torch.gather_sequence(a.plan, same_shapes, export, buffer, manager=a.mgr)
    assert not buffer.any()


def test_row_space_layer_tensors_must_be_views_of_the_planes():
    a = Pool("row_space")
    prefilled(a, 1, 300)
    export = a.mgr.describe_sequence(1)
    buffer = torch.zeros(ukv_torch.transfer_bytes(a.plan, a.kv, export), dtype=torch.uint8)
    copies = a.kv._replace(kv=[t.clone() for t in a.kv.kv])
    with pytest.raises(ValueError, match=r"kv\.kv\[0\] must be a view of kv\.planes\[0\] starting at the layer's base"):
        ukv_torch.gather_sequence(a.plan, copies, export, buffer, manager=a.mgr)


def test_an_export_gone_stale_after_deallocate_and_reuse_is_refused():
    a = Pool("row_space")
    prefilled(a, 1, 300)
    stale = a.mgr.describe_sequence(1)
    a.mgr.deallocate([1])
    prefilled(a, 1, 301)  # the same id again: another admission
    buffer = torch.zeros(ukv_torch.transfer_bytes(a.plan, a.kv, stale), dtype=torch.uint8)
    with pytest.raises(ValueError, match="export: sequence 1 was deallocated and admitted again since it was "
                                         "described"):
        ukv_torch.gather_sequence(a.plan, a.kv, stale, buffer, manager=a.mgr)
    a.mgr.deallocate([1])
    with pytest.raises(ValueError, match="export: sequence 1 is not live in manager"):
        ukv_torch.gather_sequence(a.plan, a.kv, stale, buffer, manager=a.mgr)
    assert not buffer.any()


def test_an_export_taken_before_a_decode_step_is_refused():
    a = Pool("row_space")
    prefilled(a, 1, 300)
    before_step = a.mgr.describe_sequence(1)
    a.mgr.append([1], 1)
    a.mgr.commit_decode([1], [1], [7])
    buffer = torch.zeros(ukv_torch.transfer_bytes(a.plan, a.kv, before_step), dtype=torch.uint8)
    with pytest.raises(ValueError, match="export: sequence 1's tables changed since it was described"):
        ukv_torch.gather_sequence(a.plan, a.kv, before_step, buffer, manager=a.mgr)


@pytest.mark.parametrize("field, value", [("swa_units", 10**6), ("phys", 10**6), ("swa_units", -5), ("phys", -2),
                                          ("logical", 10**5)])
def test_an_export_with_entries_out_of_range_is_refused(field, value):
    """gather left 24,384 of 33,792 buffer bytes unwritten, scatter wrote nothing there."""
    a = Pool("upstream")
    prefilled(a, 1, 300)
    export = a.mgr.describe_sequence(1)
    table = getattr(export, field).clone()
    table.view(-1)[-1] = value
    bad = export._replace(**{field: table})
    buffer = torch.zeros(ukv_torch.transfer_bytes(a.plan, a.kv, export), dtype=torch.uint8)
    with pytest.raises(ValueError, match="^export"):
        ukv_torch.gather_sequence(a.plan, a.kv, bad, buffer, manager=a.mgr)
    assert not buffer.any()


def test_an_export_of_another_manager_is_refused():
    """The sender's export handed to the receiver's scatter: its tables are the sender's."""
    a, b = Pool("row_space"), Pool("row_space")
    prefilled(a, 1, 700)
    prefilled(b, 4, 500)  # b holds another sequence: the moved one gets other rows there
    senders = a.mgr.describe_sequence(1)
    b.mgr.import_sequence(1, senders)
    buffer = torch.zeros(ukv_torch.transfer_bytes(a.plan, a.kv, senders), dtype=torch.uint8)
    before = snapshot(b)
    with pytest.raises(ValueError, match="^export: sequence 1"):
        ukv_torch.scatter_sequence(b.plan, b.kv, senders, buffer, manager=b.mgr)
    assert unchanged(b, before)


def test_a_dict_as_the_export_config_is_a_type_error_naming_it():
    a, b = Pool("row_space"), Pool("elastic")
    prefilled(a, 1, 300)
    export = a.mgr.describe_sequence(1)
    bad = export._replace(config={name: getattr(export.config, name) for name in (f.name for f in export.config._fields)})
    with pytest.raises(TypeError, match="export.config must be the exporting manager's ServeConfig, got dict"):
        b.mgr.import_sequence(5, bad)
    assert not b.mgr.has_sequence(5)
