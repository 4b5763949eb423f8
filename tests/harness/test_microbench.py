"""`kimi-harness import-benchmark`: pytest-benchmark JSON -> valid `micro` receipts, report and figure."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.figures import build_all
from harness.microbench import BenchmarkJSONError, receipts_from_runs
from harness.receipt import load_receipt, receipt_paths
from harness.report import render

FIXTURE = Path(__file__).parent / "fixtures" / "pytest_benchmark.json"


def _fixture() -> dict:
    return json.loads(FIXTURE.read_text())


def _import(tmp_path: Path, *files: Path) -> tuple[Path, list[dict]]:
    results = tmp_path / "results"
    result = CliRunner().invoke(main, ["import-benchmark", *map(str, files), "--results", str(results)])
    assert result.exit_code == 0, result.output
    return results, [load_receipt(p) for p in receipt_paths(results)]


def test_import_writes_one_valid_receipt_per_case(tmp_path):
    data = _fixture()
    results, receipts = _import(tmp_path, FIXTURE)
    by_name = {r["name"]: r for r in receipts}
    assert set(by_name) == {"k3.turn.chat.parse", "k3.deltas.tools.hermes"}
    for bench in data["benchmarks"]:
        receipt = by_name[bench["extra_info"]["case"]]
        assert receipt["suite"] == "micro"
        assert receipt["samples"]["call_us"] == pytest.approx([t * 1e6 for t in bench["stats"]["data"]])
        assert receipt["units"]["call_us"] == "µs"
        assert receipt["config"]["area"] == "k3" and "case" not in receipt["config"]
        assert receipt["config"]["pytest_benchmark"]["fullname"] == bench["fullname"]
        # machine_info and commit_info -> the hardware descriptor and commit
        assert receipt["hardware"]["hardware_id"] == "cpu-2c-AMD-EPYC"
        assert receipt["hardware"]["cpu"]["logical_cores"] == data["machine_info"]["cpu"]["count"]
        assert receipt["hardware"]["git"] == {"commit": data["commit_info"]["id"], "dirty": False}
        assert receipt["created"].startswith(data["datetime"][:19])
        assert "run_spread_pct" not in receipt["derived"]  # one run: no run-to-run spread
        assert receipt["derived"]["best_run_median_us"] == receipt["summary"]["call_us"]["median"]
    hermes = by_name["k3.deltas.tools.hermes"]
    assert hermes["derived"]["per_delta_us"] == pytest.approx(hermes["summary"]["call_us"]["median"] / 90)
    assert "Microbenchmarks" in render(results) and "k3.turn.chat.parse" in render(results)


def test_py_cpuinfos_flags_name_the_vector_tier():
    data = _fixture()
    data["machine_info"]["cpu"]["flags"] = ["avx", "avx2", "fma", "avx512f", "avx512_bf16"]
    (receipt, *_) = receipts_from_runs([(data, "x.json")])
    assert receipt["hardware"]["cpu"]["vector_flags"] == ["avx2", "fma", "avx512f", "avx512_bf16"]
    assert receipt["hardware"]["hardware_id"] == "cpu-2c-AMD-EPYC-avx512bf16"


def test_the_projects_descriptor_is_kept_when_the_benchmarks_recorded_it():
    data = _fixture()
    data["machine_info"]["local_kimi"] = {"hardware_id": "NVIDIA-H200", "gpus": [{"name": "NVIDIA H200"}]}
    (receipt, *_) = receipts_from_runs([(data, "x.json")])
    assert receipt["hardware"]["hardware_id"] == "NVIDIA-H200"
    assert receipt["hardware"]["git"]["commit"] == data["commit_info"]["id"]


def test_repeated_runs_make_one_receipt_per_case_with_their_spread(tmp_path):
    slower = _fixture()
    for bench in slower["benchmarks"]:
        bench["stats"]["data"] = [t * 1.25 for t in bench["stats"]["data"]]
    second = tmp_path / "run2.json"
    second.write_text(json.dumps(slower))
    _, receipts = _import(tmp_path, FIXTURE, second)
    assert len(receipts) == 2
    for receipt in receipts:
        assert receipt["summary"]["call_us"]["n"] == 14
        assert receipt["derived"]["run_spread_pct"] == pytest.approx(25.0)
        first = next(b for b in _fixture()["benchmarks"] if b["extra_info"]["case"] == receipt["name"])
        best = sorted(first["stats"]["data"])[3] * 1e6  # the faster run's median (7 rounds)
        assert receipt["derived"]["best_run_median_us"] == pytest.approx(best)
        assert receipt["config"]["pytest_benchmark"]["runs"] == 2


def test_the_turn_figure_stacks_each_dialects_steps(tmp_path):
    results, receipts = _import(tmp_path, FIXTURE)
    figure = build_all(results)["proxy_turn_steps"]
    (bar,) = figure["bars"]
    parse = next(r for r in receipts if r["name"] == "k3.turn.chat.parse")
    assert bar["parts"] == {"parse": parse["summary"]["call_us"]["median"]}
    assert bar["label"].startswith("chat (opencode/tool/2)")


@pytest.mark.parametrize(
    "spoil, message",
    [
        (lambda d: d["benchmarks"][0]["stats"].pop("data"), "--benchmark-save-data"),
        (lambda d: d.pop("benchmarks"), "not pytest-benchmark JSON"),
        (lambda d: d["benchmarks"].clear(), "no benchmark cases"),
        (lambda d: d["benchmarks"].append(copy.deepcopy(d["benchmarks"][0])), "two cases are named"),
    ],
)
def test_unusable_json_is_refused_with_the_reason(tmp_path, spoil, message):
    data = _fixture()
    spoil(data)
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(data))
    with pytest.raises(BenchmarkJSONError, match=message):
        receipts_from_runs([(data, str(path))])
    result = CliRunner().invoke(main, ["import-benchmark", str(path), "--results", str(tmp_path / "r")])
    assert result.exit_code == 1 and message in result.output
    assert not (tmp_path / "r").exists()  # nothing half-written


def test_runs_of_another_commit_are_not_merged(tmp_path):
    other = _fixture()
    other["commit_info"]["id"] = "f" * 40
    with pytest.raises(BenchmarkJSONError, match="another machine or commit"):
        receipts_from_runs([(_fixture(), "a.json"), (other, "b.json")])
