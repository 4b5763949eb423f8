"""The Triton variants are torch custom ops (`torch.ops.kimi.*`): `torch.compile(fullgraph=True)` keeps every
one of them in a single Inductor graph as an opaque call and gets the eager results. On the CPU the ops
run in the Triton interpreter (tests/conftest.py sets TRITON_INTERPRET=1)."""

import pytest
import torch

import engine.kernels  # noqa: F401  (registers the variants)
from engine.kernel_tools.cases import CASES
from engine.kernel_tools.shapes import EDGE_SHAPES
from engine.kernels import registry, triton_gemv

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TRITON_VARIANTS = [
    v for op in registry.operations() for v in registry.variants(op.name) if v.backend == "triton"
]


@pytest.mark.skipif(
    registry.unavailable_reason(TRITON_VARIANTS[0], DEVICE) is not None, reason="no Triton here"
)
@pytest.mark.slow
def test_triton_variants_compile_in_one_graph_as_opaque_ops():
    gen = torch.Generator(DEVICE).manual_seed(int(torch.randint(0, 2**31, (1,)).item()))
    calls = [(v.fn, CASES[v.op](EDGE_SHAPES[v.op][0], gen, DEVICE)) for v in TRITON_VARIANTS]
    graphs: list[torch.fx.GraphModule] = []

    def inductor(graph, example_inputs):
        from torch._inductor.compile_fx import compile_fx

        graphs.append(graph)
        return compile_fx(graph, example_inputs)

    def run_all():  # state an op updates in place (the KDA step's) is copied, so both runs start alike
        return [
            fn(*(a.clone() if i in case.mutated else a for i, a in enumerate(case.args)), **case.kwargs)
            for fn, case in calls
        ]

    expected = run_all()
    actual = torch.compile(run_all, backend=inductor, fullgraph=True)()
    assert len(graphs) == 1
    called = {str(node.target) for node in graphs[0].graph.nodes if node.op == "call_function"}
    ops = {
        "gemv",
        "grouped_gemv",
        "grouped_swiglu",
        "route_combine",
        "rms_norm",
        "kda_decode_step",
        "route_topk",
    }
    assert {f"kimi.{op}" for op in ops} <= {
        name.removeprefix("torch.ops.").removesuffix(".default") for name in called
    }, called
    for variant, want, got in zip(TRITON_VARIANTS, expected, actual, strict=True):
        assert got.shape == want.shape and torch.isfinite(got).all(), variant.name
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3, msg=f"{variant.op}.{variant.name}")


def test_the_ops_are_registered_with_fakes():
    for name in ("gemv", "grouped_gemv", "grouped_swiglu", "route_combine", "rms_norm", "kda_decode_step",
                 "route_topk"):  # fmt: skip
        assert hasattr(torch.ops.kimi, name)
    x = torch.empty(2, 64, device="meta", dtype=torch.bfloat16)
    codes = torch.empty(8, 32, device="meta", dtype=torch.uint8)
    scales = torch.empty(8, 2, device="meta", dtype=torch.bfloat16)
    out = triton_gemv.w4a16_gemv(x, codes, scales, 32)  # the fake runs: no kernel, no device
    assert out.shape == (2, 8) and out.device.type == "meta"
