"""ukv.seal_objects / ukv.verify_objects against the checksum formula written
out independently here (numpy, csrc/kernels/object_checksum.h's definition):
multi-chunk payloads, payloads of any length, every single-byte change caught,
bad arguments refused by name with the buffer unchanged, and the GPU kernels
byte-equal to the CPU path."""
import struct

import numpy as np
import pytest
import torch

import ukv_torch  # noqa: F401  (registers the ops)

from support.hash_formulas import fmix64

POSITION_KEY, SPREAD, LANE = 0x9E3779B97F4A7C15, 0xD6E8FEB86659FD93, 0xC2B2AE3D27D4EB4F


def reference_checksum(header48: bytes, payload: bytes) -> bytes:
    data = header48 + payload + bytes(-len(payload) % 8)
    w = np.frombuffer(data, dtype="<u8")
    j = np.arange(1, len(w) + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = (w ^ (j * np.uint64(POSITION_KEY))) * np.uint64(SPREAD)
        a = int(np.sum(x, dtype=np.uint64))
        b = int(np.sum(x ^ (x >> np.uint64(31)), dtype=np.uint64))
    lo = fmix64(a ^ (48 + len(payload)))
    hi = fmix64(b ^ lo ^ LANE)
    return struct.pack("<QQ", lo, hi)


def random_objects(gen, sizes, gap=64):
    """A buffer with objects of these payload sizes (random bytes), 64-byte aligned
    with ``gap`` spare bytes between; the objects table and their headers."""
    offsets, at = [], 0
    for size in sizes:
        offsets.append(at)
        at += -(-(64 + size) // 64) * 64 + gap
    buffer = torch.randint(0, 256, (at,), generator=gen, dtype=torch.uint8)
    headers = []
    for size in sizes:
        words = [int(v) for v in torch.randint(0, 2**62, (6,), generator=gen)]
        words[1] = size
        headers.append(struct.pack("<6Q", *words))
    table = torch.tensor([[o] + list(struct.unpack("<6q", h)) for o, h in zip(offsets, headers)], dtype=torch.int64)
    return buffer, table.view(-1, 7), offsets, headers


SIZES = [0, 1, 7, 8, 9, 15, 16, 17, 100, 4096, 65535, 65536, 65537, 200_003, 3 * 65536 + 48]


def test_seal_writes_the_header_and_the_formula_s_checksum():
    gen = torch.Generator().manual_seed(1)
    buffer, table, offsets, headers = random_objects(gen, SIZES)
    before = buffer.clone()
    torch.ops.ukv.seal_objects(buffer, table)
    data = buffer.numpy().tobytes()
    for offset, header, size in zip(offsets, headers, SIZES):
        payload = data[offset + 64: offset + 64 + size]
        assert data[offset: offset + 48] == header
        assert data[offset + 48: offset + 64] == reference_checksum(header, payload), size
    # Nothing but the headers changed.
    changed = (buffer != before).nonzero().view(-1).tolist()
    assert all(any(o <= i < o + 64 for o in offsets) for i in changed)
    assert torch.ops.ukv.verify_objects(buffer, table).all()


def test_every_changed_byte_is_caught():
    gen = torch.Generator().manual_seed(2)
    sizes = [300, 70_000]
    buffer, table, offsets, _ = random_objects(gen, sizes)
    torch.ops.ukv.seal_objects(buffer, table)
    for obj, (offset, size) in enumerate(zip(offsets, sizes)):
        for i in list(range(offset, offset + 64 + 40)) + list(range(offset + 64 + size - 40, offset + 64 + size)):
            buffer[i] ^= 1 << (i % 8)
            ok = torch.ops.ukv.verify_objects(buffer, table).tolist()
            assert ok[obj] is False and ok[1 - obj] is True, i
            buffer[i] ^= 1 << (i % 8)
    assert torch.ops.ukv.verify_objects(buffer, table).all()
    # Bytes outside every object (the gaps) do not matter.
    buffer[offsets[1] - 1] ^= 0xFF
    assert torch.ops.ukv.verify_objects(buffer, table).all()


def test_verify_compares_the_expected_header():
    gen = torch.Generator().manual_seed(3)
    buffer, table, _, _ = random_objects(gen, [500, 500])
    torch.ops.ukv.seal_objects(buffer, table)
    other = table.clone()
    other[0, 6] ^= 1  # another key expected for object 0
    assert torch.ops.ukv.verify_objects(buffer, other).tolist() == [False, True]
    swapped = table.clone()
    swapped[:, 0] = table[:, 0].flip(0)  # each header expected at the other's place
    assert torch.ops.ukv.verify_objects(buffer, swapped).tolist() == [False, False]


def bad_calls(buffer, table):
    """(what the error names, the call's arguments) for each misuse."""
    yield "objects must be int64", (buffer, table.to(torch.int32))
    yield "objects must be a contiguous \\[n, 7\\]", (buffer, table[:, :6])
    yield "buffer must be uint8", (buffer.view(torch.int8), table)
    yield "buffer must be a contiguous 1-D", (buffer.view(-1, 64), table)
    yield "buffer must start on a 16-byte boundary", (buffer[8:], table - torch.tensor([8, 0, 0, 0, 0, 0, 0]))
    misaligned = table.clone()
    misaligned[1, 0] += 8
    yield "offset must be >= 0 and a multiple of 16", (buffer, misaligned)
    past = table.clone()
    past[1, 2] = buffer.numel()
    yield "must lie inside the buffer", (buffer, past)
    huge = table.clone()
    huge[0, 2] = -1  # 2^64 - 1 payload bytes
    yield "must lie inside the buffer", (buffer, huge)


@pytest.mark.parametrize("op", ["seal_objects", "verify_objects"])
def test_bad_arguments_are_refused_by_name_and_change_nothing(op):
    gen = torch.Generator().manual_seed(4)
    buffer, table, _, _ = random_objects(gen, [100, 100])
    before = buffer.clone()
    for message, args in bad_calls(buffer, table):
        with pytest.raises((ValueError, TypeError, RuntimeError), match=f"{op}: .*{message}"):
            getattr(torch.ops.ukv, op)(*args)
        assert torch.equal(buffer, before), message


def test_seal_refuses_overlapping_objects():
    gen = torch.Generator().manual_seed(5)
    buffer, table, _, _ = random_objects(gen, [100, 100])
    overlapping = table.clone()
    overlapping[1, 0] = table[0, 0] + 128  # inside object 0 (64 + 100 bytes)
    before = buffer.clone()
    with pytest.raises(ValueError, match="seal_objects: objects must not overlap"):
        torch.ops.ukv.seal_objects(buffer, overlapping)
    assert torch.equal(buffer, before)
    assert torch.ops.ukv.verify_objects(buffer, overlapping).tolist() == [False, False]  # reading may overlap


def test_opcheck():
    gen = torch.Generator().manual_seed(6)
    buffer, table, _, _ = random_objects(gen, [100, 70_000])
    torch.library.opcheck(torch.ops.ukv.seal_objects.default, (buffer, table))
    torch.library.opcheck(torch.ops.ukv.verify_objects.default, (buffer, table))


@pytest.mark.gpu
def test_the_gpu_kernels_write_and_judge_what_the_cpu_does():
    gen = torch.Generator().manual_seed(7)
    sizes = SIZES + [1 << 20, (1 << 20) + 3]
    buffer, table, offsets, _ = random_objects(gen, sizes)
    on_gpu = buffer.cuda()
    torch.ops.ukv.seal_objects(buffer, table)
    torch.ops.ukv.seal_objects(on_gpu, table)
    assert torch.equal(on_gpu.cpu(), buffer)
    assert torch.ops.ukv.verify_objects(on_gpu, table).all()
    for obj, offset in enumerate(offsets):
        at = offset + 64 + sizes[obj] - 1 if sizes[obj] else offset + 50
        on_gpu[at] ^= 0x80
    with pytest.raises(RuntimeError, match="seal_objects: objects must be a host"):
        torch.ops.ukv.seal_objects(on_gpu, table.cuda())
    with pytest.raises(RuntimeError, match="verify_objects: buffer must be on cuda, got cpu"):
        torch.ops.ukv.verify_objects(buffer, table.cuda())  # CUDA dispatch: buffer on the host
        ok = torch.ops.ukv.verify_objects(on_gpu, table).cpu()
        assert not ok[obj] and int(ok.sum()) == len(sizes) - 1, obj
        on_gpu[at] ^= 0x80
    with pytest.raises(RuntimeError, match="seal_objects: objects must be a host"):
        torch.ops.ukv.seal_objects(on_gpu, table.cuda())
    with pytest.raises(RuntimeError, match="verify_objects: buffer must be on cuda, got cpu"):
        torch.ops.ukv.verify_objects(buffer, table.cuda())  # CUDA dispatch: buffer on the host
