"""`kimi-engine kernels --compile`: the engine's real launches compiled for sm_90 here, without a GPU."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.kernel_tools.aot import _weight_load_bits, loop_facts, parse_targets
from engine.kernels import registry

REPO = Path(__file__).resolve().parents[2]
# Compiles in a child: the test process may have TRITON_INTERPRET set (then nothing compiles).
COMPILE = """
import json
from engine.kernel_tools import aot
from engine.model import preset
print(json.dumps([{"kernel": r.kernel, "constexprs": r.constexprs, "used_by": r.used_by, "defects": r.defects,
                   "spills": r.spills, "weight_load_bits": r.weight_load_bits,
                   "per_byte": r.loop_instructions_per_weight_byte}
                  for r in aot.compile_for(preset("full"), 90)]))
"""


@pytest.fixture(scope="module")
def sm90_reports():
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "KIMI_KERNELS")}
    run = subprocess.run(
        [sys.executable, "-c", COMPILE], cwd=REPO, env={**env, "PYTHONPATH": str(REPO)},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.splitlines()[-1])


@pytest.mark.slow
def test_every_triton_variant_is_captured_at_both_batches(sm90_reports):
    used = {u.split("@")[0] for r in sm90_reports for u in r["used_by"]}
    wanted = {f"{op.name}.{v.name}" for op in registry.operations() for v in registry.variants(op.name)}
    wanted = {w for w in wanted if registry.variant(*w.split(".")).backend == "triton"}
    assert used == wanted
    assert all(r["spills"] == 0 for r in sm90_reports)


GEMV_KERNELS = ("_gemv_kernel", "_grouped_swiglu_kernel")


def _quantised(report):
    return report["kernel"] in GEMV_KERNELS and report["constexprs"].get("FMT", 0) != 2


@pytest.mark.slow
def test_quantised_gemvs_have_no_spill_scalar_weight_load_or_loop_barrier(sm90_reports):
    checked = [r for r in sm90_reports if _quantised(r)]
    assert checked and all(r["weight_load_bits"] == 128 for r in checked)
    assert [r for r in checked if r["defects"]] == []


@pytest.mark.slow
def test_int4_loops_take_under_nine_instructions_per_weight_byte(sm90_reports):
    """Per-group sums and one scale multiply per group (it was 10.6 with a multiply per word)."""
    int4 = [r for r in sm90_reports if r["kernel"] in GEMV_KERNELS and r["constexprs"].get("FMT", 0) == 0]
    assert int4 and all(r["per_byte"] is not None and r["per_byte"] < 9.0 for r in int4)


@pytest.mark.slow
def test_dense_gemv_has_no_loop_barrier(sm90_reports):
    dense = [r for r in sm90_reports if r["constexprs"].get("FMT") == 2]
    assert dense and [r["defects"] for r in dense if r["defects"]] == []


PTX = """
.visible .entry k(
$L__BB0_1:
    ld.global.v4.b32 {%r1, %r2, %r3, %r4}, [%rd1];
    ld.global.L1::evict_last.b16 %rs1, [%rd2];
    bar.sync 0;
    @%p1 bra $L__BB0_1;
    ld.global.b32 %r9, [%rd3];
    bar.sync 0;
"""


def test_loop_loads_and_barriers_are_read_from_the_ptx():
    loads, barriers = loop_facts(PTX)
    assert loads == {"ld.global.v4.b32": 1, "ld.global.b16": 1} and barriers == 1
    assert _weight_load_bits(loads, 32) == 128
    assert _weight_load_bits({"ld.global.b32": 2, "ld.global.v4.b32": 1}, 32) == 32  # one scalar load
    assert loop_facts(PTX.replace("@%p1 bra $L__BB0_1;", "")) == ({}, 0)


def test_targets_are_parsed_with_a_clear_error():
    assert parse_targets("sm_90, sm_89") == [90, 89] and parse_targets("80") == [80]
    with pytest.raises(ValueError, match="'hopper' is not a CUDA target"):
        parse_targets("sm_90,hopper")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run(
        [sys.executable, "-m", "engine", "kernels", "--compile", "gpu"], cwd=REPO,
        env={**env, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 2 and "'gpu' is not a CUDA target" in run.stderr
