"""The decode step's index building as one captured CUDA graph, the way an
engine runs it: static input and output buffers sized for a full batch
(max_num_seqs decode tokens), the persistent staged tables the manager uploads
into, and a graph of decode_index_metadata + paged_decode_indices +
csa_translate_pack + hca_decode_indices captured once and replayed every step.
Rows past the step's batch are padding (batch id -1), so one graph serves
every batch size, and the indptrs are built on the device inside the graph.
"""
from __future__ import annotations

from typing import Callable, Dict

import torch

from .. import ops


class CapturedDecode:
    """`run(inputs)` copies a step's decode inputs into the static buffers and
    replays the graph; it returns the static outputs (indptrs and indices)."""

    def __init__(self, tables: torch.Tensor, max_tokens: int, window: int, index_topk: int,
                 build: Callable[[Dict[str, torch.Tensor], torch.Tensor, Dict[str, torch.Tensor]], None]):
        dev = tables.device
        rows, width = tables.shape[0], tables.shape[2]
        i32 = dict(dtype=torch.int32, device=dev)
        self.inputs = {"positions": torch.zeros(max_tokens, dtype=torch.int64, device=dev),
                       "batch_id": torch.full((max_tokens,), -1, **i32),
                       "n_csa": torch.zeros(rows, **i32), "n_hca": torch.zeros(rows, **i32),
                       "topk": torch.zeros(max_tokens, index_topk, **i32)}
        # Worst case per token: the window plus every top-k lane (CSA) or one HCA
        # entry per logical block of a full table row.
        sizes = {"swa_indices": window, "csa_indices": window + index_topk, "hca_indices": window + width}
        self.outputs = {name: torch.zeros(max_tokens + 1, **i32) for name in ("swa_indptr", "csa_indptr", "hca_indptr")}
        self.outputs.update({name: torch.full((max_tokens * n,), -1, **i32) for name, n in sizes.items()})
        self.replays = 0

        def step():
            x, out = self.inputs, self.outputs
            ops.decode_index_metadata(x["positions"], x["batch_id"], x["n_csa"], x["n_hca"], out["swa_indptr"],
                                      out["csa_indptr"], out["hca_indptr"], window=window, index_topk=index_topk)
            build(x, tables, out)

        self.graph = capture(step, dev)

    def run(self, inputs: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        for name, static in self.inputs.items():
            given = inputs[name]
            static[: given.shape[0]].copy_(given)
            static[given.shape[0]:].fill_(-1 if name == "batch_id" else 0)
        for name, out in self.outputs.items():
            if name.endswith("_indices"):
                out.fill_(-1)  # a cell the graph failed to write must not keep last step's row
        self.graph.replay()
        self.replays += 1
        return self.outputs


def capture(step: Callable[[], None], device=None) -> torch.cuda.CUDAGraph:
    """step() warmed up on a side stream of `device`, then captured there.
    thread_local capture: another thread (NCCL's watchdog, say) may query its
    events meanwhile without invalidating the capture."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        step()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
        step()
    torch.cuda.synchronize(device)
    return graph
