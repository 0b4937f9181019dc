"""Row-copy and row-run lists handed over on the host that wrote rows twice
or raced (two copies to one destination, a copy over rows another copy of its
phase reads, overlapping scatter runs) were applied in an undefined order:
now refused naming the entries, nothing copied. On the GPU the ops do not read
the lists on the host; tests/index_ops/test_row_space_ops.py and
tests/transfer/test_row_transfer_ops.py test the documented skips there."""
import pytest
import torch

import ukv_torch


def i32(rows):
    return torch.tensor(rows, dtype=torch.int32)


@pytest.mark.parametrize("copies, counts, pair", [
    ([[0, 8, 2], [4, 8, 2]], [2], (0, 1)),            # two copies to one destination
    ([[0, 8, 2], [4, 9, 2]], [2], (0, 1)),            # overlapping destinations
    ([[0, 8, 2], [8, 12, 2]], [2], (0, 1)),           # a copy reads rows another of the phase writes
    ([[1, 2, 1], [6, 7, 1], [12, 0, 2]], [3], (0, 2))])
def test_copies_of_one_phase_that_overlap_are_refused(copies, counts, pair):
    plane = torch.arange(16, dtype=torch.int64).reshape(16, 1)
    with pytest.raises(ValueError, match=rf"^apply_row_copies: copies\[{pair[0]}\] and copies\[{pair[1]}\] of "
                                         r"phase 0 overlap where one of them writes"):
        ukv_torch.apply_row_copies([plane], i32(copies), i32(counts))
    assert plane.flatten().tolist() == list(range(16))


def test_the_same_copies_in_two_phases_run_in_order():
    plane = torch.arange(16, dtype=torch.int64).reshape(16, 1)
    ukv_torch.apply_row_copies([plane], i32([[0, 8, 2], [8, 12, 2]]), i32([1, 1]))
    assert plane.flatten().tolist()[8:14] == [0, 1, 10, 11, 0, 1]


def test_scatter_runs_that_overlap_are_refused():
    target = torch.zeros(10, 4, dtype=torch.float32)
    buffer = torch.arange(64, dtype=torch.uint8)
    runs = torch.tensor([[0, 2, 2, 0], [0, 3, 2, 32]], dtype=torch.int64)
    with pytest.raises(ValueError, match=r"^scatter_rows: runs\[0\] and runs\[1\] write the same tensor rows"):
        ukv_torch.scatter_rows([target], runs, torch.tensor([2], dtype=torch.int32), buffer)
    assert not target.any()
