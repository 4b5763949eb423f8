"""Kernel tests run the Triton variants on CUDA when there is a GPU, else in the Triton interpreter.

``@triton.jit`` reads TRITON_INTERPRET when engine.kernels is imported, so it is set here, before any
test module imports it; test_kernel_interpreter_is_active checks that it took effect.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
