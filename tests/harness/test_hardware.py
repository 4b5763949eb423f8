import json
import sys
import types

from harness import hardware


def test_cpu_descriptor_is_complete_without_gpu(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails as when nvidia-ml-py is missing
    desc = hardware.describe()
    json.dumps(desc)  # JSON-able
    assert desc["gpus"] == []
    assert "not installed" in desc["gpu_note"]
    assert desc["cpu"]["logical_cores"] >= 1 and desc["cpu"]["ram_bytes"] > 0
    assert set(desc["cpu"]["vector_flags"]) <= set(hardware.VECTOR_FLAGS)
    assert desc["software"]["python"]
    assert desc["hardware_id"].startswith(f"cpu-{desc['cpu']['logical_cores']}c-")
    assert set(desc["git"]) == {"commit", "dirty"}


def test_a_cpus_id_names_its_widest_vector_tier():
    cpu = {"logical_cores": 2, "model": "AMD EPYC"}

    def cpu_id(**fields):
        return hardware.hardware_id({"gpus": [], "cpu": cpu | fields})

    assert cpu_id(vector_flags=["avx2", "fma", "avx512f", "avx512_bf16"]) == "cpu-2c-AMD-EPYC-avx512bf16"
    assert cpu_id(vector_flags=["avx2", "fma", "avx512f"]) == "cpu-2c-AMD-EPYC-avx512"
    assert cpu_id(vector_flags=["avx2", "fma"]) == "cpu-2c-AMD-EPYC-avx2"
    assert cpu_id(vector_flags=["avx2", "avx512f", "avx512_bf16", "amx_tile"]) == "cpu-2c-AMD-EPYC-amx"
    assert cpu_id(vector_flags=[]) == "cpu-2c-AMD-EPYC"  # none of the tiers (an ARM core)
    assert cpu_id() == "cpu-2c-AMD-EPYC"  # not recorded (an imported descriptor)


def test_nvml_init_failure_is_explained(monkeypatch):
    fake = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    def init():
        raise NVMLError("Driver Not Loaded")

    fake.NVMLError, fake.nvmlInit = NVMLError, init
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    desc = hardware.describe()
    assert desc["gpus"] == [] and "Driver Not Loaded" in desc["gpu_note"]


def fake_nvml(count=1, unsupported=("nvmlDeviceGetPowerManagementLimit",)):
    fake = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    fake.NVMLError = NVMLError
    fake.NVML_CLOCK_SM, fake.NVML_CLOCK_MEM = 1, 2
    fake.nvmlInit = fake.nvmlShutdown = lambda: None
    fake.nvmlSystemGetDriverVersion = lambda: b"575.51.03"
    fake.nvmlSystemGetCudaDriverVersion = lambda: 12090
    fake.nvmlDeviceGetCount = lambda: count
    fake.nvmlDeviceGetHandleByIndex = lambda i: i
    fake.nvmlDeviceGetName = lambda h: "NVIDIA H200"
    fake.nvmlDeviceGetUUID = lambda h: f"GPU-0000-{h}"
    fake.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=150_000_000_000)
    fake.nvmlDeviceGetClockInfo = lambda h, c: 1980 if c == 1 else 3201
    fake.nvmlDeviceGetMaxClockInfo = lambda h, c: 1980 if c == 1 else 3201
    fake.nvmlDeviceGetPowerManagementLimit = lambda h: 700_000
    fake.nvmlDeviceGetCurrPcieLinkGeneration = lambda h: 5
    fake.nvmlDeviceGetCurrPcieLinkWidth = lambda h: 16
    fake.nvmlDeviceGetPersistenceMode = lambda h: 1
    fake.nvmlDeviceGetMigMode = lambda h: (0, 0)

    def unsupported_call(*args):
        raise NVMLError("Not Supported")

    for name in unsupported:
        setattr(fake, name, unsupported_call)
    return fake


def test_faked_nvml_fills_every_gpu_field(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml())
    desc = hardware.describe()
    (gpu,) = desc["gpus"]
    assert gpu["name"] == "NVIDIA H200" and gpu["uuid"] == "GPU-0000-0"
    assert gpu["driver_version"] == "575.51.03" and gpu["cuda_driver_version"] == "12.9"
    assert gpu["sm_clock_max_mhz"] == 1980 and gpu["pcie_gen"] == 5 and gpu["mig_mode"] == 0
    assert gpu["power_limit_w"] is None  # unsupported on this board: recorded, not a crash
    assert desc["hardware_id"] == "NVIDIA-H200"
    assert desc["gpu_note"] == ""


def test_several_gpus_are_counted_in_the_id(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(count=2, unsupported=()))
    desc = hardware.describe()
    assert desc["hardware_id"] == "NVIDIA-H200-x2"
    assert desc["gpus"][1]["power_limit_w"] == 700.0


def test_the_descriptor_records_other_processes_busy_beside_the_run():
    import os
    import signal
    import subprocess
    import sys

    import harness.hardware as hardware

    # Orphaned through a shell, so it is not this process's child (children are part of the run).
    pid = int(
        subprocess.run(
            ["sh", "-c", f"{sys.executable} -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
            capture_output=True, text=True, check=True,
        ).stdout
    )  # fmt: skip
    try:
        hardware._load_seen = None
        load = hardware.machine_load(window_s=0.5)
    finally:
        os.kill(pid, signal.SIGKILL)
        hardware._load_seen = None
    assert load["disturbed"] is True and load["others_cpu_pct"] > hardware.BUSY_OTHERS_PCT
    assert any(b["name"].startswith("python") and b["cpu_pct"] > 20 for b in load["busy_others"])
    assert len(load["loadavg"]) == 3 and load["cpu_steal_pct"] >= 0
    assert "load" in hardware.describe()


def test_the_cpu_descriptor_names_the_vector_extensions_of_the_first_cpu(monkeypatch, tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor: 0\nmodel name: AMD EPYC\nflags: fpu sse2 avx2 fma avx512f avx512_bf16\n\n"
                    "processor: 1\nmodel name: AMD EPYC\nflags: fpu sse2\n")  # fmt: skip
    real_path = hardware.Path
    monkeypatch.setattr(hardware, "Path", lambda p: info if p == "/proc/cpuinfo" else real_path(p))
    cpu = hardware._cpu()
    assert cpu["model"] == "AMD EPYC" and cpu["vector_flags"] == ["avx2", "fma", "avx512f", "avx512_bf16"]
