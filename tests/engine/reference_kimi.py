"""Oracle 1: an independent float64, token-by-token Kimi-Linear, written plainly from the architecture notes.

It shares no code with `engine` (it reads config.json and the safetensors shards itself) so a bug in the
engine cannot hide in a shared helper. Every function processes one token at a time with explicit state.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import load_file

F64 = torch.float64


def silu(x):
    return x / (1 + torch.exp(-x))


def sigmoid(x):
    return 1 / (1 + torch.exp(-x))


def softplus(x):
    return torch.where(x > 20, x, torch.log1p(torch.exp(x)))


def rms_norm(x, weight, eps):
    return weight * x / torch.sqrt((x * x).mean() + eps)


def l2_norm(x, eps=1e-6):
    return x / torch.sqrt((x * x).sum() + eps)


class ReferenceKimi:
    def __init__(self, checkpoint_dir: str | Path, *, router_bias_in_weights: bool = False):
        """`router_bias_in_weights` reproduces Moonshot's remote code, where the correction bias is added to
        the scores in place and so also enters the mixing weights."""
        root = Path(checkpoint_dir)
        c = json.loads((root / "config.json").read_text())
        self.c = c
        self.w: dict[str, torch.Tensor] = {}
        for shard in sorted(root.glob("*.safetensors")):
            self.w.update({k: v.to(F64) for k, v in load_file(str(shard)).items()})
        lin = c["linear_attn_config"]
        self.mla_layers = {i - 1 for i in lin["full_attn_layers"]}
        self.kda_heads, self.kda_dim = lin["num_heads"], lin["head_dim"]
        self.conv_k = lin["short_conv_kernel_size"]
        self.eps = c["rms_norm_eps"]
        self.bias_in_weights = router_bias_in_weights

    # ---- state --------------------------------------------------------------------------------------
    def new_state(self):
        state = []
        for i in range(self.c["num_hidden_layers"]):
            if i in self.mla_layers:
                state.append({"keys": [], "values": []})
            else:
                d = self.kda_heads * self.kda_dim
                state.append(
                    {
                        "history": [torch.zeros(3, d, dtype=F64) for _ in range(self.conv_k - 1)],
                        "S": torch.zeros(self.kda_heads, self.kda_dim, self.kda_dim, dtype=F64),
                    }
                )
        return state

    # ---- blocks, one token each ----------------------------------------------------------------------
    def kda_token(self, i, x, st):
        w = self.w
        a = f"model.layers.{i}.self_attn."
        H, d = self.kda_heads, self.kda_dim
        raw = torch.stack(
            [w[a + "q_proj.weight"] @ x, w[a + "k_proj.weight"] @ x, w[a + "v_proj.weight"] @ x]
        )
        st["history"].append(raw)
        window = st["history"][-self.conv_k :]  # oldest first, current last
        st["history"] = st["history"][1:]
        conv_w = [w[a + n + "_conv1d.weight"][:, 0, :] for n in "qkv"]  # [D, K]
        qkv = []
        for j in range(3):
            acc = sum(conv_w[j][:, tap] * window[tap][j] for tap in range(self.conv_k))
            qkv.append(silu(acc))
        q, k, v = (t.view(H, d) for t in qkv)
        f = w[a + "f_b_proj.weight"] @ (w[a + "f_a_proj.weight"] @ x) + w[a + "dt_bias"]
        g = -torch.exp(w[a + "A_log"].view(H, 1)) * softplus(f.view(H, d))
        beta = sigmoid(w[a + "b_proj.weight"] @ x)
        gate = (w[a + "g_b_proj.weight"] @ (w[a + "g_a_proj.weight"] @ x)).view(H, d)
        outs = []
        for h in range(H):
            qh = l2_norm(q[h]) / math.sqrt(d)
            kh = l2_norm(k[h])
            S = st["S"][h] * torch.exp(g[h])[:, None]
            S = S + beta[h] * torch.outer(kh, v[h] - S.T @ kh)
            st["S"][h] = S
            o = S.T @ qh
            outs.append(rms_norm(o, w[a + "o_norm.weight"], self.eps) * sigmoid(gate[h]))
        return w[a + "o_proj.weight"] @ torch.cat(outs)

    def mla_token(self, i, x, st):
        w, c = self.w, self.c
        a = f"model.layers.{i}.self_attn."
        H, nope, rope, vd, L = (
            c["num_attention_heads"],
            c["qk_nope_head_dim"],
            c["qk_rope_head_dim"],
            c["v_head_dim"],
            c["kv_lora_rank"],
        )
        q = (w[a + "q_proj.weight"] @ x).view(H, nope + rope)
        comp = w[a + "kv_a_proj_with_mqa.weight"] @ x
        latent = rms_norm(comp[:L], w[a + "kv_a_layernorm.weight"], 1e-6)  # class-default eps, not config
        k_pe = comp[L:]
        kv = (w[a + "kv_b_proj.weight"] @ latent).view(H, nope + vd)
        st["keys"].append(torch.cat([kv[:, :nope], k_pe.expand(H, rope)], dim=1))
        st["values"].append(kv[:, nope:])
        keys = torch.stack(st["keys"], 1)  # [H, t, 192]
        values = torch.stack(st["values"], 1)
        outs = []
        for h in range(H):
            scores = keys[h] @ q[h] / math.sqrt(nope + rope)
            p = torch.softmax(scores, 0)
            outs.append(p @ values[h])
        return w[a + "o_proj.weight"] @ torch.cat(outs)

    def swiglu(self, prefix, x, names=("gate_proj", "up_proj", "down_proj")):
        w = self.w
        gate, up, down = (w[f"{prefix}{n}.weight"] for n in names)
        return down @ (silu(gate @ x) * (up @ x))

    def route(self, i, x):
        """(expert ids, mixing weights) for one token."""
        c, w = self.c, self.w
        m = f"model.layers.{i}.block_sparse_moe."
        scores = sigmoid(w[m + "gate.weight"] @ x)
        choice = scores + w[m + "gate.e_score_correction_bias"]
        ids = torch.argsort(choice, descending=True)[: c["num_experts_per_token"]]
        picked = choice[ids] if self.bias_in_weights else scores[ids]
        picked = picked / (picked.sum() + 1e-20)
        return ids, picked * c["routed_scaling_factor"]

    def moe_token(self, i, x):
        m = f"model.layers.{i}.block_sparse_moe."
        ids, weights = self.route(i, x)
        out = sum(
            wt * self.swiglu(f"{m}experts.{int(e)}.", x, ("w1", "w3", "w2"))
            for e, wt in zip(ids, weights, strict=True)
        )
        if self.c.get("num_shared_experts", 1):
            out = out + self.swiglu(m + "shared_experts.", x)
        return out

    def ffn_token(self, i, x):
        if i < self.c["first_k_dense_replace"]:
            return self.swiglu(f"model.layers.{i}.mlp.", x)
        return self.moe_token(i, x)

    # ---- whole model ---------------------------------------------------------------------------------
    def step(self, token: int, state) -> torch.Tensor:
        w = self.w
        h = w["model.embed_tokens.weight"][token]
        for i in range(self.c["num_hidden_layers"]):
            p = f"model.layers.{i}."
            x = rms_norm(h, w[p + "input_layernorm.weight"], self.eps)
            h = h + (
                self.mla_token(i, x, state[i]) if i in self.mla_layers else self.kda_token(i, x, state[i])
            )
            h = h + self.ffn_token(i, rms_norm(h, w[p + "post_attention_layernorm.weight"], self.eps))
        return w["lm_head.weight"] @ rms_norm(h, w["model.norm.weight"], self.eps)

    def logits(self, tokens: list[int]) -> torch.Tensor:
        """[T, vocab] float64 logits, one token at a time."""
        state = self.new_state()
        return torch.stack([self.step(t, state) for t in tokens])
