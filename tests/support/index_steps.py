"""Whole decode and prefill steps, run through the ops and through the reference.

A decode step is what an attention backend does every forward: build the
indptrs on the device, then fill the SWA buffer and the CSA/HCA buffers (SWA
tails by paged_decode_indices, heads by csa_translate_pack and
hca_decode_indices). A prefill step builds its four indptrs and fills the four
buffers, then csa_translate_pack fills the CSA heads with skip = prefix count.
Both also map their tokens to the SWA rows they are written at, for each
layer class (swa_slot_mapping). A step with row-space arguments
(Step.row_space) passes them to every op and to the reference.
"""
import torch

import ukv_torch
from support.index_cases import SENTINEL, SLACK, reference_buffer
from ukv_torch.testing import index_reference as ref


def fresh_buffers(device):
    """The default allocator of a step's outputs: alloc(n, fill) -> a new int32 [n]."""
    return lambda n, fill: torch.full((n,), fill, dtype=torch.int32, device=device)


def output(alloc, indptr):
    """A sentinel-filled output for the slices of indptr, plus SLACK cells (see index_cases)."""
    return alloc(int(indptr[-1]) + SLACK, SENTINEL)


SWA_CLASSES = ("swa", "csa", "hca")


def reference_slots(step):
    """The SWA row each of the step's tokens is written at, per layer class ("<class>_slots")."""
    return {f"{name}_slots": ref.swa_slot_mapping(step.swa_table, step.positions, step.batch_id, step.block_size,
                                                  step.swa_rows_of(name)) for name in SWA_CLASSES}


def op_slots(step, x, alloc):
    """swa_slot_mapping of the step's tokens for each layer class, as lists."""
    slots = {}
    for name in SWA_CLASSES:
        out = alloc(len(step.positions), SENTINEL)
        ukv_torch.swa_slot_mapping(x.swa_table, x.positions, x.batch_id, out, block_size=step.block_size,
                                   swa_rows=step.swa_rows_of(name))
        slots[f"{name}_slots"] = out.tolist()
    return slots


def reference_decode(step):
    window = step.window
    swa_ptr, csa_ptr, hca_ptr = ref.decode_metadata(step.positions, step.batch_id, step.n_csa, step.n_hca, window,
                                                    step.index_topk, step.csa_ratio)
    swa, csa, hca = reference_buffer(swa_ptr), reference_buffer(csa_ptr), reference_buffer(hca_ptr)
    ref.paged_decode_indices([(swa_ptr, swa), (csa_ptr, csa), (hca_ptr, hca)], step.swa_table, step.positions,
                             step.batch_id, window, step.block_size, [step.swa_rows_of(n) for n in SWA_CLASSES])
    ref.csa_translate_pack(csa, step.topk, step.csa_table, step.positions, step.batch_id, csa_ptr, None, window,
                           step.compress_base, step.csa_k, step.csa_stride)
    ref.hca_decode_indices(hca, step.hca_table, step.batch_id, step.n_hca, hca_ptr, step.compress_base, step.hca_k,
                           step.hca_stride)
    return {"swa_indptr": swa_ptr, "csa_indptr": csa_ptr, "hca_indptr": hca_ptr, "swa": swa, "csa": csa, "hca": hca,
            **reference_slots(step)}


def op_decode(step, device, positions_dtype=torch.int64, strided_tables=False, alloc=None):
    """The step through the ops; alloc(n, fill) makes each output (default: fresh_buffers)."""
    alloc = alloc or fresh_buffers(device)
    x = step.tensors(device, positions_dtype, strided_tables)
    num_tokens = len(step.positions)
    ptrs = {name: alloc(num_tokens + 1, -1) for name in ("swa_indptr", "csa_indptr", "hca_indptr")}
    ukv_torch.decode_index_metadata(x.positions, x.batch_id, x.n_csa, x.n_hca, ptrs["swa_indptr"],
                                    ptrs["csa_indptr"], ptrs["hca_indptr"], window=step.window,
                                    index_topk=step.index_topk, csa_ratio=step.csa_ratio)
    out = {name: output(alloc, ptrs[name + "_indptr"]) for name in ("swa", "csa", "hca")}
    ukv_torch.paged_decode_indices(x.swa_table, x.positions, x.batch_id, ptrs["swa_indptr"], out["swa"],
                                   ptrs["csa_indptr"], out["csa"], ptrs["hca_indptr"], out["hca"],
                                   window=step.window, block_size=step.block_size, **step.swa_rows_kwargs())
    ukv_torch.csa_translate_pack(x.topk, x.csa_table, x.positions, x.batch_id, ptrs["csa_indptr"], out["csa"],
                                 compress_base=step.compress_base, window=step.window,
                                 compress_ratio=step.csa_ratio, block_size=step.block_size,
                                 block_stride=step.csa_stride)
    ukv_torch.hca_decode_indices(x.hca_table, x.batch_id, x.n_hca, ptrs["hca_indptr"], out["hca"],
                                 compress_base=step.compress_base, compress_ratio=step.hca_ratio,
                                 block_size=step.block_size, block_stride=step.hca_stride)
    return {**{k: v.tolist() for k, v in ptrs.items()}, **{k: v.tolist() for k, v in out.items()},
            **op_slots(step, x, alloc)}


