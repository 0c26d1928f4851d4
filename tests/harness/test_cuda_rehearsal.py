"""CUDA-only lines run on this CPU against autospecs of the real modules: a misspelled name
or a wrong signature fails here, where the ``torch.cuda.is_available()`` guard hides it
from every other CPU test. Nothing measured under the autospec is a measurement."""

from __future__ import annotations

from unittest import mock

import torch

from tuner.harness.system import nvml


def test_the_allocators_reserve_is_read_through_the_real_torch_cuda_api():
    """``torch.cuda.memoryreserved_bytes`` (no such function) made the NVML sampler thread die
    on its first tick on a GPU, blanking gpu_util and every GPU memory figure."""
    cuda = mock.create_autospec(torch.cuda, instance=False)
    cuda.is_available.return_value = True
    cuda.is_initialized.return_value = True
    cuda.memory_reserved.return_value = 3 * 2**30
    with mock.patch.object(torch, "cuda", cuda):
        assert nvml.reserved_bytes(0) == 3 * 2**30
        assert nvml.reserved_bytes(None) == 0
    cuda.memory_reserved.assert_called_once_with(0)
