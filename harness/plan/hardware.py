"""The hardware table `kimi-harness plan` sizes models on, and the SPEC syntax that picks from it.

Every figure is the vendor's published specification, with the page it comes from (`source`); none was
measured here. Sizes are the vendors' decimal gigabytes, bandwidths bytes per second in one direction,
FLOP rates dense (without structured sparsity). Peak figures are upper bounds: real kernels reach less.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

G, T = 10**9, 10**12


@dataclass(frozen=True)
class Link:
    name: str
    bandwidth: float  # bytes/s, one direction, per device (or per node, for a network)
    source: str


@dataclass(frozen=True)
class Device:
    name: str
    memory: float  # bytes
    bandwidth: float  # bytes/s
    bf16_flops: float  # dense tensor-core FLOP/s
    fp4_flops: float | None  # dense FP4 tensor-core FLOP/s, where the device has FP4 units
    link: str  # how devices of one node talk (a LINKS key)
    node_size: int  # devices per node, as usually sold
    network: str  # the usual network between such nodes (a LINKS key)
    source: str


@dataclass(frozen=True)
class HostMemory:
    name: str
    bandwidth: float  # bytes/s, all sockets together
    description: str
    source: str


_PCIE = "https://pcisig.com/specifications (PCI Express Base Specification): x16 lanes, one direction"
_NVLINK = "https://www.nvidia.com/en-us/data-center/nvlink/"
LINKS = {
    "PCIe4": Link("PCIe 4.0 x16", 32 * G, _PCIE + ", 16 GT/s"),
    "PCIe5": Link("PCIe 5.0 x16", 64 * G, _PCIE + ", 32 GT/s"),
    "NVLink3": Link("NVLink 3 (A100)", 300 * G, _NVLINK + " (600 GB/s per GPU, both directions)"),
    "NVLink4": Link("NVLink 4 (H100, H200)", 450 * G, _NVLINK + " (900 GB/s per GPU, both directions)"),
    "NVLink5": Link("NVLink 5 (Blackwell)", 900 * G, _NVLINK + " (1.8 TB/s per GPU, both directions)"),
    "25GbE": Link(
        "25 Gigabit Ethernet", 25 / 8 * G, "https://standards.ieee.org/ (IEEE 802.3by: 25 Gb/s per port)"
    ),
    "100GbE": Link(
        "100 Gigabit Ethernet", 100 / 8 * G, "https://standards.ieee.org/ (IEEE 802.3: 100 Gb/s per port)"
    ),
    "IB-NDR": Link(
        "InfiniBand NDR 400 Gb/s",
        400 / 8 * G,
        "https://www.nvidia.com/en-us/networking/infiniband-adapters/ (ConnectX-7, 400 Gb/s per port)",
    ),
}

DEVICES = {
    d.name: d
    for d in [
        Device("L40S", 48 * G, 864 * G, 362.05 * T, None, "PCIe4", 8, "100GbE",
               "https://www.nvidia.com/en-us/data-center/l40s/ (datasheet: 48 GB GDDR6, 864 GB/s, "
               "BF16 362.05 TFLOPS dense, PCIe Gen4 x16)"),
        Device("A100-40GB", 40 * G, 1555 * G, 312 * T, None, "NVLink3", 8, "IB-NDR",
               "https://www.nvidia.com/en-us/data-center/a100/ (datasheet, A100 40GB SXM: 40 GB HBM2, "
               "1,555 GB/s, BF16 312 TFLOPS dense, NVLink 600 GB/s)"),
        Device("A100-80GB", 80 * G, 2039 * G, 312 * T, None, "NVLink3", 8, "IB-NDR",
               "https://www.nvidia.com/en-us/data-center/a100/ (datasheet, A100 80GB SXM: 80 GB HBM2e, "
               "2,039 GB/s, BF16 312 TFLOPS dense)"),
        Device("H100", 80 * G, 3.35 * T, 989 * T, None, "NVLink4", 8, "IB-NDR",
               "https://www.nvidia.com/en-us/data-center/h100/ (datasheet, H100 SXM: 80 GB, 3.35 TB/s, "
               "BF16 1,979 TFLOPS with sparsity, NVLink 900 GB/s)"),
        Device("H200", 141 * G, 4.8 * T, 989 * T, None, "NVLink4", 8, "IB-NDR",
               "https://www.nvidia.com/en-us/data-center/h200/ (datasheet, H200 SXM: 141 GB HBM3e, "
               "4.8 TB/s, BF16 1,979 TFLOPS with sparsity, NVLink 900 GB/s)"),
        Device("B200", 180 * G, 8 * T, 2.25 * 1000 * T, 9 * 1000 * T, "NVLink5", 8, "IB-NDR",
               "https://www.nvidia.com/en-us/data-center/hgx/ (HGX B200, 8 GPUs: 1.4 TB memory, 64 TB/s, "
               "FP4 144 PFLOPS and BF16 36 PFLOPS with sparsity, NVLink 1.8 TB/s per GPU)"),
        Device("B300", 288 * G, 8 * T, 2.25 * 1000 * T, 13.125 * 1000 * T, "NVLink5", 8, "IB-NDR",
               "https://www.nvidia.com/en-us/data-center/hgx/ (HGX B300, 8 GPUs: 2.3 TB memory, "
               "FP4 105 PFLOPS dense, BF16 36 PFLOPS with sparsity, NVLink 1.8 TB/s per GPU)"),
        Device("GB300", 288 * G, 8 * T, 2.5 * 1000 * T, 1100 / 72 * 1000 * T, "NVLink5", 72, "IB-NDR",
               "https://www.nvidia.com/en-us/data-center/gb300-nvl72/ (72 GPUs: 20.7 TB HBM3e, 576 TB/s, "
               "FP4 1.1 EFLOPS dense, FP8 360 PFLOPS dense, BF16 taken as half of FP8, NVLink 1.8 TB/s per GPU)"),
        Device("RTX5090", 32 * G, 1792 * G, 209.5 * T, 1676 * T, "PCIe5", 8, "25GbE",
               "https://www.nvidia.com/en-us/geforce/graphics-cards/50-series/rtx-5090/ and the NVIDIA RTX "
               "Blackwell GPU architecture whitepaper (32 GB GDDR7, 1,792 GB/s, FP16/BF16 tensor 209.5 "
               "TFLOPS dense with FP32 accumulate, FP4 3,352 TOPS with sparsity, PCIe Gen5 x16)"),
    ]
}  # fmt: skip

HOSTS = {
    h.name: h
    for h in [
        HostMemory("DDR4", 2 * 204.8 * G, "two AMD EPYC 7002 sockets, 8 channels of DDR4-3200 each",
                   "https://www.amd.com/en/products/processors/server/epyc/7002-series/amd-epyc-7542.html "
                   "(per socket memory bandwidth 204.8 GB/s)"),
        HostMemory("DDR5", 2 * 460.8 * G, "two AMD EPYC 9004 sockets, 12 channels of DDR5-4800 each",
                   "https://www.amd.com/en/products/processors/server/epyc/4th-generation-9004-and-8004-series.html "
                   "(per socket memory bandwidth 460.8 GB/s)"),
    ]
}  # fmt: skip

SPEC_HELP = (
    "COUNTxDEVICE[+SIZE-HOST], e.g. 1xL40S, 8xB300, 80xRTX5090, 4xA100-40GB+2TB-DDR4. "
    f"Devices: {', '.join(DEVICES)}; host memory: {', '.join(HOSTS)} (SIZE in GB or TB)."
)
_SPEC = re.compile(r"^(\d+)x([A-Za-z0-9-]+?)(?:\+(\d+(?:\.\d+)?)(GB|TB)-([A-Za-z0-9]+))?$", re.IGNORECASE)


@dataclass(frozen=True)
class Hardware:
    """COUNT devices in nodes of `per_node`, nodes joined by `network`, optionally host RAM for experts."""

    spec: str
    device: Device
    count: int
    per_node: int
    network: Link
    host: HostMemory | None = None
    host_memory: float = 0.0  # bytes

    @property
    def nodes(self) -> int:
        return -(-self.count // self.per_node)

    @property
    def link(self) -> Link:
        return LINKS[self.device.link]

    @property
    def memory(self) -> float:
        return self.count * self.device.memory

    def sources(self) -> list[str]:
        out = [self.device.source]
        if self.count > 1:
            out.append(f"{self.link.name}: {self.link.source}")
        if self.nodes > 1:
            out.append(f"{self.network.name}: {self.network.source}")
        if self.host:
            out.append(f"{self.host.name}: {self.host.source}")
        return out


def _lookup(table: dict, name: str, what: str):
    for key, value in table.items():
        if key.lower() == name.lower():
            return value
    raise ValueError(f"unknown {what} {name!r}; choose one of: {', '.join(table)}")


def parse_hardware(spec: str, *, per_node: int | None = None, network: str | None = None) -> Hardware:
    """A SPEC (see SPEC_HELP); `per_node` and `network` override the device's usual node size and network."""
    match = _SPEC.match(spec.strip())
    if not match:
        raise ValueError(f"cannot read hardware {spec!r}; expected {SPEC_HELP}")
    count, name, size, unit, host_name = match.groups()
    device = _lookup(DEVICES, name, "device")
    if int(count) < 1:
        raise ValueError("the device count must be at least 1")
    per_node = per_node or min(int(count), device.node_size)
    if per_node < 1:
        raise ValueError("--per-node must be at least 1")
    host = _lookup(HOSTS, host_name, "host memory") if host_name else None
    host_memory = float(size) * (G if unit.upper() == "GB" else T) if size else 0.0
    return Hardware(
        spec=spec,
        device=device,
        count=int(count),
        per_node=per_node,
        network=_lookup(LINKS, network or device.network, "network"),
        host=host,
        host_memory=host_memory,
    )
