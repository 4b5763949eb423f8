"""`kimi-engine`: the engine's command line (synthetic and trained checkpoints, export, quantise, kernels, serve)."""

import click

from engine.gguf_export import export_gguf_command
from engine.kernel_tools.cli import kernels
from engine.quant.cli import quantize, verify
from engine.server.cli import serve_command
from engine.synth import synth_command
from engine.training.cli import train_command


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="local-kimi", prog_name="kimi-engine", message="%(prog)s %(version)s")
def main() -> None:
    """Kimi-Linear inference engine: build checkpoints and artifacts, inspect kernels, serve."""


main.add_command(synth_command)
main.add_command(export_gguf_command)
main.add_command(quantize)
main.add_command(verify)
main.add_command(kernels)
main.add_command(serve_command)
main.add_command(train_command)
