"""`ukv_torch.KvManager`: the Python face of `torch.classes.ukv.KvManager`.

The C++ manager owns the logical blocks and prefix cache, the sliding-window
pool and the unified coordinator (or the static split), and the persistent
staging tables. This wrapper only names the constructor options and converts
Python sequences to the 1-D CPU tensors the torch class takes; pass tensors
directly (int64 ids and counts, int32/int64 tokens) on hot paths.

The order of the calls in a serving step, and what every count means, is in
docs/serving-loop.md (examples/engine_loop.py follows it).

Table layout: `tables` is `staged_tables_shape(config)` int32
on the manager's device (or on the host without one); `table_index(config,
name)` says where each table lies: 'logical', 'swa' (-1: a page not held), and the
physical table of each compress type named by its ratio (the logical ids in
the static split; in the row space one 'envelope' table, which every ratio
names). `KvManager.table(name)` is that view.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch

from .. import _C
from .kv_events import KvEvent, events_from_tensors
from .prefix_hashing import Salt, int_list, salt_arg
from ..plan.records import KvPlan, PoolSizes, ServeConfig
from .sequence_export import SequenceExport, check_same_model

__all__ = ["KvManager", "table_index", "staged_tables_shape", "token_tensor"]

IntsLike = Union[torch.Tensor, Sequence[int]]


_INT64 = (-(1 << 63), (1 << 63) - 1)


def _ids(x: IntsLike, name: str = "seq_ids") -> torch.Tensor:
    # int64, which the torch class checks value by value; a float, a bool or
    # an int past 64 bits is refused here naming the argument (a conversion
    # would truncate it, or fail with an anonymous overflow error).
    if isinstance(x, torch.Tensor):
        return x
    # A list of exact ints in one pass in C (a 128K-token prompt took 14 ms through
    # torch.tensor and the range checks); anything else, named by int_list.
    fast = _C.int64_tensor(x)
    return fast if fast is not None else torch.tensor(int_list(x, name, *_INT64), dtype=torch.int64)


def _seq_id(seq_id: int) -> int:
    """One sequence id as the torch class takes it (int64)."""
    return int_list([seq_id], "seq_id", *_INT64)[0]


def _counts(x: Union[int, IntsLike], n: int) -> torch.Tensor:
    """One count per sequence: an int is every sequence's."""
    if isinstance(x, int) and not isinstance(x, bool):
        return torch.full((n,), int_list([x], "num_new_tokens", *_INT64)[0], dtype=torch.int64)
    return _ids(x, "num_new_tokens")


def token_tensor(x: IntsLike) -> torch.Tensor:
    """Tokens as the manager's calls take them: an int64 tensor, validated here
    once (a tensor passes as it is), so a caller that makes several calls with
    one prompt pays for the conversion once."""
    return _ids(x, "tokens")


