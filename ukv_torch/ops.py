"""Typed wrappers of the index-building and tensor ops (``torch.ops.ukv.*``).

Each wrapper calls the registered op (through the eager fast path of
``ukv_torch/_eager.py`` outside Dynamo); the schemas live in
``csrc/bindings.cpp``, and each docstring gives its op's contract: the
formulas of upstream's index builders. Common conventions:

- ``T`` tokens: ``batch_id`` is ``[T]`` int32, a token whose batch id is outside
  ``[0, B)`` is padding (``-1`` is the CUDA-graph padding sentinel) and writes
  nothing. ``positions`` is ``[T]`` int32 or int64.
- ``B`` sequences: block tables are ``[B, blocks]`` int32 (any strides),
  per-sequence vectors ``[B]`` int32.
- Outputs are contiguous int32 vectors written in place through a ``[T + 1]``
  indptr; token ``t`` writes only inside ``out[indptr[t]:indptr[t + 1]]``.
  Cells outside the written parts keep their contents.
- ``compress_base`` is the first compress row of a layer tensor: 0 in the
  unified layout, ``num_swa_blocks * block_size`` in the static split
  (``torch.ops.ukv.compress_base_row``).
- GPU calls enqueue their kernels (one, or one per copy phase for
  apply_row_copies) on the current stream, allocate nothing and never
  synchronise: every op can be captured in a CUDA graph.
- These are the low-level layer: the layout's constants are arguments. Given
  a view of a manager's staged tables, an op refuses an SWA page or (row
  space) a block stride other than the layout they were staged in; a table
  elsewhere is only int32 ids, and a constant left at its slot-layout
  default with a row-space table gives wrong rows, not an error.
  :class:`ukv_torch.KvStepOps` passes every constant from the plan.
"""
from typing import List, Optional

import torch

from ._extension.eager import schema_op

__all__ = [
    "csa_translate_pack",
    "paged_decode_indices",
    "hca_decode_indices",
    "paged_prefill_indices",
    "decode_index_metadata",
    "prefill_index_metadata",
    "swa_slot_mapping",
    "apply_row_copies",
    "gather_rows",
    "scatter_rows",
    "bind_compress_view",
]


@schema_op
def csa_translate_pack(
    topk_local: torch.Tensor,
    block_table: torch.Tensor,
    positions: torch.Tensor,
    batch_id: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    *,
    compress_base: int,
    window: int = 0,
    skip_per_token: Optional[torch.Tensor] = None,
    compress_ratio: int = 4,
    block_size: int,
    block_stride: Optional[int] = None,
) -> None:
    """Translate the indexer's top-k into unified_kv rows at the head of each CSA slice.

    ``topk_local[t, i]`` (``[T, index_topk]`` int32) is a sequence-local
    compressed entry ``e``; it becomes ``compress_base + block_table[b, e // k] *
    block_stride + e % k`` with ``k = block_size // compress_ratio`` (32 for
    CSA) and ``block_stride`` k by default (the row-space layout's envelope:
    ``KvPlan.layer_block_strides``). Only the
    first ``valid_k = kv_indptr[t+1] - kv_indptr[t] - skip`` lanes are read as
    entries (the rest of a top-k row may be garbage), and they are written to
    ``kv_indices[kv_indptr[t]:kv_indptr[t] + valid_k]``; the slice tail is the
    SWA part. Decode: ``skip = min(pos + 1, window)`` with ``window > 0``.
    Prefill: ``skip = skip_per_token[t]`` (the prefix SWA count) and ``window=0``.
    Pass the physical CSA table in the unified layout, the logical one in the
    static split, the envelope table in the row-space layout.
    """


