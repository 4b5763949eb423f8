"""Our C++ CPU kernels beyond the equivalence harness: bad input is refused with a clear error, a failed
build makes the variants unavailable (a shipped default then gives way to torch's kernels with a warning,
a chosen variant never), and they run inside the compiled step."""

import pytest
import torch

import engine.kernels  # noqa: F401
from engine.kernels import cpp_cpu, registry

pytestmark = pytest.mark.skipif(cpp_cpu.unavailable() is not None, reason=str(cpp_cpu.unavailable()))


def _bank(experts=4, n=16, k=64, group=32):
    gen = torch.Generator().manual_seed(3)
    codes = torch.randint(0, 256, (experts, n, k // 2), dtype=torch.uint8, generator=gen)
    scales = (torch.rand(experts, n, k // group, generator=gen) * 0.05).to(torch.bfloat16)
    return codes, scales


def test_a_route_outside_the_bank_is_refused():
    codes, scales = _bank()
    x = torch.randn(1, 64)
    with pytest.raises(RuntimeError, match="route id 4 outside a bank of 4 experts"):
        cpp_cpu.w4a16_grouped_gemv(x, codes, scales, torch.tensor([[0, 4]], dtype=torch.int32), 32)


def test_an_unsupported_group_size_is_refused_by_name():
    codes, scales = _bank(k=64, group=16)
    with pytest.raises(ValueError, match="group sizes"):
        cpp_cpu.w4a16_gemv(torch.randn(1, 64), codes[0], scales[0], 16)


def test_a_failed_build_makes_the_variants_unavailable(monkeypatch):
    monkeypatch.setattr(registry, "_cpp_unavailable", lambda: "building cpp_cpu.cpp failed: no compiler")
    with pytest.raises(registry.KernelUnavailable, match="no compiler"):
        registry.select("w4a16_grouped_gemv", "cpp", "cpu")
    assert registry.unavailable_reason(registry.variant("w16a16_gemv", "cpp"), "cuda") is not None


def test_without_a_build_the_shipped_defaults_give_way_to_torch_kernels_with_a_warning(monkeypatch):
    monkeypatch.setattr(registry, "_cpp_unavailable", lambda: "building cpp_cpu.cpp failed: no compiler")
    monkeypatch.delenv(registry.ENV_VAR, raising=False)
    with pytest.warns(
        RuntimeWarning, match="w4a16_grouped_gemv: the shipped default cpp cannot run.*no compiler.*int4pack"
    ):
        chosen = registry.select("w4a16_grouped_gemv", device="cpu")
    assert (chosen.variant.name, chosen.source) == ("int4pack", "shipped fallback")
    assert registry.select("w16a16_gemv", device="cpu").variant.name == "native"


def test_the_ops_trace_in_one_graph():
    """Opaque library ops with fake implementations: fullgraph compilation, results equal to eager."""
    gate_up, down = _bank(n=32, k=64), _bank(n=64, k=32)
    ids = torch.tensor([[2, 0, 3]], dtype=torch.int32)
    x = torch.randn(1, 64)  # FP32 throughout: Inductor may skip a BF16 rounding between the ops

    def experts(x, ids):
        hidden = cpp_cpu.w4a16_grouped_swiglu(x, *gate_up, *gate_up, ids, 32)
        return cpp_cpu.w4a16_grouped_gemv(hidden.float(), *down, ids, 32, out_dtype=torch.float32)

    compiled = torch.compile(experts, fullgraph=True, dynamic=False)
    torch.testing.assert_close(compiled(x, ids), experts(x, ids), rtol=1e-5, atol=1e-5)


def test_a_lock_left_by_a_killed_build_is_removed_and_a_live_builder_is_waited_for(tmp_path):
    """torch's build lock is a plain file: a build killed part-way leaves it, and torch alone would wait on
    it forever. Under our OS lock no other process is building, so the file is a leftover; a builder that
    still holds our lock is waited for instead."""
    import fcntl
    import threading

    (tmp_path / "lock").touch()
    with cpp_cpu._build_lock(tmp_path):
        assert not (tmp_path / "lock").exists()
        (tmp_path / "lock").touch()  # what torch writes while it builds
        entered = threading.Event()

        def second_process() -> None:
            with cpp_cpu._build_lock(tmp_path):
                entered.set()

        waiting = threading.Thread(target=second_process)
        waiting.start()  # flock conflicts between open files even within one process
        assert not entered.wait(0.5) and (tmp_path / "lock").exists()
    waiting.join(10)
    assert entered.is_set()
    with open(tmp_path / "build.flock") as handle:  # released: another taker gets it at once
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_denormals_are_flushed_on_the_thread_and_its_openmp_workers():
    """On a fresh thread with a team of 2 (its own workers): a parallel product of denormals keeps them
    until `flush_denormals`, then every element, whichever worker computed it, is zero."""
    from engine.runtime import TorchThread

    def run() -> tuple[int, int]:
        torch.set_flush_denormal(False)  # a new thread inherits its creator's mode; its workers, this one's
        tiny = torch.full((1 << 20,), 1e-39)  # below FP32's smallest normal, 1.2e-38
        before = int(((tiny * 1.0) != 0).sum())
        cpp_cpu.flush_denormals()
        return before, int(((tiny * 1.0) != 0).sum())

    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the suite runs on one (tests/conftest.py)
    thread = TorchThread("denormals")
    try:
        before, after = thread.call(run)
    finally:
        thread.close()
        torch.set_num_threads(threads)
    assert (before, after) == (1 << 20, 0)


@pytest.mark.parametrize("group", [32, 128])
@pytest.mark.parametrize("rows", [1, 3, 4, 17, 128])
def test_int4_ops_decoded_once_for_many_rows_match_the_reference(rows, group):
    """From kDecodeOnceRows (4) rows of x, or routes averaging 4 per chosen expert, the C++ ops decode each
    weight row once and read it back from L1; below, they decode it per row. Both against the FP32
    reference on fresh seeds, every shape crossing the thresholds (a ragged 17, a prompt's 128), outputs
    poisoned; tolerance 1e-5 of the output scale (FP32 sums in another order), and for the SwiGLU, whose
    output is BF16 as x is, one BF16 step besides (2^-7 relative: a sum on either side of a rounding edge)."""
    from engine.kernels import reference

    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31, (1,)).item()))
    experts, n, k, top_k = 6, 48, 256, 3
    codes = torch.randint(0, 256, (experts, n, k // 2), dtype=torch.uint8, generator=gen)
    scales = (torch.rand(experts, n, k // group, generator=gen) * 0.05 + 0.01).to(torch.bfloat16)
    up_codes = torch.randint(0, 256, (experts, n, k // 2), dtype=torch.uint8, generator=gen)
    x = torch.randn(rows, k, generator=gen).to(torch.bfloat16)
    routes = torch.randint(0, experts, (rows, top_k), generator=gen, dtype=torch.int32)
    hidden = torch.randn(rows, top_k, k, generator=gen)  # per-route input of the down projection

    def check(ours, theirs, rtol=0.0):
        scale = theirs.abs().max().item()
        torch.testing.assert_close(ours.float(), theirs.float(), rtol=rtol, atol=1e-5 * scale + 1e-6)

    def poisoned(shape, dtype):
        return torch.full(shape, float("nan"), dtype=dtype)

    check(cpp_cpu.w4a16_gemv(x, codes[0], scales[0], group, out=poisoned((rows, n), torch.float32),
                             out_dtype=torch.float32),
          reference.w4a16_gemv(x, codes[0], scales[0], group, out_dtype=torch.float32))  # fmt: skip
    check(cpp_cpu.w4a16_grouped_gemv(hidden, codes, scales, routes, group,
                                     out=poisoned((rows, top_k, n), torch.float32), out_dtype=torch.float32),
          reference.w4a16_grouped_gemv(hidden, codes, scales, routes, group, out_dtype=torch.float32))  # fmt: skip
    swiglu = (x, codes, scales, up_codes, scales, routes, group)
    check(cpp_cpu.w4a16_grouped_swiglu(*swiglu, out=poisoned((rows, top_k, n), x.dtype)),
          reference.w4a16_grouped_swiglu(*swiglu), rtol=2**-7)  # fmt: skip
