"""The benchmark runners: each writes receipts through harness/ and then regenerates RESULTS.md and figures.

python -m runners decode     engine decode (and prefill) throughput against the bandwidth roofline
python -m runners proxy      latency k3 adds per request and per event
"""

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Benchmark runners for local-kimi; every measurement becomes a receipt under results/."""


from runners.decode import decode_command  # noqa: E402

main.add_command(decode_command)

from runners.proxy import proxy_command, proxy_gate_command  # noqa: E402

main.add_command(proxy_command)
main.add_command(proxy_gate_command)
