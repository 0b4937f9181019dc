"""bind_compress_view: view[c, s] is row compress_base + c * k + s (c * stride
with a block_stride, the row-space layout), it aliases its input (writes
through it land in unified_kv), and works for a rope plane."""
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


# ---------------------------------------------------------------- block_stride --
# The row-space layout: a layer's k rows sit at the same place of every
# envelope of E rows (block_stride = E), so view[p, s] is row base + p * E + s.
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("base,ratio,stride", [(0, 4, 32), (0, 4, 100), (7, 4, 100), (100, 128, 3), (0, 128, 1),
                                               (5, 4, 2**31 - 1)])
def test_strided_view_addresses_rows(device, base, ratio, stride):
    rows, dim = 1000, 3
    k = BS // ratio
    kv = torch.arange(rows * dim, dtype=torch.float32, device=device).reshape(rows, dim)
    view = ukv_torch.bind_compress_view(kv, compress_base=base, compress_ratio=ratio, block_size=BS,
                                        block_stride=stride)
    blocks = (rows - base - k) // stride + 1  # the blocks whose k rows lie inside the tensor
    assert base + (blocks - 1) * stride + k <= rows < base + blocks * stride + k
    assert view.shape == (blocks, k, dim)
    assert view.stride()[1:] == (dim, 1) and (blocks == 1 or view.stride(0) == stride * dim)
    assert view.storage_offset() == base * dim
    for p in range(blocks):
        assert torch.equal(view[p], kv[base + p * stride: base + p * stride + k])


@pytest.mark.parametrize("device", DEVICES)
def test_strided_view_aliases_its_input(device):
    """Writes through the view land at row compress_base + p * stride + s of the
    tensor (the plane of every layer), for the NoPE and the rope plane alike."""
    base, stride, k = 40, 90, 32
    for plane in (torch.zeros(1000, 8, device=device), torch.zeros(1000, 4, dtype=torch.bfloat16, device=device)):
        view = ukv_torch.bind_compress_view(plane, compress_base=base, compress_ratio=4, block_size=BS,
                                            block_stride=stride)
        assert view.untyped_storage().data_ptr() == plane.untyped_storage().data_ptr()
        for p, s in [(0, 0), (3, 5), (view.shape[0] - 1, k - 1)]:
            view[p, s] = p * 100 + s + 1
            assert torch.all(plane[base + p * stride + s] == p * 100 + s + 1)
        assert torch.count_nonzero(plane) == 3 * plane.shape[1]
        plane[base + 2 * stride + 7] = -1  # and writes to the tensor show through the view
        assert torch.all(view[2, 7] == -1)


def test_strided_view_of_a_row_strided_tensor():
    kv = torch.zeros(512, 16)[:, :8]
    view = ukv_torch.bind_compress_view(kv, compress_base=10, compress_ratio=4, block_size=BS, block_stride=50)
    assert view.shape == ((512 - 10 - 32) // 50 + 1, 32, 8)
    assert view.stride() == (50 * 16, 16, 1) and view.storage_offset() == 10 * 16
    view[2, 3] = 4
    assert torch.all(kv[10 + 2 * 50 + 3] == 4) and torch.count_nonzero(kv) == 8


@pytest.mark.parametrize("device", DEVICES)
def test_stride_k_is_the_default_view(device):
    kv = torch.randn(512, 4, device=device)
    plain = ukv_torch.bind_compress_view(kv, compress_base=128, compress_ratio=4, block_size=BS)
    strided = ukv_torch.bind_compress_view(kv, compress_base=128, compress_ratio=4, block_size=BS, block_stride=32)
    assert plain.shape == strided.shape and plain.stride() == strided.stride()
    assert plain.storage_offset() == strided.storage_offset() and torch.equal(plain, strided)


@pytest.mark.parametrize("rows,base", [(31, 0), (100, 90), (100, 100), (0, 0)])
def test_strided_view_without_a_whole_block(rows, base):
    """Fewer than k rows after compress_base: no block (rows need not be whole blocks)."""
    view = ukv_torch.bind_compress_view(torch.zeros(rows, 2), compress_base=base, compress_ratio=4, block_size=BS,
                                        block_stride=40)
    assert view.shape == (0, 32, 2)


def test_strided_view_under_compile():
    kv = torch.zeros(1000, 4)

    @torch.compile(fullgraph=True)
    def write(kv):
        view = ukv_torch.bind_compress_view(kv, compress_base=8, compress_ratio=4, block_size=BS, block_stride=70)
        view[3, 1].fill_(5.0)

    write(kv)
    assert torch.all(kv[8 + 3 * 70 + 1] == 5) and torch.count_nonzero(kv) == 4


@pytest.mark.parametrize("stride", [31, 0, -1, -(2**63), 2**31, 2**40, 2**63 - 1])
def test_bad_block_strides(stride):
    with pytest.raises(ValueError, match=rf"^bind_compress_view: block_stride must be in \[k = 32, 2147483647\] "
                                         rf".*got {stride}$"):
        ukv_torch.bind_compress_view(torch.zeros(512, 4), compress_base=0, compress_ratio=4, block_size=BS,
                                     block_stride=stride)


def test_strided_view_needs_contiguous_rows():
    kv = torch.zeros(4, 512).t()
    with pytest.raises(ValueError, match=r"^bind_compress_view: unified_kv's rows must be contiguous"):
        ukv_torch.bind_compress_view(kv, compress_base=0, compress_ratio=4, block_size=BS, block_stride=40)
