"""pytest configuration shared by every test folder.

The tests are grouped by component (allocator/, manager/, index_ops/,
integration/; the C++ core tests are cpp/, built by CMake). Their shared
helpers are the support package (tests/support, on sys.path through
pyproject's pytest pythonpath); the reference models they check the product
against are ukv_torch.testing.

A test, or one parametrized case (support.devices.DEVICES's "cuda"), marked
``gpu`` needs a CUDA/HIP device and a GPU build of ukv_torch: without them it
is skipped here, so no test repeats the condition.
"""
import pytest

from support.devices import HAS_GPU


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA/HIP device and a GPU build")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)
