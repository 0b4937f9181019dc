"""Positional calls of the ``torch.ops.ukv`` index ops, fast in eager mode.

In eager mode the call goes through ``_C.eager_call``, which builds the
dispatcher stack straight from the positional arguments and makes the same
boxed dispatcher call as ``torch.ops`` (see csrc/python/eager_calls.cpp): the host cost
of a call drops by about 2-3 us, which is most of it for a decode-sized op.
Under ``torch.compile`` (Dynamo folds ``is_dynamo_compiling()`` to True), and whenever
``eager_call`` declines (tensor subclasses, TorchFunctionModes, arguments the
schema does not take), the call goes through the ``torch.ops`` overload, which
keeps every feature of the Python path and raises its errors.
"""
import torch
from torch.compiler import is_dynamo_compiling

from . import _C

eager_call = _C.eager_call


class EagerOp:
    """``torch.ops.ukv.<name>.default`` called with every argument positionally.

    ``op(*args)`` takes the fast path and falls back to torch.ops. The wrappers
    in ops.py inline the same two steps (a Python frame less per call)::

        if is_dynamo_compiling() or not eager_call(op.handle, args):
            op.via_torch_ops(args)

    Under Dynamo the fast path is skipped (Dynamo folds is_dynamo_compiling() to
    True and traces torch.ops); every other tracer hands the op tensor
    subclasses or runs a dispatch mode, which eager_call declines or the
    dispatcher honours.
    """

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