@schema_op
def paged_decode_indices(
    swa_block_table: torch.Tensor,
    positions: torch.Tensor,
    batch_id: torch.Tensor,
    swa_indptr: torch.Tensor,
    swa_indices: torch.Tensor,
    csa_indptr: Optional[torch.Tensor] = None,
    csa_indices: Optional[torch.Tensor] = None,
    hca_indptr: Optional[torch.Tensor] = None,
    hca_indices: Optional[torch.Tensor] = None,
    *,
    window: int,
    block_size: int,
    swa_rows: Optional[List[int]] = None,
    csa_swa_rows: Optional[List[int]] = None,
    hca_swa_rows: Optional[List[int]] = None,
) -> None:
    """Write each decode token's sliding window as unified_kv rows at its slice tails.

    The window is positions ``pos - n + 1 .. pos`` with ``n = min(pos + 1,
    window)``; position ``a`` is row ``swa_block_table[b, a // block_size] *
    block_size + a % block_size`` in the slot layouts. The rows go to the last
    ``n`` cells of the token's SWA slice (all of it) and, when given, of its
    CSA and HCA slices, whose heads belong to :func:`csa_translate_pack` and
    :func:`hca_decode_indices`. Omit the CSA/HCA pairs for SWA-only (MTP draft)
    layers.

    In the row-space layout each output's layer class has its own rows in an
    SWA unit: ``swa_rows``, ``csa_swa_rows`` and ``hca_swa_rows`` are the five
    constants ``[page tokens, unit rows, offset, group, group stride]`` of the
    SWA (dense), CSA and HCA classes (``KvPlan.swa_rows(ratio)``), and the row
    is ``unit * unit_rows + offset + (q // group) * group_stride + q % group``
    with ``unit = swa_block_table[b, a // page]`` and ``q = a % page``. None is
    the slot layouts' formula (page tokens and unit rows ``block_size``). The
    outputs a call writes share page tokens and unit rows (an SWA-only call's
    CSA and HCA constants are not used). A table entry of -1 (a page the
    sequence does not hold) is read as unit 0.
    """


@schema_op
def hca_decode_indices(
    hca_block_table: torch.Tensor,
    batch_id: torch.Tensor,
    n_committed_hca: torch.Tensor,
    hca_indptr: torch.Tensor,
    hca_indices: torch.Tensor,
    *,
    compress_base: int,
    compress_ratio: int = 128,
    block_size: int,
    block_stride: Optional[int] = None,
) -> None:
    """Write the HCA section at the head of each decode token's HCA slice.

    For every entry ``e < n_committed_hca[b]`` (per sequence, as upstream
    decode) the row is ``compress_base + hca_block_table[b, e // k] *
    block_stride + e % k`` with ``k = block_size // compress_ratio`` (1 for HCA
    at block 128) and ``block_stride`` k by default (the envelope in the
    row-space layout), written
    to ``hca_indices[hca_indptr[t] + e]``. The count is capped by the slice
    length and the table width. Upstream builds this on the host every step.
    """


@schema_op
def paged_prefill_indices(
    positions: torch.Tensor,
    batch_id: torch.Tensor,
    chunk_start: torch.Tensor,
    query_start: torch.Tensor,
    n_committed_hca: torch.Tensor,
    swa_block_table: torch.Tensor,
    hca_block_table: torch.Tensor,
    extend_indptr: torch.Tensor,
    swa_indptr: torch.Tensor,
    csa_indptr: torch.Tensor,
    hca_indptr: torch.Tensor,
    extend_indices: torch.Tensor,
    swa_indices: torch.Tensor,
    csa_indices: torch.Tensor,
    hca_indices: torch.Tensor,
    *,
    compress_base: int,
    window: int,
    compress_ratio: int = 128,
    block_size: int,
    swa_rows: Optional[List[int]] = None,
    csa_swa_rows: Optional[List[int]] = None,
    hca_swa_rows: Optional[List[int]] = None,
    hca_block_stride: Optional[int] = None,
) -> None:
    """Fill the four prefill index buffers of a (chunked) prefill forward.

    Per token at ``pos`` of sequence ``b`` whose chunk starts at
    ``cs = chunk_start[b]`` (its first token's row in the forward's kv is
    ``query_start[b]``), with ``swa_low = max(pos - window + 1, 0)``:

    - extend: ``extend_count = min(pos - cs + 1, window)`` rows of the forward's
      kv, ending at the token's own row;
    - SWA prefix: positions ``swa_low .. cs - 1`` (``prefix_swa_count`` of them)
      through ``swa_block_table``, written to the whole SWA slice, the *tail* of
      the CSA slice (the head is :func:`csa_translate_pack`'s) and the *head* of
      the HCA slice;
    - HCA: after the SWA prefix in the HCA slice, the rows of the first
      ``min((pos + 1) // compress_ratio, n_committed_hca[b])`` HCA entries, a
      per-token causal cap: no token reads an entry covering later positions.

    The row-space layout's constants are as in :func:`paged_decode_indices`
    (the SWA prefix of each output in its class's rows) and
    :func:`hca_decode_indices` (``hca_block_stride``).
    """


