"""`KvStepOps`: the ops of a serving step bound to one plan, so the engine
never passes a layout constant by hand.

The raw ops (``ukv_torch.ops``) take the layout's constants as arguments
(``block_size``, the per-class ``swa_rows``, ``compress_base``,
``block_stride``, the window). They refuse a constant that does not fit a
manager's staged tables, but a table elsewhere is only int32 ids, and a
compress view's tensor does not say its layout: there a forgotten constant
gives wrong rows, not an error. ``KvStepOps`` is made once from the plan (with the
KV tensors and the manager where a method needs them) and fills in every
constant and staged table, in the spirit of FlashInfer's plan/run wrappers.
Its methods only call the raw ops with those constants: they allocate
nothing and read nothing back, so they can be captured in a CUDA graph like
the ops themselves (the table views are views of the manager's persistent
tables).
"""
from __future__ import annotations

from typing import Dict, Optional

import torch

from . import ops, transfer
from .manager.kv_manager import KvManager, staged_tables_shape, table_index
from .plan.records import KvPlan
from .plan.unified_kv import UnifiedKv, check_plan_tensors

__all__ = ["KvStepOps"]

CSA_RATIO, HCA_RATIO = 4, 128


class KvStepOps:
    """The step's ops for one plan: ``KvStepOps(plan, kv, manager)``.

    ``kv`` (``allocate_unified_kv(plan)``) is needed by :meth:`compress_view`,
    :meth:`apply_row_copies` and the transfers; ``manager`` (``KvManager(plan)``)
    by :meth:`apply_row_copies`, the transfers and, unless ``tables`` is given,
    every index method, which reads ``manager.tables``. ``tables`` replaces
    them: a rank without a manager passes its ``ukv_torch.distributed.tables_buffer``.
    Every index method also takes ``tables=`` for one call (e.g. the step's
    rows, ``manager.tables[:rows]``); per-row vectors then have that many rows.

    Constructing it checks that the parts belong together (the manager made
    from this plan, the KV tensors laid out by it, the tables of its shape):
    ValueError naming the part otherwise.
    """

    def __init__(self, plan: KvPlan, kv: Optional[UnifiedKv] = None, manager: Optional[KvManager] = None, *,
                 tables: Optional[torch.Tensor] = None):
        if not isinstance(plan, KvPlan):
            raise TypeError(f"plan must be a KvPlan (plan_kv_layout), got {type(plan).__name__}")
        if kv is not None:
            check_plan_tensors(plan, kv)
        if manager is not None:
            if not isinstance(manager, KvManager):
                raise TypeError(f"manager must be a KvManager, got {type(manager).__name__}")
            # type_slots aside, which the manager resolves when a plan leaves them empty.
            if manager.config != plan.config or manager.pools.replace(type_slots=()) != \
                    plan.pools.replace(type_slots=()):
                raise ValueError("manager must be KvManager(plan) of this plan: its config or pools differ")
        if tables is None and manager is not None:
            tables = manager.tables
        if tables is not None and tuple(tables.shape) != staged_tables_shape(plan.config):
            raise ValueError(f"tables must have the staged tables' shape {staged_tables_shape(plan.config)} of this "
                             f"plan's config, got {tuple(tables.shape)}")
        self.plan, self.kv, self.manager, self.tables = plan, kv, manager, tables
        # The manager's persistent buffers, taken once: a method then touches only
        # tensors, so it traces under torch.compile and captures in a CUDA graph.
        self._copies = (manager.row_copies, manager.row_copy_counts) if manager is not None else None
        config = plan.config
        self.block_size, self.window = config.block_size, config.window
        ratios = plan.model.layer_ratios
        self._swa_rows = {r: list(plan.swa_rows(r)) for r in set(ratios)}
        # An output whose class the model lacks is never read; it takes another
        # class's rows so that the outputs of one call share their units.
        stand_in = self._swa_rows[ratios[0]]
        self._decode_rows = {name: self._swa_rows.get(r, stand_in) for name, r in
                             (("swa_rows", 0), ("csa_swa_rows", CSA_RATIO), ("hca_swa_rows", HCA_RATIO))}
        self._compress = {r: plan.compress_args(r) for r in set(ratios) if r}
        self._index = {name: table_index(config, name) for name in ["logical", "swa"] + list(self._compress)}

    # --- the staged tables ---------------------------------------------------------------
    def table(self, name, tables: Optional[torch.Tensor] = None) -> torch.Tensor:
        """One staged table as a [rows, columns] view: 'logical', 'swa' or a compress ratio."""
        if tables is None:
            if self.tables is None:
                raise ValueError("KvStepOps was made without a manager or tables: pass tables=")
            tables = self.tables
        if name not in self._index:
            raise ValueError(f"table must be 'logical', 'swa' or one of the model's compress ratios "
                             f"{sorted(self._compress)}, got {name!r}")
        return tables[:, self._index[name]]

    def _compress_args(self, ratio: int) -> Dict[str, int]:
        if ratio not in self._compress:
            raise ValueError(f"the plan's model has no layer of compress ratio {ratio}")
        return self._compress[ratio]

    # --- writing KV ----------------------------------------------------------------------
    def swa_slot_mapping(self, positions: torch.Tensor, batch_id: torch.Tensor, slot_mapping: torch.Tensor, *,
                         ratio: int, tables: Optional[torch.Tensor] = None) -> None:
        """The SWA row of each new token in the layers of class ``ratio`` (0: dense),
        or -1 (padding, or a position without a page): :func:`ukv_torch.swa_slot_mapping`."""
        if ratio not in self._swa_rows:
            raise ValueError(f"the plan's model has no layer of ratio {ratio} (layers: {sorted(self._swa_rows)})")
        ops.swa_slot_mapping(self.table("swa", tables), positions, batch_id, slot_mapping,
                             block_size=self.block_size, swa_rows=self._swa_rows[ratio])

    def compress_view(self, layer: int, *, rope: bool = False) -> torch.Tensor:
        """The ``[N, k, width]`` view layer ``layer``'s compressor writes through (of
        its RoPE tensor with ``rope=True``): :func:`ukv_torch.bind_compress_view`."""
        kv = self._need_kv()
        ratio = self.plan.model.layer_ratios[layer]
        tensor = kv.rope[layer] if rope else kv.kv[layer]
        if tensor is None:
            raise ValueError(f"layer {layer} has no rope tensor: the plan's model keeps rope inline")
        return ops.bind_compress_view(tensor, compress_ratio=ratio, block_size=self.block_size,
                                      **self._compress_args(ratio))

    def apply_row_copies(self) -> None:
        """The row space's unit moves staged with the step (:func:`ukv_torch.apply_row_copies`
        on every plane); nothing in the slot layouts. After ``upload``, before the step
        reads or writes KV."""
        kv = self._need_kv()
        self._need_manager()
        if kv.planes:
            ops.apply_row_copies(list(kv.planes), *self._copies)

    # --- building the indices ------------------------------------------------------------
    def decode_index_metadata(self, positions, batch_id, n_committed_csa, n_committed_hca, swa_indptr, csa_indptr,
                              hca_indptr, *, index_topk: int) -> None:
        """:func:`ukv_torch.decode_index_metadata` with the plan's window."""
        ops.decode_index_metadata(positions, batch_id, n_committed_csa, n_committed_hca, swa_indptr, csa_indptr,
                                  hca_indptr, window=self.window, index_topk=index_topk, csa_ratio=CSA_RATIO)

    def prefill_index_metadata(self, positions, batch_id, chunk_start, n_committed_csa, n_committed_hca,
                               extend_indptr, swa_indptr, csa_indptr, hca_indptr, prefix_swa_count, *,
                               index_topk: int) -> None:
        """:func:`ukv_torch.prefill_index_metadata` with the plan's window."""
        ops.prefill_index_metadata(positions, batch_id, chunk_start, n_committed_csa, n_committed_hca,
                                   extend_indptr, swa_indptr, csa_indptr, hca_indptr, prefix_swa_count,
                                   window=self.window, index_topk=index_topk, csa_ratio=CSA_RATIO,
                                   hca_ratio=HCA_RATIO)

    def paged_decode_indices(self, positions, batch_id, swa_indptr, swa_indices, csa_indptr=None, csa_indices=None,
                             hca_indptr=None, hca_indices=None, *, tables: Optional[torch.Tensor] = None) -> None:
        """Each decode token's window at its slices' tails (:func:`ukv_torch.paged_decode_indices`),
        the SWA output in the dense class's rows, the CSA and HCA outputs in theirs."""
        ops.paged_decode_indices(self.table("swa", tables), positions, batch_id, swa_indptr, swa_indices, csa_indptr,
                                 csa_indices, hca_indptr, hca_indices, window=self.window,
                                 block_size=self.block_size, **self._decode_rows)

    def csa_translate_pack(self, topk_local, positions, batch_id, kv_indptr, kv_indices, *,
                           skip_per_token: Optional[torch.Tensor] = None,
                           tables: Optional[torch.Tensor] = None) -> None:
        """The indexer's top-k as rows at the CSA slices' heads (:func:`ukv_torch.csa_translate_pack`):
        decode without ``skip_per_token``, prefill with ``prefix_swa_count`` as it."""
        ops.csa_translate_pack(topk_local, self.table(CSA_RATIO, tables), positions, batch_id, kv_indptr, kv_indices,
                               window=self.window if skip_per_token is None else 0, skip_per_token=skip_per_token,
                               compress_ratio=CSA_RATIO, block_size=self.block_size,
                               **self._compress_args(CSA_RATIO))

    def hca_decode_indices(self, batch_id, n_committed_hca, hca_indptr, hca_indices, *,
                           tables: Optional[torch.Tensor] = None) -> None:
        """The HCA entries at the decode HCA slices' heads (:func:`ukv_torch.hca_decode_indices`)."""
        ops.hca_decode_indices(self.table(HCA_RATIO, tables), batch_id, n_committed_hca, hca_indptr, hca_indices,
                               compress_ratio=HCA_RATIO, block_size=self.block_size,
                               **self._compress_args(HCA_RATIO))

    def paged_prefill_indices(self, positions, batch_id, chunk_start, query_start, n_committed_hca, extend_indptr,
                              swa_indptr, csa_indptr, hca_indptr, extend_indices, swa_indices, csa_indices,
                              hca_indices, *, tables: Optional[torch.Tensor] = None) -> None:
        """The four prefill index buffers (:func:`ukv_torch.paged_prefill_indices`)."""
        hca = self._compress_args(HCA_RATIO)
        ops.paged_prefill_indices(positions, batch_id, chunk_start, query_start, n_committed_hca,
                                  self.table("swa", tables), self.table(HCA_RATIO, tables), extend_indptr,
                                  swa_indptr, csa_indptr, hca_indptr, extend_indices, swa_indices, csa_indices,
                                  hca_indices, compress_base=hca["compress_base"],
                                  hca_block_stride=hca["block_stride"], window=self.window,
                                  compress_ratio=HCA_RATIO, block_size=self.block_size, **self._decode_rows)

    # --- moving a sequence between pools -------------------------------------------------
    def transfer_bytes(self, seq_id: int) -> int:
        """The transfer buffer's size for a live decoding sequence (:func:`ukv_torch.transfer_bytes`)."""
        return transfer.transfer_bytes(self.plan, self._need_kv(), self._need_manager().describe_sequence(seq_id))

    def gather_sequence(self, seq_id: int, buffer: torch.Tensor) -> None:
        """Copy the sequence's KV rows into ``buffer``, as the manager describes it now
        (:func:`ukv_torch.gather_sequence`)."""
        manager = self._need_manager()
        transfer.gather_sequence(self.plan, self._need_kv(), manager.describe_sequence(seq_id), buffer,
                                 manager=manager)

    def scatter_sequence(self, seq_id: int, buffer: torch.Tensor) -> None:
        """Copy ``buffer`` into the rows of a sequence ``import_sequence`` admitted, leaving
        the cached prefix it returned alone (:func:`ukv_torch.scatter_sequence`). In the
        row space after the step's :meth:`apply_row_copies`."""
        manager = self._need_manager()
        transfer.scatter_sequence(self.plan, self._need_kv(), manager.describe_sequence(seq_id), buffer,
                                  manager=manager)

    def _need_kv(self) -> UnifiedKv:
        if self.kv is None:
            raise ValueError("KvStepOps was made without kv: KvStepOps(plan, kv, manager)")
        return self.kv

    def _need_manager(self) -> KvManager:
        if self.manager is None:
            raise ValueError("KvStepOps was made without a manager: KvStepOps(plan, kv, manager)")
        return self.manager
