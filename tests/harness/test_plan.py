"""`kimi-harness plan`: three cases pinned against arithmetic done by hand (in the comments), the published
sizes the model facts must reproduce, and the errors bad input gets."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.plan import plan
from harness.plan.hardware import DEVICES, HOSTS, LINKS, parse_hardware
from harness.plan.models import MODELS, QUANT_NAMES, kimi_k3, kimi_linear


def test_kimi_linear_int4_on_one_l40s_by_hand():
    # Weights read per token at the INT4 plan (4 bits + one BF16 scale per 32: 0.5625 B per weight):
    #   routed experts 26 layers x 8 x 3 x 1024 x 2304 = 1,472,200,704 x 0.5625 =   828,112,896
    #   shared experts 26 x 3 x 1024 x 2304           =   184,025,088 x 0.5625 =   103,514,112
    #   layer-0 MLP 3 x 9216 x 2304                   =    63,700,992 x 0.5625 =    35,831,808
    #   KDA q,k,v,o 20 x 4 x 4096 x 2304 + MLA q, kv_b, o 7 x 27,787,264
    #                                                 =   949,485,568 x 0.5625 =   534,085,632
    #   LM head 163,840 x 2304 x 2 (BF16)                                      =   754,974,720
    #   KDA gates/convs (BF16) + A_log, dt_bias (FP32) 20 x 3,539,072          =    70,781,440
    #   routers 26 x 256 x 2304 x 2 + biases 26 x 256 x 2                      =    30,684,160
    #   MLA kv_a 7 x 576 x 2304 x 2                                            =    18,579,456
    #   norms 132,864 x 2 + one embedding row 2304 x 2                         =       270,336
    #                                                                   total  = 2,376,834,560
    # State: KDA 2 x 20 x 32 x 128^2 x 4 = 83,886,080; convs 2 x 20 x 3 x 4096 x 4 x 2 = 3,932,160;
    # MLA latents (17 + 1) x 7 x 576 x 2 = 145,152.  Step: 2,464,797,952 B.
    # 864 GB/s / 2,464,797,952 B = 350.536 tok/s.
    e = plan("kimi-linear-48b", "1xL40S", context=17)
    assert e.step_bytes == 2_464_797_952
    assert e.decode_tok_s == pytest.approx(864e9 / 2_464_797_952, rel=1e-12)
    assert e.decode_tok_s == pytest.approx(350.536, abs=1e-3)
    assert e.fits and e.need["weights"] == 28_803_304_448  # the published artifact's size, to the byte
    # Prefill: 362.05 TFLOPS / (2 x active parameters)
    assert e.prefill_tok_s == pytest.approx(362.05e12 / (2 * kimi_linear().active_params))


def test_k3_on_8_b300_fits_and_not_on_8_b200_by_hand():
    # Routed experts: 92 MoE layers x 896 x (3 x 3584 x 3072 = 33,030,144) = 2,722,740,830,208 params, at
    # MXFP4's 4.25 bits = 1,446,456,066,048 B; the other 2.78T - that = 57,259,169,792 params in BF16
    # = 114,518,339,584 B.  Weights 1,560,974,405,632 B (the published "1.56 TB").
    # KDA state per sequence 69 x (96 x 128^2 x 4 + 3 x 96 x 128 x 4 x 2) = 454,459,392 B;
    # MLA cache 24 x 576 x 2 = 27,648 B per token x 36,000 = 995,328,000 B; reserve 8 x 1 GB.
    # Need 1,570,424,193,024 B: fits 8 x 288 GB = 2,304 GB, not 8 x 180 GB = 1,440 GB.
    e = plan("kimi-k3", "8xB300", context=36_000)
    assert e.need["weights"] == 1_560_974_405_632
    assert e.device_need == 1_570_424_193_024
    assert e.fits
    # Per token: active experts 92 x 16 x 33,030,144 = 48,620,371,968 x 4.25 / 8 = 25,829,572,608 B, other
    # active (104e9 - 48,620,371,968) x 2 = 110,759,256,064 B; state 2 x 454,459,392; cache 36,001 x 27,648.
    # Step 138,493,103,104 B over 8 x 8 TB/s = 2.163955 ms; two all-reduces per layer of 7168 x 2 B,
    # 93 x 2 x 2 x 7/8 x 14,336 / 900 GB/s = 0.005185 ms.  1 / 2.169140 ms = 461.01 tok/s.
    assert e.step_bytes == 138_493_103_104
    assert e.decode_terms_s["memory"] == pytest.approx(138_493_103_104 / 64e12)
    assert e.decode_terms_s["link"] == pytest.approx(93 * 2 * 2 * 7 / 8 * 14_336 / 900e9)
    assert e.decode_tok_s == pytest.approx(461.01, abs=0.01)
    small = plan("kimi-k3", "8xB200", context=36_000)
    assert not small.fits and small.decode_tok_s is None and small.device_memory == 1_440e9


def test_k3_on_80_rtx5090_over_25gbe_by_hand():
    # 10 nodes of 8, one pipeline stage per node: at batch 1 one node works at a time.
    # Step 136,588,828,672 + 2 x 454,459,392 + 4097 x 27,648 = 137,611,021,312 B over 8 x 1,792 GB/s
    # = 9.599039 ms; PCIe 5.0 all-reduces 93 x 2 x 2 x 7/8 x 14,336 / 64 GB/s = 0.072912 ms; the hidden
    # state over 9 node boundaries, 9 x 14,336 B / 3.125 GB/s = 0.041288 ms.  1 / 9.713239 ms = 102.95 tok/s.
    e = plan("kimi-k3", "80xRTX5090", context=4096)
    assert e.fits and e.step_bytes == 137_611_021_312
    assert e.decode_terms_s["network"] == pytest.approx(9 * 14_336 / 3.125e9)
    assert e.decode_tok_s == pytest.approx(
        1 / (137_611_021_312 / 14.336e12 + 72.912e-6 + 41.288e-6), rel=1e-5
    )
    assert e.decode_tok_s == pytest.approx(102.95, abs=0.01)


def test_experts_go_to_host_ram_only_when_the_devices_are_too_small():
    offload = plan("kimi-k3", "4xA100-40GB+2TB-DDR4", quant="ud-iq1_s")
    assert offload.layout == "experts in host RAM" and offload.fits
    assert offload.host_need == kimi_k3().formats["ud-iq1_s"].expert_bytes
    assert offload.decode_terms_s["host"] > offload.decode_terms_s["memory"]  # experts dominate
    assert not plan("kimi-k3", "4xA100-40GB", quant="ud-iq1_s").fits
    assert plan("kimi-k3", "8xB300+2TB-DDR4").layout == "devices"  # fits the GPUs: RAM unused


def test_published_sizes_are_reproduced():
    assert kimi_linear().total_params == 49_122_681_728
    assert kimi_linear().formats["bf16"].total_bytes == 98_245_528_576
    assert kimi_k3().formats["mxfp4"].total_bytes == pytest.approx(1.56e12, rel=1e-3)
    assert kimi_k3().formats["ud-iq1_s"].total_bytes == pytest.approx(594e9, rel=1e-9)


def test_every_hardware_figure_names_its_source():
    for entry in [*DEVICES.values(), *LINKS.values(), *HOSTS.values()]:
        assert entry.source.startswith("https://"), entry


@pytest.mark.parametrize(
    ("spec", "message"),
    [("8B300", "cannot read hardware"), ("2xTPU", "unknown device"), ("1xL40S+1TB-DDR9", "unknown host")],
)
def test_bad_specs_say_what_is_wrong(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_hardware(spec)


def test_cli_text_json_and_errors():
    runner = CliRunner()
    text = runner.invoke(main, ["plan", "--model", "kimi-k3", "--hardware", "8xB200"])
    assert text.exit_code == 0 and "does not fit" in text.output and "nvidia.com" in text.output
    as_json = runner.invoke(main, ["plan", "--model", "kimi-linear-48b", "--hardware", "1xL40S", "--json"])
    assert json.loads(as_json.output)["fits"] is True
    bad = runner.invoke(main, ["plan", "--model", "kimi-k3", "--hardware", "8xB300", "--quant", "int4"])
    assert bad.exit_code == 2 and "no --quant 'int4'" in bad.output


def test_batching_shares_the_weight_reads_and_the_overrides_apply():
    # At batch 16 a step reads the always-active weights once, the distinct experts 16 tokens pick (uniform
    # routing: 256 x (1 - (1 - 8/256)^16) = 101.9 of 256 per layer, not 16 x 8 = 128) and 16 sequences'
    # state: more tokens per step, so the aggregate ceiling rises.
    one, many = plan("kimi-linear-48b", "1xH200", batch=1), plan("kimi-linear-48b", "1xH200", batch=16)
    fmt = kimi_linear().formats["int4"]
    picked = fmt.expert_bytes * (1 - (1 - 8 / 256) ** 16)
    shared = fmt.token_bytes - fmt.token_expert_bytes
    assert many.step_bytes == pytest.approx(shared + picked + 16 * (one.step_bytes - fmt.token_bytes))
    assert many.decode_tok_s > 2 * one.decode_tok_s
    assert many.need["kda_state"] == 16 * one.need["kda_state"]
    split = plan("kimi-k3", "16xB300", per_node=4, network="25GbE")
    assert split.decode_terms_s["network"] == pytest.approx(3 * 14_336 / 3.125e9)


def test_the_cli_offers_exactly_the_formats_the_models_know():
    assert sorted(QUANT_NAMES) == sorted(name for facts in MODELS.values() for name in facts().formats)
