"""Every argument of every index op, given a wrong dtype, rank, size, stride,
device or value, is refused with an error that names the op and the argument,
and writes nothing. Each case starts from a valid call (checked to succeed)
and breaks one thing."""
import pytest
import torch

from support.devices import DEVICES
from support.index_calls import call, op_label, snapshot, valid_calls


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
