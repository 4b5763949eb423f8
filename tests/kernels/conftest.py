"""Kernel tests run the Triton variants on CUDA when there is a GPU, else in the Triton interpreter.

The interpreter must be switched on before triton is first imported (Triton's own jit helpers are
decorated then), so this sets TRITON_INTERPRET=1 at collection time; when a test collected earlier has
already imported triton compiled, the kernel tests fail with that reason (test_kernel_interpreter_is_active).
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
