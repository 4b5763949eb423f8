"""Published claims about Kimi-Linear and Kimi K3, each checked against what `kimi-harness plan` computes.

`CLAIMS` holds each claim as published (the publisher's number, where it was published, what it states);
`check` sets it against its ceiling: a speed against the batch-1 decode ceiling of the hardware it names,
a "fits" / "does not fit" against the memory plan. A speed above its ceiling is allowed only with a
stated reason the ceiling does not model (speculative decoding emits several tokens per target step;
batching shares each weight read among sequences); without one, or for a fit the plan contradicts, the
audit fails (`findings`). docs/CLAIMS.md is generated from these checks (`kimi-harness claims`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.plan import Estimate, plan

REASONS = ("speculation", "batching")  # what may take a claim above the batch-1 ceiling
KINDS = ("decode", "fits", "does not fit")
CLAIMS_DOC = Path("docs") / "CLAIMS.md"
REGENERATE = "kimi-harness claims"


@dataclass(frozen=True)
class Claim:
    id: int
    title: str  # no numbers: it becomes a heading
    statement: str  # the claim as published, with its number(s)
    source: str  # a public source, or this repository's file that records it
    model: str
    hardware: str  # a plan SPEC
    kind: str  # one of KINDS
    value: float | None = None  # the claimed tok/s, for "decode"
    quant: str | None = None
    context: int = 4096
    reason: str | None = None  # "speculation: ..." / "batching: ..."
    baseline: int | None = None  # id of the same setup's claim without the reason (speculation)
    note: str = ""  # how the claim was read into a plan

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"claim {self.id}: kind {self.kind!r} is not one of {KINDS}")
        if (self.kind == "decode") != (self.value is not None):
            raise ValueError(f"claim {self.id}: a decode claim, and only one, has a value")

    @property
    def plan_command(self) -> str:
        quant = f" --quant {self.quant}" if self.quant else ""
        return f"kimi-harness plan --model {self.model} --hardware {self.hardware}{quant} --context {self.context}"


@dataclass(frozen=True)
class Check:
    claim: Claim
    estimate: Estimate
    finding: str | None  # why the audit fails on this claim; None when it is consistent

    @property
    def ceiling(self) -> float:
        return self.estimate.decode_tok_s or 0.0

    @property
    def above_ceiling(self) -> bool:
        return self.claim.value is not None and self.claim.value > self.ceiling  # only decode claims have one


def _reason_kind(reason: str | None) -> str | None:
    return reason.split(":")[0].strip().lower() if reason else None


def check(claim: Claim) -> Check:
    e = plan(claim.model, claim.hardware, quant=claim.quant, context=claim.context)
    finding = None
    if claim.value is not None:  # a decode claim
        if claim.value > (e.decode_tok_s or 0.0) and _reason_kind(claim.reason) not in REASONS:
            ceiling = f"{e.decode_tok_s:,.2f} tok/s" if e.fits else "none: the model does not fit"
            finding = (
                f"claims {claim.value:,} tok/s, above its computed batch-1 ceiling ({ceiling}), with no stated "
                f"reason ({' / '.join(REASONS)})"
            )
    elif e.fits != (claim.kind == "fits"):
        finding = (
            f"says it {claim.kind}, but the plan needs {e.device_need / 1e9:,.2f} GB of "
            f"{e.device_memory / 1e9:,.2f} GB"
        )
    return Check(claim, e, finding)


def check_all(claims: list[Claim] | None = None) -> list[Check]:
    return [check(c) for c in (CLAIMS if claims is None else claims)]


def findings(checks: list[Check]) -> list[tuple[int, str]]:
    """(claim id, message) for every claim the audit refuses."""
    return [(c.claim.id, c.finding) for c in checks if c.finding]


def render(checks: list[Check] | None = None) -> str:
    from harness.plan.hardware import DEVICES, HOSTS, LINKS
    from harness.plan.models import MODELS
    from harness.report import TEMPLATES, templates

    checks = check_all() if checks is None else checks
    return (
        templates(TEMPLATES)
        .get_template("CLAIMS.md.j2")
        .render(
            checks=checks,
            by_id={c.claim.id: c for c in checks},
            reasons=REASONS,
            regenerate=REGENERATE,
            models=[facts() for facts in MODELS.values()],
            devices=DEVICES.values(),
            links=LINKS.values(),
            hosts=HOSTS.values(),
        )
    )


def write(root: Path, checks: list[Check] | None = None) -> Path:
    out = root / CLAIMS_DOC
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(checks))
    return out


_LOCAL_KIMI = "github.com/RightNow-AI/local-kimi README.md (2026-07-29/30)"
_K3_GUIDE = 'harness/claims.py (the "Run Kimi K3 Locally" guide, 2026-08)'

CLAIMS = [
    Claim(1, "local-kimi: Kimi-Linear INT4 on one L40S",
          "Kimi-Linear-48B-A3B with INT4 weights decodes at 113.83 tok/s on one NVIDIA L40S (1 stream, "
          "17-token prompt, 64 generated, greedy)", _LOCAL_KIMI,
          "kimi-linear-48b", "1xL40S", "decode", 113.83, context=17,
          note="the ceiling at the first decoded token (context 17), the highest of the run"),
    Claim(2, "Kimi-Linear INT4 needs a 32 GB card",
          "the INT4 artifact (26.83 GiB) needs roughly 2.5 GiB more for activations, state and the CUDA "
          "context: 32 GB of VRAM or more", _LOCAL_KIMI,
          "kimi-linear-48b", "1xRTX5090", "fits", note="a 32 GB card at a 4096-token context"),
    Claim(3, "K3 UD-IQ1_S through llama.cpp with the experts in RAM",
          "Kimi K3 UD-IQ1_S (594 GB) through llama.cpp on 4 x A100-SXM4-40GB, 2 x EPYC 7542 and 2 TB "
          "of RAM, experts on the CPU (`--cpu-moe`): generation 0.10 tok/s", _K3_GUIDE,
          "kimi-k3", "4xA100-40GB+2TB-DDR4", "decode", 0.10, quant="ud-iq1_s", context=128,
          note="llama-bench's generation test starts from an empty cache; 128 tokens used"),
    Claim(4, "K3 on 80 RTX 5090s over 25GbE",
          "Kimi K3 runs at 20 tok/s single stream on 80 x RTX 5090 (10 nodes of 8) over 25GbE, "
          "official FP4 weights", "harness/claims.py (posts of 2026-07-28, markjeffrey, panchovix)",
          "kimi-k3", "80xRTX5090", "decode", 20.0, note="context not stated; 4096 used"),
    Claim(5, "vLLM single-stream K3 on 8 B300",
          "vLLM single-stream Kimi K3 throughput: 118 tok/s", "harness/claims.py (vLLM posts, 2026-07-27)",
          "kimi-k3", "8xB300", "decode", 118.0, note="hardware from the same posts; context not stated"),
    Claim(6, "vLLM K3 with the DSpark draft model on 8 B300",
          "370 tok/s with the Kimi-K3-DSpark MLA-native draft model (speculative decoding)",
          "harness/claims.py (vLLM posts, 2026-07-27)",
          "kimi-k3", "8xB300", "decode", 370.0,
          reason="speculation: each target step verifies several drafted tokens", baseline=5),
    Claim(7, "vLLM K3 with DSpark on GB300",
          "vLLM: 464 tok/s decode on Kimi K3 with DSpark on 4 GB300 systems, batch 1, "
          "\"low-entropy workload\"", "harness/claims.py (vLLM / zhyncs42 posts, 2026-07-29)",
          "kimi-k3", "16xGB300", "decode", 464.0,
          reason="speculation: DSpark drafts, the target verifies", baseline=5,
          note="read as 4 GB300 compute trays of 4 GPUs (16 GPUs, one NVLink domain): 4 GPUs hold "
               "4 x 288 = 1,152 GB, less than the weights"),
    Claim(8, "K3 does not fit one 8-B200 node",
          "Kimi K3 (1.56 TB of weights) does not fit one 8 x B200 node",
          "github.com/RightNow-AI/local-kimi README.md; K3 guides",
          "kimi-k3", "8xB200", "does not fit", context=36_000,
          note="text-only coding prompts of 34-36k tokens; 36,000 used"),
    Claim(9, "K3 fits one 8-B300 node",
          "Kimi K3 fits one 8 x B300 node (288 GB per GPU, 2,304 GB per node, one NVLink domain)",
          "github.com/RightNow-AI/local-kimi README.md; K3 guides",
          "kimi-k3", "8xB300", "fits", context=36_000, note="36,000-token prompts, as for claim 8"),
]  # fmt: skip
