"""Does a model fit on some hardware, and how fast could it be at best: memory fit, decode and prefill ceilings.

Decode at batch B reads, per step: every always-active weight once, the routed experts the B tokens pick
(as many distinct ones as B tokens pick under uniform routing, E(1 - (1 - k/E)^B) per layer), and each sequence's KDA state (read and written) and MLA cache. The step cannot
be faster than those bytes over the memory bandwidth, plus the activations that must cross devices:
- one node: tensor parallel, two all-reduces of the hidden state per layer over the node's link (ring:
  2(p-1)/p of the message per device);
- several nodes: pipeline stages, one per node; at batch 1 only one node works at a time, so the bytes
  go over one node's bandwidth, and the hidden state crosses the network once per node boundary.
  (Splitting a layer across nodes needs two collectives per layer, bound by network latency, which the
  table does not hold: it is never the better layout at batch 1.)
- experts in host RAM (a `+SIZE-HOST` spec, used only when the weights do not fit the devices): the
  routed experts' bytes go over the host memory bandwidth.
Prefill: 2 FLOPs per active parameter per token over the devices' dense tensor-core rate (attention's
FLOPs left out). Every figure is a ceiling: peak bandwidth and FLOPs, no latency, no overlap lost.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from harness.plan.hardware import Hardware
from harness.plan.models import GB, ModelFacts, WeightFormat

DEFAULT_RESERVE = 1 * GB  # per device: CUDA context, allocator slack (an assumption; --reserve-gb)
ACTIVATION_BYTES = 2  # BF16 hidden states between devices


@dataclass(frozen=True)
class Estimate:
    model: str
    quant: str
    hardware: str
    context: int
    batch: int
    layout: str  # "devices" | "experts in host RAM"
    fits: bool
    device_need: float  # bytes on the devices, all together
    device_memory: float
    host_need: float
    host_memory: float
    need: dict  # the parts of device_need, bytes
    decode_tok_s: float | None  # all sequences together; None when it does not fit
    decode_terms_s: dict  # seconds per step: memory, link, network, host
    step_bytes: float
    prefill_tok_s: float | None
    prefill_note: str
    sources: list

    def as_dict(self) -> dict:
        return asdict(self)


def _fit(model: ModelFacts, fmt: WeightFormat, hw: Hardware, context: int, batch: int, reserve: float):
    need = {
        "weights": fmt.total_bytes,
        "kda_state": batch * model.state_bytes,
        "mla_cache": batch * context * model.cache_bytes_per_token,
        "workspace": model.workspace_bytes(context),
        "reserve": hw.count * reserve,
    }
    if sum(need.values()) <= hw.memory or not hw.host:
        return "devices", need, 0.0
    need = need | {"weights": fmt.total_bytes - fmt.expert_bytes}
    return "experts in host RAM", need, float(fmt.expert_bytes)


def _step(model: ModelFacts, fmt: WeightFormat, hw: Hardware, context: int, batch: int, layout: str):
    """(bytes read from device memory, bytes read from host RAM) per decode step of `batch` tokens."""
    p = model.routed_share
    experts = fmt.token_expert_bytes if batch == 1 else fmt.token_expert_bytes * (1 - (1 - p) ** batch) / p
    state = batch * (2 * model.state_bytes + (context + 1) * model.cache_bytes_per_token)
    always = fmt.token_bytes - fmt.token_expert_bytes + state
    return (always, experts) if layout == "experts in host RAM" else (always + experts, 0)


def _all_reduce_s(model: ModelFacts, devices: int, batch: int, bandwidth: float) -> float:
    if devices < 2:
        return 0.0
    message = batch * model.hidden_size * ACTIVATION_BYTES
    return model.layers * 2 * 2 * (devices - 1) / devices * message / bandwidth


def estimate(
    model: ModelFacts,
    hw: Hardware,
    *,
    quant: str | None = None,
    context: int = 4096,
    batch: int = 1,
    reserve: float = DEFAULT_RESERVE,
) -> Estimate:
    if context < 0 or batch < 1:
        raise ValueError("--context must be >= 0 and --batch >= 1")
    fmt = model.fmt(quant)
    layout, need, host_need = _fit(model, fmt, hw, context, batch, reserve)
    fits = sum(need.values()) <= hw.memory and host_need <= hw.host_memory
    device_bytes, host_bytes = _step(model, fmt, hw, context, batch, layout)
    working = hw.per_node if hw.nodes > 1 else hw.count  # pipeline across nodes: one node at a time
    terms = {
        "memory": device_bytes / (working * hw.device.bandwidth),
        "link": _all_reduce_s(model, working, batch, hw.link.bandwidth),
        "network": (hw.nodes - 1) * batch * model.hidden_size * ACTIVATION_BYTES / hw.network.bandwidth,
        "host": host_bytes / hw.host.bandwidth if hw.host and host_bytes else 0.0,
    }
    decode = batch / sum(terms.values()) if fits else None
    if not fits:
        prefill, note = None, "does not fit"
    elif layout != "devices":
        prefill, note = None, "the experts run on the host CPU, whose FLOPs the table does not hold"
    else:
        fp4_flops = hw.device.fp4_flops if fmt.compute == "fp4" else None
        flops = hw.count * (fp4_flops or hw.device.bf16_flops)
        prefill = flops / (2 * model.active_params)
        note = f"{'FP4' if fp4_flops else 'BF16'} dense tensor-core peak of {hw.count} x {hw.device.name}"
    return Estimate(
        model=model.name,
        quant=fmt.name,
        hardware=hw.spec,
        context=context,
        batch=batch,
        layout=layout,
        fits=fits,
        device_need=float(sum(need.values())),
        device_memory=hw.memory,
        host_need=host_need,
        host_memory=hw.host_memory,
        need={k: float(v) for k, v in need.items()},
        decode_tok_s=decode,
        decode_terms_s=terms,
        step_bytes=float(device_bytes + host_bytes),
        prefill_tok_s=prefill,
        prefill_note=note,
        sources=[model.sources, fmt.how, *hw.sources()],
    )
