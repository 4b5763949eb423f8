"""`kimi-engine serve`: start-up refusals with a clear message, and a real run over a socket."""

from __future__ import annotations

import subprocess
import sys

import httpx
import jinja2
import openai
import pytest
from click.testing import CliRunner

from engine.cli import main
from engine.kernels.defaults import SHIPPED_DEFAULTS
from engine.model import Tokenizer
from tests.runtime.runtime_support import ARTIFACT_CHAT_TEMPLATE, write_tiny_artifact
from tests.server.server_support import REPO_ROOT, CliProcess


def test_a_context_that_cannot_fit_is_refused_at_start_up():
    result = CliRunner().invoke(main, ["serve", "--synthetic", "tiny", "--memory-cap-gib", "0.01"])
    assert result.exit_code == 1
    assert "over the memory cap of 0.01 GiB" in result.output and "raise --memory-cap-gib" in result.output


def test_a_broken_int4_artifact_is_refused_clearly(tmp_path):
    (tmp_path / "manifest.json").write_text("{}")
    result = CliRunner().invoke(main, ["serve", "--weights", str(tmp_path)])
    assert result.exit_code == 1 and "not a loadable artifact" in result.output


def test_quant_plans_the_full_model_at_its_packed_size_before_allocating():
    result = CliRunner().invoke(
        main,
        ["serve", "--synthetic", "full", "--quant", "default", "--device", "cpu", "--dtype", "bfloat16",
         "--memory-cap-gib", "20"],
    )  # fmt: skip
    # Dense BF16 weights would be ~91.5 GiB; the INT4 default plan's packed weights are under 27.
    assert (
        result.exit_code == 1
        and "weights 26.89" in result.output
        and "raise --memory-cap-gib" in result.output
    )


@pytest.mark.parametrize(
    "args,message",
    [
        (["--synthetic", "tiny", "--kernels", "fastest"], "no operation has a variant named 'fastest'"),
        (["--synthetic", "tiny", "--kernels", "reference"], "apply to quantised weights"),
    ],
)
def test_kernel_selections_are_checked_at_start_up(args, message):
    result = CliRunner().invoke(main, ["serve", *args])
    assert result.exit_code in (1, 2) and message in result.output


def test_serve_an_int4_artifact(tmp_path):
    """`kimi-engine serve --weights ARTIFACT`: the artifact's own chat template and tokenizer, the packed
    kernels named at start-up and in /health, and a chat completion over a socket."""
    _, artifact = write_tiny_artifact(tmp_path)
    messages = [{"role": "user", "content": "hi"}]
    process = CliProcess(
        "engine", "serve", "--weights", str(artifact), "--port", "0", "--max-context", "1024"
    )
    try:
        url = process.url()
        with openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=30) as client:
            reply = client.chat.completions.create(
                model="kimi-linear", messages=messages, max_tokens=4, temperature=0
            )
        health = httpx.get(url + "/health", timeout=30).json()
        tokens = httpx.post(url + "/tokenize", json={"messages": messages}, timeout=30)
    finally:
        process.stop()
    output = "".join(process.output)
    assert reply.usage.completion_tokens <= 4 and reply.choices[0].finish_reason in ("stop", "length"), output
    cpu = SHIPPED_DEFAULTS["cpu"]
    assert health["quant_plan"] == "default" and health["kernel_variants"]["w4a16_gemv"] == cpu["w4a16_gemv"]
    assert "INT4 artifact, plan default" in output
    assert f"w4a16_grouped_swiglu={cpu['w4a16_grouped_swiglu']}" in output
    rendered = jinja2.Template(ARTIFACT_CHAT_TEMPLATE).render(messages=messages, add_generation_prompt=True)
    expected = Tokenizer.from_dir(artifact).encode(rendered, allow_special=True)
    assert tokens.json()["tokens"] == expected  # the artifact's template, not the built-in synthetic one


def test_weights_and_synthetic_are_exclusive(tmp_path):
    result = CliRunner().invoke(main, ["serve", "--weights", str(tmp_path), "--synthetic", "tiny"])
    assert result.exit_code == 2 and "not both" in result.output


def test_serve_answers_over_a_socket_and_reports_memory():
    process = CliProcess("engine", "serve", "--synthetic", "tiny", "--port", "0", "--max-context", "4096")
    try:
        url = process.url()
        with openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=30) as client:
            reply = client.chat.completions.create(
                model="kimi-linear", messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
        assert reply.usage.completion_tokens <= 4 and reply.choices[0].finish_reason in ("stop", "length")
    finally:
        code = process.stop()
    output = "".join(process.output)
    assert code in (0, -15), output  # uvicorn re-raises SIGTERM after its graceful shutdown
    assert "Application shutdown complete" in output
    assert "SYNTHETIC WEIGHTS" in output and "memory: weights" in output and "at 4096 tokens" in output


def test_api_key_guards_every_route_but_health_metrics_and_version():
    process = CliProcess("engine", "serve", "--synthetic", "tiny", "--port", "0", "--api-key", "sesame",
                         "--max-context", "1024")  # fmt: skip
    try:
        url = process.url()
        body = {"model": "kimi-linear", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        with httpx.Client(base_url=url, timeout=30) as http:
            refused = http.post("/v1/chat/completions", json=body)
            wrong = http.post("/v1/chat/completions", json=body, headers={"authorization": "Bearer nope"})
            ok = http.post("/v1/chat/completions", json=body, headers={"authorization": "Bearer sesame"})
            open_routes = [http.get(path).status_code for path in ("/health", "/metrics", "/version")]
            models = http.get("/v1/models").status_code
    finally:
        process.stop()
    output = "".join(process.output)
    assert refused.status_code == wrong.status_code == models == 401
    assert refused.json()["error"]["code"] == "invalid_api_key"
    assert ok.status_code == 200 and open_routes == [200, 200, 200]
    assert "auth: on" in output and "sesame" not in output
    # One line per finished request, with status and tokens, never the prompt.
    assert "POST /v1/chat/completions 200" in output and "completion=2" in output
    assert "POST /v1/chat/completions 401" in output and '"hi"' not in output


def test_every_cli_has_a_version():
    for args in (["engine", "--version"], ["runners", "--version"], ["harness", "--version"]):
        result = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, cwd=REPO_ROOT)
        assert result.returncode == 0 and result.stdout.split()[-1][0].isdigit(), (args, result)


def test_a_model_larger_than_this_machines_ram_is_refused_before_allocating():
    # A cap above the RAM (the default cap, 16 GiB, would refuse it first) does not make it fit.
    result = CliRunner().invoke(
        main, ["serve", "--synthetic", "full", "--device", "cpu", "--memory-cap-gib", "1e6"]
    )
    assert result.exit_code == 1 and "GiB of RAM" in result.output and "Traceback" not in result.output
