"""Property-based fuzzing of every index op (hypothesis, fixed example counts,
derandomized). Every output is a view inside a larger guard-filled buffer
whose guard cells must stay untouched, whatever the inputs.

  * Random decode and prefill steps (sequence counts, contexts, chunk and
    MTP lengths, padding, windows, block sizes, top-k widths, both layouts,
    random row-space constants and block strides, int32/int64 positions,
    strided tables, zero-token batches) give exactly the per-token reference
    of ukv_torch/testing/index_reference.py.
  * One argument of one op is then changed: a wrong dtype, rank, device
    (meta) or a non-contiguous vector is refused with an error naming the op
    and the argument; a table in another memory layout gives the same result
    as the contiguous call; batch ids outside the table act as padding;
    garbage values the validation cannot see (they live in device memory)
    never make an op write outside its outputs; out-of-domain scalars are
    refused naming the scalar.
  * bind_compress_view and allocate_unified_kv over random shapes, dtypes,
    strides, bases and ratios: the documented view / row counts, or a
    ValueError naming the argument.
"""
import random
import re
from collections import Counter

import pytest
import torch
from hypothesis import given, strategies as st

import ukv_torch
from support.devices import DEVICES
from support.fuzz_support import GuardedOutputs, fuzz_settings
from support.index_calls import call, op_label, valid_calls
from support.index_cases import INT32_MAX, INT32_MIN, make_decode_step, make_prefill_step
from support.index_steps import op_decode, op_prefill, reference_decode, reference_prefill
from ukv_torch.testing.allocator_model import reference_layer_rows

STEP_SHAPES = dict(window=st.sampled_from([1, 3, 64, 128, 200]), block_size=st.sampled_from([128, 256, 384]),
                   index_topk=st.sampled_from([1, 4, 64]), unified=st.booleans(),
                   num_padding=st.integers(0, 3), seed=st.integers(0, 2**16), row_space=st.booleans())
LAYOUTS = dict(positions_dtype=st.sampled_from([torch.int32, torch.int64]), strided_tables=st.booleans())


def steps(make, per_seq, lengths, seqs, lens, max_seqs):
    """Steps from make(rng, per_seq=[...], lengths=[...], ...): one length per sequence."""
    def build(values, all_lens, seed, **shape):
        return make(random.Random(seed), **{per_seq: values, lengths: all_lens[:len(values)]}, **shape)
    return st.builds(build, st.lists(seqs, min_size=1, max_size=max_seqs),
                     st.lists(lens, min_size=max_seqs, max_size=max_seqs), **STEP_SHAPES)


def decode_steps():
    """Decode / MTP-verify steps; q_len 0 leaves a sequence out (all 0: no tokens)."""
    return steps(make_decode_step, "contexts", "q_lens", st.integers(1, 3000), st.integers(0, 4), 5)


def prefill_steps():
    return steps(make_prefill_step, "prefixes", "chunk_lens", st.integers(0, 3000), st.integers(0, 300), 4)


STEP_KINDS = {"decode": (decode_steps, op_decode, reference_decode),
              "prefill": (prefill_steps, op_prefill, reference_prefill)}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", sorted(STEP_KINDS))
def test_random_steps_match_the_reference(device, kind):
    steps, run, reference = STEP_KINDS[kind]
    tokens = Counter()

    @fuzz_settings(300)
    @given(step=steps(), layout=st.fixed_dictionaries(LAYOUTS))
    def case(step, layout):
        tokens[len(step.positions) > 0] += 1
        outputs = GuardedOutputs(device)
        assert run(step, device, alloc=outputs, **layout) == reference(step)
        outputs.assert_untouched()

    case()
    assert tokens[True] > 0 and tokens[False] > 0  # zero-token batches were among the cases


# ------------------------------------------------------ one argument changed --
WRONG_DTYPES = [torch.int8, torch.int16, torch.int64, torch.uint8, torch.float32, torch.bool]


def is_matrix(name):
    return name.endswith("_table") or name == "topk_local"


def is_output(name, call_name):
    return (name.endswith("_indices") or name == "slot_mapping"
            or call_name.endswith("_metadata") and name.endswith(("_indptr", "_count")))


def refusal(exc, fragment):
    """(exception type, message fragment after "op: argument ") of a refused change."""
    return ("refused", exc, fragment)


