"""Where a test can run. HAS_GPU: a CUDA/HIP device and a GPU build of
ukv_torch. DEVICES: the device parameter of the tests that run on both, CPU
always and "cuda" marked gpu (tests/conftest.py skips it without a GPU)."""
import pytest
import torch

import ukv_torch

HAS_GPU = torch.cuda.is_available() and ukv_torch.BACKEND != "cpu"
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
