"""The ``torch.ops.ukv`` index ops as Python functions, fast in eager mode.

``@schema_op`` turns a stub (a signature and a docstring, in ops.py) into the
op's wrapper. The stub's signature must be the registered schema's, name for
name, in order, with the same defaults and keyword-only part
(``check_signature``): the schema's argument list is written once, in
csrc/ops/index_op_args.h, and anything that disagrees with it fails at import.
The generated wrapper passes its arguments in that order to ``_C.eager_call``,
which builds the dispatcher stack straight from them and makes the same boxed
dispatcher call as ``torch.ops`` (csrc/python/eager_calls.cpp): the host cost
of a call drops by about 2-3 us, which is most of it for a decode-sized op.
Under ``torch.compile`` (Dynamo folds ``is_dynamo_compiling()`` to True), and
whenever ``eager_call`` declines (tensor subclasses, TorchFunctionModes,
arguments the schema does not take), the call goes through the ``torch.ops``
overload, which keeps every feature of the Python path and raises its errors.
"""
import functools
import inspect

import torch
from torch.compiler import is_dynamo_compiling

from .. import _C

eager_call = _C.eager_call


def check_signature(op_name: str, fn, what: str) -> None:
    """Raises TypeError unless fn's parameters are torch.ops.ukv.<op_name>'s schema arguments."""
    arguments = getattr(torch.ops.ukv, op_name).default._schema.arguments
    expected = [(a.name, a.kwarg_only, a.default_value if a.has_default_value() else inspect.Parameter.empty)
                for a in arguments]
    found = [(p.name, p.kind == inspect.Parameter.KEYWORD_ONLY, p.default)
             for p in inspect.signature(fn).parameters.values()]
    if found != expected:
        raise TypeError(f"{what} {fn.__qualname__} does not match the schema of ukv::{op_name}: "
                        f"expected (name, keyword-only, default) {expected}, got {found}")


class EagerOp:
    """``torch.ops.ukv.<name>.default`` called with every argument positionally,
    in schema order: ``op(*args)`` takes the fast path and falls back to torch.ops."""

    def __init__(self, name: str):
        self.overload = getattr(torch.ops.ukv, name).default
        self.handle = _C.eager_op_handle("ukv::" + name)
        arguments = self.overload._schema.arguments
        self.num_positional = sum(not a.kwarg_only for a in arguments)
        self.keyword_names = tuple(a.name for a in arguments if a.kwarg_only)

    def __call__(self, *args):
        if is_dynamo_compiling() or not eager_call(self.handle, args):
            self.via_torch_ops(args)

    def via_torch_ops(self, args: tuple) -> None:
        n = self.num_positional
        self.overload(*args[:n], **dict(zip(self.keyword_names, args[n:])))


def schema_op(stub):
    """The fast wrapper of torch.ops.ukv.<stub.__name__>, with the stub's signature and docstring."""
    name = stub.__name__
    check_signature(name, stub, "wrapper")
    op = EagerOp(name)
    params = list(inspect.signature(stub).parameters.values())

    # One generated function per op: its parameters are the schema's, its body
    # the fast path (no intermediate Python frame, no signature binding).
    unannotated = inspect.Signature([p.replace(annotation=inspect.Parameter.empty) for p in params])
    names = ", ".join(p.name for p in params)
    source = (f"def {name}{unannotated}:\n"
              f"    args = ({names},)\n"
              f"    if is_dynamo_compiling() or not eager_call(handle, args):\n"
              f"        via_torch_ops(args)\n")
    namespace = {"is_dynamo_compiling": is_dynamo_compiling, "eager_call": eager_call, "handle": op.handle,
                 "via_torch_ops": op.via_torch_ops}
    exec(compile(source, f"<ukv_torch.ops.{name}>", "exec"), namespace)
    return functools.wraps(stub)(namespace[name])