@schema_op
def decode_index_metadata(
    positions: torch.Tensor,
    batch_id: torch.Tensor,
    n_committed_csa: torch.Tensor,
    n_committed_hca: torch.Tensor,
    swa_indptr: torch.Tensor,
    csa_indptr: torch.Tensor,
    hca_indptr: torch.Tensor,
    *,
    window: int,
    index_topk: int,
    csa_ratio: int = 4,
) -> None:
    """Build the three decode indptrs (``[T + 1]`` each) on the device.

    Slice lengths per real token: SWA ``n = min(pos + 1, window)``, CSA
    ``n + min((pos + 1) // csa_ratio, n_committed_csa[b], index_topk)``, HCA
    ``n + n_committed_hca[b]``; padding tokens get empty slices, so the padded
    tail repeats the last value. Inside a captured graph this replaces the
    host-side cumsums.
    """


@schema_op
def prefill_index_metadata(
    positions: torch.Tensor,
    batch_id: torch.Tensor,
    chunk_start: torch.Tensor,
    n_committed_csa: torch.Tensor,
    n_committed_hca: torch.Tensor,
    extend_indptr: torch.Tensor,
    swa_indptr: torch.Tensor,
    csa_indptr: torch.Tensor,
    hca_indptr: torch.Tensor,
    prefix_swa_count: torch.Tensor,
    *,
    window: int,
    index_topk: int,
    csa_ratio: int = 4,
    hca_ratio: int = 128,
) -> None:
    """Build the four prefill indptrs (``[T + 1]``) and ``prefix_swa_count`` (``[T]``).

    Slice lengths per real token: extend ``extend_count``, SWA prefix
    ``prefix_swa_count``, CSA ``prefix_swa_count + min((pos + 1) // csa_ratio,
    n_committed_csa[b], index_topk)``, HCA ``prefix_swa_count +
    min((pos + 1) // hca_ratio, n_committed_hca[b])`` (see
    :func:`paged_prefill_indices`). ``prefix_swa_count`` is the
    ``skip_per_token`` of :func:`csa_translate_pack` in prefill.
    """


@schema_op
def swa_slot_mapping(
    swa_block_table: torch.Tensor,
    positions: torch.Tensor,
    batch_id: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    block_size: int,
    swa_rows: Optional[List[int]] = None,
) -> None:
    """The SWA rows a step's new tokens are written at, for one layer class.

    ``slot_mapping[t]`` (``[T]`` int32) becomes the row of ``positions[t]``
    through ``swa_block_table`` and the class's ``swa_rows`` (see
    :func:`paged_decode_indices`), relative to the layer's base row, or -1 for
    a padding token, a negative position, and a position whose page the table
    holds as -1 or lies past the table's columns: a prefill chunk writes only
    the positions the manager gave pages, and an SWA writer skips -1. One call
    per layer class serves every layer of it.

    Given ``swa_rows`` the page size is its first value and ``block_size``
    only checks the pair: a page that does not divide ``block_size`` is a
    ValueError. Without it the slot layouts' formula (pages of ``block_size``
    tokens) is used: refused for a view of a row-space manager's staged
    tables, not detectable for a table elsewhere.
    """


@schema_op
def apply_row_copies(planes: List[torch.Tensor], copies: torch.Tensor, copy_counts: torch.Tensor) -> None:
    """Apply the row-space layout's unit moves to the KV planes, in place.

    ``copies`` (``[max_copies, 3]`` int32: source row, destination row, rows)
    and ``copy_counts`` (the copies of each phase) are
    ``KvManager.row_copies`` / ``KvManager.row_copy_counts`` after
    ``stage``/``upload``; every plane (NoPE, RoPE: ``[rows, width]``, any
    dtype) gets the same row copies. Call it on the step's stream before any
    kernel of the step reads or writes KV: the staged tables already point at
    the new rows. Copies of one phase touch disjoint rows and phases run in
    order (one kernel per phase). A list on the host is checked first: an
    entry copying no rows or reaching outside the planes, or two copies of
    one phase where one writes rows the other reads or writes, is a
    ValueError naming them, nothing copied. On the GPU the list is not read
    by the host: such an entry outside the planes is skipped, and
    overlapping copies of a phase are the caller's to avoid.
    """


