import json

import gguf
import numpy as np
import psutil
import pytest
from click.testing import CliRunner

from engine.cli_options import default_dtype_name
from engine.kernels.defaults import SHIPPED_DEFAULTS
from engine.kernels.linear import DENSE_EXPERT_OPS
from harness import figures
from harness.receipt import load_receipt, receipt_paths
from runners.cli import main
from runners.gguf_requantize import QUANTISED, requantize_q4_0, tensor_types
from runners.llamacpp import INT4, engine_runs, prepare_models
from runners.llamacpp_tools import build_dir

TOOLS = build_dir() / "bin"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return prepare_models("tiny", 5, tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def f16_gguf(models):
    return models.gguf["f16"]


def test_the_models_are_built_once_and_the_int4_artifact_quantises_the_same_checkpoint(models):
    manifest = json.loads((models.artifact / "manifest.json").read_text())
    assert manifest["plan"] == INT4.to_json() and INT4.name == "default" and INT4.group_size == 32
    assert manifest["source"]["path"] == str(models.checkpoint)
    stamp = (models.artifact / "manifest.json").stat().st_mtime_ns
    assert prepare_models("tiny", 5, models.checkpoint.parent.parent) == models
    assert (models.artifact / "manifest.json").stat().st_mtime_ns == stamp  # reused, not rebuilt
    assert models.tensor_types["q4_0"]["Q4_0"] > 0 and "Q4_0" not in models.tensor_types["f16"]


def test_the_engine_runs_the_checkpoint_and_its_int4_artifact_through_the_runtime(models):
    runs = {
        kind: engine_runs(
            models.engine_weights(kind), prompt=6, gen=3, repeats=2, device="cpu", dtype="fp32", seed=1
        )
        for kind in ("dense", "int4")
    }
    dense_ops = ("w16a16_gemv", *DENSE_EXPERT_OPS)
    assert runs["dense"].kernel_variants == {op: SHIPPED_DEFAULTS["cpu"][op] for op in dense_ops}
    cpu_defaults = {op: SHIPPED_DEFAULTS["cpu"][op] for op in runs["int4"].kernel_variants}
    assert runs["int4"].kernel_variants == cpu_defaults and "int4pack" in cpu_defaults.values()
    for run in runs.values():
        assert len(run.samples["decode_ms"]) == 2 * 3 and len(run.samples["decode_tok_s"]) == 2
        assert min(run.samples["decode_ms"]) > 0 and min(run.samples["prefill_tok_s"]) > 0
        assert "eager static-buffer step" in run.method  # KIMI_DECODE_STEP=eager in the tests
        assert run.decode_step == "eager" and run.compile_s is None


def test_q4_0_copy_quantises_the_plan_tensors_within_one_step_and_copies_the_rest(f16_gguf, tmp_path):
    counts = requantize_q4_0(f16_gguf, tmp_path / "q4.gguf")
    assert counts == tensor_types(tmp_path / "q4.gguf") and counts["Q4_0"] > 0
    src, dst = gguf.GGUFReader(f16_gguf), gguf.GGUFReader(tmp_path / "q4.gguf")
    assert dst.get_field("general.file_type").contents() == gguf.LlamaFileType.MOSTLY_Q4_0
    assert (
        dst.get_field("kimi-linear.expert_count").contents()
        == src.get_field("kimi-linear.expert_count").contents()
    )
    names = {t.name for t in dst.tensors if t.tensor_type == gguf.GGMLQuantizationType.Q4_0}
    assert "blk.1.ffn_down_exps.weight" in names and "blk.0.attn_q.weight" in names
    assert "output.weight" not in names and "token_embd.weight" not in names  # the plan keeps them 16-bit
    for a, b in zip(src.tensors, dst.tensors, strict=True):
        assert a.name == b.name
        if a.name not in names:
            assert a.tensor_type == b.tensor_type and np.array_equal(a.data, b.data)
            continue
        assert QUANTISED.match(a.name) and a.tensor_type == gguf.GGMLQuantizationType.F16
        x = a.data.astype(np.float32)
        back = gguf.quants.dequantize(b.data, gguf.GGMLQuantizationType.Q4_0).reshape(x.shape)
        # One step of the block's scale (= its largest magnitude / 8) bounds the error; FP16 scale rounding aside.
        blocks = np.abs(x).reshape(-1, 32).max(-1, keepdims=True) / 8
        err = np.abs(back - x).reshape(-1, 32)
        assert (err <= blocks * 1.001 + 1e-7).all(), a.name
        assert err.max() > 0  # it really was quantised


@pytest.mark.skipif(
    not all((TOOLS / tool).exists() for tool in ("llama-bench", "llama-server")),
    reason=f"llama.cpp tools not built in {TOOLS} (`python -m runners llamacpp` builds them, minutes)",
)
def test_head_to_head_on_tiny_writes_engine_and_llama_receipts_and_stops_the_server(tmp_path):
    result = CliRunner().invoke(
        main,
        ["llamacpp", "--synthetic", "tiny", "--prompt", "8", "--gen", "4", "--repeats", "1", "--threads", "1",
         "--models", str(tmp_path / "models"), "--results", str(tmp_path / "results"), "--no-regenerate"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert not [p for p in psutil.Process().children(recursive=True) if "llama-server" in p.name()]
    receipts = {r["name"]: r for r in (load_receipt(p) for p in receipt_paths(tmp_path / "results"))}
    label, dtype = "synthetic-tiny.p8.n4.t1", default_dtype_name("cpu")
    engines = {"f16": f"engine.{label}.{dtype}", "q4_0": f"engine.{label}.{dtype}.int4-default"}
    assert set(receipts) == {*engines.values(), f"llama.cpp.{label}.f16", f"llama.cpp.{label}.q4_0"}
    dense, int4 = receipts[engines["f16"]], receipts[engines["q4_0"]]
    # Dense Linears (FP32 or BF16) and expert banks decode through the shipped CPU kernels.
    dense_gemv = {op: SHIPPED_DEFAULTS["cpu"][op] for op in ("w16a16_gemv", *DENSE_EXPERT_OPS)}
    assert dense["config"]["kernel_variants"] == dense_gemv and dense["config"]["quant"] is None
    assert int4["config"]["quant"]["name"] == "default" and int4["config"]["quant"]["group_size"] == 32
    assert int4["config"]["kernel_variants"]["w4a16_grouped_swiglu"] == "cpp"  # the CPU defaults
    assert int4["config"]["kernel_variants"]["w4a16_gemv"] == "int4pack"
    assert "int4pack kernels" in int4["notes"] and "C++ CPU kernels" in int4["notes"]
    for engine in (dense, int4):
        assert len(engine["samples"]["decode_ms"]) == 4 and "synthetic weights" in engine["notes"]
        assert "engine.runtime.Engine" in engine["config"]["engine"]
    for kind in ("f16", "q4_0"):
        r, engine = receipts[f"llama.cpp.{label}.{kind}"], receipts[engines[kind]]
        cfg, d = r["config"], r["derived"]
        assert cfg["gguf_type"] == kind and cfg["threads"] == 1 and cfg["n_gpu_layers"] == 0
        assert cfg["engine"]["receipt_name"] == engine["name"]
        assert "0c1e570" in cfg["llama_cpp"]
        for metric in ("pp_tok_s", "tg_tok_s", "server_prompt_tok_s", "server_decode_tok_s"):
            assert len(r["samples"][metric]) == 1 and r["samples"][metric][0] > 0
        assert d["engine_decode_tok_s"] == engine["summary"]["decode_tok_s"]["median"]
        assert (
            d["engine_over_llama_bench_decode"]
            == d["engine_decode_tok_s"] / r["summary"]["tg_tok_s"]["median"]
        )
    assert "Q4_0 differs" in receipts[f"llama.cpp.{label}.q4_0"]["notes"]
    bars = figures.build_all(tmp_path / "results")["llamacpp_vs_engine"]["series"][0]["bars"]
    assert {b["name"] for b in bars if b["name"].startswith("engine")} == {
        f"engine {dtype} dense", f"engine INT4 default g32, {dtype} activations"
    }  # fmt: skip