def change_tensor(data, call_name, name, t):
    """A drawn change of tensor argument `name`: (changed tensor, expectation)."""
    kinds = ["dtype", "rank", "meta"] + (["layout"] if is_matrix(name) else ["stride"] if t.numel() > 1 else [])
    if name == "batch_id" and t.numel():
        kinds.append("outside_bid")
    if not is_output(name, call_name) and t.numel():
        kinds.append("garbage")
    kind = data.draw(st.sampled_from(kinds), label="change")
    if kind == "dtype":
        dtypes = [d for d in WRONG_DTYPES if not (name == "positions" and d == torch.int64)]
        wanted = "must be int32 or int64" if name == "positions" else "must be int32"
        return t.to(data.draw(st.sampled_from(dtypes))), refusal(TypeError, wanted)
    if kind == "rank":
        return (t.flatten() if t.dim() == 2 else t.unsqueeze(0)), refusal(ValueError, "must (be|have)")
    if kind == "meta":
        return t.to("meta"), refusal(RuntimeError, f"must be on {t.device}")
    if kind == "stride" and name == "copies":  # every other column group of a wider matrix
        return torch.cat([t, t], dim=1)[:, :3], refusal(ValueError, r"must be a contiguous \[max_copies, 3\]")
    if kind == "stride":
        return torch.repeat_interleave(t, 2)[::2], refusal(ValueError, "must be contiguous")
    if kind == "layout":  # column-major, or the leading columns of a wider table
        wide = torch.cat([t, torch.full_like(t, 999)], dim=1)[:, : t.shape[1]]
        return data.draw(st.sampled_from([t.t().contiguous().t(), wide])), ("same",)
    if kind == "outside_bid":
        tokens = data.draw(st.sets(st.integers(0, t.numel() - 1), min_size=1), label="tokens")
        bids = data.draw(st.lists(st.sampled_from([INT32_MIN, -2, -1, 5, 10**6, INT32_MAX]),  # tables have <= 5 rows
                                  min_size=len(tokens), max_size=len(tokens)), label="batch ids")
        changed, padded = t.clone(), t.clone()
        for i, b in zip(sorted(tokens), bids):
            changed[i], padded[i] = b, -1
        return changed, ("as", padded)
    rng = random.Random(data.draw(st.integers(0, 2**32), label="garbage seed"))  # tensors can be large
    garbage = torch.tensor([rng.randint(INT32_MIN, INT32_MAX) for _ in range(t.numel())], dtype=t.dtype,
                           device=t.device)
    if call_name == "apply_row_copies" and t.device.type == "cpu":  # a list on the host is checked entry by entry
        return garbage.reshape(t.shape), ("confined or refused",)
    return garbage.reshape(t.shape), ("confined",)


def prepared(device, call_name, decode, prefill, change):
    """The call built into guarded outputs, with change(tensors, scalars) applied."""
    outputs = GuardedOutputs(device)
    tensors, scalars = valid_calls(device, decode, prefill, alloc=outputs)[call_name]
    return outputs, *change(dict(tensors), dict(scalars))


def run_call(device, call_name, decode, prefill, change):
    """Every output buffer, guards included, after the changed call."""
    outputs, tensors, scalars = prepared(device, call_name, decode, prefill, change)
    call(call_name, tensors, scalars)
    outputs.assert_untouched()
    return [base.tolist() for base, _ in outputs.buffers]


def expect_refusal(device, call_name, decode, prefill, change, exc, fragment):
    outputs, tensors, scalars = prepared(device, call_name, decode, prefill, change)
    with pytest.raises(exc, match=rf"^{op_label(call_name)}: {fragment}"):
        call(call_name, tensors, scalars)
    outputs.assert_untouched()


CALL_NAMES = sorted(valid_calls("cpu"))


@pytest.mark.parametrize("device", DEVICES)
def test_one_changed_tensor_argument_is_refused_or_harmless(device):
    outcomes = Counter()

    @fuzz_settings(1200)
    @given(decode=decode_steps(), prefill=prefill_steps(), call_name=st.sampled_from(CALL_NAMES), data=st.data())
    def case(decode, prefill, call_name, data):
        tensors, _ = valid_calls(device, decode, prefill)[call_name]
        names = sorted(n for n, t in tensors.items() if isinstance(t, torch.Tensor))  # not the planes list
        # batch_id and the tables more often: their changes are the ones that must still give results
        name = data.draw(st.sampled_from(names + [n for n in names if n == "batch_id"] * 3
                                         + [n for n in names if is_matrix(n)] * 2), label="argument")
        changed, expectation = change_tensor(data, call_name, name, tensors[name])
        outcomes[expectation[0]] += 1
        with_change = lambda value: lambda ts, ss: ({**ts, name: value}, ss)  # noqa: E731
        if expectation[0] == "refused":
            _, exc, fragment = expectation
            expect_refusal(device, call_name, decode, prefill, with_change(changed), exc, rf"{name} {fragment}")
            return
        if expectation[0] == "confined or refused":
            try:
                run_call(device, call_name, decode, prefill, with_change(changed))
            except ValueError as e:
                assert re.match(rf"^{op_label(call_name)}: copies\[\d+\] ", str(e)), e
            return
        cells = run_call(device, call_name, decode, prefill, with_change(changed))
        if expectation[0] == "same":
            assert cells == run_call(device, call_name, decode, prefill, lambda ts, ss: (ts, ss))
        elif expectation[0] == "as":
            assert cells == run_call(device, call_name, decode, prefill, with_change(expectation[1]))

    case()
    assert all(outcomes[kind] > 0 for kind in ("refused", "same", "as", "confined")), outcomes


