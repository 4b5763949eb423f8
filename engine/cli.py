"""`kimi-engine`: the engine's command line (synthetic checkpoints, export, quantise, kernels, serve)."""

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Kimi-Linear inference engine: build checkpoints and artifacts, inspect kernels, serve."""
