"""Positional calls of the ``torch.ops.ukv`` index ops, fast in eager mode.

In eager mode the call goes through ``_C.eager_call``, which builds the
dispatcher stack straight from the positional arguments and makes the same
boxed dispatcher call as ``torch.ops`` (see csrc/eager_calls.cpp): the host cost
of a call drops by about 2-3 us, which is most of it for a decode-sized op.
Under ``torch.compile`` (Dynamo folds ``is_compiling()`` to True), and whenever
``eager_call`` declines (tensor subclasses, TorchFunctionModes, arguments the
schema does not take), the call goes through the ``torch.ops`` overload, which
keeps every feature of the Python path and raises its errors.
"""
import torch

from . import _C


class EagerOp:
    """``torch.ops.ukv.<name>.default`` called with every argument positionally."""

    def __init__(self, name: str):
        self.overload = getattr(torch.ops.ukv, name).default
        self.handle = _C.eager_op_handle("ukv::" + name)
        arguments = self.overload._schema.arguments
        self.num_positional = sum(not a.kwarg_only for a in arguments)
        self.keyword_names = tuple(a.name for a in arguments if a.kwarg_only)

    def __call__(self, *args):
        if not torch.compiler.is_compiling() and _C.eager_call(self.handle, args):
            return
        n = self.num_positional
        self.overload(*args[:n], **dict(zip(self.keyword_names, args[n:])))
