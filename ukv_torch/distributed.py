"""Tensor-parallel helpers: every rank must address the same KV rows.

Two deployment patterns keep the ranks' block tables identical:

- **replicated managers**: every rank runs its own `KvManager` and feeds it the
  same calls; determinism gives every rank the same ids, so each rank stages
  and uploads its own tables. `check_tables_replicated` verifies it.
- **one scheduler rank**: only `src` runs the manager; after `stage`/`upload`
  it calls `broadcast_tables(manager.tables, rows)` while every other rank
  calls it with its own persistent buffer from `tables_buffer`. The broadcast
  writes in place into that buffer, so a CUDA graph captured on it reads the
  new tables at every replay.

Both work with any torch.distributed backend: NCCL needs the tables on the
rank's GPU, gloo takes CPU tensors. Every rank must make the same calls with
the same `rows` (collectives pair up in call order).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple, Union

import torch
import torch.distributed as dist

from .manager.kv_manager import staged_tables_shape
from .plan.records import ServeConfig

__all__ = ["Divergence", "TablesDiverged", "broadcast_tables", "check_tables_replicated", "first_divergence",
           "tables_buffer"]

MAX_DIMS = 8  # first_divergence gathers shapes as fixed-size vectors


@dataclass(frozen=True)
class Divergence:
    """Where a rank's tensor differs from the group's first rank's.

    `index` is the first differing element's index, or None when the shapes
    differ; `expected`/`found` are then the two shapes."""
    rank: int
    index: Optional[Tuple[int, ...]]
    expected: Union[int, Tuple[int, ...]]
    found: Union[int, Tuple[int, ...]]


class TablesDiverged(RuntimeError):
    """Raised on every rank when the ranks' staged tables differ."""

    def __init__(self, message: str, divergence: Divergence):
        super().__init__(message)
        self.divergence = divergence


def tables_buffer(config: ServeConfig, device: Optional[Union[str, torch.device]] = None) -> torch.Tensor:
    """A persistent int32 buffer laid out like `KvManager.tables` of a manager
    with this config (`staged_tables_shape(config)`), for ranks that receive
    broadcast tables. Pass the ServeConfig the scheduler rank's manager has."""
    if not isinstance(config, ServeConfig):
        raise TypeError(f"tables_buffer: config must be a ServeConfig, got {type(config).__name__}")
    return torch.zeros(staged_tables_shape(config), dtype=torch.int32, device=device)


def broadcast_tables(tables: torch.Tensor, rows: int, *, src: int = 0,
                     group: Optional[dist.ProcessGroup] = None) -> None:
    """Copy rows [0, rows) of `src`'s tables into every rank's `tables`, in place.

    On `src` pass the manager's `tables` after `upload(rows)` (the broadcast is
    ordered after the upload on the current stream); elsewhere a buffer from
    `tables_buffer`. `src` is a global rank of `group`."""
    _check_tables("broadcast_tables", tables, rows, group)
    if src not in dist.get_process_group_ranks(group or dist.group.WORLD):
        raise ValueError(f"broadcast_tables: src must be a rank of the group, got {src!r}")
    if rows:
        dist.broadcast(tables[:rows], src=src, group=group)


def check_tables_replicated(tables: torch.Tensor, rows: int, *,
                            group: Optional[dist.ProcessGroup] = None) -> None:
    """Raise TablesDiverged on every rank unless rows [0, rows) of `tables` are
    identical on all ranks of `group` (an all-gather compare: it moves
    world_size x rows x table bytes, a validation aid rather than a per-step cost)."""
    _check_tables("check_tables_replicated", tables, rows, group)
    d = first_divergence(tables[:rows], group=group)
    if d is None:
        return
    first = dist.get_process_group_ranks(group or dist.group.WORLD)[0]
    if d.index is None:
        raise TablesDiverged(f"staged tables differ in shape: rank {first} has {list(d.expected)}, rank {d.rank} "
                             f"has {list(d.found)} (every rank must pass the same rows)", d)
    row, table, col = d.index
    # The staged layout (table_index): logical, SWA, then the physical tables
    # (one per compress type, or the row space's envelope table).
    name = {0: "logical", 1: "SWA"}.get(table, f"physical table {table - 2}")
    raise TablesDiverged(f"staged tables differ: row {row}, {name} table, column {col}: rank {first} has "
                         f"{d.expected}, rank {d.rank} has {d.found}", d)


