"""One small valid call of every index op (decode and prefill flavours of
csa_translate_pack; each op with row-space arguments as a "<name>@rows"
call beside its slot-layout one), by schema argument name, for the
bad-input, fuzz, eager and opcheck tests."""
import random

import torch

from support.index_cases import RowSpaceArgs, make_decode_step, make_prefill_step
from ukv_torch.testing import index_reference as ref


def i32(values, device):
    return torch.tensor(values, dtype=torch.int32, device=device)


def decode_call(device, step=None):
    step = step or make_decode_step(random.Random(0), contexts=[5, 300], num_padding=1, index_topk=8)
    x = step.tensors(device)
    swa, csa, hca = (i32(p, device) for p in ref.decode_metadata(step.positions, step.batch_id, step.n_csa,
                                                                 step.n_hca, step.window, step.index_topk))
    return step, x, (swa, csa, hca)


def prefill_call(device, step=None):
    step = step or make_prefill_step(random.Random(1), prefixes=[0, 200], chunk_lens=[2, 3], index_topk=8)
    x = step.tensors(device)
    meta = ref.prefill_metadata(step.positions, step.batch_id, step.chunk_start, step.n_csa, step.n_hca,
                                step.window, step.index_topk)
    return step, x, [i32(p, device) for p in meta[:4]], i32(meta[4], device)


def zeros(device):
    return lambda n, fill: torch.full((n,), fill, dtype=torch.int32, device=device)


