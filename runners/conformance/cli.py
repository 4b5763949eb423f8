"""`python -m runners.conformance`: install the pinned clients, run the suite, render docs/CLIENTS.md."""

from __future__ import annotations

import time
from pathlib import Path

import click

from harness.hardware import REPO_ROOT
from runners.conformance import install as installer
from runners.conformance import report
from runners.conformance.driver import CLIENT_TIMEOUT_S, Driver
from runners.conformance.k3proc import K3_REPO_ENV, K3Error, resolve_k3_repo
from runners.conformance.scenarios import MATRIX, Result, select


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Real coding agents (Claude Code, Codex, opencode, aider, the SDKs) through k3."""


@main.command(name="install")
def install_cmd() -> None:
    """Install the pinned clients into .cache/clients/ (a no-op when they are already there)."""
    started = time.perf_counter()
    try:
        installed = installer.ensure(log=click.echo)
    except installer.InstallError as exc:
        raise click.ClickException(str(exc)) from None
    for name, pin in installer.PINS.items():
        where = installed.program(name) if pin.program else installed.python(pin.group)
        click.echo(f"{name:<12} {pin.package}@{pin.version}  {where}")
    click.echo(f"ready in {time.perf_counter() - started:.1f} s")


@main.command(name="run")
@click.option(
    "--client",
    "-c",
    "clients",
    multiple=True,
    type=click.Choice(list(MATRIX)),
    help="Only this client (repeatable).",
)
@click.option(
    "--scenario",
    "-s",
    "scenarios",
    multiple=True,
    help="Only this scenario or family, e.g. tool_round_trip, tool_format (repeatable).",
)
@click.option(
    "--k3-repo",
    type=click.Path(file_okay=False, path_type=Path),
    help=f"Checkout whose k3 serves (default: ${K3_REPO_ENV}, else this repository).",
)
@click.option(
    "--timeout",
    default=CLIENT_TIMEOUT_S,
    show_default=True,
    type=float,
    help="Seconds one client run may take.",
)
@click.option(
    "--log-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Keep k3 logs and the full record of failed runs here.",
)
@click.option(
    "--receipt/--no-receipt",
    default=True,
    show_default=True,
    help="Write the receipt, results/RESULTS.md and docs/CLIENTS.md.",
)
@click.option("--list", "list_only", is_flag=True, help="List the selected cases and exit.")
def run_cmd(clients, scenarios, k3_repo, timeout, log_dir, receipt, list_only) -> None:
    """Run every selected client x scenario through k3; exit 1 if any fails."""
    try:
        cases = select(list(clients) or None, list(scenarios) or None)
        repo = resolve_k3_repo(k3_repo, REPO_ROOT)
    except (ValueError, K3Error) as exc:
        raise click.UsageError(str(exc)) from None
    if list_only:
        for case in cases:
            click.echo(f"{case.key} [{case.client.dialect}] {case.scenario.summary}")
        return
    try:
        installed = installer.ensure(sorted({c.client.pin for c in cases}), log=click.echo)
    except installer.InstallError as exc:
        raise click.ClickException(str(exc)) from None
    results: list[Result] = []
    with Driver(installed, repo, log_dir, timeout) as driver:
        with click.progressbar(
            cases, label="conformance", item_show_func=lambda c: c.key if c else ""
        ) as bar:
            for case in bar:
                results.append(driver.run(case))
    for result in results:
        click.echo(f"{result.seconds:6.1f} s  {result.headline()}")
    for result in results:
        if not result.passed:
            click.echo(f"\n{result.headline()}\n  " + "\n  ".join(result.details))
    passed = sum(r.passed for r in results)
    click.echo(f"\n{passed} of {len(results)} cases pass (k3 from {repo})")
    if receipt:
        from harness.report import write_report

        path = report.write(results, repo, timeout)
        click.echo(f"receipt {path}")
        click.echo(f"report {write_report()}")
        click.echo(f"docs {report.write_doc()}")
    if passed < len(results):
        raise SystemExit(1)


@main.command(name="docs")
def docs_cmd() -> None:
    """Render docs/CLIENTS.md from the newest conformance receipt."""
    click.echo(f"wrote {report.write_doc()}")
