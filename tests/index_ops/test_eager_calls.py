"""The eager fast path of the index ops (ukv_torch/_eager.py, csrc/eager_calls.cpp)
must be indistinguishable from torch.ops: same results, same errors, and the
Python path wherever only it is right (tensor subclasses, TorchFunctionModes,
Dynamo)."""
import pytest
import torch
from torch.overrides import TorchFunctionMode

from ukv_torch import _C
from ukv_torch._eager import EagerOp
from support.devices import DEVICES
from support.index_calls import op_label, op_of, valid_calls

CALLS = list(valid_calls("cpu"))


def positional(call_name, tensors, scalars):
    """The call's arguments in schema order, defaults filled in."""
    given = {**tensors, **scalars}
    return tuple(given[a.name] if a.name in given else a.default_value
                 for a in op_of(call_name).default._schema.arguments)


def mutated(tensors):
    return {name: t for name, t in tensors.items() if name.endswith(("_indices", "_indptr", "_count"))
            and t is not None}


def run_both(call_name, device, wrap=lambda t: t):
    """Outputs after the eager path and after torch.ops, from equal inputs."""
    ours, theirs = valid_calls(device)[call_name], valid_calls(device)[call_name]
    for t in mutated(ours[0]).values():
        t.fill_(-7)
    for t in mutated(theirs[0]).values():
        t.fill_(-7)
    eager = EagerOp(op_label(call_name))
    eager(*(wrap(a) if isinstance(a, torch.Tensor) else a for a in positional(call_name, *ours)))
    op_of(call_name).default(**theirs[0], **theirs[1])
    return mutated(ours[0]), mutated(theirs[0])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("call_name", CALLS)
def test_fast_path_runs_and_matches_torch_ops(device, call_name):
    tensors, scalars = valid_calls(device)[call_name]
    handle = EagerOp(op_label(call_name)).handle
    assert _C.eager_call(handle, positional(call_name, tensors, scalars)) is True
    ours, theirs = run_both(call_name, device)
    assert ours.keys() == theirs.keys()
    for name in ours:
        assert torch.equal(ours[name], theirs[name]), name


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


@pytest.mark.parametrize("call_name", ["csa_translate_pack", "paged_prefill_indices"])
def test_tensor_subclasses_take_the_python_path_with_the_same_result(call_name):
    tensors, scalars = valid_calls("cpu")[call_name]
    args = tuple(a.as_subclass(Tagged) if isinstance(a, torch.Tensor) else a
                 for a in positional(call_name, tensors, scalars))
    assert _C.eager_call(EagerOp(op_label(call_name)).handle, args) is False
    ours, theirs = run_both(call_name, "cpu", wrap=lambda t: t.as_subclass(Tagged))
    for name in ours:
        assert torch.equal(ours[name], theirs[name]), name


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
