"""Shared by the CUDA twins' tests (test_cuda_twins.py, test_cuda_twins_gdn.py,
test_cuda_twins_chain.py).

``_refused(call)``: where the kernels run on the CPU, ``impl="cuda"`` must refuse: the
``RuntimeError`` naming the alternative when torch sees no CUDA device, or the ``ValueError``
naming ``impl`` for CPU tensors on a GPU machine (the interpreter asked for there).
"""

from __future__ import annotations

import pytest
import torch


def _refused(call):
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="^impl: 'cuda' runs on CUDA tensors"):
            call()
    else:
        with pytest.raises(RuntimeError, match="needs an NVIDIA GPU.*impl='triton'"):
            call()
