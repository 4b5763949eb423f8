import psutil
import pytest

from common.memory_cap import GIB, MemoryCap, MemoryCapExceeded


def current_rss() -> int:
    return psutil.Process().memory_info().rss


def test_peak_is_reported_without_a_cap():
    with MemoryCap(None) as cap:
        block = bytearray(b"\x01") * (64 << 20)
        cap.check()
        del block
    report = cap.report()
    assert report["cap_gib"] is None and report["enforced_by"] == "rss-watch"
    assert report["peak_rss_gib"] >= report["baseline_rss_gib"] + 60 / 1024


def test_exceeding_the_cap_fails_with_a_message_naming_it():
    cap_gib = round((current_rss() + (100 << 20)) / GIB, 3)
    with pytest.raises(MemoryCapExceeded, match=f"cap of {cap_gib} GiB"):
        with MemoryCap(cap_gib) as cap:
            block = bytearray(b"\x01") * (300 << 20)
            cap.check()
    del block


def test_exceeding_is_caught_at_exit_even_without_check():
    cap_gib = (current_rss() + (100 << 20)) / GIB
    with pytest.raises(MemoryCapExceeded):
        with MemoryCap(cap_gib):
            block = bytearray(b"\x01") * (300 << 20)
    del block


def test_staying_under_the_cap_passes():
    with MemoryCap((current_rss() + (512 << 20)) / GIB) as cap:
        block = bytearray(b"\x01") * (16 << 20)
        del block
    assert cap.report()["peak_rss_gib"] < cap.cap_gib


@pytest.mark.gpu
def test_gpu_cap_records_allocator_and_nvml_figures():
    import torch

    with MemoryCap(4, device="cuda") as cap:
        x = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        del x
    report = cap.report()
    assert report["peak_allocated_gib"] >= 0.25
    assert "nvml_process_gib" in report
    with pytest.raises(MemoryCapExceeded, match="cap of 1 GiB"):
        with MemoryCap(1, device="cuda"):
            torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    assert torch.empty(2 << 30, dtype=torch.uint8, device="cuda").numel()  # the cap ended with its block


def test_the_gpu_fraction_is_restored_on_exit(monkeypatch):
    """Without a GPU: the allocator calls are recorded (a cap must not outlive its block)."""
    import torch

    calls = []
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda index: None)
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda index: type("P", (), {"total_memory": 8 * GIB})
    )
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda index: 0.75, raising=False)
    monkeypatch.setattr(
        torch.cuda, "set_per_process_memory_fraction", lambda f, index: calls.append((f, index))
    )
    cap = MemoryCap(2, device="cuda:0")
    monkeypatch.setattr(cap, "report", lambda: {})
    with pytest.raises(RuntimeError, match="boom"):
        with cap:
            raise RuntimeError("boom")
    assert calls == [(0.25, 0), (0.75, 0)]
