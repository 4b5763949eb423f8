"""The benchmark runners: each writes receipts through harness/ and then regenerates RESULTS.md and figures.

python -m runners decode     engine decode (and prefill) throughput against the bandwidth roofline
python -m runners proxy      latency k3 adds per request and per event
python -m runners proxy-peers  k3 and LiteLLM's proxy side by side in front of the same engine
python -m runners accuracy   quantised against unquantised model (KL, top-1, perplexity, greedy, routing)
python -m runners kernels    every kernel variant against its reference: achieved bandwidth
python -m runners llamacpp   our engine against llama.cpp on the same model and machine
python -m runners micro      pytest-benchmark microbenchmarks of k3's turn steps and the engine's host work
python -m runners gpu-check  the one prepared GPU run: kernels, copy bandwidth, decode; a tar of receipts
python -m runners training   train a checkpoint here (kimi-engine train) and record it as a receipt
python -m runners batching   the engine's continuous batching: aggregate tok/s, TTFT, ITL per concurrency
python -m runners llamacpp-quality  perplexity of llama.cpp's F16/Q8_0/Q4_0/Q4_K_M on the accuracy runner's tokens
python -m runners serve      any streaming endpoint (Chat, Anthropic, Responses): TTFT, ITL, TPOT, goodput

Subcommands are imported only when run: `gpu-check` must start on the GPU image, which lacks k3's
dependencies (starlette, uvicorn, orjson) that the proxy runners import.
"""

import importlib

import click

# name -> "module:attribute" of its click command
COMMANDS = {
    "decode": "runners.decode:decode_command",
    "proxy": "runners.proxy:proxy_command",
    "proxy-gate": "runners.proxy:proxy_gate_command",
    "proxy-peers": "runners.proxy_peers:proxy_peers_command",
    "accuracy": "runners.accuracy:accuracy_command",
    "kernels": "runners.kernels:kernels_command",
    "llamacpp": "runners.llamacpp:llamacpp_command",
    "profile": "runners.profile:profile_command",
    "gpu-check": "runners.gpu_check:gpu_check_command",
    "micro": "runners.micro:micro_command",
    "micro-gate": "runners.micro:micro_gate_command",
    "training": "runners.training:training_command",
    "llamacpp-quality": "runners.llamacpp_quality:llamacpp_quality_command",
    "batching": "runners.batching:batching_command",
    "serve": "runners.serve.cli:serve_command",
}


class LazyGroup(click.Group):
    """A group that imports a subcommand's module only when that subcommand is looked up."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module, attribute = COMMANDS[name].split(":")
        return getattr(importlib.import_module(module), attribute)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(
    package_name="local-kimi", prog_name="python -m runners", message="%(prog)s %(version)s"
)
def main() -> None:
    """Benchmark runners for local-kimi; every measurement becomes a receipt under results/."""