@schema_op
def gather_rows(sources: List[torch.Tensor], runs: torch.Tensor, run_count: torch.Tensor,
                buffer: torch.Tensor, *, layer_offsets: Optional[List[int]] = None) -> None:
    """Copy row runs of up to four 2-D tensors into one contiguous byte buffer, in place.

    ``runs`` is ``[max_runs, 4]`` int64: (tensor, first_row, rows,
    buffer_offset); run ``i < run_count[0]`` (``run_count``: ``[1]`` int32, on
    the device) copies rows ``[first_row, first_row + rows)`` of
    ``sources[tensor]`` to ``buffer[buffer_offset:]`` (uint8, 1-D), packed
    (``rows * width * element_size`` bytes). A source is any 2-D tensor whose
    rows are contiguous and do not overlap: a layer's KV or RoPE tensor, or a
    CSA indexer cache flattened to ``[blocks, k * entry_bytes]``. Runs must
    write disjoint bytes. Runs on the host are checked first (one outside
    its tensor or the buffer, or two writing the same bytes: a ValueError
    naming them, nothing copied); on the GPU a run outside is skipped.
    ``ukv_torch.transfer`` builds the runs of a sequence. One kernel on the
    current stream sized by ``max_runs``: capturable in a CUDA graph.

    ``layer_offsets`` (at most 64) applies the same runs to several layers in
    that one kernel: ``sources`` then holds the layers' tensors layer after
    layer, the same number each (at most four), tensor ``k`` of every layer
    with the row bytes and row stride of layer 0's tensor ``k`` (the layers
    of one compress ratio); layer ``l``'s runs read its own tensors and land
    ``layer_offsets[l]`` bytes further into the buffer. The layers' row
    counts may differ (the row space's do, by a few rows): every layer takes
    the same runs, so they must lie in the rows of the layer with the
    fewest. Checked like one layer's runs, every layer's writes disjoint
    from every other's. A call per layer cost more host time than the copy
    of a few blocks takes on the GPU.
    """


@schema_op
def scatter_rows(targets: List[torch.Tensor], runs: torch.Tensor, run_count: torch.Tensor,
                 buffer: torch.Tensor, *, layer_offsets: Optional[List[int]] = None) -> None:
    """The inverse of :func:`gather_rows`: copy each run's packed bytes from ``buffer``
    into rows ``[first_row, first_row + rows)`` of ``targets[tensor]``, in place.

    Same arguments and rules; runs must write disjoint rows (checked on the
    host, like the ranges). With ``layer_offsets`` tensor ``k`` of two
    layers may not start at the same address (always checked); the layers
    may be views of one plane at different base rows, as the row space's
    are, and then every byte a run writes, in any layer, must be written by
    no other run (checked on the host; on the GPU, as for one layer's runs,
    the caller's to keep). In the row-space
    layout apply the step's row copies first: a unit moved out of the rows a
    run fills would otherwise be copied from after the scatter wrote them.
    """


def bind_compress_view(
    unified_kv: torch.Tensor, *, compress_base: int, compress_ratio: int, block_size: int,
    block_stride: Optional[int] = None,
) -> torch.Tensor:
    """The ``[N, k, head_dim]`` view a layer's main compressor writes through.

    ``view[c, s]`` is row ``compress_base + c * block_stride + s`` of
    ``unified_kv`` (``k = block_size // compress_ratio``, ``block_stride`` k
    by default): the whole tensor in the unified layout
    (``compress_base=0``), the rows after the SWA region in the static split,
    and in the row-space layout (the layer's view of the planes, ``block_stride``
    the envelope) the layer's block of every envelope. The result aliases
    ``unified_kv``; use it for the rope plane too.
    """
    return torch.ops.ukv.bind_compress_view.default(
        unified_kv, compress_base=compress_base, compress_ratio=compress_ratio, block_size=block_size,
        block_stride=block_stride)