def first_divergence(tensor: torch.Tensor, *, group: Optional[dist.ProcessGroup] = None) -> Optional[Divergence]:
    """All-gather `tensor` and return the lowest rank (and its first element)
    that differs from the group's first rank, or None when all agree. Every
    rank gets the same answer. Shapes are compared first, so ranks holding
    different shapes get a Divergence instead of a hang."""
    _require_initialized("first_divergence")
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"first_divergence: tensor must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dim() > MAX_DIMS:
        raise ValueError(f"first_divergence: tensor must have at most {MAX_DIMS} dims, got {tensor.dim()}")
    _check_backend_device("first_divergence", "tensor", tensor, group)
    ranks = dist.get_process_group_ranks(group or dist.group.WORLD)
    shape = [tensor.dim(), *tensor.shape] + [0] * (MAX_DIMS - tensor.dim())
    shapes = _all_gather(torch.tensor(shape, dtype=torch.int64, device=tensor.device), group).tolist()
    for i, s in enumerate(shapes):
        if s != shapes[0]:
            return Divergence(ranks[i], None, tuple(shapes[0][1:1 + shapes[0][0]]), tuple(s[1:1 + s[0]]))
    if tensor.numel() == 0:  # the shapes agree, so every rank returns here together
        return None
    gathered = _all_gather(tensor.contiguous(), group)
    differs = (gathered != gathered[0]).nonzero()
    if differs.shape[0] == 0:
        return None
    i, *index = differs[0].tolist()
    return Divergence(ranks[i], tuple(index), gathered[0][tuple(index)].item(), gathered[i][tuple(index)].item())


def _all_gather(tensor: torch.Tensor, group: Optional[dist.ProcessGroup]) -> torch.Tensor:
    """[world_size, *tensor.shape]; all_gather with a list works on every backend."""
    parts: List[torch.Tensor] = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, tensor, group=group)
    return torch.stack(parts)


def _check_tables(caller: str, tables: torch.Tensor, rows: int, group: Optional[dist.ProcessGroup]) -> None:
    _require_initialized(caller)
    if not isinstance(tables, torch.Tensor):
        raise TypeError(f"{caller}: tables must be a torch.Tensor, got {type(tables).__name__}")
    if tables.dtype != torch.int32 or tables.dim() != 3 or not tables.is_contiguous():
        raise ValueError(f"{caller}: tables must be a contiguous 3-D int32 tensor [max_num_seqs, tables, columns] "
                         f"(KvManager.tables or tables_buffer), got {tables.dtype} "
                         f"{list(tables.shape)}{'' if tables.is_contiguous() else ' non-contiguous'}")
    if not isinstance(rows, int) or isinstance(rows, bool) or not 0 <= rows <= tables.shape[0]:
        raise ValueError(f"{caller}: rows must be an int in [0, {tables.shape[0]}], got {rows!r}")
    _check_backend_device(caller, "tables", tables, group)


def _check_backend_device(caller: str, name: str, tensor: torch.Tensor, group: Optional[dist.ProcessGroup]) -> None:
    if dist.get_backend(group) == "nccl" and not tensor.is_cuda:
        raise ValueError(f"{caller}: the NCCL backend needs {name} on this rank's GPU, got a tensor on "
                         f"{tensor.device} (pass KvManager.tables, not host_tables)")


def _require_initialized(caller: str) -> None:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(f"{caller}: torch.distributed is not initialized; call "
                           "torch.distributed.init_process_group first")
