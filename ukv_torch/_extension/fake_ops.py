"""Fake (meta) kernels of the index-building ops, for torch.compile and opcheck.

The ops write their outputs in place and return nothing, so a fake kernel has
no output to shape; it states the token-count rules between the arguments with
``torch._check`` so that a traced call with mismatched sizes fails while
tracing (with symbolic sizes, as a guard) rather than inside a replayed graph.
Everything else (dtypes, strides, scalar ranges) is checked by the one C++
validation function of each op when the real kernel runs.

A call mixing real tensors with meta tensors also dispatches here (Meta wins
the dispatch), and would return without writing its real outputs; so every
fake first requires all its tensors on one device, naming the odd one out,
with the C++ checks' wording.
``bind_compress_view`` needs no fake: it is CompositeImplicitAutograd and
traces as aten views.

Imported by ``ukv_torch/__init__.py`` after ``_C`` has registered the schemas.
"""
import functools
import inspect

import torch

from .eager import check_signature


def _check_one_device(op, arguments, host=()):
    """Every tensor argument (lists of tensors included) but those named in ``host``
    on one device: the first non-meta one's, else meta."""
    tensors = {}
    for name, value in arguments.items():
        if name in host:
            continue
        if isinstance(value, torch.Tensor):
            tensors[name] = value
        elif isinstance(value, (list, tuple)):
            tensors.update((f"{name}[{i}]", t) for i, t in enumerate(value) if isinstance(t, torch.Tensor))
    devices = [t.device for t in tensors.values()]
    expected = next((d for d in devices if d.type != "meta"), devices[0] if devices else None)
    for name, t in tensors.items():
        if t.device != expected:
            raise RuntimeError(f"{op}: {name} must be on {expected} like the other arguments, got {t.device}")


def _register_fake(op, host=()):
    """torch.library.register_fake for ukv::op, with the one-device check first
    (``host``: arguments that are host tensors whatever the device).
    The fake's signature must be the op's schema (checked here, at import)."""
    def register(fn):
        check_signature(op, fn, "fake kernel")
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def checked(*args, **kwargs):
            _check_one_device(op, signature.bind(*args, **kwargs).arguments, host)
            return fn(*args, **kwargs)
        return torch.library.register_fake(f"ukv::{op}")(checked)
    return register


def _check_tokens(batch_id, per_token=(), indptrs=()):
    num_tokens = batch_id.shape[0]
    for t in per_token:
        if t is not None:
            torch._check(t.shape[0] == num_tokens, lambda: "per-token tensors must have batch_id's length")
    for t in indptrs:
        if t is not None:
            torch._check(t.shape[0] == num_tokens + 1, lambda: "indptrs must have len(batch_id) + 1 entries")


@_register_fake("csa_translate_pack")
def _csa_translate_pack(topk_local, block_table, positions, batch_id, kv_indptr, kv_indices, *, compress_base,
                        window=0, skip_per_token=None, compress_ratio=4, block_size, block_stride=None):
    _check_tokens(batch_id, per_token=(topk_local, positions, skip_per_token), indptrs=(kv_indptr,))


@_register_fake("paged_decode_indices")
def _paged_decode_indices(swa_block_table, positions, batch_id, swa_indptr, swa_indices, csa_indptr=None,
                          csa_indices=None, hca_indptr=None, hca_indices=None, *, window, block_size, swa_rows=None,
                          csa_swa_rows=None, hca_swa_rows=None):
    _check_tokens(batch_id, per_token=(positions,), indptrs=(swa_indptr, csa_indptr, hca_indptr))


@_register_fake("hca_decode_indices")
def _hca_decode_indices(hca_block_table, batch_id, n_committed_hca, hca_indptr, hca_indices, *, compress_base,
                        compress_ratio=128, block_size, block_stride=None):
    _check_tokens(batch_id, indptrs=(hca_indptr,))
    torch._check(n_committed_hca.shape[0] == hca_block_table.shape[0],
                 lambda: "n_committed_hca needs one entry per block-table row")


