"""bind_compress_view: view[c, s] is row compress_base + c * k + s, it aliases
its input (writes through it land in unified_kv), and works for a rope plane."""
import pytest
import torch

import ukv_torch
from support.devices import DEVICES

NUM_SWA_BLOCKS, NB, BS = 3, 10, 128


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("unified", [True, False], ids=["unified", "static"])
@pytest.mark.parametrize("ratio", [4, 128])
def test_view_addresses_rows(device, unified, ratio):
    rows = torch.ops.ukv.layer_rows(ratio, NUM_SWA_BLOCKS, NB, BS, unified)
    base = torch.ops.ukv.compress_base_row(unified, NUM_SWA_BLOCKS, BS)
    k = BS // ratio
    kv = torch.arange(rows * 2, dtype=torch.float32, device=device).reshape(rows, 2)
    view = ukv_torch.bind_compress_view(kv, compress_base=base, compress_ratio=ratio, block_size=BS)
    assert view.shape == ((rows - base) // k, k, 2)
    if not unified:
        assert view.shape[0] == NB  # the static split's compress region is exactly NB blocks
    for c, s in [(0, 0), (1, k - 1), (view.shape[0] - 1, k - 1)]:
        assert torch.equal(view[c, s], kv[base + c * k + s])
    assert view.stride(0) == k * kv.stride(0)


@pytest.mark.parametrize("device", DEVICES)
def test_view_aliases_and_serves_the_rope_plane(device):
    rows = torch.ops.ukv.layer_rows(4, NUM_SWA_BLOCKS, NB, BS, False)
    base = torch.ops.ukv.compress_base_row(False, NUM_SWA_BLOCKS, BS)
    layers = ukv_torch.allocate_unified_kv([4], NUM_SWA_BLOCKS, 8, num_compress_blocks=NB, unified=False,
                                           rope_head_dim=4, device=device)
    for plane in (layers.kv[0], layers.rope[0]):
        view = ukv_torch.bind_compress_view(plane, compress_base=base, compress_ratio=4, block_size=BS)
        view[2, 5] = 1
        assert plane.shape[0] == rows
        assert torch.count_nonzero(plane) == plane.shape[1]
        assert torch.all(plane[base + 2 * 32 + 5] == 1)


def test_view_of_a_row_strided_tensor():
    kv = torch.zeros(512, 16)[:, :8]
    view = ukv_torch.bind_compress_view(kv, compress_base=128, compress_ratio=4, block_size=BS)
    view[1, 0] = 3
    assert torch.all(kv[128 + 32] == 3) and view.stride() == (32 * 16, 16, 1)


def test_view_under_compile():
    kv = torch.zeros(512, 4)

    @torch.compile(fullgraph=True)
    def write(kv):
        ukv_torch.bind_compress_view(kv, compress_base=128, compress_ratio=4, block_size=BS)[2, 1].fill_(5.0)

    write(kv)
    assert torch.all(kv[128 + 2 * 32 + 1] == 5) and torch.count_nonzero(kv) == 4


@pytest.mark.parametrize("kwargs,match", [
    ({"compress_base": 0, "compress_ratio": 0}, "compress_ratio must be > 0"),
    ({"compress_base": 0, "compress_ratio": 3}, "compress_ratio 3 must divide block_size 128"),
    ({"compress_base": -1, "compress_ratio": 4}, r"compress_base must be in \[0, 512\]"),
    ({"compress_base": 513, "compress_ratio": 4}, r"compress_base must be in \[0, 512\]"),
    ({"compress_base": 100, "compress_ratio": 4}, "not a whole number of 32-row compress blocks"),
    ({"compress_base": 0, "compress_ratio": 4, "block_size": 0}, "block_size must be > 0"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=f"bind_compress_view: .*{match}"):
        ukv_torch.bind_compress_view(torch.zeros(512, 4), **{"block_size": BS, **kwargs})


def test_bad_rank():
    with pytest.raises(ValueError, match=r"bind_compress_view: unified_kv must be 2-D"):
        ukv_torch.bind_compress_view(torch.zeros(512), compress_base=0, compress_ratio=4, block_size=BS)
