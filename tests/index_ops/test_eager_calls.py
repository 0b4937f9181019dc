"""The eager fast path of the index ops (ukv_torch/_eager.py, csrc/eager_calls.cpp)
must be indistinguishable from torch.ops: same results, same errors, and the
Python path wherever only it is right (tensor subclasses, TorchFunctionModes,
Dynamo). Int lists (the SWA row constants) and tensor lists (the planes of
apply_row_copies), as lists or tuples, take the fast path."""
import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

import ukv_torch
from ukv_torch import _C
from ukv_torch._extension.eager import EagerOp
from support.devices import DEVICES
from support.index_calls import op_label, op_of, outputs_of, valid_calls

CALLS = list(valid_calls("cpu"))
LIST_CALLS = ["paged_decode_indices@rows", "paged_prefill_indices@rows", "swa_slot_mapping@rows",
              "apply_row_copies"]


def positional(call_name, tensors, scalars):
    """The call's arguments in schema order, defaults filled in."""
    given = {**tensors, **scalars}
    return tuple(given[a.name] if a.name in given else a.default_value
                 for a in op_of(call_name).default._schema.arguments)


def mutated(call_name, tensors):
    return outputs_of(call_name, tensors)


def run_both(call_name, device, wrap=lambda t: t, convert=lambda a: a):
    """Outputs after the eager path and after torch.ops, from equal inputs.
    wrap: applied to each tensor argument of the eager call, convert: to
    each argument (after wrap). Index outputs start as -7; the planes keep
    their contents, which the copies move."""
    ours, theirs = valid_calls(device)[call_name], valid_calls(device)[call_name]
    for call in (ours, theirs):
        for name, t in mutated(call_name, call[0]).items():
            if "[" not in name:
                t.fill_(-7)
    eager = EagerOp(op_label(call_name))
    wrapped = lambda a: wrap(a) if isinstance(a, torch.Tensor) else (  # noqa: E731
        [wrap(t) for t in a] if isinstance(a, list) and a and isinstance(a[0], torch.Tensor) else a)
    eager(*(convert(wrapped(a)) for a in positional(call_name, *ours)))
    op_of(call_name).default(**theirs[0], **theirs[1])
    return mutated(call_name, ours[0]), mutated(call_name, theirs[0])


def assert_same_outputs(ours, theirs):
    assert ours.keys() == theirs.keys()
    for name in ours:
        assert torch.equal(ours[name], theirs[name]), name


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("call_name", CALLS)
def test_fast_path_runs_and_matches_torch_ops(device, call_name):
    tensors, scalars = valid_calls(device)[call_name]
    handle = EagerOp(op_label(call_name)).handle
    assert _C.eager_call(handle, positional(call_name, tensors, scalars)) is True
    ours, theirs = run_both(call_name, device)
    assert_same_outputs(ours, theirs)


def as_tuples(a):
    return tuple(a) if isinstance(a, list) else a


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("call_name", LIST_CALLS)
@pytest.mark.parametrize("container", ["list", "tuple"])
def test_lists_and_tuples_take_the_fast_path(device, call_name, container):
    """int[] and Tensor[] arguments given as lists or tuples: the fast path
    runs the call (no fallback) with the results of torch.ops."""
    convert = as_tuples if container == "tuple" else (lambda a: a)
    tensors, scalars = valid_calls(device)[call_name]
    args = tuple(convert(a) for a in positional(call_name, tensors, scalars))
    assert any(isinstance(a, (list, tuple)) and a for a in args)
    assert _C.eager_call(EagerOp(op_label(call_name)).handle, args) is True
    assert_same_outputs(*run_both(call_name, device, convert=convert))


@pytest.mark.parametrize("device", DEVICES)
def test_the_wrappers_take_tuples(device):
    tensors, scalars = valid_calls(device)["apply_row_copies"]
    expected = [p.clone() for p in tensors["planes"]]
    torch.ops.ukv.apply_row_copies.default(expected, tensors["copies"], tensors["copy_counts"])
    ukv_torch.apply_row_copies(tuple(tensors["planes"]), tensors["copies"], tensors["copy_counts"])
    assert all(torch.equal(p, e) for p, e in zip(tensors["planes"], expected))
    tensors, scalars = valid_calls(device)["swa_slot_mapping@rows"]
    expected = tensors["slot_mapping"].clone()
    torch.ops.ukv.swa_slot_mapping.default(**{**tensors, "slot_mapping": expected}, **scalars)
    ukv_torch.swa_slot_mapping(*(tensors[n] for n in ("swa_block_table", "positions", "batch_id", "slot_mapping")),
                               block_size=scalars["block_size"], swa_rows=tuple(scalars["swa_rows"]))
    assert torch.equal(tensors["slot_mapping"], expected)


# A list argument only the Python path takes: an element that is not an exact
# int (a bool, a numpy int, a float) or not an exact tensor (a subclass, an int).
LIST_FALLBACKS = {
    "numpy_int": ("swa_slot_mapping@rows", "swa_rows", lambda v: [np.int64(x) for x in v]),
    "bool": ("paged_decode_indices@rows", "csa_swa_rows", lambda v: [v[0], v[1], v[2], True, True]),
    "float": ("paged_prefill_indices@rows", "hca_swa_rows", lambda v: [float(x) for x in v]),
    "int_subclass": ("swa_slot_mapping@rows", "swa_rows", lambda v: [IntLike(x) for x in v]),
    "tensor_subclass": ("apply_row_copies", "planes", lambda v: [v[0], v[1].as_subclass(Tagged), v[2]]),
    "not_a_tensor": ("apply_row_copies", "planes", lambda v: [v[0], 3]),
    "nested": ("apply_row_copies", "planes", lambda v: [v[:1], v[1:]]),
}


