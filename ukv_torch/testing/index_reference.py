"""Plain per-token Python reference of the index builders (SPEC.md §2.3-2.6).

Written from the SPEC formulas, token by token and cell by cell, on Python
lists; it shares nothing with the C++/CUDA implementation. Inputs are assumed
valid (the kernels' clamps for bad values are tested separately).
"""


def swa_row(swa_table, b, a, block_size):
    """unified_kv row of SWA position a of sequence b."""
    return swa_table[b][a // block_size] * block_size + a % block_size


def compress_row(table, b, e, k, base):
    """unified_kv row of compressed entry e of sequence b (k entries per block)."""
    return base + table[b][e // k] * k + e % k


def is_real(b, num_seqs):
    return 0 <= b < num_seqs


def cumsum0(counts):
    out = [0]
    for c in counts:
        out.append(out[-1] + c)
    return out


def decode_metadata(positions, batch_id, n_csa, n_hca, window, index_topk, csa_ratio=4):
    """(swa_indptr, csa_indptr, hca_indptr) of a decode step."""
    swa, csa, hca = [], [], []
    for p, b in zip(positions, batch_id):
        if not is_real(b, len(n_csa)):
            swa.append(0), csa.append(0), hca.append(0)
            continue
        n_swa = min(p + 1, window)
        valid_k = min((p + 1) // csa_ratio, n_csa[b], index_topk)
        swa.append(n_swa)
        csa.append(n_swa + valid_k)
        hca.append(n_swa + n_hca[b])
    return cumsum0(swa), cumsum0(csa), cumsum0(hca)


def prefill_window(p, cs, window):
    """(pos_in_chunk, swa_low, extend_count, prefix_swa_count) of a prefill token."""
    tpic = p - cs
    swa_low = max(p - window + 1, 0)
    extend_count = min(tpic + 1, window)
    prefix_swa_count = max(cs - swa_low, 0)
    return tpic, swa_low, extend_count, prefix_swa_count


def prefill_metadata(positions, batch_id, chunk_start, n_csa, n_hca, window, index_topk, csa_ratio=4,
                     hca_ratio=128):
    """(extend, swa, csa, hca indptrs, prefix_swa_count) of a prefill forward."""
    ext, swa, csa, hca, prefix = [], [], [], [], []
    for p, b in zip(positions, batch_id):
        if not is_real(b, len(chunk_start)):
            for lst in (ext, swa, csa, hca, prefix):
                lst.append(0)
            continue
        _, _, extend_count, prefix_swa_count = prefill_window(p, chunk_start[b], window)
        valid_k = min((p + 1) // csa_ratio, n_csa[b], index_topk)
        n_hca_tok = min((p + 1) // hca_ratio, n_hca[b])
        ext.append(extend_count)
        swa.append(prefix_swa_count)
        csa.append(prefix_swa_count + valid_k)
        hca.append(prefix_swa_count + n_hca_tok)
        prefix.append(prefix_swa_count)
    return cumsum0(ext), cumsum0(swa), cumsum0(csa), cumsum0(hca), prefix


def csa_translate_pack(out, topk, table, positions, batch_id, indptr, skip, window, base, k):
    """Top-k entries -> rows at the head of each CSA slice; out is modified in place."""
    for t, b in enumerate(batch_id):
        if not is_real(b, len(table)):
            continue
        s = skip[t] if skip is not None else min(positions[t] + 1, window)
        valid_k = indptr[t + 1] - indptr[t] - s
        for i in range(valid_k):
            out[indptr[t] + i] = compress_row(table, b, topk[t][i], k, base)


def paged_decode_indices(outs, swa_table, positions, batch_id, window, block_size):
    """outs: list of (indptr, out) pairs; the window goes to each slice's tail."""
    for t, b in enumerate(batch_id):
        if not is_real(b, len(swa_table)):
            continue
        p = positions[t]
        n = min(p + 1, window)
        for indptr, out in outs:
            end = indptr[t + 1]
            for i in range(n):
                out[end - n + i] = swa_row(swa_table, b, p - n + 1 + i, block_size)


def hca_decode_indices(out, table, batch_id, n_hca, indptr, base, k):
    """Committed HCA entries at the head of each decode HCA slice."""
    for t, b in enumerate(batch_id):
        if not is_real(b, len(table)):
            continue
        for e in range(n_hca[b]):
            out[indptr[t] + e] = compress_row(table, b, e, k, base)


def paged_prefill_indices(outs, positions, batch_id, chunk_start, query_start, n_hca, swa_table, hca_table,
                          window, block_size, base, hca_ratio, hca_k):
    """outs: dict name -> (indptr, out) for 'extend', 'swa', 'csa', 'hca'."""
    ext_ptr, ext = outs["extend"]
    swa_ptr, swa = outs["swa"]
    csa_ptr, csa = outs["csa"]
    hca_ptr, hca = outs["hca"]
    for t, b in enumerate(batch_id):
        if not is_real(b, len(swa_table)):
            continue
        p = positions[t]
        tpic, swa_low, extend_count, prefix_swa_count = prefill_window(p, chunk_start[b], window)
        n_hca_tok = min((p + 1) // hca_ratio, n_hca[b])
        for i in range(extend_count):
            ext[ext_ptr[t] + i] = query_start[b] + tpic - extend_count + 1 + i
        for i in range(prefix_swa_count):
            row = swa_row(swa_table, b, swa_low + i, block_size)
            swa[swa_ptr[t] + i] = row
            hca[hca_ptr[t] + i] = row
            csa[csa_ptr[t + 1] - prefix_swa_count + i] = row
        for e in range(n_hca_tok):
            hca[hca_ptr[t] + prefix_swa_count + e] = compress_row(hca_table, b, e, hca_k, base)
