"""INT4 weights in the runtime: artifacts from `kimi-engine quantize` and synthetic models quantised in
memory load through `Engine.load`, are sized at their packed bytes by the memory plan, carry their own
tokenizer and chat template, and decode through the static-buffer runner with the packed kernels."""

from __future__ import annotations

import pytest
import torch

from engine.kernels.defaults import SHIPPED_DEFAULTS
from engine.model import KimiLinearForCausalLM, SamplingParams, Tokenizer, generate, preset
from engine.quant import (
    PackedExpertBank,
    PackedLinear,
    load_quantized_model,
    make_plan,
    quantized_meta_model,
    synthetic_quantized_model,
)
from engine.runtime import Engine, MemoryPlanError, ModelSourceError, open_model_source
from engine.runtime.memory import dequantize_workspace_bytes, module_bytes
from tests.runtime.runtime_support import (
    ARTIFACT_CHAT_TEMPLATE,
    decode_with_and_without_graphs,
    random_prompt,
)

OPS = ("route_combine", "w16a16_gemv", "w4a16_gemv", "w4a16_grouped_gemv", "w4a16_grouped_swiglu",
       "rms_norm", "kda_decode_step", "route_topk")  # fmt: skip
CPU_DEFAULT_KERNELS = {op: SHIPPED_DEFAULTS["cpu"][op] for op in OPS}


@pytest.fixture(scope="module")
def int4_engine(tiny_artifact):
    _, artifact = tiny_artifact
    with Engine.load(
        weights=artifact, device="cpu", dtype=torch.float32, max_context=2048, prefix_cache_gib=0
    ) as eng:
        yield eng


def test_quantize_carries_tokenizer_config_and_chat_template_into_the_artifact(tiny_artifact):
    checkpoint, artifact = tiny_artifact
    for name in (
        "config.json",
        "tiktoken.model",
        "tokenizer_config.json",
        "chat_template.jinja",
        "synthetic.json",
    ):
        assert (artifact / name).read_bytes() == (checkpoint / name).read_bytes(), name
    source = open_model_source(weights=artifact)
    assert source.artifact == artifact and source.synthetic and source.plan.name == "default"
    assert source.chat_template() == ARTIFACT_CHAT_TEMPLATE
    text = "Grüße <|im_end|> and bytes"
    assert source.tokenizer().encode(text, allow_special=True) == Tokenizer.from_dir(checkpoint).encode(
        text, allow_special=True
    )


def test_artifact_decodes_the_greedy_tokens_of_the_quantized_model(int4_engine, tiny_artifact, rng):
    """Prompt longer than DECODE_MAX_ROWS (prefill's many-row path); then every token is one step of
    the static-buffer runner, which must go through the packed kernels."""
    reference = load_quantized_model(tiny_artifact[1], device="cpu", dtype=torch.float32)
    prompt = random_prompt(rng, 37)
    expected = generate(reference, prompt, SamplingParams(max_tokens=20)).token_ids
    banks = [m for m in int4_engine.model.modules() if isinstance(m, PackedExpertBank)]
    calls = []
    for bank in banks:
        bound = bank._swiglu
        bank._swiglu = lambda x, *args, _bound=bound: calls.append(x.shape[0]) or _bound(x, *args)
    try:
        seq = int4_engine.prefill([prompt], max_new_tokens=20)
        calls.clear()  # int4pack's prefill runs the kernels too, one expert at a time
        tokens = int4_engine.decode(seq, 20)
        int4_engine.release(seq)
    finally:
        for bank in banks:
            del bank._swiglu  # back to the bound kernel
    assert tokens == [expected] and len(set(expected)) >= 3
    assert isinstance(int4_engine.model.lm_head, PackedLinear)
    assert calls == [1] * (19 * len(banks))  # one fused kernel call per bank per decode step, one row each
    assert int4_engine.kernel_variants == CPU_DEFAULT_KERNELS


def test_the_memory_plan_counts_packed_bytes(int4_engine):
    structure = quantized_meta_model(int4_engine.model.config, make_plan("default"), dtype=torch.float32)
    dense = KimiLinearForCausalLM(int4_engine.model.config, dtype=torch.float32, device="meta")
    assert int4_engine.plan.weights_bytes == module_bytes(int4_engine.model) == module_bytes(structure)
    assert int4_engine.plan.weights_bytes < module_bytes(dense)
    stored = {
        n: (t.shape, t.dtype)
        for n, t in [*int4_engine.model.named_buffers(), *int4_engine.model.named_parameters()]
    }
    assert stored == {
        n: (t.shape, t.dtype) for n, t in [*structure.named_buffers(), *structure.named_parameters()]
    }
    assert dequantize_workspace_bytes(structure) > 0 == dequantize_workspace_bytes(dense)