class IntLike(int):
    """An int subclass: not an exact int."""


def errors_or_outputs(fn, call_name, tensors):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 (the comparison is of whatever it raised)
        return "raised", type(exc), str(exc).splitlines()[0]
    return "ran", {n: t.clone() for n, t in outputs_of(call_name, tensors).items()}


@pytest.mark.parametrize("label", list(LIST_FALLBACKS))
def test_lists_the_fast_path_declines_behave_as_torch_ops(label):
    call_name, name, change = LIST_FALLBACKS[label]
    results = []
    for path in ("eager", "torch.ops"):
        tensors, scalars = valid_calls("cpu")[call_name]
        given = {**tensors, **scalars}
        given[name] = change(given[name])
        args = positional(call_name, {n: given[n] for n in tensors}, {n: given[n] for n in scalars})
        if path == "eager":
            assert _C.eager_call(EagerOp(op_label(call_name)).handle, args) is False
            fn = lambda: EagerOp(op_label(call_name))(*args)  # noqa: E731
        else:
            fn = lambda: op_of(call_name).default(**given)  # noqa: E731
        results.append(errors_or_outputs(fn, call_name, tensors))
    if results[0][0] == "raised":
        assert results[0] == results[1]
    else:
        assert results[1][0] == "ran"
        assert_same_outputs(results[0][1], results[1][1])


class CountingMode(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.ops.append(func)
        return func(*args, **(kwargs or {}))


def test_a_torch_function_mode_sees_the_call():
    tensors, scalars = valid_calls("cpu")["hca_decode_indices"]
    eager = EagerOp("hca_decode_indices")
    with CountingMode() as mode:
        assert _C.eager_call(eager.handle, positional("hca_decode_indices", tensors, scalars)) is False
        eager(*positional("hca_decode_indices", tensors, scalars))
    assert torch.ops.ukv.hca_decode_indices.default in mode.ops


class Tagged(torch.Tensor):
    """A subclass with its own __torch_function__ (the default one)."""


@pytest.mark.parametrize("call_name", ["csa_translate_pack", "paged_prefill_indices", "apply_row_copies"])
def test_tensor_subclasses_take_the_python_path_with_the_same_result(call_name):
    tensors, scalars = valid_calls("cpu")[call_name]
    args = tuple(a.as_subclass(Tagged) if isinstance(a, torch.Tensor) else a
                 for a in positional(call_name, tensors, scalars))
    assert _C.eager_call(EagerOp(op_label(call_name)).handle, args) is False
    ours, theirs = run_both(call_name, "cpu", wrap=lambda t: t.as_subclass(Tagged))
    assert_same_outputs(ours, theirs)


def errors_of(fn):
    with pytest.raises(Exception) as info:
        fn()
    return type(info.value), str(info.value).splitlines()[0]


@pytest.mark.parametrize("bad", [
    ("window", -1),            # a scalar the check refuses
    ("batch_id", "float"),     # a tensor of the wrong dtype
    ("window", 2 ** 70),       # an int the schema cannot hold: the Python path reports it
    ("topk_local", "list"),    # not a tensor at all
])
def test_errors_are_those_of_torch_ops(bad):
    name, value = bad
    tensors, scalars = valid_calls("cpu")["csa_translate_pack"]
    given = {**tensors, **scalars}
    given[name] = {"float": lambda: given[name].float(), "list": lambda: [1, 2]}.get(value, lambda: value)()
    args = tuple(given.get(a.name, a.default_value)
                 for a in torch.ops.ukv.csa_translate_pack.default._schema.arguments)
    theirs = errors_of(lambda: torch.ops.ukv.csa_translate_pack.default(**given))
    assert errors_of(lambda: EagerOp("csa_translate_pack")(*args)) == theirs


def test_unknown_handles_and_names_are_refused():
    with pytest.raises(TypeError, match="handle must come from eager_op_handle"):
        _C.eager_call(10 ** 6, ())
    with pytest.raises(RuntimeError, match="ukv::no_such_op"):
        _C.eager_op_handle("ukv::no_such_op")


def test_dynamo_traces_the_wrapper_into_one_graph():
    import ukv_torch

    tensors, scalars = valid_calls("cpu")["hca_decode_indices"]
    expected = torch.full_like(tensors["hca_indices"], -7)
    torch.ops.ukv.hca_decode_indices.default(**{**tensors, "hca_indices": expected}, **scalars)

    def program(table, batch_id, n_hca, indptr, out):
        ukv_torch.hca_decode_indices(table, batch_id, n_hca, indptr, out, compress_base=0,
                                     block_size=scalars["block_size"])
        return out

    torch._dynamo.reset()
    compiled = torch.compile(program, fullgraph=True, backend="aot_eager")
    out = torch.full_like(expected, -7)
    compiled(tensors["hca_block_table"], tensors["batch_id"], tensors["n_committed_hca"], tensors["hca_indptr"], out)
    assert torch.equal(out, expected)
