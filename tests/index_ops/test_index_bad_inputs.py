"""Every argument of every index op, given a wrong dtype, rank, size, stride,
device or value, is refused with an error that names the op and the argument,
and writes nothing. Each case starts from a valid call (checked to succeed)
and breaks one thing."""
import pytest
import torch

from support.devices import DEVICES
from support.index_calls import PLANE_ROWS, call, op_label, snapshot, valid_calls


# Arguments whose size defines a count the others are checked against (the
# token count comes from batch_id, the sequence count from these; the phase
# count from copy_counts).
SEQUENCE_COUNT = {"csa_translate_pack": "block_table", "paged_decode_indices": "swa_block_table",
                  "hca_decode_indices": "hca_block_table", "paged_prefill_indices": "swa_block_table",
                  "decode_index_metadata": "n_committed_csa", "prefill_index_metadata": "chunk_start",
                  "swa_slot_mapping": "swa_block_table", "apply_row_copies": "copy_counts"}
COPIES_SHAPE = r"must be a contiguous \[max_copies, 3\]"


# Ways to break one tensor argument: label -> (broken tensor, exception, message fragment).
def tensor_breakages(call_name, name, t):
    out = {}
    if name == "positions":
        out["dtype"] = (t.to(torch.float32), TypeError, "must be int32 or int64")
    else:
        out["dtype"] = (t.to(torch.int64), TypeError, "must be int32")
    defines_count = name == "batch_id" or SEQUENCE_COUNT[op_label(call_name)] == name
    if t.dim() == 1:
        out["rank"] = (t.unsqueeze(0), ValueError, "must be 1-D|must have shape")
        out["stride"] = (torch.repeat_interleave(t, 2)[::2], ValueError, "must be contiguous")
        if not name.endswith("_indices") and not defines_count:
            out["size"] = (torch.cat([t, t[:1]]), ValueError, "must have")
    elif name == "copies":  # any number of entries, exactly 3 contiguous columns
        out["rank"] = (t.flatten(), ValueError, "must be 2-D")
        out["columns"] = (t[:, :2], ValueError, COPIES_SHAPE)
        out["wider"] = (torch.cat([t, t[:, :1]], dim=1), ValueError, COPIES_SHAPE)
        out["stride"] = (torch.cat([t, t], dim=1)[:, :3], ValueError, COPIES_SHAPE)
        out["column_major"] = (t.t().contiguous().t(), ValueError, COPIES_SHAPE)
    else:
        out["rank"] = (t.flatten(), ValueError, "must be 2-D")
        if not defines_count:
            out["rows"] = (torch.cat([t, t[:1]]), ValueError, "must have shape")
        if name != "topk_local":
            out["no_columns"] = (t[:, :0], ValueError, "must have at least one column")
    return out


def tensor_cases():
    for call_name, (tensors, _) in valid_calls("cpu").items():
        for name, t in tensors.items():
            if not isinstance(t, torch.Tensor):  # None, or the planes (test_apply_row_copies_bad_planes)
                continue
            for label in tensor_breakages(call_name, name, t):
                yield pytest.param(call_name, name, label, id=f"{call_name}-{name}-{label}")


def expect_refused(call_name, tensors, scalars, exc, match):
    """The call raises exc matching `match` and leaves every output as it was."""
    before = snapshot(call_name, tensors)
    with pytest.raises(exc, match=match):
        call(call_name, tensors, scalars)
    after = snapshot(call_name, tensors)
    assert before.keys() == after.keys()
    for name in before:
        assert torch.equal(before[name], after[name]), f"{name} was written by a refused call"


@pytest.mark.parametrize("device", DEVICES)
def test_valid_calls_succeed(device):
    for call_name, (tensors, scalars) in valid_calls(device).items():
        before = snapshot(call_name, tensors)
        call(call_name, tensors, scalars)
        assert any(not torch.equal(before[n], t) for n, t in snapshot(call_name, tensors).items()), call_name


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("call_name,name,label", list(tensor_cases()))
def test_bad_tensor_argument(device, call_name, name, label):
    tensors, scalars = valid_calls(device)[call_name]
    broken, exc, fragment = tensor_breakages(call_name, name, tensors[name])[label]
    expect_refused(call_name, {**tensors, name: broken}, scalars, exc,
                   rf"{op_label(call_name)}: {name} ({fragment})")