# Scalar values outside each scalar's domain (for the calls that take it).
BAD_SCALARS = {
    "window": [-1, -(2**40), 2**31],
    "compress_base": [-1, 2**31, -(2**63)],
    "compress_ratio": [0, -4, 3, 2**31],
    "block_size": [0, -128, 2**31, 2**40],
    "index_topk": [-1, 2**31],
    "csa_ratio": [0, -1, 2**31],
    "hca_ratio": [0, -1, 2**31],
    "block_stride": [0, -1, 2**31, -(2**63)],  # below every k, or past int32
    "hca_block_stride": [0, -5, 2**31],
    # wrong length, a field out of its domain, a group that does not divide the page
    **{name: [[128], [], [0, 128, 0, 128, 128], [128, 0, 0, 128, 128], [128, 128, -1, 128, 128],
              [128, 128, 0, 0, 128], [128, 128, 0, 128, 2**31], [128, 128, 0, 3, 3]]
       for name in ("swa_rows", "csa_swa_rows", "hca_swa_rows")},
}
DEFAULTED_SCALARS = {"csa_translate_pack": ["compress_ratio"], "hca_decode_indices": ["compress_ratio"],
                     "paged_prefill_indices": ["compress_ratio"], "decode_index_metadata": ["csa_ratio"],
                     "prefill_index_metadata": ["csa_ratio", "hca_ratio"]}


def scalar_names(call_name, scalars):
    names = list(scalars) + DEFAULTED_SCALARS.get(op_label(call_name), [])
    return sorted(n for n in names if n != "window" or not call_name.startswith("csa_translate_pack_prefill"))


# Every (call, scalar) pair, drawn uniformly: a scalar only the row-space calls take is drawn as often as any.
SCALAR_PAIRS = [(c, n) for c in CALL_NAMES for n in scalar_names(c, valid_calls("cpu")[c][1])]


@pytest.mark.parametrize("device", DEVICES)
def test_out_of_domain_scalars_are_refused_naming_them(device):
    refused = Counter()

    @fuzz_settings(300)
    @given(pair=st.sampled_from(SCALAR_PAIRS), data=st.data())
    def case(pair, data):
        call_name, name = pair
        value = data.draw(st.sampled_from(BAD_SCALARS[name]), label="value")
        refused[name] += 1
        expect_refusal(device, call_name, None, None, lambda ts, ss: (ts, {**ss, name: value}), ValueError,
                       rf".*\b{name}\b")

    case()
    assert set(refused) == set(BAD_SCALARS)


# ------------------------------------------------ compress views, allocation --
VIEW_DTYPES = [torch.float32, torch.bfloat16, torch.float8_e4m3fn, torch.int8, torch.float64]


@given(rows=st.integers(0, 1100), cols=st.integers(0, 5), pad=st.integers(0, 3), dtype=st.sampled_from(VIEW_DTYPES),
       base=st.one_of(st.integers(-3, 1200), st.sampled_from([0, 128, 256, -(2**63), 2**63 - 1])),
       ratio=st.sampled_from([0, -4, 1, 3, 4, 64, 128, 256, 2**40]), block_size=st.sampled_from([0, -1, 128, 256]))