class KvManager:
    """Sequence-level KV manager of the unified pool.

    ``KvManager(plan)`` takes everything from a :class:`KvPlan`: its
    :class:`ServeConfig` and its pools. ``KvManager(config, pools)`` takes a
    ServeConfig and a :class:`PoolSizes` (or the PoolSizes fields as
    keywords: ``num_logical_blocks``, ``num_swa_blocks``, ``type_slots``).
    ``device`` is where the staged tables are mirrored (pinned host staging
    when it is a GPU); without one the kernels read the host tables.

    The keyword form of earlier versions, ``KvManager(num_logical_blocks=...,
    num_swa_blocks=..., **options)``, is accepted: ``options`` are ServeConfig
    fields, plus ``compress_ks`` (rows per block, converted to ratios),
    ``unified`` and ``borrow_unreleased_swa`` (converted to the layout:
    static, upstream or elastic).
    """

    def __init__(self, config: Union[KvPlan, ServeConfig, None] = None, pools: Optional[PoolSizes] = None, *,
                 device: Optional[Union[str, torch.device]] = None, **options):
        config, pools = _config_and_pools(config, pools, options)
        self.torch_object = torch.classes.ukv.KvManager(
            config.encode(), pools.encode(), "" if device is None else str(torch.device(device)))
        self.config = config
        self.pools = PoolSizes.decode(self.torch_object.pools())  # type_slots resolved

    @classmethod
    def from_torch_object(cls, obj) -> "KvManager":
        """Wrap an existing ``torch.classes.ukv.KvManager`` (one unpickled or made elsewhere)."""
        self = cls.__new__(cls)
        self.torch_object = obj
        self.config = ServeConfig.decode(obj.config())
        self.pools = PoolSizes.decode(obj.pools())
        return self

    @property
    def num_types(self) -> int:
        """The number of compress types: ``len(config.compress_ratios)``."""
        return len(self.config.compress_ratios)

    # --- admission ---
    # Refusals of can_allocate / allocate.
    NOT_NOW = -1     # live sequences hold what it needs (or max_num_seqs are live): retry later
    NEVER_FITS = -2  # it would not fit with no sequence live: reject the request

    def can_allocate(self, tokens: IntsLike, *, salt: Salt = None, loaded_tokens: int = 0) -> int:
        """The cached prefix in tokens allocate() would give now (with the same
        ``loaded_tokens``), or NOT_NOW / NEVER_FITS; changes nothing (not even the
        refusal count)."""
        return self.torch_object.can_allocate(token_tensor(tokens), salt_arg(salt), loaded_tokens)

    def allocate(self, seq_id: int, tokens: IntsLike, *, salt: Salt = None, loaded_tokens: int = 0) -> int:
        """Admit a request given its known tokens (the prompt, or prompt + generated
        tokens when a preempted request resumes).

        Returns its cached prefix in tokens, a multiple of block_size below
        ``len(tokens)``: the KV of those positions is in place and prefill starts
        there. Or NOT_NOW (wait and retry) / NEVER_FITS (reject) with nothing
        changed. A yes is a promise: ensure_for_tokens for its chunks cannot run
        out of memory. ``seq_id`` must be >= 0 and not live; at most
        max_num_seqs sequences are live at once; more than
        ``max_blocks_per_seq * block_size`` tokens is a ValueError.

        ``salt`` isolates the request's prefix cache (tenants, LoRA
        adapters): it hits, and later publishes, only blocks of requests with
        the same salt. None (or 0) is no salt; an int in [0, 2^64) or bytes
        (:func:`ukv_torch.cache_salt`). A resumed request passes its salt
        again. A bad salt is a TypeError / ValueError naming it.

        ``loaded_tokens`` (a multiple of block_size below ``len(tokens)``):
        the KV of positions ``[0, loaded_tokens)`` beyond the HBM hit was found
        in a KV tier (:class:`ukv_torch.tiers.TierCache` finds it and fills
        the rows). The answer is then the larger of the HBM hit and the loaded
        prefix, which the caller writes (its blocks' compress rows and the SWA
        rows of the ``window - 1`` positions before it) before the request's
        first chunk runs; they are published to the prefix cache by its first
        commit_prefill. In the row space it may be less than asked (the
        step's copy list had no room to bind all their rows): only the rows up
        to the answer are the caller's to fill, the rest is prompt."""
        return self.torch_object.allocate(_seq_id(seq_id), token_tensor(tokens), salt_arg(salt), loaded_tokens)

    # --- prefill ---
    def ensure_for_tokens(self, seq_ids: IntsLike, counts: IntsLike) -> None:
        """Before a prefill forward: SWA pages for each sequence's next chunk, positions
        ``[num_computed, num_computed + counts[i])``.

        Always the pages of the chunk's last ``window`` positions, and those of
        the whole chunk with :meth:`set_whole_chunks` on (for a step's chunks
        within max_num_batched_tokens) or when the pools have room beyond every
        promise made (``stats()["whole_chunks"]`` counts them). The positions that got pages are the ones
        :func:`ukv_torch.swa_slot_mapping` maps to a row: the model writes SWA KV
        there. Once per chunk, with its exact count, which commit_prefill then
        commits. Not for decoding sequences."""
        self.torch_object.ensure_for_tokens(_ids(seq_ids), _ids(counts, "counts"))

    def set_whole_chunks(self, on: bool) -> None:
        """Whole chunks (a KV tier turns them on: :class:`ukv_torch.tiers.TierCache`):
        every prefill chunk gets the SWA pages of all its positions, so every block
        boundary inside a prompt has its trailing window written and published,
        and a tier saves a tail object there (a later load can end there).

        The pages below a chunk's window come from a reserve of
        ``quota_bounds()["whole_chunk_pages"]`` pages (enough for a step's chunks
        within max_num_batched_tokens) that admission keeps apart, and go back at
        the chunk's commit; beyond it a chunk is whole only where the pools have
        room, as with the mode off. Turning it on while the live sequences'
        promises leave no room for the reserve is a RuntimeError, nothing
        changed: turn it on before admitting. ``on`` not a bool is a TypeError."""
        if not isinstance(on, bool):
            raise TypeError(f"set_whole_chunks: on must be a bool, got {on!r}")
        self.torch_object.set_whole_chunks(on)

    @property
    def whole_chunks(self) -> bool:
        """Whether :meth:`set_whole_chunks` is on."""
        return self.torch_object.whole_chunks()

    def commit_prefill(self, seq_ids: IntsLike, counts: IntsLike, sampled: Optional[IntsLike] = None) -> None:
        """After the forward: the chunks' KV was computed.

        ``counts[i]`` is exactly what ensure_for_tokens provisioned for the chunk,
        or 0. ``sampled[i]`` is the token sampled after the prompt's last position,
        -1 for none (None: all -1); a token is accepted only when the chunk
        completes the known tokens, and a last chunk committed without one is
        completed by ``commit_prefill(ids, [0], [token])``. Publishes the full
        blocks a later request can hit and frees the SWA pages that left the
        window. Once the token is committed the sequence decodes:
        ``num_tokens == num_computed + 1`` between steps."""
        ids = _ids(seq_ids)
        samp = torch.full((ids.numel(),), -1, dtype=torch.int32) if sampled is None else token_tensor(sampled)
        self.torch_object.commit_prefill(ids, _ids(counts, "counts"), samp)

    # --- decode ---
    def can_append(self, seq_ids: IntsLike, num_new_tokens: Union[int, IntsLike] = 1) -> int:
        """Length of the longest prefix of seq_ids that append() can serve (preempt the rest).

        ``num_new_tokens``: positions each sequence computes this step, 1 + its
        draft tokens (at most 1 + mtp_k): one int for all, or one per sequence.
        Order seq_ids by priority. Changes nothing."""
        ids = _ids(seq_ids)
        return self.torch_object.can_append(ids, _counts(num_new_tokens, ids.numel()))

    def append(self, seq_ids: IntsLike, num_new_tokens: Union[int, IntsLike] = 1) -> None:
        """Give each decoding sequence room for its next ``num_new_tokens`` positions
        (blocks and SWA pages); all or nothing (OutOfSlots names how many fit:
        call can_append and preempt first). Counts as in can_append."""
        ids = _ids(seq_ids)
        self.torch_object.append(ids, _counts(num_new_tokens, ids.numel()))

    def commit_decode(self, seq_ids: IntsLike, counts: IntsLike, tokens: IntsLike) -> None:
        """After the forward and the draft verification: ``counts[i]`` = accepted drafts
        + 1, in [1, the count append() scheduled], positions whose KV is now final.
        ``tokens`` are those positions' successors, concatenated per sequence: the
        accepted drafts, then the bonus token (``sum(counts)`` in all)."""
        self.torch_object.commit_decode(_ids(seq_ids), _ids(counts, "counts"), token_tensor(tokens))

    def deallocate(self, seq_ids: Union[int, IntsLike]) -> None:
        """End sequences, finished or preempted: their blocks and SWA pages are released.
        Published blocks stay in the prefix cache until their memory is reused, so
        a preempted request resumed with allocate(all its known tokens) gets back
        the prefix that survived."""
        self.torch_object.deallocate(_ids([seq_ids] if isinstance(seq_ids, int) else seq_ids))

    def clear_cache(self) -> None:
        """Forget every cached block and SWA page no sequence holds (an ALL_CLEARED event)."""
        self.torch_object.clear_cache()

    # --- moving a sequence to another pool (docs/serving-loop.md, "Moving a sequence between pools") ---
    def describe_sequence(self, seq_id: int) -> SequenceExport:
        """A decoding sequence for export: its tokens, computed count, block hashes and the
        tables its KV rows are found through (:class:`ukv_torch.SequenceExport`).

        The sequence must be decoding (its prompt computed and the token sampled
        after it committed) with no append() awaiting commit_decode; otherwise a
        RuntimeError says which. Changes nothing: the sequence stays live here
        until you deallocate it (after :func:`ukv_torch.gather_sequence` has
        read its rows). Called on the importing side after import_sequence, it
        gives the rows :func:`ukv_torch.scatter_sequence` writes."""
        seq_id = _seq_id(seq_id)
        (tokens, computed, swa_begin, hashes, logical, swa_units, phys, salt, generation,
         cached) = self.torch_object.describe_sequence(seq_id)
        return SequenceExport(tokens, computed, swa_begin, hashes, logical, swa_units, phys, self.config,
                              salt & ((1 << 64) - 1), seq_id, generation, cached)

    def import_sequence(self, seq_id: int, export: SequenceExport) -> int:
        """Admit a sequence another manager exported, as decoding.

        Same rules and answers as :meth:`allocate`: NOT_NOW or NEVER_FITS with
        nothing changed (not even the refusal count), or the cached prefix in
        tokens, below which this pool already holds the sequence's KV. On
        success the sequence holds the blocks of its ``num_computed`` positions
        and the SWA pages of its last window, as if it had been prefilled here;
        fill them with :func:`ukv_torch.scatter_sequence` before its first
        decode step reads them. Its full blocks are published to the prefix
        cache by the prefill rule (those whose trailing window of SWA rows the
        transfer carries). ``export.config`` must have this manager's
        block_size, window, compress_ratios and prefix_hash (ValueError
        otherwise: the export's block_hashes are keys of its prefix_hash), and
        the manager must not be configured with full_retain. The sequence
        keeps its cache salt (``export.salt``), so its blocks hit as they did
        there."""
        check_same_model(export, self)
        if export.config.prefix_hash != self.config.prefix_hash:
            raise ValueError(f"the sequence was exported under prefix_hash={export.config.prefix_hash!r}, this "
                             f"manager uses prefix_hash={self.config.prefix_hash!r}: its block_hashes are not this "
                             f"cache's keys")
        return self.torch_object.import_sequence(_seq_id(seq_id), token_tensor(export.tokens), export.num_computed,
                                                 salt_arg(export.salt))

    # --- inspection ---
    def has_sequence(self, seq_id: int) -> bool:
        """Whether seq_id is live: allocated and not deallocated."""
        return self.torch_object.has_sequence(_seq_id(seq_id))

    def num_computed(self, seq_id: int) -> int:
        """Positions of the sequence whose KV is computed and committed."""
        return self.torch_object.num_computed(_seq_id(seq_id))

    def num_tokens(self, seq_id: int) -> int:
        """Tokens the sequence knows: its prompt, then the committed sampled tokens. A
        decoding sequence knows one more than it computed: the last sampled token,
        whose KV the next step computes."""
        return self.torch_object.num_tokens(_seq_id(seq_id))

    def locate_blocks(self, hashes: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Where published compress blocks hold their KV now: ``hashes`` their
        block keys (:func:`ukv_torch.key_tensor`: int64 [n] under xxh64, [n, 2]
        under sha256 and blake2b), ``tokens`` their block_size tokens each,
        concatenated. int32 [n, 1 + tables]: the logical id, then the staged
        physical id per table (:meth:`phys_table`'s values); -1 for a block the
        prefix cache no longer holds. A RuntimeError while the row space has
        row copies not yet taken (:meth:`row_copies`): the rows it would name
        are not filled yet. The KV tiers read a block's rows to save it."""
        return self.torch_object.locate_blocks(hashes, tokens)

    def locate_pages(self, hashes: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """:meth:`locate_blocks` for published SWA pages (``swa_page`` tokens each):
        int32 [n], the staged SWA unit of each (the 'swa' table's values), -1 if
        none."""
        return self.torch_object.locate_pages(hashes, tokens)

    def logical_table(self, seq_id: int) -> torch.Tensor:
        """The sequence's logical block ids (int32, one per block)."""
        return self.torch_object.logical_table(_seq_id(seq_id))

    def swa_table(self, seq_id: int) -> torch.Tensor:
        """The sequence's SWA pages (int32, one per page, -1 for a page it does not hold)
        by the manager's page ids; in the row space the staged 'swa' table holds the
        units they are in."""
        return self.torch_object.swa_table(_seq_id(seq_id))

    def phys_table(self, seq_id: int, type_index: int) -> torch.Tensor:
        """The sequence's physical compress blocks as staged, for the compress type at
        ``type_index`` in compress_ratios (``config.type_of_ratio(r)``): logical ids
        in the static split, envelope ids in the row space (type 0)."""
        return self.torch_object.phys_table(_seq_id(seq_id), type_index)

    def staged_swa_table(self, seq_id: int) -> torch.Tensor:
        """The sequence's SWA table as staged (int32, one entry per page, -1 for a page
        it does not hold): SWA blocks in the slot layouts, units in the row space."""
        return self.torch_object.staged_swa_table(seq_id)

    def stats(self) -> Dict[str, int]:
        """Counters since construction and gauges of the current state; docs/serving-loop.md
        ("What stats() reports") describes every key.

        Every layout: num_sequences, free_logical_blocks, free_swa_slots,
        held_swa_slots, swa_reserved, reclaimable_slots, admissions,
        admission_refusals, appends, append_refusals, prefix_query_blocks,
        compressed_hit_blocks, prefix_hit_blocks, reclaimed_slots,
        reclaimed_blocks, compress_evictions, whole_chunks. The row space adds
        live_envelopes, cached_envelopes, live_swa_units, cached_swa_units,
        unheld_rows, envelope_evictions, swa_unit_evictions, envelope_moves,
        swa_unit_moves, moved_rows; upstream and elastic add swa_evictions,
        unreleased_borrows and, per compress ratio r, ratio{r}_free_blocks and
        ratio{r}_borrows."""
        return dict(self.torch_object.stats())

    def quota_bounds(self) -> Dict[str, int]:
        """SWA quota bounds in pages: tail_pages (the hit's trailing window), prefill_quota_bound,
        decode_quota_bound, and whole_chunk_pages (the reserve of :meth:`set_whole_chunks`)."""
        return dict(self.torch_object.quota_bounds())

    def take_events(self) -> List[KvEvent]:
        """The KV events since the last call, in order (:class:`ukv_torch.KvEvent`;
        docs/serving-loop.md, "KV events"): the compress blocks and SWA pages
        that became hittable or stopped being so, and cache clears."""
        return events_from_tensors(*self.torch_object.take_events(), self.config.prefix_hash)

    def check_invariants(self) -> None:
        """Verify the internal invariants (admission's promise included); RuntimeError
        names the first broken one. A test aid: it walks the whole state."""
        self.torch_object.check_invariants()

    # --- graph-safe staging ---
    def stage(self, seq_ids: IntsLike) -> None:
        """Write the batch's rows (row i = seq_ids[i]) into the pinned host tables.
        Waits first until the previous upload no longer reads them.

        Once per step, after the step's allocate / ensure_for_tokens / append and
        before its forward (a token's batch id is its sequence's row). In the
        row space it also takes the unit moves since the last stage into
        :attr:`row_copies`, which must be applied before the step touches KV."""
        self.torch_object.stage(_ids(seq_ids))

    def upload(self, rows: int) -> None:
        """Non-blocking copy of rows [0, rows) to the device tables on the current stream
        (may be captured in a CUDA graph; then call mark_uploaded() after each replay)."""
        self.torch_object.upload(rows)

    def mark_uploaded(self) -> None:
        """After each replay of a graph that captured upload(): the next stage() waits for that copy."""
        self.torch_object.mark_uploaded()

    @property
    def tables(self) -> torch.Tensor:
        """The staged tables the kernels read: staged_tables_shape(config) int32 (see table_index)."""
        return self.torch_object.tables()

    @property
    def row_copies(self) -> torch.Tensor:
        """Row-space layout: the staged unit moves, ``[max_copies, 3]`` int32
        (source row, destination row, rows) grouped by phase, for
        :func:`ukv_torch.apply_row_copies`; on the device after ``upload``.
        Empty (0 rows) in the slot layouts."""
        return self.torch_object.row_copies()

    @property
    def row_copy_counts(self) -> torch.Tensor:
        """The number of :attr:`row_copies` of each phase (int32, one per phase)."""
        return self.torch_object.row_copy_counts()

    @property
    def host_tables(self) -> torch.Tensor:
        """The host tables stage() writes (pinned with a device), laid out like :attr:`tables`."""
        return self.torch_object.host_tables()

    def table(self, name: Union[str, int]) -> torch.Tensor:
        """One table of :attr:`tables` as a [max_num_seqs, columns] view: 'logical', 'swa', or a compress ratio."""
        return self.tables[:, table_index(self.config, name)]

    def __getstate__(self):
        return {"torch_object": self.torch_object}

    def __setstate__(self, state):
        obj = state["torch_object"]
        self.torch_object = obj
        self.config = ServeConfig.decode(obj.config())
        self.pools = PoolSizes.decode(obj.pools())


def table_index(config: ServeConfig, name: Union[str, int]) -> int:
    """Where a table lies in the staged tables ([rows, table, columns]): 'logical',
    'swa', then the physical table of each compress type, named by its ratio
    (csrc/core/manager/staged_tables.h)."""
    return torch.ops.ukv.staged_table_index(config.encode(), str(name))


def staged_tables_shape(config: ServeConfig) -> Tuple[int, int, int]:
    """(max_num_seqs, tables, columns) of the staged tables of a manager with this config."""
    return tuple(torch.ops.ukv.staged_tables_shape(config.encode()))


_LEGACY_LAYOUT = {(False, False): "static", (True, False): "upstream", (True, True): "elastic"}


def _config_and_pools(config, pools, options):
    """(ServeConfig, PoolSizes) from a plan, a config and pools, or the earlier keyword form."""
    pool_options = {f.name: options.pop(f.name) for f in PoolSizes._fields if f.name in options}
    if isinstance(config, KvPlan):
        if pools is not None or pool_options or options:
            raise TypeError("KvManager(plan) takes no pools or options: the plan carries them")
        return config.config, config.pools
    if pools is None:
        pools = PoolSizes(**pool_options)
    elif pool_options:
        raise TypeError(f"KvManager: give pools or {', '.join(sorted(pool_options))}, not both")
    if config is None:
        config = _legacy_config(options)
    elif options:
        raise TypeError(f"KvManager: unknown option(s) {', '.join(sorted(options))} beside a ServeConfig")
    if not isinstance(config, ServeConfig):
        raise TypeError(f"KvManager: config must be a KvPlan or a ServeConfig, got {type(config).__name__}")
    return config, pools


def _legacy_config(options) -> ServeConfig:
    unified = options.pop("unified", True)
    borrow = options.pop("borrow_unreleased_swa", False)
    if (unified, borrow) == (False, True):
        raise ValueError("borrow_unreleased_swa applies to the unified layout only (unified=False)")
    block_size = options.get("block_size", 128)
    ks = options.pop("compress_ks", None)
    if ks is not None:
        for k in ks:
            if not isinstance(k, int) or k <= 0 or block_size % k:
                raise ValueError(f"compress_ks: each k must divide block_size {block_size}, got {k}")
        options["compress_ratios"] = tuple(sorted(block_size // k for k in ks))
        if list(options["compress_ratios"]) != [block_size // k for k in ks]:
            raise ValueError(f"compress_ks must be in descending order of k (ascending ratio), got {tuple(ks)}")
    options.setdefault("layout", _LEGACY_LAYOUT[(bool(unified), bool(borrow))])
    fields = {f.name for f in ServeConfig._fields}
    unknown = set(options) - fields
    if unknown:
        raise TypeError(f"KvManager: unknown option(s) {', '.join(sorted(unknown))} "
                        f"(ServeConfig fields: {', '.join(sorted(fields))})")
    return ServeConfig(**options)
