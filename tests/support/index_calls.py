"""One small valid call of every index op (decode and prefill flavours of
csa_translate_pack), by schema argument name, for the bad-input and opcheck
tests."""
import random

import torch

from support.index_cases import make_decode_step, make_prefill_step
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
    return calls


def op_of(call_name):
    return getattr(torch.ops.ukv, call_name.replace("_prefill", "") if call_name.startswith("csa") else call_name)


def call(call_name, tensors, scalars):
    op_of(call_name).default(**tensors, **scalars)


def op_label(call_name):
    return call_name.replace("_prefill", "") if call_name.startswith("csa") else call_name
