import json
import random

from harness import figures, report


def test_report_has_a_section_per_suite_and_names_each_receipt(make_receipt):
    old = make_receipt(suite="proxy", name="anthropic.stream")
    new = make_receipt(suite="proxy", name="anthropic.stream")
    other = make_receipt(suite="harness", name="probe")
    page = report.render(make_receipt.results)
    assert page.index("## Proxy overhead") < page.index("## Harness self-check")  # fixed suite order
    assert new.name in page and other.name in page
    assert old.name not in page  # only the newest per (suite, name, hardware)
    assert "cpu-2c-Test-CPU" in page and "`0123456789`" in page
    assert "from 3 receipts" in page


def test_report_numbers_come_from_the_receipt(make_receipt):
    path = make_receipt(samples={"ms": [1.0, 2.0, 4.0]}, units={"ms": "ms"}, derived={"ratio": 0.25})
    page = report.render(make_receipt.results)
    row = next(line for line in page.splitlines() if path.name in line and "| ms |" in line)
    assert "| 2 |" in row and "| 3 |" in row  # median 2 of n 3
    assert "| ratio | 0.25 |" in page


def test_report_is_stable_and_empty_results_say_so(tmp_path, make_receipt):
    assert "No receipts yet." in report.render(tmp_path / "nothing")
    make_receipt()
    assert report.render(make_receipt.results) == report.render(make_receipt.results)


def test_number_format():
    assert report.fmt(113.83) == "113.8"
    assert report.fmt(12345.6) == "12,346"
    assert report.fmt(0.012345) == "0.0123"


def test_figures_are_byte_identical_when_regenerated(tmp_path, make_receipt):
    make_receipt(name="a")
    make_receipt(name="b")
    first = figures.write_all(make_receipt.results, tmp_path / "f1")
    second = figures.write_all(make_receipt.results, tmp_path / "f2")
    assert [p.name for p in first] == [
        "harness_selfcheck.png",
        "harness_selfcheck.pdf",
        "harness_selfcheck.json",
    ]
    for a, b in zip(first, second, strict=True):
        assert a.read_bytes() == b.read_bytes(), a.name


def test_figure_data_is_taken_from_the_receipts(tmp_path, make_receipt):
    path = make_receipt(name="only", samples={"encode_us": [1.0, 3.0, 5.0]})
    figures.write_all(make_receipt.results, tmp_path)
    data = json.loads((tmp_path / "harness_selfcheck.json").read_text())
    (bar,) = data["bars"]
    assert bar["median"] == 3.0 and bar["unit"] == "µs" and bar["receipt"].endswith(path.name)


def test_no_receipts_no_figures(tmp_path):
    assert figures.write_all(tmp_path / "none", tmp_path / "out") == []


def test_peer_comparison_has_a_bar_per_proxy_that_answered(tmp_path):
    from harness.receipt import write_receipt
    from tests.harness.conftest import HARDWARE

    results = tmp_path / "results"
    k3 = [random.uniform(0.5, 1.5) for _ in range(9)]
    peer = [random.uniform(5, 15) for _ in range(9)]
    for name, samples in [("peers.anthropic.json", {"k3_added_ms": k3, "litellm_added_ms": peer}),
                          ("peers.responses.json", {"k3_added_ms": k3})]:  # fmt: skip
        write_receipt(
            "proxy", name, config={"peers": {"litellm": {"version": "0"}}}, samples=samples,
            units={k: "ms" for k in samples}, results_dir=results, hardware=HARDWARE, command=["test"],
        )  # fmt: skip
    data = figures.build_all(results)["proxy_vs_peers"]
    labels = [bar["label"].split("\n")[0] for bar in data["bars"]]
    assert labels == ["anthropic.json · k3", "anthropic.json · litellm", "responses.json · k3"]
    assert data["bars"][1]["median"] == sorted(peer)[4]
    assert "proxy_overhead" not in figures.build_all(results)  # peer receipts carry no added_ms


def _decode_receipt(results, hardware=None, weights="synthetic weights"):
    from harness.receipt import write_receipt
    from tests.harness.conftest import HARDWARE

    cfg = {"model": "synthetic-small", "dtype": "fp32", "batch": 1, "context": 17, "plan": None}
    if weights is not None:
        cfg["weights"] = weights
    samples = {"decode_tok_s": [9.0, 10.0, 11.0], "ttft_ms": [180.0, 182.0, 184.0]}
    return write_receipt(
        "decode", "synthetic-small.fp32.ctx17.b1", config=cfg, samples=samples,
        units={"decode_tok_s": "tok/s", "ttft_ms": "ms"}, derived={"fraction_of_roofline": 0.25,
        "roofline_tok_s": 40.0}, results_dir=results, hardware=hardware or HARDWARE, command=["test"],
    )  # fmt: skip


def test_results_open_with_a_summary_row_per_configuration(tmp_path, make_receipt):
    import json

    path = _decode_receipt(make_receipt.results, weights=None)  # an old receipt: no `weights` field
    make_receipt()
    page = report.render(make_receipt.results)
    sections = [line for line in page.splitlines() if line.startswith("## ")]
    assert sections[0] == "## Summary"
    row = next(line for line in page.splitlines() if line.startswith("| decode: synthetic-small"))
    sha = json.loads(path.read_text())["sha256"][:7]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:5] == ["decode: synthetic-small, dense, FP32, batch 1, context 17", "cpu-2c-Test-CPU",
                         "random (stress test)", "10", "25%"]  # fmt: skip
    assert (
        cells[6] == "182" and cells[-1] == f"[`{sha}`]({path.relative_to(make_receipt.results).as_posix()})"
    )
    assert "†" not in page


def test_summary_marks_dirty_receipts_and_lists_what_is_not_measured(tmp_path):
    from tests.harness.conftest import HARDWARE

    results = tmp_path / "results"
    _decode_receipt(results, hardware=HARDWARE | {"git": {"commit": "abc", "dirty": True}})
    page = report.render(results)
    row = next(line for line in page.splitlines() if line.startswith("| decode: "))
    assert "†`]" in row and "the audit refuses it" in page
    gaps = page[page.index("### Not measured yet") :]
    assert "No GPU receipts at all" in gaps and "Prefill (`prefill`): no receipts yet." in gaps
    assert "Decode throughput (`decode`): random weights only" in gaps

    gpu = HARDWARE | {"hardware_id": "NVIDIA-H200", "gpus": [{"name": "NVIDIA H200"}]}
    _decode_receipt(results, hardware=gpu, weights="moonshotai/Kimi-Linear-48B-A3B-Instruct")
    gaps = report.render(results).split("### Not measured yet")[1]
    assert "No GPU receipts at all" not in gaps and "Decode throughput (`decode`)" not in gaps
    assert "Kernels (`kernels`): no receipts yet." in gaps