def row_space_args(step):
    """The row-space arguments of the @rows calls: the step's own, else a fixed
    set on its tables (a page per column), each class with its own rows and
    both block strides past k."""
    if step.row_space is not None:
        return step.row_space
    bs = step.block_size
    unit = 3 * bs + 8
    return RowSpaceArgs([bs, unit, 5, bs, bs], [bs, unit, bs + 9, bs // 2, bs // 2 + 3], [bs, unit, 2 * bs + 9, 1, 1],
                        csa_stride=step.csa_k + 40, hca_stride=step.hca_k + 700, page=bs)


PLANE_ROWS = 24
# (src_row, dst_row, rows) in three phases of two: phase 1 reads the rows phase
# 0 wrote (8..11) and writes rows phase 0 read (0..1); phase 2 copies the last
# rows to the front; the last entry is past every phase's count and is not
# applied (on the host it is not even checked).
COPIES = [[0, 8, 4], [12, 20, 3], [8, 16, 4], [4, 0, 2], [22, 2, 2], [5, 6, 1], [0, 1, 5]]
COPY_COUNTS = [2, 2, 2]


def planes(alloc, device):
    """Three planes of PLANE_ROWS rows, made by alloc (int32 cells) and viewed as
    [rows, width] of several dtypes and widths, with distinct contents."""
    out = []
    for i, (width, dtype) in enumerate([(4, torch.int32), (3, torch.int16), (5, torch.uint8)]):
        cells = alloc(PLANE_ROWS * width, 0)
        cells.copy_(torch.arange(PLANE_ROWS * width, dtype=torch.int32, device=device) * 1000 + 7 * i + 1)
        plane = cells.view(PLANE_ROWS, width)
        out.append(plane if dtype == torch.int32 else plane.view(dtype))
    return out


# Each valid call: (op name, tensor arguments by schema name with their kind, scalar kwargs).
# decode / prefill: the steps to build them from (default: small fixed ones);
# alloc(n, fill): how each output is made (default: a fresh zero tensor).
def valid_calls(device, decode=None, prefill=None, alloc=None):
    alloc = alloc or zeros(device)
    step, x, (swa, csa, hca) = decode_call(device, decode)
    out = lambda ptr: alloc(int(ptr[-1]), 0)  # noqa: E731
    base, window, bs = step.compress_base, step.window, step.block_size
    calls = {
        "csa_translate_pack": ({"topk_local": x.topk, "block_table": x.csa_table, "positions": x.positions,
                                "batch_id": x.batch_id, "kv_indptr": csa, "skip_per_token": None,
                                "kv_indices": out(csa)},
                               {"compress_base": base, "window": window, "block_size": bs}),
        "paged_decode_indices": ({"swa_block_table": x.swa_table, "positions": x.positions, "batch_id": x.batch_id,
                                  "swa_indptr": swa, "swa_indices": out(swa), "csa_indptr": csa,
                                  "csa_indices": out(csa), "hca_indptr": hca, "hca_indices": out(hca)},
                                 {"window": window, "block_size": bs}),
        "hca_decode_indices": ({"hca_block_table": x.hca_table, "batch_id": x.batch_id, "n_committed_hca": x.n_hca,
                                "hca_indptr": hca, "hca_indices": out(hca)}, {"compress_base": base, "block_size": bs}),
        "decode_index_metadata": ({"positions": x.positions, "batch_id": x.batch_id, "n_committed_csa": x.n_csa,
                                   "n_committed_hca": x.n_hca, **{f"{n}_indptr": alloc(p.numel(), 0) for n, p in
                                                                  (("swa", swa), ("csa", csa), ("hca", hca))}},
                                  {"window": window, "index_topk": step.index_topk}),
    }

    def with_rows(call_name, outputs, scalars):
        """The call with fresh outputs (name -> indptr) and the row-space scalars added."""
        tensors, plain = calls[call_name]
        return {**tensors, **{n: out(ptr) for n, ptr in outputs.items()}}, {**plain, **scalars}

    rows = row_space_args(step)
    calls["csa_translate_pack@rows"] = with_rows("csa_translate_pack", {"kv_indices": csa},
                                                 {"block_stride": rows.csa_stride})
    calls["paged_decode_indices@rows"] = with_rows(
        "paged_decode_indices", {"swa_indices": swa, "csa_indices": csa, "hca_indices": hca},
        step.swa_rows_kwargs(rows))
    calls["hca_decode_indices@rows"] = with_rows("hca_decode_indices", {"hca_indices": hca},
                                                 {"block_stride": rows.hca_stride})
    for name, class_rows in (("swa_slot_mapping", {}), ("swa_slot_mapping@rows", {"swa_rows": rows.csa_swa_rows})):
        calls[name] = ({"swa_block_table": x.swa_table, "positions": x.positions, "batch_id": x.batch_id,
                        "slot_mapping": alloc(len(step.positions), 0)}, {"block_size": bs, **class_rows})

    step, x, ptrs, prefix = prefill_call(device, prefill)
    base, window, bs = step.compress_base, step.window, step.block_size
    names = ("extend", "swa", "csa", "hca")
    calls["paged_prefill_indices"] = (
        {"positions": x.positions, "batch_id": x.batch_id, "chunk_start": x.chunk_start,
         "query_start": x.query_start, "n_committed_hca": x.n_hca, "swa_block_table": x.swa_table,
         "hca_block_table": x.hca_table,
         **{f"{n}_indptr": p for n, p in zip(names, ptrs)},
         **{f"{n}_indices": out(p) for n, p in zip(names, ptrs)}},
        {"compress_base": base, "window": window, "block_size": bs})
    calls["csa_translate_pack_prefill"] = (
        {"topk_local": x.topk, "block_table": x.csa_table, "positions": x.positions, "batch_id": x.batch_id,
         "kv_indptr": ptrs[2], "skip_per_token": prefix, "kv_indices": out(ptrs[2])},
        {"compress_base": base, "block_size": bs})
    calls["prefill_index_metadata"] = (
        {"positions": x.positions, "batch_id": x.batch_id, "chunk_start": x.chunk_start, "n_committed_csa": x.n_csa,
         "n_committed_hca": x.n_hca, **{f"{n}_indptr": alloc(p.numel(), 0) for n, p in zip(names, ptrs)},
         "prefix_swa_count": alloc(prefix.numel(), 0)}, {"window": window, "index_topk": step.index_topk})
    rows = row_space_args(step)
    calls["paged_prefill_indices@rows"] = with_rows(
        "paged_prefill_indices", {f"{n}_indices": p for n, p in zip(names, ptrs)},
        {"hca_block_stride": rows.hca_stride, **step.swa_rows_kwargs(rows)})
    calls["csa_translate_pack_prefill@rows"] = with_rows("csa_translate_pack_prefill", {"kv_indices": ptrs[2]},
                                                         {"block_stride": rows.csa_stride})
    calls["apply_row_copies"] = ({"planes": planes(alloc, device), "copies": i32(COPIES, device),
                                  "copy_counts": i32(COPY_COUNTS, device)}, {})
    return calls


def op_label(call_name):
    """The op a call name calls: without its variant ("_prefill" of csa_translate_pack, "@rows")."""
    name = call_name.split("@")[0]
    return name.replace("_prefill", "") if name.startswith("csa") else name


def op_of(call_name):
    return getattr(torch.ops.ukv, op_label(call_name))


def call(call_name, tensors, scalars):
    op_of(call_name).default(**tensors, **scalars)


def output_names(call_name):
    """The arguments the call's op writes (its schema's mutable ones)."""
    return [a.name for a in op_of(call_name).default._schema.arguments
            if a.alias_info is not None and a.alias_info.is_write]


def outputs_of(call_name, tensors):
    """The call's outputs among tensors, by name (a tensor list's elements as name[i])."""
    out = {}
    for name in output_names(call_name):
        value = tensors.get(name)
        if isinstance(value, torch.Tensor):
            out[name] = value
        elif isinstance(value, (list, tuple)):
            out.update((f"{name}[{i}]", t) for i, t in enumerate(value))
    return out


def snapshot(call_name, tensors):
    """Copies of the call's outputs (outputs_of)."""
    return {name: t.clone() for name, t in outputs_of(call_name, tensors).items()}
