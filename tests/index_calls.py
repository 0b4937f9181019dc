"""One small valid call of every index op (decode and prefill flavours of
csa_translate_pack), by schema argument name, for the bad-input and opcheck
tests."""
import random

import torch

import index_reference as ref
from index_cases import make_decode_step, make_prefill_step


def i32(values, device):
    return torch.tensor(values, dtype=torch.int32, device=device)


def decode_call(device):
    step = make_decode_step(random.Random(0), contexts=[5, 300], num_padding=1, index_topk=8)
    x = step.tensors(device)
    swa, csa, hca = (i32(p, device) for p in ref.decode_metadata(step.positions, step.batch_id, step.n_csa,
                                                                 step.n_hca, step.window, step.index_topk))
    out = lambda ptr: torch.zeros(int(ptr[-1]), dtype=torch.int32, device=device)  # noqa: E731
    return step, x, (swa, csa, hca), out


def prefill_call(device):
    step = make_prefill_step(random.Random(1), prefixes=[0, 200], chunk_lens=[2, 3], index_topk=8)
    x = step.tensors(device)
    meta = ref.prefill_metadata(step.positions, step.batch_id, step.chunk_start, step.n_csa, step.n_hca,
                                step.window, step.index_topk)
    return step, x, [i32(p, device) for p in meta[:4]], i32(meta[4], device)


# Each valid call: (op name, tensor arguments by schema name with their kind, scalar kwargs).
def valid_calls(device):
    step, x, (swa, csa, hca), out = decode_call(device)
    calls = {
        "csa_translate_pack": ({"topk_local": x.topk, "block_table": x.csa_table, "positions": x.positions,
                                "batch_id": x.batch_id, "kv_indptr": csa, "skip_per_token": None,
                                "kv_indices": out(csa)},
                               {"compress_base": 0, "window": 128}),
        "paged_decode_indices": ({"swa_block_table": x.swa_table, "positions": x.positions, "batch_id": x.batch_id,
                                  "swa_indptr": swa, "swa_indices": out(swa), "csa_indptr": csa,
                                  "csa_indices": out(csa), "hca_indptr": hca, "hca_indices": out(hca)},
                                 {"window": 128}),
        "hca_decode_indices": ({"hca_block_table": x.hca_table, "batch_id": x.batch_id, "n_committed_hca": x.n_hca,
                                "hca_indptr": hca, "hca_indices": out(hca)}, {"compress_base": 0}),
        "decode_index_metadata": ({"positions": x.positions, "batch_id": x.batch_id, "n_committed_csa": x.n_csa,
                                   "n_committed_hca": x.n_hca, "swa_indptr": swa.clone(), "csa_indptr": csa.clone(),
                                   "hca_indptr": hca.clone()}, {"window": 128, "index_topk": 8}),
    }
    step, x, ptrs, prefix = prefill_call(device)
    names = ("extend", "swa", "csa", "hca")
    calls["paged_prefill_indices"] = (
        {"positions": x.positions, "batch_id": x.batch_id, "chunk_start": x.chunk_start,
         "query_start": x.query_start, "n_committed_hca": x.n_hca, "swa_block_table": x.swa_table,
         "hca_block_table": x.hca_table,
         **{f"{n}_indptr": p for n, p in zip(names, ptrs)},
         **{f"{n}_indices": torch.zeros(int(p[-1]), dtype=torch.int32, device=device) for n, p in zip(names, ptrs)}},
        {"compress_base": 0, "window": 128})
    calls["csa_translate_pack_prefill"] = (
        {"topk_local": x.topk, "block_table": x.csa_table, "positions": x.positions, "batch_id": x.batch_id,
         "kv_indptr": ptrs[2], "skip_per_token": prefix,
         "kv_indices": torch.zeros(int(ptrs[2][-1]), dtype=torch.int32, device=device)},
        {"compress_base": 0})
    calls["prefill_index_metadata"] = (
        {"positions": x.positions, "batch_id": x.batch_id, "chunk_start": x.chunk_start, "n_committed_csa": x.n_csa,
         "n_committed_hca": x.n_hca, **{f"{n}_indptr": p.clone() for n, p in zip(names, ptrs)},
         "prefix_swa_count": prefix.clone()}, {"window": 128, "index_topk": 8})
    return calls


def op_of(call_name):
    return getattr(torch.ops.ukv, call_name.replace("_prefill", "") if call_name.startswith("csa") else call_name)


def call(call_name, tensors, scalars):
    op_of(call_name).default(**tensors, **scalars)


def op_label(call_name):
    return call_name.replace("_prefill", "") if call_name.startswith("csa") else call_name
