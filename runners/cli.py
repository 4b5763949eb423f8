"""The benchmark runners: each writes receipts through harness/ and then regenerates RESULTS.md and figures.

python -m runners decode     engine decode (and prefill) throughput against the bandwidth roofline
python -m runners proxy      latency k3 adds per request and per event
python -m runners proxy-peers  k3 and LiteLLM's proxy side by side in front of the same engine
python -m runners accuracy   quantised against unquantised model (KL, top-1, perplexity, greedy, routing)
python -m runners kernels    every kernel variant against its reference: achieved bandwidth
python -m runners llamacpp   our engine against llama.cpp on the same model and machine
python -m runners training   train a checkpoint here (kimi-engine train) and record it as a receipt
python -m runners llamacpp-quality  perplexity of llama.cpp's F16/Q8_0/Q4_0/Q4_K_M on the accuracy runner's tokens
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

from runners.proxy_peers import proxy_peers_command  # noqa: E402

main.add_command(proxy_peers_command)

from runners.accuracy import accuracy_command  # noqa: E402

main.add_command(accuracy_command)

from runners.kernels import kernels_command  # noqa: E402

main.add_command(kernels_command)

from runners.llamacpp import llamacpp_command  # noqa: E402

main.add_command(llamacpp_command)

from runners.llamacpp_quality import llamacpp_quality_command  # noqa: E402
from runners.training import training_command  # noqa: E402

main.add_command(training_command)

main.add_command(llamacpp_quality_command)

from runners.profile import profile_command  # noqa: E402

main.add_command(profile_command)
