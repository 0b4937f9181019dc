"""ukv_torch.distributed: bad inputs raise naming the argument; on two gloo
ranks the broadcast writes exactly the rows asked for, in place, and the
all-gather compare finds the entry (or the shape) a rank changed, the same on
every rank."""
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ukv_torch import ServeConfig
from ukv_torch.distributed import (Divergence, TablesDiverged, broadcast_tables, check_tables_replicated,
                                   first_divergence, tables_buffer)


def small_config(max_num_seqs, max_blocks_per_seq):
    """A manager's configuration with the default two compress types: staged tables of 2 + 2 tables."""
    return ServeConfig(max_num_seqs=max_num_seqs, max_blocks_per_seq=max_blocks_per_seq)


@pytest.fixture
def one_rank():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_helpers_refuse_to_run_without_a_process_group():
    with pytest.raises(RuntimeError, match="broadcast_tables: torch.distributed is not initialized"):
        broadcast_tables(tables_buffer(small_config(2, 4)), 1)
    with pytest.raises(RuntimeError, match="first_divergence: torch.distributed is not initialized"):
        first_divergence(torch.zeros(3))


# The sizes come from the ServeConfig, which refuses a bad one naming the field.
@pytest.mark.parametrize("sizes,error,message", [
    (dict(max_num_seqs=0), ValueError, "max_num_seqs must be > 0, got 0"),
    (dict(compress_ratios=(-1,)), ValueError, "compress_ratios: each ratio must be > 0 .* got -1"),
    (dict(max_blocks_per_seq=4.0), TypeError, "max_blocks_per_seq must be an int, got float 4.0"),
    (dict(max_num_seqs=True), TypeError, "max_num_seqs must be an int, got bool True"),
])
def test_tables_buffer_bad_sizes(sizes, error, message):
    with pytest.raises(error, match=f"ServeConfig.{message}"):
        tables_buffer(ServeConfig(**sizes))


def test_tables_buffer_has_the_manager_layout():
    from ukv_torch import KvManager
    m = KvManager(num_logical_blocks=16, num_swa_blocks=8, max_num_seqs=3, max_blocks_per_seq=5)
    t = tables_buffer(m.config)
    assert (t.shape, t.dtype, int(t.abs().sum())) == (m.tables.shape, m.tables.dtype, 0)
    with pytest.raises(TypeError, match="tables_buffer: config must be a ServeConfig, got int"):
        tables_buffer(3, m.num_types)  # the sizes of earlier versions


@pytest.mark.parametrize("fn", [broadcast_tables, check_tables_replicated])
@pytest.mark.parametrize("tables,rows,message", [
    ([[[0]]], 1, "tables must be a torch.Tensor, got list"),
    (torch.zeros(2, 4, 3, dtype=torch.int64), 1, "tables must be a contiguous 3-D int32 tensor"),
    (torch.zeros(2, 4, dtype=torch.int32), 1, r"tables must be a contiguous 3-D .* got torch.int32 \[2, 4\]"),
    (torch.zeros(2, 3, 4, dtype=torch.int32).transpose(1, 2), 1, r"tables must be .* \[2, 4, 3\] non-contiguous"),
    (torch.zeros(2, 4, 3, dtype=torch.int32), 3, r"rows must be an int in \[0, 2\], got 3"),
    (torch.zeros(2, 4, 3, dtype=torch.int32), -1, r"rows must be an int in \[0, 2\], got -1"),
    (torch.zeros(2, 4, 3, dtype=torch.int32), True, r"rows must be an int in \[0, 2\], got True"),
])
def test_table_helpers_bad_inputs(one_rank, fn, tables, rows, message):
    with pytest.raises((TypeError, ValueError), match=f"{fn.__name__}: {message}"):
        fn(tables, rows)


def test_broadcast_src_must_be_in_the_group(one_rank):
    with pytest.raises(ValueError, match="broadcast_tables: src must be a rank of the group, got 1"):
        broadcast_tables(tables_buffer(small_config(2, 4)), 1, src=1)


def test_first_divergence_bad_inputs(one_rank):
    with pytest.raises(TypeError, match="first_divergence: tensor must be a torch.Tensor, got list"):
        first_divergence([1, 2])
    with pytest.raises(ValueError, match="first_divergence: tensor must have at most 8 dims, got 9"):
        first_divergence(torch.zeros([1] * 9))


def test_one_rank_agrees_with_itself(one_rank):
    t = torch.arange(24, dtype=torch.int32).reshape(2, 3, 4)
    before = (t.data_ptr(), t.clone())
    broadcast_tables(t, 2)
    check_tables_replicated(t, 2)
    assert first_divergence(t) is None
    assert (t.data_ptr(), t.tolist()) == (before[0], before[1].tolist())


# --- two ranks --------------------------------------------------------------------
def tables_of(rank):
    """4 rows of 2 + 2 tables x 8 columns; rank 1 differs at row 2, SWA table, column 5."""
    t = torch.arange(4 * 4 * 8, dtype=torch.int32).reshape(4, 4, 8)
    if rank == 1:
        t[2, 1, 5] += 100
    return t


def two_rank_worker(rank, init_file):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        t = tables_of(rank)
        want = t[2, 1, 5].item() - 100 * rank
        assert first_divergence(t) == Divergence(1, (2, 1, 5), want, want + 100)
        check_tables_replicated(t, 2)  # rows 0-1 agree
        check_tables_replicated(t, 0)  # an empty batch agrees
        with pytest.raises(TablesDiverged, match=f"row 2, SWA table, column 5: rank 0 has {want}, rank 1 has "
                                                 f"{want + 100}") as exc:
            check_tables_replicated(t, 4)
        assert exc.value.divergence.rank == 1
        with pytest.raises(TablesDiverged, match=r"differ in shape: rank 0 has \[2, 4, 8\], rank 1 has \[3, 4, 8\]"):
            check_tables_replicated(t, 2 + rank)
        # Rank 1 sends rows 0-2 of its tables into rank 0's buffer, in place; row 3 stays as it was.
        buffer = tables_of(1) if rank == 1 else tables_buffer(small_config(4, 8))
        address = buffer.data_ptr()
        broadcast_tables(buffer, 3, src=1)
        assert buffer.data_ptr() == address
        assert buffer[:3].tolist() == tables_of(1)[:3].tolist()
        assert buffer[3].tolist() == (tables_of(1)[3].tolist() if rank == 1 else [[0] * 8] * 4)
    finally:
        dist.destroy_process_group()


def test_two_ranks_broadcast_rows_in_place_and_find_the_divergent_entry(tmp_path):
    mp.spawn(two_rank_worker, args=(str(tmp_path / "init"),), nprocs=2, join=True)