@_register_fake("paged_prefill_indices")
def _paged_prefill_indices(positions, batch_id, chunk_start, query_start, n_committed_hca, swa_block_table,
                           hca_block_table, extend_indptr, swa_indptr, csa_indptr, hca_indptr, extend_indices,
                           swa_indices, csa_indices, hca_indices, *, compress_base, window, compress_ratio=128,
                           block_size, swa_rows=None, csa_swa_rows=None, hca_swa_rows=None, hca_block_stride=None):
    _check_tokens(batch_id, per_token=(positions,), indptrs=(extend_indptr, swa_indptr, csa_indptr, hca_indptr))
    num_seqs = swa_block_table.shape[0]
    for t in (hca_block_table, chunk_start, query_start, n_committed_hca):
        torch._check(t.shape[0] == num_seqs, lambda: "per-sequence tensors need one entry per block-table row")


@_register_fake("decode_index_metadata")
def _decode_index_metadata(positions, batch_id, n_committed_csa, n_committed_hca, swa_indptr, csa_indptr,
                           hca_indptr, *, window, index_topk, csa_ratio=4):
    _check_tokens(batch_id, per_token=(positions,), indptrs=(swa_indptr, csa_indptr, hca_indptr))
    torch._check(n_committed_hca.shape[0] == n_committed_csa.shape[0],
                 lambda: "n_committed_csa and n_committed_hca need one entry per sequence")


@_register_fake("prefill_index_metadata")
def _prefill_index_metadata(positions, batch_id, chunk_start, n_committed_csa, n_committed_hca, extend_indptr,
                            swa_indptr, csa_indptr, hca_indptr, prefix_swa_count, *, window, index_topk,
                            csa_ratio=4, hca_ratio=128):
    _check_tokens(batch_id, per_token=(positions, prefix_swa_count),
                  indptrs=(extend_indptr, swa_indptr, csa_indptr, hca_indptr))
    for t in (n_committed_csa, n_committed_hca):
        torch._check(t.shape[0] == chunk_start.shape[0], lambda: "per-sequence tensors need one entry per sequence")


@_register_fake("swa_slot_mapping")
def _swa_slot_mapping(swa_block_table, positions, batch_id, slot_mapping, *, block_size, swa_rows=None):
    _check_tokens(batch_id, per_token=(positions, slot_mapping))


@_register_fake("apply_row_copies")
def _apply_row_copies(planes, copies, copy_counts):
    torch._check(copies.dim() == 2 and copies.shape[1] == 3, lambda: "copies must be [max_copies, 3]")
    for plane in planes:
        torch._check(plane.shape[0] == planes[0].shape[0], lambda: "every plane must have the same rows")


def _check_transfer(tensors, runs, run_count, buffer, layer_offsets):
    torch._check(runs.dim() == 2 and runs.shape[1] == 4, lambda: "runs must be [max_runs, 4]")
    torch._check(run_count.dim() == 1 and run_count.shape[0] == 1, lambda: "run_count must have 1 element")
    torch._check(buffer.dim() == 1, lambda: "buffer must be 1-D")
    layers = 1 if layer_offsets is None else len(layer_offsets)
    torch._check(1 <= layers <= 64, lambda: "layer_offsets must hold 1 to 64 offsets")
    torch._check(len(tensors) % layers == 0 and len(tensors) // layers <= 4,
                 lambda: "the tensors must be at most 4 a layer, the same number each")
    for t in tensors:
        torch._check(t.dim() == 2, lambda: "every tensor must be 2-D [rows, width]")


@_register_fake("gather_rows")
def _gather_rows(sources, runs, run_count, buffer, *, layer_offsets=None):
    _check_transfer(sources, runs, run_count, buffer, layer_offsets)


@_register_fake("scatter_rows")
def _scatter_rows(targets, runs, run_count, buffer, *, layer_offsets=None):
    _check_transfer(targets, runs, run_count, buffer, layer_offsets)


def _check_objects(buffer, objects):
    torch._check(buffer.dim() == 1, lambda: "buffer must be 1-D")
    torch._check(objects.dim() == 2 and objects.shape[1] == 7, lambda: "objects must be [n, 7]")


@_register_fake("seal_objects", host=("objects",))
def _seal_objects(buffer, objects):
    _check_objects(buffer, objects)


@_register_fake("verify_objects", host=("objects",))
def _verify_objects(buffer, objects):
    _check_objects(buffer, objects)
    return buffer.new_empty((objects.shape[0],), dtype=torch.bool)
