"""Prompts as Python lists become the manager's int64 tensors value for value
(the one-pass C conversion against torch.tensor), at int64's ends too, and
what it does not take (a bool, a float, an int subclass, past 64 bits, a
tuple) takes the checked path, which refuses or converts as before."""
import random

import pytest
import torch

from ukv_torch import _C
from ukv_torch.manager.kv_manager import token_tensor

INT64 = (-(1 << 63), (1 << 63) - 1)


@pytest.mark.parametrize("n", [0, 1, 7, 32768])
def test_a_list_of_ints_converts_value_for_value(n):
    rng = random.Random(n)
    values = [rng.randrange(*INT64) for _ in range(n)] + list(INT64)
    got = token_tensor(values)
    assert got.dtype == torch.int64 and got.device.type == "cpu"
    assert torch.equal(got, torch.tensor(values, dtype=torch.int64))


class Int(int):
    pass


@pytest.mark.parametrize("values", [[1, True], [1, 2.0], [1, 1 << 63], [1, -(1 << 63) - 1], [1, Int(2)], (1, 2), "12"])
def test_what_the_c_pass_does_not_take_is_left_to_the_checked_path(values):
    assert _C.int64_tensor(values) is None


def test_the_checked_path_still_converts_int_subclasses_and_tuples():
    assert token_tensor([1, Int(2)]).tolist() == [1, 2]
    assert token_tensor((3, 4)).tolist() == [3, 4]
