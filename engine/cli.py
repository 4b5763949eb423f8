"""`kimi-engine`: the engine's command line (synthetic checkpoints, export, quantise, kernels, serve)."""

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Kimi-Linear inference engine: build checkpoints and artifacts, inspect kernels, serve."""


from engine.gguf_export import export_gguf_command  # noqa: E402
from engine.server.cli import serve_command  # noqa: E402
from engine.synth import synth_command  # noqa: E402

main.add_command(synth_command)
main.add_command(export_gguf_command)
main.add_command(serve_command)
