"""Index-kernel benchmark (run on the GPU machine): every index op over decode
and prefill shapes, eager and CUDA-graph replay, beside the device-to-device
copy bandwidth and a plain-torch composite of the same computation, all
measured in this one run. Prints a markdown table; --out also writes JSON.

    python benchmarks/bench_kernels.py [--out results.json] [--iters 2000]
    python benchmarks/bench_kernels.py --device cpu --quick   # smoke run, no GPU

Timing: eager = back-to-back calls between two CUDA events, the median of
EAGER_ROUNDS runs of iters / EAGER_ROUNDS calls (per-call host cost included
when it exceeds the kernel);
graph = CALLS_PER_GRAPH calls captured in one CUDA graph, replayed between two
events, per call, the median of GRAPH_ROUNDS runs (the cost of the op as one
node of a captured forward, the way Triton's do_bench_cudagraph measures);
graph x1 = a graph holding one call, per replay, which adds the graph launch.
The header also gives the same run's floors: an eager ATen zero_ of 4 cells
(dispatch + launch), the same zero_ as one of CALLS_PER_GRAPH graph nodes, and
a one-node graph replay. An eager call of a decode-sized op is bound by the
host, whose speed on a shared machine moves by tens of percent within a run,
so each case's eager time is given beside an eager zero_ timed in the same
stretch ("zero_ beside": its runs alternate with the op's).

Bytes moved count 4 bytes per int32 read and written per output cell (a
translated top-k cell: top-k read + table read + write = 12 B), so at large
batches "% copy" compares the kernel with a plain device-to-device copy of the
same bytes. The row-transfer cases (gather_rows, scatter_rows) count the rows'
bytes read and written, and are also timed beside a plain tensor copy of the
same bytes (a second table). Every case also checks that the op and the
composite agree.
"""
import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import torch

import ukv_torch

try:  # the upstream Triton kernels, timed beside the ops where Triton and a GPU are there
    import triton_reference
    if not triton_reference.available():
        triton_reference = None
except ImportError:
    triton_reference = None

TOPK, WINDOW, BS, CSA_RATIO, HCA_RATIO = 1024, 128, 128, 4, 128
CSA_K, HCA_K = BS // CSA_RATIO, BS // HCA_RATIO


@dataclass(frozen=True)
class RowSpace:
    """The row-space layout's index arguments: the V4-Pro plan of 5 GiB with
    32-token SWA pages (its envelope stride and each class's SWA constants)."""
    rows: int
    envelope: int
    unit_rows: int
    swa: tuple   # swa_rows of the dense (SWA-only), CSA and HCA classes
    csa: tuple
    hca: tuple

    @staticmethod
    def of_plan() -> "RowSpace":
        from ukv_torch.plan.planning import MODEL_PRESETS, plan_kv_layout
        config = ukv_torch.ServeConfig(layout="row_space", swa_page_tokens=32, compress_ratios=(CSA_RATIO, HCA_RATIO),
                                       window=WINDOW, block_size=BS, max_num_seqs=256, max_num_batched_tokens=8192)
        plan = plan_kv_layout(5 << 30, MODEL_PRESETS["v4-pro"], config)
        return RowSpace(plan.pools.total_rows, plan.pools.envelope_rows, plan.pools.swa_unit_rows,
                        tuple(plan.swa_rows(0)), tuple(plan.swa_rows(CSA_RATIO)), tuple(plan.swa_rows(HCA_RATIO)))

    @property
    def page(self) -> int:
        return self.swa[0]

# Upstream Triton kernels on the same H200 (torch 2.11, Triton 3.6): (graph us, eager us).
REFERENCE = {
    ("csa_translate_pack", "decode T=1 ctx 8K"): (1.65, 5.0),
    ("csa_translate_pack", "decode T=256 ctx 32K"): (2.18, 13.7),
    ("csa_translate_pack", "prefill T=2048 ctx 32K"): (5.06, 22.6),
    ("csa_translate_pack", "prefill T=8192 ctx 64K"): (23.8, 33.3),
    ("paged_decode_indices", "decode T=64 ctx 32K"): (1.65, 5.4),
    ("paged_decode_indices", "decode T=512 ctx 32K"): (1.80, 6.2),
    ("paged_decode_indices", "decode T=4096 ctx 32K"): (3.86, 8.6),
    ("paged_prefill_indices", "prefill 1 seq 8K chunk at 0"): (8.8, 13.2),
    ("paged_prefill_indices", "prefill 1 seq 16K chunk at 112K"): (27.4, 31.9),
}


# ---- inputs -------------------------------------------------------------------

def i32(x):
    return x.to(torch.int32)


