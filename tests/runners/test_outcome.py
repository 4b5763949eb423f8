from harness.receipt import write_receipt
from runners.outcome import report


def _receipt(tmp_path, name, disturbed):
    hardware = {"hardware_id": "cpu-test", "load": {"disturbed": disturbed, "others_cpu_pct": 180.0,
                "busy_others": [{"name": "python -m pytest", "cpu_pct": 90.0}], "loadavg": [9.0, 8.0, 7.0],
                "cpu_steal_pct": 0.0}}  # fmt: skip
    return write_receipt(
        "decode", name, results_dir=tmp_path, config={}, samples={"decode_tok_s": [10.0, 12.0, 11.0]},
        units={"decode_tok_s": "tok/s", "engine_over_llama": "ratio"}, derived={"engine_over_llama": 1.25},
        hardware=hardware,
    )  # fmt: skip


def test_a_runner_ends_with_its_results_and_says_when_the_machine_was_busy(tmp_path, capsys):
    quiet = _receipt(tmp_path, "quiet.run", False)
    report([quiet])
    out = capsys.readouterr()
    assert "results on cpu-test" in out.out and "quiet.run" in out.out
    assert "engine_over_llama 1.25 ratio" in out.out and "decode_tok_s 11 tok/s (median)" in out.out
    assert str(quiet) in out.out and "WARNING" not in out.err
    report([quiet, _receipt(tmp_path, "busy.run", True)])
    err = capsys.readouterr().err
    assert "WARNING: the machine was busy with other work during 1 of 2 receipts" in err
    assert "python -m pytest 90%" in err