SCALAR_CASES = [
    ("csa_translate_pack", "window", 0, "window must be > 0 when skip_per_token is None"),
    ("csa_translate_pack", "compress_base", -1, "compress_base must be in"),
    ("csa_translate_pack", "compress_base", 2**31, "compress_base must be in"),
    ("csa_translate_pack", "compress_ratio", 0, "compress_ratio must be in"),
    ("csa_translate_pack", "compress_ratio", 3, "compress_ratio 3 must divide block_size 128"),
    ("csa_translate_pack", "block_size", 0, "block_size must be in"),
    ("csa_translate_pack_prefill", "window", 128, "pass either skip_per_token"),
    ("paged_decode_indices", "window", 0, "window must be in"),
    ("paged_decode_indices", "block_size", -3, "block_size must be in"),
    ("hca_decode_indices", "compress_base", -1, "compress_base must be in"),
    ("hca_decode_indices", "compress_ratio", 256, "compress_ratio 256 must divide block_size 128"),
    ("hca_decode_indices", "block_size", 0, "block_size must be in"),
    ("paged_prefill_indices", "window", 0, "window must be in"),
    ("paged_prefill_indices", "compress_base", -1, "compress_base must be in"),
    ("paged_prefill_indices", "compress_ratio", 0, "compress_ratio must be in"),
    ("paged_prefill_indices", "block_size", 100, "compress_ratio 128 must divide block_size 100"),
    ("decode_index_metadata", "window", 0, "window must be in"),
    ("decode_index_metadata", "index_topk", -1, "index_topk must be in"),
    ("decode_index_metadata", "csa_ratio", 0, "csa_ratio must be in"),
    ("prefill_index_metadata", "window", -1, "window must be in"),
    ("prefill_index_metadata", "index_topk", -1, "index_topk must be in"),
    ("prefill_index_metadata", "csa_ratio", 0, "csa_ratio must be in"),
    ("prefill_index_metadata", "hca_ratio", 0, "hca_ratio must be in"),
]


@pytest.mark.parametrize("call_name,name,value,fragment", SCALAR_CASES,
                         ids=[f"{c}-{n}-{v}" for c, n, v, _ in SCALAR_CASES])
@pytest.mark.parametrize("device", DEVICES)
def test_bad_scalar_argument(device, call_name, name, value, fragment):
    tensors, scalars = valid_calls(device)[call_name]
    with pytest.raises(ValueError, match=rf"{op_label(call_name)}: .*{fragment}"):
        call(call_name, tensors, {**scalars, name: value})


@pytest.mark.parametrize("missing", ["csa_indices", "hca_indices"])
def test_paged_decode_output_pairs_go_together(missing):
    tensors, scalars = valid_calls("cpu")["paged_decode_indices"]
    pair = missing.replace("indices", "indptr")
    with pytest.raises(ValueError, match=f"paged_decode_indices: {pair} and {missing} must be given together"):
        call("paged_decode_indices", {**tensors, missing: None}, scalars)


def test_table_too_wide_for_int32_entries():
    tensors, scalars = valid_calls("cpu")["csa_translate_pack"]
    wide = torch.zeros(1, 2**26 + 1, dtype=torch.int32).expand(tensors["block_table"].shape[0], -1)
    with pytest.raises(ValueError, match="csa_translate_pack: block_table with .* exceeds the int32 entry range"):
        call("csa_translate_pack", {**tensors, "block_table": wide}, scalars)


def moved(tensors, device):
    """(name, label, tensors with that one moved to device) for every tensor
    argument, and for every element of a tensor list (label name[i])."""
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor):
            yield name, name, {**tensors, name: t.to(device)}
        elif isinstance(t, list):
            for i in range(len(t)):
                yield name, rf"{name}\[{i}\]", {**tensors, name: [p.to(device) if j == i else p
                                                                  for j, p in enumerate(t)]}


