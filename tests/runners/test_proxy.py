import random

from click.testing import CliRunner

from harness.receipt import load_receipt, write_receipt
from runners import proxy, proxy_load
from runners.cli import main
from tests.runners.runner_support import run_for_receipts


def test_proxy_runner_writes_receipts_for_every_mode(tmp_path):
    written = run_for_receipts(
        ["proxy", "--iterations", "6", "--warmup", "1", "--clients", "1,3", "--load-seconds", "1",
         "--warm-streams", "20"],
        tmp_path,
    )  # fmt: skip
    receipts = {r["name"]: r for r in written}
    for mode in ("asgi", "sockets"):
        for dialect in ("anthropic", "chat", "responses"):
            for kind in ("json", "stream"):
                r = receipts.pop(f"{mode}.{dialect}.{kind}")
                assert len(r["samples"]["added_ms"]) == len(r["samples"]["direct_ms"]) > 0
                assert all(d > 0 for d in r["samples"]["direct_ms"])
                if mode == "sockets" and kind == "stream":
                    assert "added_us_per_event" in r["derived"]
    for kind in ("raw", "httpx"):
        for clients in (1, 3):
            r = receipts.pop(f"load.anthropic.stream.{kind}.c{clients}")
            assert r["config"]["clients"] == clients and r["config"]["client"] == kind
            assert r["derived"]["errors"] == 0 and r["derived"]["turns_per_s"] > 0
            assert r["derived"]["served_before"] >= 20  # the warm-up ran first, on the same k3
            assert 0 < r["derived"]["k3_cpu_ms_per_turn"] < 1e3
            assert r["summary"]["latency_ms"]["n"] == r["derived"]["turns_per_s"] * r["config"]["seconds"]
            assert r["summary"]["rss_mib"]["median"] > 10
    assert not receipts


def test_unknown_mode_is_refused(tmp_path):
    result = CliRunner().invoke(main, ["proxy", "--modes", "asgi,carrier-pigeon", "--results", str(tmp_path)])
    assert result.exit_code == 2 and "carrier-pigeon" in result.output


def test_proxy_gate_compares_with_committed_receipts(tmp_path):
    runner = CliRunner()
    args = ["--iterations", "4", "--results", str(tmp_path)]
    load = ["--warm-streams", "30", "--load-seconds", "0.5"]
    quiet = runner.invoke(main, ["proxy-gate", *args, *load, "--load-floor", "0"])
    assert quiet.exit_code == 0 and "nothing to compare against" in quiet.output
    baseline = runner.invoke(
        main, ["proxy", "--modes", "asgi,sockets", "--warmup", "1", "--no-regenerate", *args]
    )
    assert baseline.exit_code == 0, baseline.output
    generous = runner.invoke(
        main, ["proxy-gate", *args, *load, "--load-floor", "0", "--max-regression", "1e6",
               "--max-regression-sockets", "1e6"]
    )  # fmt: skip
    assert generous.exit_code == 0, generous.output
    assert generous.output.count("— ok") == 5  # the load check and the four gated cases
    # A baseline where k3 added 10 ns a turn: any real measurement lies beyond the allowance and wholly
    # outside the bootstrap interval, so the gate must fail.
    for path in sorted(tmp_path.glob("proxy/*/*.json")):
        receipt = load_receipt(path)
        n = len(receipt["samples"]["added_ms"])
        write_receipt(
            "proxy", receipt["name"], config=receipt["config"], results_dir=tmp_path, units=receipt["units"],
            samples=receipt["samples"] | {"added_ms": [1e-5] * n},
            derived=receipt["derived"] | {"added_median_us": 0.01}, command=["test"],
        )  # fmt: skip
    strict = runner.invoke(main, ["proxy-gate", "--iterations", "8", "--results", str(tmp_path), *load,
                                  "--load-floor", "0"])  # fmt: skip
    assert strict.exit_code != 0 and "REGRESSED" in strict.output and "CI [" in strict.output


def test_proxy_gate_fails_when_k3_does_not_hold_load(tmp_path):
    # No run reaches 1e6 times the 4-client rate with 32 clients: the load check must be able to fail.
    result = CliRunner().invoke(
        main, ["proxy-gate", "--iterations", "4", "--results", str(tmp_path), "--warm-streams", "30",
               "--load-seconds", "0.5", "--load-floor", "1e6", "--confirm", "1", "--confirm-pause", "0"],
    )  # fmt: skip
    assert result.exit_code != 0
    assert "COLLAPSED" in result.output and "load collapsed with 32 clients" in result.output
    assert (
        "confirming the load ratio (1/1)" in result.output
    )  # a persistent collapse fails every confirmation


def test_a_one_off_dip_under_the_load_floor_passes_on_confirmation(tmp_path, monkeypatch):
    # The two 32-client rounds of the first measurement keep a tenth of their turns, as a burst of load on
    # the machine would: that measurement lands under the floor, the confirmation (real rates) over it.
    real = proxy_load.measure_level
    dipped = []

    def first_32_client_round_dips(kind, base, clients, seconds, k3):
        level = real(kind, base, clients, seconds, k3)
        if clients == 32 and len(dipped) < 2:
            dipped.append(True)
            level.latencies_ms = level.latencies_ms[: len(level.latencies_ms) // 10]
        return level

    monkeypatch.setattr(proxy_load, "measure_level", first_32_client_round_dips)
    # No warm-up streams: they run through measure_level too, and the dip belongs to the measurement.
    args = ["--iterations", "4", "--results", str(tmp_path), "--warm-streams", "0", "--load-seconds", "0.5",
            "--load-floor", "0.3", "--confirm", "2", "--confirm-pause", "0"]  # fmt: skip
    result = CliRunner().invoke(main, ["proxy-gate", *args])
    assert result.exit_code == 0, result.output
    assert result.output.count("— COLLAPSED") == 1 and "confirming the load ratio (1/2)" in result.output
    assert "(2/2)" not in result.output


def _receipt(direct_ms: list[float], added_ms: list[float]) -> dict:
    added_sorted = sorted(added_ms)
    return {"samples": {"direct_ms": direct_ms, "added_ms": added_ms},
            "derived": {"added_median_us": added_sorted[len(added_sorted) // 2] * 1e3}}  # fmt: skip


def test_the_latency_gate_divides_out_a_slower_machine_but_not_a_slower_k3():
    gen = random.Random(7)
    direct = [0.14 + gen.random() * 0.02 for _ in range(301)]
    added = [0.075 + gen.random() * 0.01 for _ in range(301)]
    base = _receipt(direct, added)
    # The whole machine twice as slow: the direct turns (no k3 code) and k3's added time alike.
    slow_host = _receipt([2 * t for t in direct], [2 * t for t in added])
    factor, result = proxy.judge_added_latency(base, slow_host, 75.0)
    assert abs(factor - 2.0) < 1e-9 and not result.regressed
    # k3 itself twice as slow on the same machine: still a regression.
    factor, result = proxy.judge_added_latency(base, _receipt(direct, [2 * t for t in added]), 75.0)
    assert factor == 1.0 and result.regressed
    # A faster machine never makes a regression look smaller.
    assert proxy.machine_factor(base, _receipt([t / 2 for t in direct], added)) == 1.0
