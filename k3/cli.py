"""`k3`: the protocol adapter's command line."""

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """k3: let Claude Code, Codex, opencode, aider and the SDKs talk to a local OpenAI-Chat engine."""
