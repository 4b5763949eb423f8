import json
import random
import statistics

import numpy as np
import pytest

from harness.receipt import (
    SCHEMA,
    ReceiptError,
    content_hash,
    load_receipt,
    resolve_field,
    summarize,
)


def test_written_receipt_round_trips_with_every_field(make_receipt):
    values = [random.uniform(10, 20) for _ in range(11)]
    path = make_receipt(
        suite="decode", name="tiny b1", samples={"tok_s": values}, units={"tok_s": "tok/s"},
        derived={"fraction_of_roofline": 0.5}, notes="synthetic weights", memory={"cap_gib": 1.0},
    )  # fmt: skip
    assert path.parent.name == "cpu-2c-Test-CPU" and path.parent.parent.name == "decode"
    assert path.name.endswith("-tiny_b1.json")
    receipt = load_receipt(path)
    assert receipt["schema"] == SCHEMA
    assert receipt["samples"]["tok_s"] == values
    assert receipt["summary"]["tok_s"]["median"] == statistics.median(values)
    assert receipt["summary"]["tok_s"]["n"] == 11
    assert receipt["derived"] == {"fraction_of_roofline": 0.5}
    assert receipt["memory_cap"] == {"cap_gib": 1.0}
    assert receipt["sha256"] == content_hash(receipt)
    assert resolve_field(receipt, "summary.tok_s.median") == receipt["summary"]["tok_s"]["median"]


def test_summary_statistics_match_numpy():
    values = [random.gauss(5, 2) for _ in range(101)]
    stats = summarize(values)
    assert stats["p10"] == pytest.approx(np.percentile(values, 10))
    assert stats["p90"] == pytest.approx(np.percentile(values, 90))
    assert stats["min"] == min(values) and stats["max"] == max(values)
    assert stats["stdev"] == pytest.approx(np.std(values, ddof=1))
    assert summarize([3.0])["stdev"] == 0.0


def test_numpy_samples_are_accepted(make_receipt):
    path = make_receipt(samples={"x": list(np.linspace(1, 2, 5, dtype=np.float32))}, units={"x": "ms"})
    assert load_receipt(path)["summary"]["x"]["n"] == 5


def rewrite(path, mutate, rehash=True):
    receipt = json.loads(path.read_text())
    mutate(receipt)
    if rehash:
        receipt["sha256"] = content_hash(receipt)
    path.write_text(json.dumps(receipt))


@pytest.mark.parametrize(
    ("mutate", "field", "message"),
    [
        (lambda r: r.pop("config"), "config", "missing"),
        (lambda r: r.update(notes=3), "notes", "expected str"),
        (lambda r: r.update(schema="local-kimi.receipt/99"), "schema", "unknown schema"),
        (lambda r: r["samples"].update(encode_us=[]), "samples.encode_us", "non-empty list"),
        (lambda r: r["samples"].update(encode_us=["1"]), "samples.encode_us", "numbers"),
        (lambda r: r["units"].clear(), "units.encode_us", "unit"),
        (lambda r: r["summary"]["encode_us"].update(median=0.0), "summary.encode_us", "raw samples"),
        (lambda r: r["derived"].update(x="fast"), "derived.x", "number"),
        (lambda r: r["hardware"].pop("hardware_id"), "hardware.hardware_id", "missing"),
    ],
)
def test_each_defect_is_named(make_receipt, mutate, field, message):
    path = make_receipt()
    rewrite(path, mutate)
    with pytest.raises(ReceiptError, match=message) as info:
        load_receipt(path)
    assert info.value.field == field and info.value.path == str(path)


def test_an_edited_value_breaks_the_hash(make_receipt):
    path = make_receipt()
    rewrite(path, lambda r: r["config"].update(seed=1.0), rehash=False)
    with pytest.raises(ReceiptError, match="sha256"):
        load_receipt(path)


def test_unreadable_file_is_named(tmp_path):
    bad = tmp_path / "broken.json"
    bad.write_text("{not json")
    with pytest.raises(ReceiptError, match="broken.json"):
        load_receipt(bad)


# Values where the standard library's spelling differs from orjson's unless the fallback corrects it.
AWKWARD = [1e-5, -1.5000000000000002e-05, 1e-7, 1e-10, 5e-324, 1e16, -0.0, 0.1, 1e300, 123.456, 2**62]


def test_stdlib_json_writes_orjson_bytes():
    orjson = pytest.importorskip("orjson")
    from harness import json_bytes

    rng = random.Random(7)
    floats = AWKWARD + [rng.uniform(-1, 1) * 10.0 ** rng.randint(-30, 30) for _ in range(2000)]
    doc = {
        "z": floats, "a": {"nested": [{}, [], None, True, False, "é \u2028 \" \\ \n \x01 \x7f 😀"]},
        "nan": float("nan"), "inf": [float("inf"), -float("inf")], "np": np.float32(0.25), "arr": np.arange(3),
        "tuple": (1, 2.5), "": 0,
    }  # fmt: skip
    for indent in (False, True):
        option = orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY | (orjson.OPT_INDENT_2 if indent else 0)
        assert json_bytes.stdlib_dumps(doc, indent=indent) == orjson.dumps(doc, option=option)


def test_receipts_are_identical_with_and_without_orjson(make_receipt, monkeypatch):
    pytest.importorskip("orjson")
    from datetime import UTC, datetime

    from harness import json_bytes
    from harness.receipt import write_receipt
    from tests.harness.conftest import HARDWARE

    fields = dict(
        config={"seed": 0.5, "small": 1e-5, "tiny": 3e-7, "launch": (64, 256)},
        samples={"t_ms": AWKWARD[:6] + [2.5]}, units={"t_ms": "ms"}, derived={"x": 1e-6},
        hardware=HARDWARE, command=["test"], created=datetime(2026, 12, 1, tzinfo=UTC),
    )  # fmt: skip
    with_orjson = write_receipt("s", "a@b=c", results_dir=make_receipt.results / "1", **fields)
    monkeypatch.setattr(json_bytes, "orjson", None)
    without = write_receipt("s", "a@b=c", results_dir=make_receipt.results / "2", **fields)
    assert with_orjson.read_bytes() == without.read_bytes()
    assert load_receipt(without)["sha256"] == load_receipt(with_orjson)["sha256"]
    assert with_orjson.name.endswith("-a_b_c.json")  # transfer-safe: letters, digits, '.', '_', '-'


def test_receipts_named_with_at_and_equals_still_load(make_receipt, tmp_path):
    old = make_receipt(name="probe")
    legacy = old.with_name(old.name.replace("probe", "op.v@shape:B1=x"))
    old.rename(legacy)
    assert load_receipt(legacy)["name"] == "probe"
