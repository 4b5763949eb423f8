"""The memory cap a measurement runs under lives in `common.memory_cap` (the engine enforces it, the harness
records its report); these names stay importable from here for the runners."""

from common.memory_cap import DEFAULT_CAP_GIB, GIB, MemoryCap, MemoryCapExceeded, default_cap_gib

__all__ = ["DEFAULT_CAP_GIB", "GIB", "MemoryCap", "MemoryCapExceeded", "default_cap_gib"]
