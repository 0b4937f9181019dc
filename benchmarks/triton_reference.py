"""The upstream engine's SWA index kernels, written in Triton as it writes them
(one program per token, a power-of-two lane vector over the window), for the
kernel benchmark to time beside ukv_torch's ops on the same inputs in the same
process. They follow the upstream contract (slot layouts: row = unit *
block_size + a % block_size; compress base added to the HCA entries) and are
checked against the ops' outputs before any timing.

    paged_decode(...)   each decode token's window at the tail of its SWA, CSA
                        and HCA slices
    paged_prefill(...)  each prefill token's extend rows, SWA prefix (SWA
                        slice; CSA slice tail; HCA slice head) and HCA entries

Runs on a GPU, or on the CPU under TRITON_INTERPRET=1 (tests use that).
"""
import torch
import triton
import triton.language as tl


@triton.jit
def _paged_decode_kernel(table, table_stride, batch_id, positions, swa_indptr, csa_indptr, hca_indptr, swa_out,
                         csa_out, hca_out, block_size, WINDOW: tl.constexpr, LANES: tl.constexpr):
    t = tl.program_id(0)
    b = tl.load(batch_id + t)
    if b >= 0:
        p = tl.load(positions + t).to(tl.int32)
        n = tl.minimum(p + 1, WINDOW)
        i = tl.arange(0, LANES)
        live = i < n
        a = p - n + 1 + i
        unit = tl.load(table + b.to(tl.int64) * table_stride + a // block_size, mask=live, other=0)
        row = unit * block_size + a % block_size
        tl.store(swa_out + tl.load(swa_indptr + t + 1) - n + i, row, mask=live)
        tl.store(csa_out + tl.load(csa_indptr + t + 1) - n + i, row, mask=live)
        tl.store(hca_out + tl.load(hca_indptr + t + 1) - n + i, row, mask=live)


@triton.jit
def _paged_prefill_kernel(positions, batch_id, chunk_start, query_start, n_hca_committed, hca_table, hca_stride,
                          swa_table, swa_stride, extend_indptr, swa_indptr, csa_indptr, hca_indptr, extend_out,
                          swa_out, csa_out, hca_out, block_size, compress_base, WINDOW: tl.constexpr,
                          HCA_RATIO: tl.constexpr, LANES: tl.constexpr):
    t = tl.program_id(0)
    b = tl.load(batch_id + t)
    if b >= 0:
        p = tl.load(positions + t).to(tl.int32)
        cs = tl.load(chunk_start + b)
        n_hca = tl.minimum((p + 1) // HCA_RATIO, tl.load(n_hca_committed + b))
        in_chunk = p - cs
        swa_low = tl.maximum(p - WINDOW + 1, 0)
        extend_count = tl.minimum(in_chunk + 1, WINDOW)
        prefix = tl.maximum(cs - swa_low, 0)
        i = tl.arange(0, LANES)
        first_row = tl.load(query_start + b) + in_chunk - extend_count + 1
        tl.store(extend_out + tl.load(extend_indptr + t) + i, first_row + i, mask=i < extend_count)
        live = i < prefix
        a = swa_low + i
        unit = tl.load(swa_table + b.to(tl.int64) * swa_stride + a // block_size, mask=live, other=0)
        row = unit * block_size + a % block_size
        hca_begin = tl.load(hca_indptr + t)
        tl.store(swa_out + tl.load(swa_indptr + t) + i, row, mask=live)
        tl.store(hca_out + hca_begin + i, row, mask=live)
        tl.store(csa_out + tl.load(csa_indptr + t + 1) - prefix + i, row, mask=live)
        for k0 in range(0, n_hca, LANES):
            k = k0 + i
            entry = tl.load(hca_table + b.to(tl.int64) * hca_stride + k, mask=k < n_hca, other=0)
            tl.store(hca_out + hca_begin + prefix + k, compress_base + entry, mask=k < n_hca)


def paged_decode(swa_table, positions, batch_id, swa_indptr, swa_out, csa_indptr, csa_out, hca_indptr, hca_out,
                 window: int, block_size: int):
    _paged_decode_kernel[(batch_id.numel(),)](swa_table, swa_table.stride(0), batch_id, positions, swa_indptr,
                                              csa_indptr, hca_indptr, swa_out, csa_out, hca_out, block_size,
                                              WINDOW=window, LANES=triton.next_power_of_2(window))


def paged_prefill(positions, batch_id, chunk_start, query_start, n_hca, swa_table, hca_table, extend_indptr,
                  swa_indptr, csa_indptr, hca_indptr, extend_out, swa_out, csa_out, hca_out, window: int,
                  block_size: int, hca_ratio: int, compress_base: int = 0):
    """hca_table holds one row per HCA block (block_size / hca_ratio == 1), as upstream's V4 constants."""
    _paged_prefill_kernel[(batch_id.numel(),)](positions, batch_id, chunk_start, query_start, n_hca, hca_table,
                                               hca_table.stride(0), swa_table, swa_table.stride(0), extend_indptr,
                                               swa_indptr, csa_indptr, hca_indptr, extend_out, swa_out, csa_out,
                                               hca_out, block_size, compress_base, WINDOW=window,
                                               HCA_RATIO=hca_ratio, LANES=triton.next_power_of_2(window))


def available() -> bool:
    """Whether Triton can run these kernels here (a CUDA device)."""
    return torch.cuda.is_available()
