"""torch.library.opcheck for every op, the row-space arguments included (the
@rows calls of support.index_calls, bind_compress_view with a block stride):
schema honesty (what is mutated is declared), fake kernels, autograd
registration and AOT dispatch."""
import pytest
import torch

from support.devices import DEVICES
from support.index_calls import op_of, valid_calls

CALLS = list(valid_calls("cpu"))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("call_name", CALLS)
def test_opcheck_index_ops(device, call_name):
    tensors, scalars = valid_calls(device)[call_name]
    torch.library.opcheck(op_of(call_name).default, (), {**tensors, **scalars})


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("base,ratio", [(0, 4), (256, 4), (0, 128), (384, 128)])
def test_opcheck_bind_compress_view(device, base, ratio):
    kv = torch.randn(1024, 16, device=device)
    torch.library.opcheck(torch.ops.ukv.bind_compress_view.default, (kv,),
                          {"compress_base": base, "compress_ratio": ratio, "block_size": 128})


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("base,ratio,stride", [(0, 4, 32), (0, 4, 100), (7, 4, 1000), (100, 128, 3), (1024, 4, 40),
                                               (1000, 4, 2**31 - 1)])
def test_opcheck_bind_compress_view_with_a_block_stride(device, base, ratio, stride):
    kv = torch.randn(1024, 16, device=device)
    torch.library.opcheck(torch.ops.ukv.bind_compress_view.default, (kv,),
                          {"compress_base": base, "compress_ratio": ratio, "block_size": 128, "block_stride": stride})