PREFILL_BUFFERS = ("extend", "swa", "csa", "hca")


def reference_prefill(step):
    ext_ptr, swa_ptr, csa_ptr, hca_ptr, prefix = ref.prefill_metadata(
        step.positions, step.batch_id, step.chunk_start, step.n_csa, step.n_hca, step.window, step.index_topk,
        step.csa_ratio, step.hca_ratio)
    ptrs = dict(zip(PREFILL_BUFFERS, (ext_ptr, swa_ptr, csa_ptr, hca_ptr)))
    outs = {name: (ptrs[name], reference_buffer(ptrs[name])) for name in PREFILL_BUFFERS}
    ref.paged_prefill_indices(outs, step.positions, step.batch_id, step.chunk_start, step.query_start, step.n_hca,
                              step.swa_table, step.hca_table, step.window, step.block_size, step.compress_base,
                              step.hca_ratio, step.hca_k, {n: step.swa_rows_of(n) for n in SWA_CLASSES},
                              step.hca_stride)
    ref.csa_translate_pack(outs["csa"][1], step.topk, step.csa_table, step.positions, step.batch_id, csa_ptr,
                           prefix, 0, step.compress_base, step.csa_k, step.csa_stride)
    result = {name + "_indptr": ptrs[name] for name in PREFILL_BUFFERS}
    result.update({name: outs[name][1] for name in PREFILL_BUFFERS})
    result["prefix_swa_count"] = prefix
    result.update(reference_slots(step))
    return result


def op_prefill(step, device, positions_dtype=torch.int64, strided_tables=False, alloc=None):
    """The step through the ops; alloc(n, fill) makes each output (default: fresh_buffers)."""
    alloc = alloc or fresh_buffers(device)
    x = step.tensors(device, positions_dtype, strided_tables)
    num_tokens = len(step.positions)
    ptrs = {name: alloc(num_tokens + 1, -1) for name in PREFILL_BUFFERS}
    prefix = alloc(num_tokens, -1)
    ukv_torch.prefill_index_metadata(x.positions, x.batch_id, x.chunk_start, x.n_csa, x.n_hca, ptrs["extend"],
                                     ptrs["swa"], ptrs["csa"], ptrs["hca"], prefix, window=step.window,
                                     index_topk=step.index_topk, csa_ratio=step.csa_ratio,
                                     hca_ratio=step.hca_ratio)
    out = {name: output(alloc, ptrs[name]) for name in PREFILL_BUFFERS}
    ukv_torch.paged_prefill_indices(x.positions, x.batch_id, x.chunk_start, x.query_start, x.n_hca, x.swa_table,
                                    x.hca_table, ptrs["extend"], ptrs["swa"], ptrs["csa"], ptrs["hca"],
                                    out["extend"], out["swa"], out["csa"], out["hca"],
                                    compress_base=step.compress_base, window=step.window,
                                    compress_ratio=step.hca_ratio, block_size=step.block_size,
                                    hca_block_stride=step.hca_stride, **step.swa_rows_kwargs())
    ukv_torch.csa_translate_pack(x.topk, x.csa_table, x.positions, x.batch_id, ptrs["csa"], out["csa"],
                                 compress_base=step.compress_base, skip_per_token=prefix,
                                 compress_ratio=step.csa_ratio, block_size=step.block_size,
                                 block_stride=step.csa_stride)
    result = {name + "_indptr": ptrs[name].tolist() for name in PREFILL_BUFFERS}
    result.update({name: out[name].tolist() for name in PREFILL_BUFFERS})
    result["prefix_swa_count"] = prefix.tolist()
    result.update(op_slots(step, x, alloc))
    return result