@fuzz_settings(300)
def test_bind_compress_view_addresses_rows_or_refuses(rows, cols, pad, dtype, base, ratio, block_size):
    kv = torch.arange(rows * (cols + pad), dtype=torch.float32).reshape(rows, cols + pad).to(dtype)[:, :cols]
    valid = (block_size > 0 and 0 < ratio and block_size % ratio == 0 and 0 <= base <= rows
             and (rows - base) % (block_size // ratio) == 0)
    if not valid:
        with pytest.raises(ValueError, match="^bind_compress_view: .*(compress_ratio|block_size|compress_base)"):
            ukv_torch.bind_compress_view(kv, compress_base=base, compress_ratio=ratio, block_size=block_size)
        return
    k = block_size // ratio
    view = ukv_torch.bind_compress_view(kv, compress_base=base, compress_ratio=ratio, block_size=block_size)
    assert view.shape == ((rows - base) // k, k, cols)
    rows_of = [base + c * k + s for c in range(view.shape[0]) for s in range(k)]
    as_bytes = lambda t: t.contiguous().view(torch.uint8)  # noqa: E731  (float8 values need not compare equal)
    assert torch.equal(as_bytes(view.reshape(len(rows_of), cols)), as_bytes(kv[rows_of]))
    if view.numel():
        assert view.untyped_storage().data_ptr() == kv.untyped_storage().data_ptr()  # an alias, not a copy


@given(rows=st.integers(0, 1100), cols=st.integers(0, 5), pad=st.integers(0, 3), dtype=st.sampled_from(VIEW_DTYPES),
       base=st.one_of(st.integers(-3, 1200), st.sampled_from([0, 128, 256])),
       ratio=st.sampled_from([0, 1, 3, 4, 64, 128]), block_size=st.sampled_from([0, 128, 256]),
       stride=st.one_of(st.integers(-2, 700), st.sampled_from([2**31 - 1, 2**31, 2**40, -(2**63)])))
@fuzz_settings(300)
def test_bind_compress_view_with_a_block_stride_addresses_rows_or_refuses(rows, cols, pad, dtype, base, ratio,
                                                                         block_size, stride):
    """view[c, s] is row base + c * stride + s for every block whose k rows lie in the tensor."""
    kv = torch.arange(rows * (cols + pad), dtype=torch.float32).reshape(rows, cols + pad).to(dtype)[:, :cols]
    k = block_size // ratio if block_size > 0 and ratio > 0 and block_size % ratio == 0 else None
    if k is None or not 0 <= base <= rows or not k <= stride < 2**31:
        with pytest.raises(ValueError,
                           match="^bind_compress_view: .*(compress_ratio|block_size|compress_base|block_stride)"):
            ukv_torch.bind_compress_view(kv, compress_base=base, compress_ratio=ratio, block_size=block_size,
                                         block_stride=stride)
        return
    view = ukv_torch.bind_compress_view(kv, compress_base=base, compress_ratio=ratio, block_size=block_size,
                                        block_stride=stride)
    blocks = 0 if rows - base < k else (rows - base - k) // stride + 1
    assert view.shape == (blocks, k, cols)
    assert base + (blocks - 1) * stride + k <= rows and (blocks == 0 or base + blocks * stride + k > rows)
    rows_of = [base + c * stride + s for c in range(blocks) for s in range(k)]
    as_bytes = lambda t: t.contiguous().view(torch.uint8)  # noqa: E731
    assert torch.equal(as_bytes(view.reshape(len(rows_of), cols)), as_bytes(kv[rows_of]))
    if view.numel():
        assert view.untyped_storage().data_ptr() == kv.untyped_storage().data_ptr()


@given(ratios=st.lists(st.sampled_from([0, 4, 128, 3, -4, 256]), max_size=4), num_swa=st.integers(-1, 40),
       head_dim=st.integers(-1, 9), nb=st.one_of(st.none(), st.integers(-1, 300)), unified=st.booleans(),
       block_size=st.sampled_from([128, 256]), rope=st.sampled_from([None, 0, 4]))
@fuzz_settings(200)
def test_allocate_unified_kv_sizes_every_layer_or_refuses(ratios, num_swa, head_dim, nb, unified, block_size, rope):
    plan = {"num_compress_blocks": nb} if nb is not None else {"type_slots": {4: num_swa + 3, 128: num_swa + 1}}
    known = (0, 4, 128) if nb is None else [r for r in ratios if r == 0 or r > 0 and block_size % r == 0]
    sizes_ok = not ratios or num_swa >= 0 and (nb is None or nb >= 0)  # no layer, nothing is sized
    valid = (head_dim > 0 and rope != 0 and (nb is not None or unified) and sizes_ok
             and all(r in known for r in ratios))
    if not valid:
        with pytest.raises(ValueError, match="allocate_unified_kv|num_swa_blocks|num_compress_blocks|compress_ratio"):
            ukv_torch.allocate_unified_kv(ratios, num_swa, head_dim, block_size=block_size, unified=unified,
                                          rope_head_dim=rope, **plan)
        return
    layers = ukv_torch.allocate_unified_kv(ratios, num_swa, head_dim, block_size=block_size, unified=unified,
                                           rope_head_dim=rope, **plan)
    if nb is None:  # the elastic plan: the slots given, dense layers the shared SWA slots only
        expected = [(plan["type_slots"][r] if r else num_swa) * block_size for r in ratios]
    else:
        expected = [reference_layer_rows(r, num_swa, nb, block_size, unified) for r in ratios]
    assert [t.shape for t in layers.kv] == [(rows, head_dim) for rows in expected]
    assert [None if p is None else p.shape for p in layers.rope] == [None if rope is None else (rows, rope)
                                                                   for rows in expected]
    assert all(not t.any() for t in layers.kv)
