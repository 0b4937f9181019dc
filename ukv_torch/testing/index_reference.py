"""Plain per-token Python reference of the index builders (upstream's decode
and prefill index formulas) and of the row-space layout's ops
(swa_slot_mapping, apply_row_copies).

Written from those formulas, token by token and cell by cell, on Python
lists; it shares nothing with the C++/CUDA implementation. Inputs are assumed
valid (the kernels' clamps for bad values are tested separately), except for
what the contracts define: a negative SWA table entry (a page the sequence
does not hold) is read as unit 0, and rows are the int32 values they are
stored as.

Row-space constants: a layer class's SWA rows are the five ints
``[page, unit_rows, offset, group, group_stride]`` (``swa_rows`` of the ops);
None is the slot layouts' formula, the constants of plain_swa_rows.
"""


def as_int32(value):
    """value modulo 2^32, as the int32 an output cell stores."""
    return (value + 2**31) % 2**32 - 2**31


def plain_swa_rows(block_size):
    """The slot layouts' SWA row constants: one page of block_size rows per table entry."""
    return [block_size, block_size, 0, block_size, block_size]


def swa_row_in(unit, a, rows):
    """Row of SWA position a inside SWA unit `unit`, with a class's constants."""
    page, unit_rows, offset, group, group_stride = rows
    q = a % page
    return as_int32(unit * unit_rows + offset + (q // group) * group_stride + q % group)


def swa_row(swa_table, b, a, block_size, rows=None):
    """unified_kv row of SWA position a of sequence b: table[b][a // block_size] *
    block_size + a % block_size, or with the constants `rows` unit * unit_rows +
    offset + (q // group) * group_stride + q % group, unit = table[b][a // page]
    (read as 0 when negative) and q = a % page."""
    rows = plain_swa_rows(block_size) if rows is None else rows
    return swa_row_in(max(swa_table[b][a // rows[0]], 0), a, rows)


def compress_row(table, b, e, k, base, stride=None):
    """unified_kv row of compressed entry e of sequence b (k entries per block,
    `stride` rows from one block to the next: k unless given)."""
    return as_int32(base + table[b][e // k] * (k if stride is None else stride) + e % k)


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


def csa_translate_pack(out, topk, table, positions, batch_id, indptr, skip, window, base, k, stride=None):
    """Top-k entries -> rows at the head of each CSA slice; out is modified in place."""
    for t, b in enumerate(batch_id):
        if not is_real(b, len(table)):
            continue
        s = skip[t] if skip is not None else min(positions[t] + 1, window)
        valid_k = indptr[t + 1] - indptr[t] - s
        for i in range(valid_k):
            out[indptr[t] + i] = compress_row(table, b, topk[t][i], k, base, stride)


def paged_decode_indices(outs, swa_table, positions, batch_id, window, block_size, swa_rows=None):
    """outs: list of (indptr, out) pairs; the window goes to each slice's tail.
    swa_rows: the row constants of each output (a list beside outs), None: all plain."""
    swa_rows = swa_rows or [None] * len(outs)
    for t, b in enumerate(batch_id):
        if not is_real(b, len(swa_table)):
            continue
        p = positions[t]
        n = min(p + 1, window)
        for (indptr, out), rows in zip(outs, swa_rows):
            end = indptr[t + 1]
            for i in range(n):
                out[end - n + i] = swa_row(swa_table, b, p - n + 1 + i, block_size, rows)


def hca_decode_indices(out, table, batch_id, n_hca, indptr, base, k, stride=None):
    """Committed HCA entries at the head of each decode HCA slice."""
    for t, b in enumerate(batch_id):
        if not is_real(b, len(table)):
            continue
        for e in range(n_hca[b]):
            out[indptr[t] + e] = compress_row(table, b, e, k, base, stride)


def paged_prefill_indices(outs, positions, batch_id, chunk_start, query_start, n_hca, swa_table, hca_table,
                          window, block_size, base, hca_ratio, hca_k, swa_rows=None, hca_stride=None):
    """outs: dict name -> (indptr, out) for 'extend', 'swa', 'csa', 'hca'.
    swa_rows: dict 'swa' / 'csa' / 'hca' -> the row constants of that output's
    SWA prefix (a missing or None entry: plain); hca_stride: the HCA block stride."""
    rows_of = {name: (swa_rows or {}).get(name) for name in ("swa", "csa", "hca")}
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
            row = {name: swa_row(swa_table, b, swa_low + i, block_size, rows) for name, rows in rows_of.items()}
            swa[swa_ptr[t] + i] = row["swa"]
            hca[hca_ptr[t] + i] = row["hca"]
            csa[csa_ptr[t + 1] - prefix_swa_count + i] = row["csa"]
        for e in range(n_hca_tok):
            hca[hca_ptr[t] + prefix_swa_count + e] = compress_row(hca_table, b, e, hca_k, base, hca_stride)


def swa_slot_mapping(swa_table, positions, batch_id, block_size, rows=None):
    """The SWA row each token is written at (a list, one per token): -1 for a
    padding token, a negative position, and a position whose page the table
    does not hold (an entry < 0, or a page past the table's columns)."""
    rows = plain_swa_rows(block_size) if rows is None else rows
    out = []
    for p, b in zip(positions, batch_id):
        if not is_real(b, len(swa_table)) or p < 0 or p // rows[0] >= len(swa_table[b]):
            out.append(-1)
            continue
        unit = swa_table[b][p // rows[0]]
        out.append(-1 if unit < 0 else swa_row_in(unit, p, rows))
    return out


def row_copy_phases(copies, counts):
    """The entries of each phase: phase p is copies[sum(counts[:p]) : + counts[p]],
    a negative count read as 0, every range clamped to the list."""
    phases, first = [], 0
    for count in counts:
        count = max(count, 0)
        phases.append(copies[min(first, len(copies)): min(first + count, len(copies))])
        first += count
    return phases


def refused_row_copies(copies, counts, num_rows):
    """Whether apply_row_copies refuses a list handed over on the host: an entry
    of a phase copying no rows, reaching outside the planes or overlapping
    itself, or two entries of one phase where one writes rows the other reads
    or writes (the GPU skips the first kind and leaves the second undefined)."""
    for phase in row_copy_phases(copies, counts):
        reads, writes = set(), set()
        for src, dst, n in phase:
            if n <= 0 or src < 0 or dst < 0 or src + n > num_rows or dst + n > num_rows:
                return True
            source, target = set(range(src, src + n)), set(range(dst, dst + n))
            if source & target or target & (reads | writes) or source & writes:
                return True
            reads |= source
            writes |= target
    return False


def apply_row_copies(planes, copies, counts):
    """planes: lists of rows (each plane the same number of rows), modified in
    place. copies: (src_row, dst_row, rows) entries; the phases run in order,
    an entry with rows <= 0 or a range outside the planes is skipped."""
    num_rows = len(planes[0]) if planes else 0
    for phase in row_copy_phases(copies, counts):
        for src, dst, n in phase:
            if n <= 0 or src < 0 or dst < 0 or src + n > num_rows or dst + n > num_rows:
                continue
            for plane in planes:
                plane[dst:dst + n] = plane[src:src + n]