def tables(rows: int, ctx: int, device, gen, rs: Optional[RowSpace]) -> Dict[str, object]:
    """Random block tables for sequences of ctx tokens: slot ids (SWA slots of
    4096, compress blocks of 2^20), or the row space's SWA units per page and
    envelopes per block."""
    cols = ctx // BS + 1
    swa_cols, swa_ids = (cols, 4096) if rs is None else (ctx // rs.page + 1, rs.rows // rs.unit_rows)
    env_ids = 1 << 20 if rs is None else rs.rows // rs.envelope
    return {"row_space": rs,
            "swa_table": i32(torch.randint(0, swa_ids, (rows, swa_cols), generator=gen, device=device)),
            "csa_table": i32(torch.randint(0, env_ids, (rows, cols), generator=gen, device=device)),
            "hca_table": i32(torch.randint(0, env_ids, (rows, cols), generator=gen, device=device))}


def decode_batch(num_tokens: int, ctx: int, device, gen, rs: Optional[RowSpace] = None) -> Dict[str, torch.Tensor]:
    """num_tokens sequences of ctx tokens each, one decode token per sequence."""
    d = {
        "positions": torch.full((num_tokens,), ctx - 1, dtype=torch.int64, device=device),
        "batch_id": i32(torch.arange(num_tokens, device=device)),
        "n_csa": torch.full((num_tokens,), ctx // CSA_RATIO, dtype=torch.int32, device=device),
        "n_hca": torch.full((num_tokens,), ctx // HCA_RATIO, dtype=torch.int32, device=device),
        **tables(num_tokens, ctx, device, gen, rs),
    }
    d["topk"] = i32(torch.randint(0, ctx // CSA_RATIO, (num_tokens, TOPK), generator=gen, device=device))
    ptrs = [torch.empty(num_tokens + 1, dtype=torch.int32, device=device) for _ in range(3)]
    ukv_torch.decode_index_metadata(d["positions"], d["batch_id"], d["n_csa"], d["n_hca"], *ptrs, window=WINDOW,
                                    index_topk=TOPK)
    d["swa_indptr"], d["csa_indptr"], d["hca_indptr"] = ptrs
    return d


def prefill_batch(num_tokens: int, start: int, device, gen, rs: Optional[RowSpace] = None) -> Dict[str, torch.Tensor]:
    """One sequence computing positions [start, start + num_tokens)."""
    ctx = start + num_tokens
    positions = torch.arange(start, ctx, dtype=torch.int64, device=device)
    d = {
        "positions": positions,
        "batch_id": torch.zeros(num_tokens, dtype=torch.int32, device=device),
        "chunk_start": torch.tensor([start], dtype=torch.int32, device=device),
        "query_start": torch.zeros(1, dtype=torch.int32, device=device),
        "n_csa": torch.tensor([ctx // CSA_RATIO], dtype=torch.int32, device=device),
        "n_hca": torch.tensor([ctx // HCA_RATIO], dtype=torch.int32, device=device),
        **tables(1, ctx, device, gen, rs),
    }
    visible = torch.clamp((positions + 1) // CSA_RATIO, min=1)
    d["topk"] = i32((torch.rand((num_tokens, TOPK), generator=gen, device=device) * visible[:, None]).long())
    ptrs = [torch.empty(num_tokens + 1, dtype=torch.int32, device=device) for _ in range(4)]
    prefix = torch.empty(num_tokens, dtype=torch.int32, device=device)
    ukv_torch.prefill_index_metadata(positions, d["batch_id"], d["chunk_start"], d["n_csa"], d["n_hca"], *ptrs,
                                     prefix, window=WINDOW, index_topk=TOPK)
    d["extend_indptr"], d["swa_indptr"], d["csa_indptr"], d["hca_indptr"] = ptrs
    d["prefix_swa_count"] = prefix
    return d


def buffer(indptr: torch.Tensor) -> torch.Tensor:
    """An output for indptr's slices plus one scratch cell (the composites' dump)."""
    return torch.zeros(int(indptr[-1]) + 1, dtype=torch.int32, device=indptr.device)


# ---- plain-torch composites (no host sync, so they can be captured too) ---------

def scatter(out, indptr_base, lane, mask, values):
    """out[indptr_base + lane] = values where mask; masked-off lanes go to the scratch cell."""
    dst = torch.where(mask, indptr_base[:, None] + lane[None, :], out.numel() - 1)
    out.index_put_((dst.reshape(-1).long(),), values.reshape(-1).to(torch.int32))


def compress_rows(table, b, entries, k, stride=None):
    """base 0 + id(e / k) * stride + e % k; the stride is k but in the row space (the envelope)."""
    e = entries.clamp(0, table.shape[1] * k - 1).long()
    return table[b[:, None], e // k].long() * (k if stride is None else stride) + e % k


def block_stride(d) -> Optional[int]:
    return None if d["row_space"] is None else d["row_space"].envelope


def class_rows(d, cls: str) -> Optional[tuple]:
    """A class's swa_rows (None in the slot layouts)."""
    return None if d["row_space"] is None else getattr(d["row_space"], cls)


def composite_csa(d, out, skip):
    real = d["batch_id"] >= 0
    b = d["batch_id"].clamp(min=0).long()
    indptr = d["csa_indptr"]
    valid_k = indptr[1:] - indptr[:-1] - skip
    lane = torch.arange(d["topk"].shape[1], device=out.device)
    mask = (lane[None, :] < valid_k[:, None]) & real[:, None]
    scatter(out, indptr[:-1], lane, mask, compress_rows(d["csa_table"], b, d["topk"], CSA_K, block_stride(d)))


def swa_rows(table, b, first, lane, rows: Optional[tuple] = None):
    """Rows of positions first + lane: unit * block_size + a % block_size in the
    slot layouts; with the row space's constants (page, unit rows, offset,
    group, group stride) unit * unit_rows + offset + (q / group) * stride + q % group, q = a % page."""
    a = (first[:, None] + lane[None, :]).clamp(min=0)
    page = BS if rows is None else rows[0]
    unit = table[b[:, None], (a // page).clamp(max=table.shape[1] - 1)].long().clamp(min=0)
    if rows is None:
        return unit * BS + a % BS
    _, unit_rows, offset, group, group_stride = rows
    q = a % page
    return unit * unit_rows + offset + (q // group) * group_stride + q % group


def composite_paged_decode(d, outs):
    real = d["batch_id"] >= 0
    b = d["batch_id"].clamp(min=0).long()
    n = torch.clamp(d["positions"] + 1, max=WINDOW)
    lane = torch.arange(WINDOW, device=n.device)
    mask = (lane[None, :] < n[:, None]) & real[:, None]
    for (indptr, out), cls in zip(outs, ("swa", "csa", "hca")):
        scatter(out, indptr[1:] - n, lane, mask, swa_rows(d["swa_table"], b, d["positions"] - n + 1, lane,
                                                         class_rows(d, cls)))


def composite_hca_decode(d, out):
    real = d["batch_id"] >= 0
    b = d["batch_id"].clamp(min=0).long()
    lane = torch.arange(d["hca_table"].shape[1] * HCA_K, device=out.device)
    mask = (lane[None, :] < d["n_hca"][b][:, None]) & real[:, None]
    scatter(out, d["hca_indptr"][:-1], lane, mask,
            compress_rows(d["hca_table"], b, lane.expand(b.shape[0], -1), HCA_K, block_stride(d)))


def composite_paged_prefill(d, outs):
    ext, swa, csa, hca = outs
    real = d["batch_id"] >= 0
    b = d["batch_id"].clamp(min=0).long()
    p = d["positions"]
    cs = d["chunk_start"][b]
    tpic = p - cs
    swa_low = torch.clamp(p - WINDOW + 1, min=0)
    extend_count = torch.clamp(tpic + 1, max=WINDOW)
    prefix = torch.clamp(cs - swa_low, min=0)
    lane = torch.arange(WINDOW, device=p.device)
    ext_mask = (lane[None, :] < extend_count[:, None]) & real[:, None]
    scatter(ext, d["extend_indptr"][:-1], lane, ext_mask,
            (d["query_start"][b] + tpic - extend_count + 1)[:, None] + lane[None, :])
    mask = (lane[None, :] < prefix[:, None]) & real[:, None]
    scatter(swa, d["swa_indptr"][:-1], lane, mask, swa_rows(d["swa_table"], b, swa_low, lane, class_rows(d, "swa")))
    scatter(hca, d["hca_indptr"][:-1], lane, mask, swa_rows(d["swa_table"], b, swa_low, lane, class_rows(d, "hca")))
    scatter(csa, d["csa_indptr"][1:] - prefix, lane, mask,
            swa_rows(d["swa_table"], b, swa_low, lane, class_rows(d, "csa")))
    n_hca = torch.minimum((p + 1) // HCA_RATIO, d["n_hca"][b].long())
    hlane = torch.arange(d["hca_table"].shape[1] * HCA_K, device=p.device)
    hmask = (hlane[None, :] < n_hca[:, None]) & real[:, None]
    scatter(hca, d["hca_indptr"][:-1] + prefix, hlane, hmask,
            compress_rows(d["hca_table"], b, hlane.expand(b.shape[0], -1), HCA_K, block_stride(d)))


def composite_slot_mapping(d, out, rows):
    real = d["batch_id"] >= 0
    b = d["batch_id"].clamp(min=0).long()
    zero = torch.zeros(1, dtype=torch.int64, device=out.device)
    page = BS if d["row_space"] is None else d["row_space"].page
    held = d["swa_table"][b, (d["positions"] // page).clamp(max=d["swa_table"].shape[1] - 1)] >= 0
    row = swa_rows(d["swa_table"], b, d["positions"], zero, rows)[:, 0]
    out.copy_(torch.where(real & held, row, -1).to(torch.int32))


def composite_row_copies(planes, moves):
    """Every phase's rows gathered, then scattered (moves: per phase, (src, dst) row index tensors)."""
    for src, dst in moves:
        for plane in planes:
            plane.index_copy_(0, dst, plane.index_select(0, src))


def composite_decode_metadata(d, ptrs):
    real = d["batch_id"] >= 0
    b = d["batch_id"].clamp(min=0).long()
    p = d["positions"]
    n_swa = torch.clamp(p + 1, max=WINDOW) * real
    valid_k = torch.minimum(torch.clamp((p + 1) // CSA_RATIO, max=TOPK), d["n_csa"][b].long()) * real
    n_hca = d["n_hca"][b] * real
    for ptr, counts in zip(ptrs, (n_swa, n_swa + valid_k, n_swa + n_hca)):
        ptr[:1].zero_()
        torch.cumsum(counts, 0, out=ptr[1:])


def composite_prefill_metadata(d, ptrs, prefix_out):
    real = d["batch_id"] >= 0
    b = d["batch_id"].clamp(min=0).long()
    p = d["positions"]
    cs = d["chunk_start"][b].long()
    swa_low = torch.clamp(p - WINDOW + 1, min=0)
    extend_count = torch.clamp(p - cs + 1, max=WINDOW) * real
    prefix = torch.clamp(cs - swa_low, min=0) * real
    valid_k = torch.minimum(torch.clamp((p + 1) // CSA_RATIO, max=TOPK), d["n_csa"][b].long()) * real
    n_hca = torch.minimum((p + 1) // HCA_RATIO, d["n_hca"][b].long()) * real
    for ptr, counts in zip(ptrs, (extend_count, prefix, prefix + valid_k, prefix + n_hca)):
        ptr[:1].zero_()
        torch.cumsum(counts, 0, out=ptr[1:])
    prefix_out.copy_(prefix)


# ---- cases --------------------------------------------------------------------

@dataclass
class Case:
    op: str
    label: str
    num_tokens: int
    bytes_moved: int
    run_op: Callable[[], None]
    run_composite: Callable[[], None]
    outputs: Callable[[], List[torch.Tensor]]  # op results, then composite results, to compare
    result: Dict[str, float] = field(default_factory=dict)
    # A plain tensor copy of the bytes the op moves (read + written = bytes_moved), timed beside it.
    same_bytes_copy: Optional[Callable[[], None]] = None
    # The upstream Triton kernel on the same inputs (benchmarks/triton_reference.py), and its outputs
    # (compared with the op's before timing).
    triton_run: Optional[Callable[[], None]] = None
    triton_outputs: Optional[Callable[[], List[torch.Tensor]]] = None


def csa_case(label, d, prefill):
    skip = d["prefix_swa_count"] if prefill else None
    out_op, out_ref = buffer(d["csa_indptr"]), buffer(d["csa_indptr"])
    composite_skip = skip if prefill else torch.clamp(d["positions"] + 1, max=WINDOW)
    cells = int((d["csa_indptr"][1:] - d["csa_indptr"][:-1] - composite_skip).clamp(min=0).sum())

    def run_op():
        ukv_torch.csa_translate_pack(d["topk"], d["csa_table"], d["positions"], d["batch_id"], d["csa_indptr"],
                                     out_op, compress_base=0, window=0 if prefill else WINDOW, skip_per_token=skip,
                                     block_size=BS, block_stride=block_stride(d))

    return Case("csa_translate_pack", label, d["batch_id"].numel(), 12 * cells, run_op,
                lambda: composite_csa(d, out_ref, composite_skip), lambda: ([out_op[:-1]], [out_ref[:-1]]))


def paged_decode_case(label, d):
    names = ("swa", "csa", "hca")
    op_outs = [buffer(d[n + "_indptr"]) for n in names]
    ref_outs = [buffer(d[n + "_indptr"]) for n in names]
    cells = int(torch.clamp(d["positions"] + 1, max=WINDOW).sum())

    def run_op():
        ukv_torch.paged_decode_indices(d["swa_table"], d["positions"], d["batch_id"], d["swa_indptr"], op_outs[0],
                                       d["csa_indptr"], op_outs[1], d["hca_indptr"], op_outs[2], window=WINDOW,
                                       block_size=BS, swa_rows=class_rows(d, "swa"), csa_swa_rows=class_rows(d, "csa"),
                                       hca_swa_rows=class_rows(d, "hca"))

    case = Case("paged_decode_indices", label, d["batch_id"].numel(), 16 * cells, run_op,
                lambda: composite_paged_decode(d, [(d[n + "_indptr"], o) for n, o in zip(names, ref_outs)]),
                lambda: ([o[:-1] for o in op_outs], [o[:-1] for o in ref_outs]))
    if triton_reference is not None and d["row_space"] is None:
        tri_outs = [buffer(d[n + "_indptr"]) for n in names]
        case.triton_run = lambda: triton_reference.paged_decode(
            d["swa_table"], d["positions"], d["batch_id"], d["swa_indptr"], tri_outs[0], d["csa_indptr"], tri_outs[1],
            d["hca_indptr"], tri_outs[2], window=WINDOW, block_size=BS)
        case.triton_outputs = lambda: [o[:-1] for o in tri_outs]
    return case


def hca_decode_case(label, d):
    out_op, out_ref = buffer(d["hca_indptr"]), buffer(d["hca_indptr"])
    cells = int(d["n_hca"][d["batch_id"].long()].sum())

    def run_op():
        ukv_torch.hca_decode_indices(d["hca_table"], d["batch_id"], d["n_hca"], d["hca_indptr"], out_op,
                                     compress_base=0, block_size=BS, block_stride=block_stride(d))

    return Case("hca_decode_indices", label, d["batch_id"].numel(), 8 * cells, run_op,
                lambda: composite_hca_decode(d, out_ref), lambda: ([out_op[:-1]], [out_ref[:-1]]))


def paged_prefill_case(label, d):
    names = ("extend", "swa", "csa", "hca")
    op_outs = [buffer(d[n + "_indptr"]) for n in names]
    ref_outs = [buffer(d[n + "_indptr"]) for n in names]
    ends = {n: int(d[n + "_indptr"][-1]) for n in names}
    hca_entries = ends["hca"] - ends["swa"]
    bytes_moved = 4 * ends["extend"] + 16 * ends["swa"] + 8 * hca_entries

    def run_op():
        ukv_torch.paged_prefill_indices(d["positions"], d["batch_id"], d["chunk_start"], d["query_start"], d["n_hca"],
                                        d["swa_table"], d["hca_table"], d["extend_indptr"], d["swa_indptr"],
                                        d["csa_indptr"], d["hca_indptr"], *op_outs, compress_base=0, window=WINDOW,
                                        block_size=BS, swa_rows=class_rows(d, "swa"),
                                        csa_swa_rows=class_rows(d, "csa"), hca_swa_rows=class_rows(d, "hca"),
                                        hca_block_stride=block_stride(d))

    # Only the prefill op's cells of the CSA buffer (its SWA tails) are compared;
    # both sides leave the top-k heads at zero.
    case = Case("paged_prefill_indices", label, d["batch_id"].numel(), bytes_moved, run_op,
                lambda: composite_paged_prefill(d, ref_outs),
                lambda: ([o[:-1] for o in op_outs], [o[:-1] for o in ref_outs]))
    if triton_reference is not None and d["row_space"] is None:
        tri_outs = [buffer(d[n + "_indptr"]) for n in names]
        case.triton_run = lambda: triton_reference.paged_prefill(
            d["positions"], d["batch_id"], d["chunk_start"], d["query_start"], d["n_hca"], d["swa_table"],
            d["hca_table"], d["extend_indptr"], d["swa_indptr"], d["csa_indptr"], d["hca_indptr"], *tri_outs,
            window=WINDOW, block_size=BS, hca_ratio=HCA_RATIO)
        case.triton_outputs = lambda: [o[:-1] for o in tri_outs]
    return case


def decode_metadata_case(label, d):
    n = d["batch_id"].numel()
    op_ptrs = [torch.empty(n + 1, dtype=torch.int32, device=d["positions"].device) for _ in range(3)]
    ref_ptrs = [torch.empty(n + 1, dtype=torch.int32, device=d["positions"].device) for _ in range(3)]

    def run_op():
        ukv_torch.decode_index_metadata(d["positions"], d["batch_id"], d["n_csa"], d["n_hca"], *op_ptrs,
                                        window=WINDOW, index_topk=TOPK)

    return Case("decode_index_metadata", label, n, n * (8 + 4 + 8 + 12), run_op,
                lambda: composite_decode_metadata(d, ref_ptrs), lambda: (op_ptrs, ref_ptrs))


def prefill_metadata_case(label, d):
    n = d["batch_id"].numel()
    dev = d["positions"].device
    op_out = [torch.empty(n + 1, dtype=torch.int32, device=dev) for _ in range(4)] + [
        torch.empty(n, dtype=torch.int32, device=dev)]
    ref_out = [torch.empty(n + 1, dtype=torch.int32, device=dev) for _ in range(4)] + [
        torch.empty(n, dtype=torch.int32, device=dev)]

    def run_op():
        ukv_torch.prefill_index_metadata(d["positions"], d["batch_id"], d["chunk_start"], d["n_csa"], d["n_hca"],
                                         *op_out, window=WINDOW, index_topk=TOPK)

    return Case("prefill_index_metadata", label, n, n * (8 + 4 + 12 + 20), run_op,
                lambda: composite_prefill_metadata(d, ref_out[:4], ref_out[4]), lambda: (op_out, ref_out))


def slot_mapping_case(label, d):
    n = d["batch_id"].numel()
    rows = class_rows(d, "csa")
    out_op, out_ref = (torch.empty(n, dtype=torch.int32, device=d["positions"].device) for _ in range(2))

    def run_op():
        ukv_torch.swa_slot_mapping(d["swa_table"], d["positions"], d["batch_id"], out_op, block_size=BS, swa_rows=rows)

    return Case("swa_slot_mapping", label, n, 16 * n, run_op, lambda: composite_slot_mapping(d, out_ref, rows),
                lambda: ([out_op], [out_ref]))


def row_copies_case(label, rs: RowSpace, moves: int, device, gen):
    """moves SWA units relocated in one phase (disjoint rows) over the V4 planes
    (fp8 NoPE 448 B and bf16 RoPE 128 B per row), on a row space cut to the rows the moves touch."""
    rows = 2 * moves * rs.unit_rows
    planes = [torch.randint(0, 255, (rows, 448), generator=gen, device=device, dtype=torch.uint8),
              torch.randn((rows, 64), generator=gen, device=device).to(torch.bfloat16)]
    ref = [p.clone() for p in planes]
    order = torch.randperm(2 * moves, generator=gen, device=device)
    src_units, dst_units = order[:moves], order[moves:]
    copies = torch.stack([src_units * rs.unit_rows, dst_units * rs.unit_rows,
                          torch.full_like(src_units, rs.unit_rows)], 1).to(torch.int32)
    counts = torch.tensor([moves], dtype=torch.int32, device=device)
    lane = torch.arange(rs.unit_rows, device=device)
    src, dst = ((u[:, None] * rs.unit_rows + lane).reshape(-1) for u in (src_units, dst_units))
    bytes_moved = 2 * moves * rs.unit_rows * (448 + 128)
    return Case("apply_row_copies", label, moves, bytes_moved, lambda: ukv_torch.apply_row_copies(planes, copies, counts),
                lambda: composite_row_copies(ref, [(src, dst)]), lambda: (planes, ref))


def transfer_case(label, scatter: bool, rs: RowSpace, ctx: int, device, gen):
    """One CSA layer's rows of a ctx-token sequence (window - 1 SWA rows and 32 rows
    per block, from scattered envelopes and SWA units) between the V4 planes (fp8
    NoPE 448 B and bf16 RoPE 128 B per row) and a transfer buffer, as
    gather_sequence / scatter_sequence run it per layer."""
    blocks = ctx // BS
    units = -(-(WINDOW - 1) // rs.unit_rows)
    rows = (blocks + 1) * rs.envelope + (units + 1) * rs.unit_rows
    planes = [torch.randint(0, 255, (rows, 448), generator=gen, device=device, dtype=torch.uint8),
              torch.randn((rows, 64), generator=gen, device=device).to(torch.bfloat16)]
    envelopes = torch.randperm(blocks, generator=gen, device=device) * rs.envelope
    unit_rows = (blocks + 1) * rs.envelope + torch.randperm(units, generator=gen, device=device) * rs.unit_rows
    first = torch.cat([unit_rows, envelopes])
    count = torch.cat([torch.full((units,), rs.unit_rows, device=device),
                       torch.full((blocks,), CSA_K, device=device)])
    count[units - 1] = (WINDOW - 1) - (units - 1) * rs.unit_rows
    runs, offset = [], 0
    for index, plane in enumerate(planes):
        row_bytes = plane.shape[1] * plane.element_size()
        starts = offset + torch.cumsum(count, 0) * row_bytes - count * row_bytes
        runs.append(torch.stack([torch.full_like(first, index), first, count, starts], 1))
        offset += int(count.sum()) * row_bytes
    runs = torch.cat(runs).to(torch.int64)
    run_count = torch.tensor([runs.shape[0]], dtype=torch.int32, device=device)
    lanes = torch.cat([torch.arange(int(c), device=device) + f for f, c in zip(first.tolist(), count.tolist())])
    buffer = torch.randint(0, 255, (offset,), generator=gen, device=device, dtype=torch.uint8)
    twin = buffer.clone()
    ref_planes = [p.clone() for p in planes]
    copy_src, copy_dst = torch.empty_like(buffer), torch.empty_like(buffer)

    def composite():
        """index_select / index_copy_ through the packed buffer's per-plane parts."""
        at = 0
        for plane, ref in zip(planes, ref_planes):
            part = twin[at: at + lanes.numel() * plane.shape[1] * plane.element_size()]
            rows_view = part.view(plane.dtype).view(lanes.numel(), plane.shape[1])
            if scatter:
                ref.index_copy_(0, lanes, rows_view)
            else:
                rows_view.copy_(plane.index_select(0, lanes))
            at += part.numel()

    op = "scatter_rows" if scatter else "gather_rows"
    call = (lambda: ukv_torch.scatter_rows(planes, runs, run_count, buffer)) if scatter else \
        (lambda: ukv_torch.gather_rows(planes, runs, run_count, buffer))
    # Compared as bytes: the random buffer holds NaN patterns in the bf16 plane.
    outputs = (lambda: ([p.view(torch.uint8) for p in planes], [p.view(torch.uint8) for p in ref_planes])) \
        if scatter else (lambda: ([buffer], [twin]))
    return Case(op, label, runs.shape[0], 2 * offset, call, composite, outputs,
                same_bytes_copy=lambda: copy_dst.copy_(copy_src))


def build_cases(device, quick):
    gen = torch.Generator(device=device)
    gen.manual_seed(0)
    scale = 16 if quick else 1  # --quick divides token counts and contexts for a CPU smoke run
    K = 1024 // scale

    def dec(t, ctx):
        return decode_batch(max(1, t // scale), ctx * K, device, gen)

    def pre(t, start):
        return prefill_batch(max(1, t // scale), start * K, device, gen)

    cases = [
        csa_case("decode T=1 ctx 8K", dec(1, 8), False),
        csa_case("decode T=64 ctx 128K", dec(64, 128), False),
        csa_case("decode T=256 ctx 32K", dec(256, 32), False),
        csa_case("decode T=512 ctx 32K", dec(512, 32), False),
        csa_case("decode T=512 ctx 64K", dec(512, 64), False),
        csa_case("decode T=512 ctx 128K", dec(512, 128), False),
        csa_case("prefill T=2048 ctx 32K", pre(2048, 30), True),
        csa_case("prefill T=8192 ctx 64K", pre(8192, 56), True),
    ]
    for t in (64, 512, 4096):
        cases.append(paged_decode_case(f"decode T={t} ctx 32K", dec(t, 32)))
    for t, ctx in ((1, 128), (64, 128), (512, 32), (4096, 8)):
        cases.append(hca_decode_case(f"decode T={t} ctx {ctx}K", dec(t, ctx)))
    cases.append(paged_prefill_case("prefill 1 seq 8K chunk at 0", pre(8192, 0)))
    cases.append(paged_prefill_case("prefill 1 seq 16K chunk at 112K", pre(16384, 112)))
    for t in (64, 512, 4096):
        cases.append(decode_metadata_case(f"decode T={t}", dec(t, 32)))
    cases.append(prefill_metadata_case("prefill 1 seq 8K chunk at 0", pre(8192, 0)))
    cases.append(prefill_metadata_case("prefill 1 seq 16K chunk at 112K", pre(16384, 112)))
    cases.append(slot_mapping_case("decode T=512", dec(512, 32)))
    cases.append(slot_mapping_case("prefill 1 seq 8K chunk at 0", pre(8192, 0)))
    return cases + row_space_cases(device, gen, scale)


# The row-space cases, labelled as the slot case with the same shapes (whose
# upstream reference figures they are held to) plus ROW_SPACE.
ROW_SPACE = ", row space"


def row_space_cases(device, gen, scale):
    rs = RowSpace.of_plan()
    K = 1024 // scale

    def dec(t, ctx):
        return decode_batch(max(1, t // scale), ctx * K, device, gen, rs)

    def pre(t, start):
        return prefill_batch(max(1, t // scale), start * K, device, gen, rs)

    return [
        csa_case("decode T=256 ctx 32K" + ROW_SPACE, dec(256, 32), False),
        csa_case("prefill T=2048 ctx 32K" + ROW_SPACE, pre(2048, 30), True),
        paged_decode_case("decode T=512 ctx 32K" + ROW_SPACE, dec(512, 32)),
        paged_decode_case("decode T=4096 ctx 32K" + ROW_SPACE, dec(4096, 32)),
        hca_decode_case("decode T=512 ctx 32K" + ROW_SPACE, dec(512, 32)),
        paged_prefill_case("prefill 1 seq 8K chunk at 0" + ROW_SPACE, pre(8192, 0)),
        paged_prefill_case("prefill 1 seq 16K chunk at 112K" + ROW_SPACE, pre(16384, 112)),
        slot_mapping_case("decode T=512" + ROW_SPACE, dec(512, 32)),
        slot_mapping_case("prefill 1 seq 8K chunk at 0" + ROW_SPACE, pre(8192, 0)),
        row_copies_case("16 unit moves" + ROW_SPACE, rs, max(1, 16 // scale), device, gen),
        row_copies_case("256 unit moves" + ROW_SPACE, rs, max(1, 256 // scale), device, gen),
        transfer_case("one CSA layer of a 32K-token sequence" + ROW_SPACE, False, rs, 32 * K, device, gen),
        transfer_case("one CSA layer of a 32K-token sequence" + ROW_SPACE, True, rs, 32 * K, device, gen),
        transfer_case("one CSA layer of a 128K-token sequence" + ROW_SPACE, False, rs, 128 * K, device, gen),
        transfer_case("one CSA layer of a 128K-token sequence" + ROW_SPACE, True, rs, 128 * K, device, gen),
    ]


# ---- timing -------------------------------------------------------------------

def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_eager(fn, iters, device, rounds=5) -> float:
    """Microseconds per call of back-to-back calls of fn (time_eager_together)."""
    return time_eager_together([fn], iters, device, rounds)[0]


def time_eager_together(fns, iters, device, rounds=5) -> list:
    """Microseconds per call of back-to-back calls of each of fns: the median
    over `rounds` runs of iters / rounds calls each. The runs of the fns take
    turns (a, b, a, b, ...), so a slow patch of a shared host, which moves a
    single run by a microsecond or more, falls on all of them alike."""
    for fn in fns:
        for _ in range(10):
            fn()
    sync(device)
    calls = max(1, iters // rounds)
    per_call = [[] for _ in fns]
    for _ in range(rounds):
        for fn, samples in zip(fns, per_call):
            samples.append(run_calls(fn, calls, device))
    return [statistics.median(samples) for samples in per_call]


def run_calls(fn, calls, device) -> float:
    """Microseconds per call of `calls` back-to-back calls, up to the device's
    completion of the last (CUDA events) or on the host clock (CPU)."""
    if device.type != "cuda":
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - start) / calls * 1e6
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / calls * 1e3


CALLS_PER_GRAPH = 20
EAGER_ROUNDS = 15  # eager runs per case, alternating with those of the zero_ beside
GRAPH_ROUNDS = 5  # runs of iters / CALLS_PER_GRAPH replays per graph figure


def time_graph(fn, iters, calls_per_graph=CALLS_PER_GRAPH, rounds=GRAPH_ROUNDS) -> float:
    """Microseconds per call of `calls_per_graph` calls captured in one graph:
    the median over `rounds` runs of back-to-back replays (one run of a few
    thousand calls lasts milliseconds, and a clock or neighbour change within it
    moves a decode-sized figure by a tenth of a microsecond)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls_per_graph):
            fn()
    for _ in range(10):
        graph.replay()
    torch.cuda.synchronize()
    replays = max(1, iters // calls_per_graph)
    device = torch.device("cuda", torch.cuda.current_device())
    runs = [run_calls(graph.replay, replays, device) for _ in range(rounds)]
    return statistics.median(runs) / calls_per_graph


def floors(device, iters) -> Dict[str, Optional[float]]:
    """What any op costs on this host and GPU: an eager ATen zero_ of 4 cells, the
    same zero_ as one of CALLS_PER_GRAPH nodes of a graph (per node, the floor of
    the graph column), and a graph of one such node per replay (the floor of the
    graph x1 column)."""
    if device.type != "cuda":
        return {"aten_eager_us": None, "aten_graph_node_us": None, "one_node_graph_us": None}
    cells = torch.zeros(4, dtype=torch.int32, device=device)
    return {"aten_eager_us": time_eager(cells.zero_, iters, device),
            "aten_graph_node_us": time_graph(cells.zero_, iters),
            "one_node_graph_us": time_graph(cells.zero_, iters, calls_per_graph=1)}


def copy_bandwidth(device, iters) -> Optional[float]:
    """Device-to-device copy bandwidth in GB/s (bytes read + written)."""
    if device.type != "cuda":
        return None
    src = torch.empty(1 << 28, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    us = time_eager(lambda: dst.copy_(src), max(10, iters // 100), device)
    return 2 * src.numel() / (us * 1e-6) / 1e9


def check(case: Case):
    case.run_op()
    case.run_composite()
    ours, theirs = case.outputs()
    for a, b in zip(ours, theirs):
        if not torch.equal(a, b):
            raise AssertionError(f"{case.op} [{case.label}]: op and composite disagree")
    if case.triton_run is not None:
        case.triton_run()
        if not all(torch.equal(a, b) for a, b in zip(ours, case.triton_outputs())):
            # Reported, not raised: the reference is not the product, and the op agrees with the composite.
            print(f"{case.op} [{case.label}]: the upstream Triton kernel gives other indices; not timed",
                  file=sys.stderr)
            case.triton_run = None


def fmt(v, digits=2):
    return "-" if v is None else f"{v:.{digits}f}"


def print_against_slot_and_triton(rows):
    """The row-space forms beside their slot forms and beside upstream's Triton
    kernel (timed on the slot form's inputs of the same shape), graph replay."""
    by_case = {(row["op"], row["case"]): row for row in rows}
    lines = []
    for row in rows:
        if not row["case"].endswith(ROW_SPACE):
            continue
        slot = by_case.get((row["op"], row["case"].removesuffix(ROW_SPACE)))
        if slot is None or row.get("graph_us") is None:
            continue
        tri = slot.get("triton_graph_us")
        lines.append(f"| {row['op']} | {row['case']} | {fmt(row['graph_us'])} | {fmt(slot['graph_us'])} | "
                     f"{fmt(row['graph_us'] / slot['graph_us'], 3)} | {fmt(tri)} | "
                     f"{fmt(None if tri is None else tri / row['graph_us'], 2)} | "
                     f"{fmt(None if tri is None else tri / slot['graph_us'], 2)} |")
    if lines:
        print("\nRow space against the slot form and upstream's Triton kernel (graph us, same run):\n")
        print("| op | case | row space | slot form | row / slot | Triton | Triton / row space | Triton / slot |")
        print("|---|---|---|---|---|---|---|---|")
        print("\n".join(lines))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--quick", action="store_true", help="small shapes (a smoke run)")
    parser.add_argument("--out", help="also write the results as JSON to this path")
    parser.add_argument("--once", action="store_true",
                        help="check every case and run each op once, no timing (for a profiler such as ncu)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("bench_kernels: no CUDA device; nothing measured (use --device cpu --quick for a smoke run)")
        return 0
    if device.type == "cuda" and ukv_torch.BACKEND == "cpu":
        print("bench_kernels: ukv_torch was built without GPU support; rebuild on a CUDA torch")
        return 1
    iters = 20 if args.quick else args.iters
    if args.once:
        for case in build_cases(device, args.quick):
            check(case)
            case.run_op()
        sync(device)
        return 0
    copy_gbs = copy_bandwidth(device, iters)
    floor = floors(device, iters)
    rows = []
    cells = torch.zeros(4, dtype=torch.int32, device=device)
    for case in build_cases(device, args.quick):
        check(case)
        r = case.result
        if device.type == "cuda":
            r["aten_eager_beside_us"], r["eager_us"] = time_eager_together(
                [cells.zero_, case.run_op], iters, device, rounds=EAGER_ROUNDS)
        else:
            r["aten_eager_beside_us"], r["eager_us"] = None, time_eager(case.run_op, iters, device)
        r["composite_eager_us"] = time_eager(case.run_composite, max(5, iters // 20), device)
        if device.type == "cuda":
            r["graph_us"] = time_graph(case.run_op, iters)
            r["graph_x1_us"] = time_graph(case.run_op, iters, calls_per_graph=1)
            r["composite_graph_us"] = time_graph(case.run_composite, max(5, iters // 20), calls_per_graph=1)
        if case.same_bytes_copy is not None:
            r["same_bytes_copy_us"] = (time_graph(case.same_bytes_copy, iters) if device.type == "cuda"
                                       else time_eager(case.same_bytes_copy, iters, device))
            r["same_bytes_copy_gb_per_s"] = case.bytes_moved / (r["same_bytes_copy_us"] * 1e-6) / 1e9
        if case.triton_run is not None and device.type == "cuda":
            r["triton_graph_us"] = time_graph(case.triton_run, iters)
            r["triton_eager_us"] = time_eager(case.triton_run, iters, device)
        best = r.get("graph_us", r["eager_us"])
        r["mb_moved"] = case.bytes_moved / 1e6
        r["gb_per_s"] = case.bytes_moved / (best * 1e-6) / 1e9
        ref = REFERENCE.get((case.op, case.label.removesuffix(ROW_SPACE)))
        rows.append({"op": case.op, "case": case.label, "tokens": case.num_tokens,
                     "reference_graph_us": ref and ref[0], "reference_eager_us": ref and ref[1], **r})
        print(f"measured {case.op} [{case.label}]", file=sys.stderr)

    print(f"\nDevice: {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}; torch "
          f"{torch.__version__}; device-to-device copy {fmt(copy_gbs, 0)} GB/s; index_topk {TOPK}, window {WINDOW}, "
          f"unified base 0; floors: eager ATen zero_ {fmt(floor['aten_eager_us'])} us, the same zero_ as a graph node "
          f"({CALLS_PER_GRAPH}/graph) {fmt(floor['aten_graph_node_us'])} us, one-node graph replay "
          f"{fmt(floor['one_node_graph_us'])} us" + ("; --quick: token counts and contexts divided by 16, labels are nominal" if args.quick
                               else "") + "\n")
    print(f"| op | case | graph us ({CALLS_PER_GRAPH}/graph) | graph x1 us | eager us | zero_ beside us "
          "| ref graph / eager us | MB moved | GB/s | % copy | torch composite graph x1 / eager us |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        ref = "-" if row["reference_graph_us"] is None else f"{row['reference_graph_us']} / {row['reference_eager_us']}"
        pct = None if copy_gbs is None else 100 * row["gb_per_s"] / copy_gbs
        print(f"| {row['op']} | {row['case']} | {fmt(row.get('graph_us'))} | {fmt(row.get('graph_x1_us'))} | "
              f"{fmt(row['eager_us'])} | {fmt(row['aten_eager_beside_us'])} | {ref} | "
              f"{fmt(row['mb_moved'], 3)} | {fmt(row['gb_per_s'], 0)} | {fmt(pct, 0)} | "
              f"{fmt(row.get('composite_graph_us'), 1)} / {fmt(row['composite_eager_us'], 1)} |")
    copied = [row for row in rows if "same_bytes_copy_us" in row]
    if copied:
        print("\nAgainst a plain tensor copy of the same bytes (graph node on a GPU, eager on the CPU):\n")
        print("| op | case | MB moved | op us | op GB/s | copy us | copy GB/s | % of that copy |")
        print("|---|---|---|---|---|---|---|---|")
        for row in copied:
            best = row.get("graph_us", row["eager_us"])
            print(f"| {row['op']} | {row['case']} | {fmt(row['mb_moved'], 3)} | {fmt(best)} | "
                  f"{fmt(row['gb_per_s'], 0)} | {fmt(row['same_bytes_copy_us'])} | "
                  f"{fmt(row['same_bytes_copy_gb_per_s'], 0)} | "
                  f"{fmt(100 * row['same_bytes_copy_us'] / best, 0)} |")
    print_against_slot_and_triton(rows)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": str(device), "torch": torch.__version__, "copy_gb_per_s": copy_gbs, **floor,
                       "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