def test_a_cap_is_judged_against_the_full_models_packed_weights():
    """Planned on `meta` and refused before anything is allocated: dense BF16 weights of the full model
    do not fit 40 GiB at all, packed ones do, leaving room for a bounded context."""
    with pytest.raises(MemoryPlanError, match=r"weights 91\.5\d.*even one token does not fit"):
        Engine.load(synthetic="full", device="cpu", dtype=torch.bfloat16, memory_cap_gib=40)
    packed_gib = (
        module_bytes(quantized_meta_model(preset("full"), make_plan("default"), dtype=torch.bfloat16)) / 2**30
    )
    with pytest.raises(MemoryPlanError, match=rf"weights {packed_gib:.2f}.*at most \d+ tokens fit"):
        Engine.load(
            synthetic="full",
            quant="default",
            device="cpu",
            dtype=torch.bfloat16,
            memory_cap_gib=40,
            max_context=10**8,
            prefix_cache_gib=0,
        )


def test_synthetic_quantised_engine_matches_the_in_memory_quantised_model(rng):
    eng = Engine.load(  # FP32 like the reference: greedy tokens of random logits flip under BF16 rounding
        synthetic="tiny",
        quant="int8-head",
        seed=3,
        device="cpu",
        dtype=torch.float32,
        max_context=512,
        prefix_cache_gib=0,
    )
    try:
        reference = synthetic_quantized_model(
            preset("tiny"), make_plan("int8-head"), device="cpu", dtype=torch.float32, seed=3
        )
        prompt = random_prompt(rng, 9)
        expected = generate(reference, prompt, SamplingParams(max_tokens=12)).token_ids
        seq = eng.prefill([prompt], max_new_tokens=12)
        assert eng.decode(seq, 12) == [expected]
        eng.release(seq)
        assert eng.source.synthetic and "plan int8-head" in eng.source.name
        # The INT8 head runs the INT8 GEMV; the plain FP32 Linears left (MLA's kv_b_proj, dequantised
        # once) the dense one at their decode rows.
        assert eng.kernel_variants == CPU_DEFAULT_KERNELS | {"w8a16_gemv": "reference"}
        # Re-binding frees the idle caches (their CUDA graphs would call the old kernels).
        assert eng.pool.idle_count == 1
        assert eng.use_kernels({"w4a16_gemv": "reference"})["w4a16_gemv"] == "reference"
        assert eng.pool.idle_count == 0
    finally:
        eng.close()


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"quant": "default"}, "already quantised"),
        ({"quant": "nope"}, "unknown quantisation plan"),
    ],
)
def test_an_artifact_refuses_another_plan(tiny_artifact, kwargs, message):
    with pytest.raises(ModelSourceError, match=message):
        open_model_source(weights=tiny_artifact[1], **kwargs)


def test_a_checkpoint_is_quantised_through_an_artifact_and_dense_weights_have_no_kernels(tiny_artifact):
    with pytest.raises(ModelSourceError, match="kimi-engine quantize"):
        open_model_source(weights=tiny_artifact[0], quant="default")
    with pytest.raises(ModelSourceError, match="apply to quantised weights"):
        Engine.load(synthetic="tiny", kernels={"w4a16_gemv": "reference"}, device="cpu")


def test_a_damaged_artifact_is_refused_naming_the_problem(tiny_artifact, tmp_path):
    (tmp_path / "manifest.json").write_text("{}")
    with pytest.raises(ModelSourceError, match="not a loadable artifact"):
        open_model_source(weights=tmp_path)


@pytest.mark.gpu
def test_packed_decode_replays_cuda_graphs_with_the_tokens_of_eager_decode(rng):
    common = dict(synthetic="small", quant="default", device="cuda", max_context=4096, prefix_cache_gib=0)
    graphs, eager = Engine.load(**common), Engine.load(**common, cuda_graphs=False)
    try:
        assert graphs.kernel_variants["w4a16_grouped_swiglu"] == "triton_fused"
        for n_prompt in (5, 300):
            replayed, eager_tokens = decode_with_and_without_graphs(
                graphs, eager, random_prompt(rng, n_prompt), 32
            )
            assert replayed == eager_tokens
        assert graphs.pool.graphs_captured >= 1 and eager.pool.graphs_captured == 0
    finally:
        graphs.close()
        eager.close()


@pytest.mark.gpu
@pytest.mark.slow
def test_full_shapes_quantised_on_the_device_fit_the_32_gib_cap(rng):
    """The 48B model generated and quantised tensor by tensor under the 32 GiB allocator cap; the plan's
    weight bytes are what was allocated for them."""
    before = torch.cuda.memory_allocated()
    eng = Engine.load(synthetic="full", quant="default", device="cuda", memory_cap_gib=32, max_context=8192)
    try:
        assert module_bytes(eng.model) == eng.plan.weights_bytes
        assert torch.cuda.memory_allocated() - before >= eng.plan.weights_bytes
        seq = eng.prefill([random_prompt(rng, 64)], max_new_tokens=16)
        assert len(eng.decode(seq, 16)[0]) == 16
        eng.release(seq)
        assert eng.pool.graphs_captured == 1
    finally:
        eng.close()
