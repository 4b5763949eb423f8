"""The side-by-side proxy runner: rotation, samples and unsupported dialects, with stand-in proxies
(LiteLLM itself is installed only by `nox -s bench-proxy-peers`)."""

import asyncio
import importlib.metadata

import pytest
from click.testing import CliRunner

from runners.cli import main
from runners.proxy import engine_and_k3
from runners.proxy_peers import rotated


@pytest.fixture(scope="module")
def engine_and_k3_bases():
    with engine_and_k3() as (engine, k3, _):
        yield engine, k3


@pytest.mark.parametrize("dialect", ["anthropic", "chat"])
def test_rotated_times_every_proxy_that_answers_and_names_the_ones_that_do_not(engine_and_k3_bases, dialect):
    engine, k3 = engine_and_k3_bases
    # The engine answers only OpenAI Chat itself: as a "proxy" it stands in for a peer without Anthropic.
    proxies = {"k3": k3, "bare": engine.removesuffix("/v1")}
    samples, unsupported = asyncio.run(rotated(engine, proxies, dialect, True, iterations=5, warmup=1))
    if dialect == "anthropic":
        assert list(unsupported) == ["bare"] and unsupported["bare"].startswith("HTTP 404")
        assert set(samples) == {"direct_ms", "k3_ms", "k3_added_ms"}
    else:
        assert unsupported == {}
        assert set(samples) == {"direct_ms", "k3_ms", "k3_added_ms", "bare_ms", "bare_added_ms"}
    assert all(len(v) == 5 for v in samples.values())
    assert all(t > 0 for t in samples["direct_ms"] + samples["k3_ms"])
    assert samples["k3_added_ms"] == [
        p - d for p, d in zip(samples["k3_ms"], samples["direct_ms"], strict=True)
    ]


def test_without_litellm_the_runner_says_how_to_get_it(tmp_path):
    try:
        importlib.metadata.version("litellm")
        pytest.skip("LiteLLM is installed here")
    except importlib.metadata.PackageNotFoundError:
        pass
    result = CliRunner().invoke(main, ["proxy-peers", "--results", str(tmp_path)])
    assert result.exit_code == 1 and "nox -s bench-proxy-peers" in result.output
    assert not list(tmp_path.rglob("*.json"))
