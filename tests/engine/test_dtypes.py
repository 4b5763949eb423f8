"""The default dtype: BF16 on CPUs that advertise BF16 arithmetic, FP32 on the others."""

import torch

from engine.model import dtypes


def _cpuinfo(tmp_path, flags: str):
    path = tmp_path / "cpuinfo"
    path.write_text(
        f"processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu sse2 {flags}\n\nprocessor\t: 1\n"
    )
    return path


def test_bf16_flags_are_read_from_cpuinfo(tmp_path):
    detect = dtypes.cpu_has_native_bf16.__wrapped__  # uncached, for other files
    assert detect(_cpuinfo(tmp_path, "avx2 avx512f avx512_bf16"))
    assert detect(_cpuinfo(tmp_path, "amx_tile amx_bf16"))
    assert not detect(_cpuinfo(tmp_path, "avx2 avx512f avx512_vnni"))
    assert not detect(tmp_path / "missing")


def test_default_dtype_follows_the_cpu(monkeypatch):
    monkeypatch.setattr(dtypes, "cpu_has_native_bf16", lambda: True)
    assert dtypes.default_dtype("cpu") == torch.bfloat16
    monkeypatch.setattr(dtypes, "cpu_has_native_bf16", lambda: False)
    assert dtypes.default_dtype("cpu") == torch.float32
    assert dtypes.default_dtype("cuda") == torch.bfloat16