@pytest.mark.gpu
def test_argument_on_the_wrong_device():
    for call_name, (tensors, scalars) in valid_calls("cuda").items():
        for _, label, with_cpu in moved(tensors, "cpu"):
            expect_refused(call_name, with_cpu, scalars, RuntimeError,
                           rf"{op_label(call_name)}: {label} must be on cuda")


def test_argument_on_the_meta_device():
    """Regression: one meta argument among CPU ones used to dispatch to the fake
    kernel and return without writing the real outputs."""
    for call_name, (tensors, scalars) in valid_calls("cpu").items():
        for name, label, with_meta in moved(tensors, "meta"):
            before = snapshot(call_name, tensors)
            with pytest.raises(RuntimeError, match=rf"{op_label(call_name)}: {label} must be on cpu .*got meta"):
                call(call_name, with_meta, scalars)
            for key, value in snapshot(call_name, tensors).items():
                assert torch.equal(value, before[key]), key


# ------------------------------------------------------- row-space arguments --
# The ops that take SWA row constants, and which of them they take.
SWA_ROWS_CALLS = {"paged_decode_indices@rows": ("swa_rows", "csa_swa_rows", "hca_swa_rows"),
                  "paged_prefill_indices@rows": ("swa_rows", "csa_swa_rows", "hca_swa_rows"),
                  "swa_slot_mapping@rows": ("swa_rows",)}
FIELDS = ["page tokens", "unit rows", "offset", "group", "group stride"]
# A value out of each field's domain, and the domain's low end.
BAD_FIELD_VALUES = {"page tokens": ([0, -128, 2**31], 1), "unit rows": ([0, -1, 2**31], 1),
                    "offset": ([-1, 2**31, -(2**40)], 0), "group": ([0, -2, 2**31], 1),
                    "group stride": ([0, -1, 2**31, 2**40], 1)}


