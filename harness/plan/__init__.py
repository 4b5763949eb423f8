"""`kimi-harness plan`: size a model on hardware from its architecture and the vendors' specifications."""

from harness.plan.ceilings import Estimate, estimate
from harness.plan.hardware import parse_hardware
from harness.plan.models import model

__all__ = ["Estimate", "estimate", "model", "parse_hardware", "plan"]


def plan(model_name: str, spec: str, **options) -> Estimate:
    """The estimate for `model_name` on hardware `spec`; `options` are estimate()'s and parse_hardware()'s."""
    per_node, network = options.pop("per_node", None), options.pop("network", None)
    return estimate(model(model_name), parse_hardware(spec, per_node=per_node, network=network), **options)
