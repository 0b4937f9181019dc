"""`ukv_torch.BatchCalls`: the batch methods of a `torch.classes.ukv.TypePool`
or `Coordinator` at a fraction of a torchbind call's cost.

A torchbind method call from Python costs ~1.6 us whatever it does, 5x the
allocator's own work for a 16-block batch. BatchCalls holds the C++ object
directly (csrc/python/batch_calls.cpp) and calls its batch methods through the C
API, with the same signatures, validation, all-or-nothing behaviour, errors
and locking as the torchbind methods:

    calls = BatchCalls(coordinator)            # torch.classes.ukv.Coordinator
    ids = calls.alloc_compress_n(type, n)      # int64 tensor
    calls.free_compress_many(type, ids)
    slots = calls.alloc_swa_n(n); calls.free_swa_many(slots)
    calls.alloc_compress_into(type, out)       # fills a persistent int64 tensor

The `_into` forms write `out.numel()` new ids into a contiguous int64 CPU
tensor the caller keeps, which saves the tensor allocation (for a 16-block
batch that is most of the call's cost).

For a TypePool the compress methods take no type: `alloc_compress_n(n)`.
Evicted SWA slots are queued exactly as for the torchbind methods
(`take_evicted_swa()` on the coordinator).
"""
from functools import partial

from .. import _C

__all__ = ["BatchCalls"]

_SWA, _COMPRESS = 0, 1


class BatchCalls:
    def __init__(self, torch_object):
        self.torch_object = torch_object
        target = _C.batch_target(torch_object)
        # partial objects call straight into C: no Python frame per call.
        self.alloc_swa_n = partial(_C.batch_alloc, target, _SWA, 0)
        self.alloc_swa_into = partial(_C.batch_alloc_into, target, _SWA, 0)
        self.free_swa_many = partial(_C.batch_free, target, _SWA, 0)
        # A pool's compress methods take no type (it has one); a coordinator's do.
        compress = (_COMPRESS, 0) if torch_object._type().qualified_name().endswith(".TypePool") else (_COMPRESS,)
        self.alloc_compress_n = partial(_C.batch_alloc, target, *compress)
        self.alloc_compress_into = partial(_C.batch_alloc_into, target, *compress)
        self.free_compress_many = partial(_C.batch_free, target, *compress)

    def __reduce__(self):
        return BatchCalls, (self.torch_object,)