def swa_rows_cases():
    for call_name, args in SWA_ROWS_CALLS.items():
        for arg in args:
            for values in ([], [128], [128] * 4, [128] * 6):
                yield pytest.param(call_name, arg, values, rf"{arg} must be None or 5 ints .* got {len(values)} values",
                                   id=f"{call_name}-{arg}-{len(values)}_values")
            for i, field in enumerate(FIELDS):
                bad, low = BAD_FIELD_VALUES[field]
                for value in bad:
                    rows = [128, 392, 5, 64, 64]
                    rows[i] = value
                    yield pytest.param(call_name, arg, rows,
                                       rf"the {field} of {arg} must be in \[{low}, 2147483647\], got {value}",
                                       id=f"{call_name}-{arg}-{field.replace(' ', '_')}={value}")
            for group in (3, 256, 100):
                yield pytest.param(call_name, arg, [128, 392, 5, group, group],
                                   rf"{arg}: the group {group} must divide the page 128",
                                   id=f"{call_name}-{arg}-group={group}")
            for page in (48, 256):  # constants of another block size
                yield pytest.param(call_name, arg, [page, 392, 5, page // 2, page // 2],
                                   rf"{arg}: the page of {page} tokens must divide block_size 128",
                                   id=f"{call_name}-{arg}-page={page}")
            for unit, stride in ((127, 64), (392, 63)):  # a page spilling into the next unit, overlapping groups
                yield pytest.param(call_name, arg, [128, unit, 5, 64, stride],
                                   rf"{arg}: a page's rows \(2 groups of 64, {stride} rows apart: {64 + stride} rows\) "
                                   rf"must fit in a unit of {unit} rows with groups that do not overlap",
                                   id=f"{call_name}-{arg}-unit={unit}-stride={stride}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("call_name,arg,rows,fragment", list(swa_rows_cases()))
def test_bad_swa_rows(device, call_name, arg, rows, fragment):
    tensors, scalars = valid_calls(device)[call_name]
    expect_refused(call_name, tensors, {**scalars, arg: rows}, ValueError, rf"^{op_label(call_name)}: {fragment}")


# The SWA row constants of one call share page tokens and unit rows; None is
# the slot layouts' (block_size, block_size).
MISMATCHED_UNITS = [
    ({"swa_rows": [128, 392, 0, 128, 128], "csa_swa_rows": [64, 392, 0, 64, 64]}, "csa_swa_rows", 128, 392, 64, 392),
    ({"swa_rows": [128, 392, 0, 128, 128], "csa_swa_rows": [128, 392, 3, 2, 5],
      "hca_swa_rows": [128, 400, 0, 128, 128]}, "hca_swa_rows", 128, 392, 128, 400),
    ({"swa_rows": [128, 392, 0, 128, 128], "csa_swa_rows": [128, 392, 9, 64, 64], "hca_swa_rows": [64, 392, 0, 1, 1]},
     "hca_swa_rows", 128, 392, 64, 392),
    ({"swa_rows": None, "csa_swa_rows": [128, 392, 9, 64, 64]}, "csa_swa_rows", 128, 128, 128, 392),
    ({"swa_rows": [64, 128, 0, 64, 64]}, "csa_swa_rows", 64, 128, 128, 128),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("call_name", ["paged_decode_indices@rows", "paged_prefill_indices@rows"])
@pytest.mark.parametrize("given,arg,page,unit,bad_page,bad_unit", MISMATCHED_UNITS)
def test_swa_rows_of_other_units(device, call_name, given, arg, page, unit, bad_page, bad_unit):
    tensors, scalars = valid_calls(device)[call_name]
    scalars = {**scalars, "swa_rows": None, "csa_swa_rows": None, "hca_swa_rows": None, **given}
    expect_refused(call_name, tensors, scalars, ValueError,
                   rf"^{op_label(call_name)}: {arg} must have swa_rows' page tokens and unit rows "
                   rf"\({page}, {unit}\), got \({bad_page}, {bad_unit}\)")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("call_name", ["paged_decode_indices@rows", "paged_prefill_indices@rows"])
def test_plain_constants_mix_with_none(device, call_name):
    """A class given the slot layouts' constants explicitly is the same as None."""
    results = []
    for explicit in (None, [128, 128, 0, 128, 128]):
        tensors, scalars = valid_calls(device)[call_name]
        call(call_name, tensors, {**scalars, "swa_rows": explicit, "csa_swa_rows": None, "hca_swa_rows": explicit})
        results.append(snapshot(call_name, tensors))
    assert all(torch.equal(results[0][n], results[1][n]) for n in results[0])


# (call, stride argument, k of the call)
STRIDE_ARGS = [("csa_translate_pack@rows", "block_stride", 32), ("csa_translate_pack_prefill@rows", "block_stride", 32),
               ("hca_decode_indices@rows", "block_stride", 1), ("paged_prefill_indices@rows", "hca_block_stride", 1)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("call_name,arg,k", STRIDE_ARGS)
@pytest.mark.parametrize("delta", ["k-1", "zero", "negative", "int32_max+1", "2^40", "-2^63"])
def test_bad_block_stride(device, call_name, arg, k, delta):
    value = {"k-1": k - 1, "zero": 0, "negative": -k, "int32_max+1": 2**31, "2^40": 2**40, "-2^63": -(2**63)}[delta]
    tensors, scalars = valid_calls(device)[call_name]
    expect_refused(call_name, tensors, {**scalars, arg: value}, ValueError,
                   rf"^{op_label(call_name)}: {arg} must be in \[k = {k}, 2147483647\] .*got {value}$")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("call_name,arg,k", STRIDE_ARGS)
def test_block_stride_edges_are_accepted(device, call_name, arg, k):
    """k (the slot layouts' stride, the same as None) and the int32 maximum are valid."""
    results = []
    for value in (None, k, 2**31 - 1):
        tensors, scalars = valid_calls(device)[call_name]
        call(call_name, tensors, {**scalars, arg: value})
        results.append(snapshot(call_name, tensors))
    assert all(torch.equal(results[0][n], results[1][n]) for n in results[0])


# --------------------------------------------------------- apply_row_copies --
def plane_breakages(planes, device):
    """label -> (planes, message fragment after "apply_row_copies: ")."""
    extra = torch.zeros(PLANE_ROWS, 2, device=device)
    return {
        "five_planes": (planes + [extra, extra], r"planes must hold at most 4 tensors, got 5"),
        "fewer_rows": ([planes[0], planes[1][:-1]], rf"every plane must have planes\[0\]'s {PLANE_ROWS} rows, "
                                                    rf"planes\[1\] has {PLANE_ROWS - 1}"),
        "more_rows": ([planes[0], torch.zeros(PLANE_ROWS + 1, 2, device=device)],
                      rf"every plane must have planes\[0\]'s {PLANE_ROWS} rows, planes\[1\] has {PLANE_ROWS + 1}"),
        "column_slice": ([planes[0], planes[0][:, :2]], r"planes\[1\] must be a contiguous 2-D \[rows, width\]"),
        "column_major": ([planes[0].t().contiguous().t()], r"planes\[0\] must be a contiguous 2-D"),
        "every_other_row": ([planes[0], torch.zeros(2 * PLANE_ROWS, 3, device=device)[::2]],
                            r"planes\[1\] must be a contiguous 2-D"),
        "1d": ([planes[0], torch.zeros(PLANE_ROWS, device=device)], r"planes\[1\] must be a contiguous 2-D"),
        "3d": ([planes[0], torch.zeros(PLANE_ROWS, 2, 2, device=device)], r"planes\[1\] must be a contiguous 2-D"),
    }


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("label", list(plane_breakages([torch.zeros(PLANE_ROWS, 4)] * 2, "cpu")))
def test_apply_row_copies_bad_planes(device, label):
    tensors, scalars = valid_calls(device)["apply_row_copies"]
    planes, fragment = plane_breakages(tensors["planes"], device)[label]
    expect_refused("apply_row_copies", {**tensors, "planes": planes}, scalars, ValueError,
                   rf"^apply_row_copies: {fragment}")


@pytest.mark.parametrize("device", DEVICES)
def test_apply_row_copies_accepts_any_contiguous_plane(device):
    """A single-column plane (any stride of a size-1 dimension), an empty plane
    and a plane of zero width are contiguous: accepted, and copied like the rest
    (copies into a plane of no rows lie outside it: refused on the host,
    skipped on the GPU; with no planes nothing is copied)."""
    tensors, scalars = valid_calls(device)["apply_row_copies"]
    column = torch.arange(PLANE_ROWS, dtype=torch.float64, device=device).reshape(1, -1).t()
    assert column.stride() == (1, PLANE_ROWS)
    call("apply_row_copies", {**tensors, "planes": [column, torch.zeros(PLANE_ROWS, 0, device=device)]}, scalars)
    assert column[8:12, 0].tolist() == [0, 1, 2, 3]
    empty = {**tensors, "planes": [torch.zeros(0, 4, device=device)]}
    if torch.device(device).type == "cpu":
        with pytest.raises(ValueError, match=r"apply_row_copies: copies\[0\] = \(0, 8, 4\) .* the planes' 0 rows"):
            call("apply_row_copies", empty, scalars)
    else:
        call("apply_row_copies", empty, scalars)
    call("apply_row_copies", {**tensors, "planes": []}, scalars)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name,value,exc,fragment", [
    ("copies", lambda t: t.float(), TypeError, "copies must be int32, got Float"),
    ("copies", lambda t: t.reshape(1, -1, 3), ValueError, r"copies must be 2-D \[max_copies, 3\], got 3-D"),
    ("copies", lambda t: t[:, None, 0], ValueError, "copies " + COPIES_SHAPE),
    ("copy_counts", lambda t: t.to(torch.int16), TypeError, "copy_counts must be int32, got Short"),
    ("copy_counts", lambda t: t[0], ValueError, "copy_counts must be 1-D, got 0-D"),
])
def test_apply_row_copies_bad_copies(device, name, value, exc, fragment):
    tensors, scalars = valid_calls(device)["apply_row_copies"]
    expect_refused("apply_row_copies", {**tensors, name: value(tensors[name])}, scalars, exc,
                   rf"^apply_row_copies: {fragment}")
