"""One vocabulary across the command lines (k3, kimi-engine, kimi-harness, python -m runners): every option
described, defaults shown relative to the checkout, the same dtype / --synthetic / --quant spellings and
memory-cap default wherever they appear; and a KIMI_KERNELS entry the weights do not use is reported."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from common.memory_cap import default_cap_gib
from engine.cli import main as engine_main
from engine.cli_options import DTYPE_ALIASES, DTYPES, NO_QUANT
from engine.kernels import KernelSelectionError
from engine.model.presets import PRESETS
from engine.quant.plan import PLANS
from harness.cli import main as harness_main
from k3.cli import main as k3_main
from runners.cli import main as runners_main

ROOT = Path(__file__).resolve().parents[1]
CLIS = {
    "k3": k3_main,
    "kimi-engine": engine_main,
    "kimi-harness": harness_main,
    "python -m runners": runners_main,
}


def commands() -> Iterator[tuple[str, click.Command]]:
    """Every command and subcommand of every CLI, by its full name."""

    def walk(command: click.Command, name: str) -> Iterator[tuple[str, click.Command]]:
        yield name, command
        if isinstance(command, click.Group):
            ctx = click.Context(command, info_name=name)
            for sub in command.list_commands(ctx):
                yield from walk(command.get_command(ctx, sub), f"{name} {sub}")

    for name, main in CLIS.items():
        yield from walk(main, name)


def options(name_filter: str | None = None) -> Iterator[tuple[str, click.Option]]:
    for name, command in commands():
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden:
                if name_filter is None or name_filter in param.opts:
                    yield name, param


def test_every_option_of_every_cli_is_described():
    missing = [f"{name} {'/'.join(opt.opts)}" for name, opt in options() if not (opt.help or "").strip()]
    assert not missing, "options without help text:\n" + "\n".join(missing)


def test_no_help_shows_this_checkouts_absolute_path():
    shown = []
    for name, command in commands():
        ctx = click.Context(command, info_name=name, max_content_width=10_000, terminal_width=10_000)
        help_text = command.get_help(ctx)
        if str(ROOT) in help_text:
            shown += [f"{name}: {line.strip()}" for line in help_text.splitlines() if str(ROOT) in line]
    assert not shown, "\n".join(shown)


def test_choices_are_listed_in_help():
    for name, opt in options():
        if isinstance(opt.type, click.Choice):
            help_text = opt.get_help_record(click.Context(click.Command(name)))[0]
            assert "[" in help_text and "|" in help_text or len(opt.type.choices) == 1, (name, help_text)


def _choices(option: str) -> dict[str, tuple[str, ...]]:
    return {
        name: tuple(opt.type.choices) for name, opt in options(option) if isinstance(opt.type, click.Choice)
    }


def test_dtype_is_spelled_the_same_everywhere_and_the_torch_names_are_aliases():
    found = _choices("--dtype")
    # export-gguf's --dtype is the GGUF file's tensor type (f32/f16, llama.cpp's names), not the engine's.
    found.pop("kimi-engine export-gguf")
    assert set(found) >= {"kimi-engine serve", "python -m runners decode", "python -m runners profile",
                          "python -m runners accuracy", "python -m runners llamacpp"}  # fmt: skip
    assert set(found.values()) == {("auto", *DTYPES)}, found
    dtype = next(opt for name, opt in options("--dtype") if name == "kimi-engine serve")
    assert {alias: dtype.type.convert(alias, dtype, None) for alias in DTYPE_ALIASES} == DTYPE_ALIASES
    assert "bfloat16" not in dtype.get_help_record(click.Context(click.Command("serve")))[0]


def test_model_sizes_are_synthetic_everywhere_and_quant_is_a_choice():
    assert not list(options("--preset")), "use --synthetic (kimi-engine serve's spelling)"
    for name, choices in _choices("--synthetic").items():
        assert set(choices) <= set(PRESETS), name
    quants = _choices("--quant")
    # plan's --quant names a published model's format (mxfp4, ud-iq1_s, ...), not one of the engine's plans.
    assert set(quants.pop("kimi-harness plan")) >= {"int4", "mxfp4"}
    assert {"kimi-engine serve", "python -m runners decode", "python -m runners profile"} <= set(quants)
    assert set(quants.values()) == {(NO_QUANT, *PLANS)}, quants
    assert not [name for name, opt in options("--quant") if not isinstance(opt.type, click.Choice)]


def test_the_kernels_runner_still_takes_the_old_preset_spelling():
    result = CliRunner().invoke(runners_main, ["kernels", "--preset", "tiny", "--ops", "nope"])
    assert result.exit_code == 2 and "unknown operations" in result.output


def test_the_memory_cap_default_is_the_same_for_serve_and_the_runners():
    helps = {name: opt.help for name, opt in options("--memory-cap-gib")}
    assert {"kimi-engine serve", "python -m runners decode"} <= set(helps)
    tail = f"Default: {default_cap_gib('cuda'):g} on a GPU, {default_cap_gib('cpu'):g} on the CPU."
    assert all(text.endswith(tail) for text in helps.values()), helps
    # The default applies: the full dense model on the CPU is refused by the 16 GiB cap before allocating.
    result = CliRunner().invoke(engine_main, ["serve", "--synthetic", "full", "--device", "cpu"])
    assert (
        result.exit_code == 1 and f"over the memory cap of {default_cap_gib('cpu'):.2f} GiB" in result.output
    )


def test_a_kimi_kernels_typo_is_refused_with_dense_weights_too(monkeypatch):
    from engine.runtime import Engine

    monkeypatch.setenv("KIMI_KERNELS", "w4a16_gemv=fastest")
    with pytest.raises(KernelSelectionError, match="w4a16_gemv has no variant 'fastest'"):
        Engine.load(synthetic="tiny", device="cpu", max_context=64, prefix_cache_gib=0)


def test_a_kimi_kernels_entry_the_weights_do_not_use_is_reported(monkeypatch, caplog):
    from engine.runtime import Engine

    monkeypatch.setenv("KIMI_KERNELS", "w8a16_gemv=reference")
    with caplog.at_level(logging.WARNING, logger="engine.runtime"):
        dense = Engine.load(synthetic="tiny", device="cpu", max_context=64, prefix_cache_gib=0)
        dense_calls = dense.kernel_variants  # BF16 Linears decode through w16a16_gemv's C++ variant here
        dense.close()
        # The default plan packs no INT8 weights: its model never calls w8a16_gemv either.
        packed = Engine.load(
            synthetic="tiny", quant="default", device="cpu", max_context=64, prefix_cache_gib=0
        )
        packed.close()
    warnings = [r.getMessage() for r in caplog.records if r.name == "engine.runtime"]
    assert len(warnings) == 2, warnings
    assert "KIMI_KERNELS entries w8a16_gemv=reference select nothing" in warnings[0]
    expected = f"call {', '.join(dense_calls)}" if dense_calls else "dense"
    assert expected in warnings[0] and "w4a16_gemv" in warnings[1]
