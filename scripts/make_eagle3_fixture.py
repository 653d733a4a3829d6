#!/usr/bin/env python3
"""Writes a tiny random EAGLE-3 draft (LlamaForCausalLMEagle3 layout, bf16 weights, d2t, its own
embed_tokens) and a reference of its forward computed with torch in float32 from the same bf16 values:
the fixture tests/unit/test_eagle3_draft.cpp checks kiln's CPU draft (src/model/eagle3.h) against.

The reference follows the EAGLE-3 midlayer as SpecForge trains it and SGLang runs it (scripts/
train_eagle3_draft.py's Eagle3Draft): rows at rotary positions 0..T-1 over fc(target features) and the token
after each position, causal attention over the draft's own keys, then a top-1 chain of k drafts from the last
row (each next row: the previous row's midlayer output and the token it drafted, one position further).

Usage: python3 scripts/make_eagle3_fixture.py OUT_DIR   (torch on the CPU is enough; a few seconds)
Then:  KILN_EAGLE3_FIXTURE=OUT_DIR build/.../tests/test_eagle3_draft
"""
import json
import math
import os
import sys

import torch
from safetensors.torch import save_file

H, HT, I, HEADS, KV, D, V, DV, T, K = 64, 48, 96, 4, 2, 16, 120, 56, 12, 4
EPS, THETA = 1e-6, 10000.0


def rms(x, w):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS))


def rope(x, pos):
    inv = 1.0 / (THETA ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    ang = (pos.double()[:, None] * inv[None, :]).float()
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return x * cos[:, None, :] + torch.cat([-x2, x1], -1) * sin[:, None, :]


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    g = torch.Generator().manual_seed(47)

    def rnd(*shape, std=0.08):
        return (torch.randn(*shape, generator=g) * std).to(torch.bfloat16)

    w = {
        "fc.weight": rnd(H, 3 * HT),
        "midlayer.input_layernorm.weight": (1 + rnd(H, std=0.1).float()).to(torch.bfloat16),
        "midlayer.hidden_norm.weight": (1 + rnd(H, std=0.1).float()).to(torch.bfloat16),
        "midlayer.self_attn.q_proj.weight": rnd(HEADS * D, 2 * H),
        "midlayer.self_attn.k_proj.weight": rnd(KV * D, 2 * H),
        "midlayer.self_attn.v_proj.weight": rnd(KV * D, 2 * H),
        "midlayer.self_attn.o_proj.weight": rnd(H, HEADS * D),
        "midlayer.post_attention_layernorm.weight": (1 + rnd(H, std=0.1).float()).to(torch.bfloat16),
        "midlayer.mlp.gate_proj.weight": rnd(I, H),
        "midlayer.mlp.up_proj.weight": rnd(I, H),
        "midlayer.mlp.down_proj.weight": rnd(H, I),
        "norm.weight": (1 + rnd(H, std=0.1).float()).to(torch.bfloat16),
        "lm_head.weight": rnd(DV, H, std=0.3),
        "embed_tokens.weight": rnd(V, H, std=1.0),
    }
    ids = torch.sort(torch.randperm(V, generator=g)[:DV]).values
    w["d2t"] = (ids - torch.arange(DV)).to(torch.int64)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[ids] = True
    w["t2d"] = t2d
    save_file(w, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": H,
           "intermediate_size": I, "num_attention_heads": HEADS, "num_key_value_heads": KV, "head_dim": D,
           "num_hidden_layers": 1, "vocab_size": V, "draft_vocab_size": DV, "target_hidden_size": HT,
           "rms_norm_eps": EPS, "rope_theta": THETA,
           "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 5], "use_aux_hidden_state": True}}
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)

    f32 = {k: v.float() for k, v in w.items() if v.dtype == torch.bfloat16}
    feats = torch.randn(T, 3 * HT, generator=g)
    tokens = torch.randint(0, V, (T,), generator=g, dtype=torch.int32)
    keys, vals = [], []

    def rows(tok, hidden, pos0):
        """Rows at positions pos0.. appended to keys/vals; returns (outputs [n, H], logits [n, DV])."""
        n = tok.shape[0]
        pos = torch.arange(pos0, pos0 + n)
        x = torch.cat([rms(f32["embed_tokens.weight"][tok.long()], f32["midlayer.input_layernorm.weight"]),
                       rms(hidden, f32["midlayer.hidden_norm.weight"])], -1)
        q = rope((x @ f32["midlayer.self_attn.q_proj.weight"].T).view(n, HEADS, D), pos)
        k = rope((x @ f32["midlayer.self_attn.k_proj.weight"].T).view(n, KV, D), pos)
        v = (x @ f32["midlayer.self_attn.v_proj.weight"].T).view(n, KV, D)
        keys.append(k)
        vals.append(v)
        ka, va = torch.cat(keys), torch.cat(vals)  # [pos0 + n, KV, D]
        rep = HEADS // KV
        ka, va = ka.repeat_interleave(rep, 1), va.repeat_interleave(rep, 1)
        s = torch.einsum("nhd,jhd->hnj", q, ka) / math.sqrt(D)
        mask = torch.arange(ka.shape[0])[None, :] <= pos[:, None]
        s = s.masked_fill(~mask[None], float("-inf"))
        a = torch.einsum("hnj,jhd->nhd", torch.softmax(s, -1), va).reshape(n, HEADS * D)
        h = hidden + a @ f32["midlayer.self_attn.o_proj.weight"].T
        xn = rms(h, f32["midlayer.post_attention_layernorm.weight"])
        mlp = (torch.nn.functional.silu(xn @ f32["midlayer.mlp.gate_proj.weight"].T) *
               (xn @ f32["midlayer.mlp.up_proj.weight"].T)) @ f32["midlayer.mlp.down_proj.weight"].T
        o = h + mlp
        return o, rms(o, f32["norm.weight"]) @ f32["lm_head.weight"].T

    hidden0 = feats @ f32["fc.weight"].T
    outs, logits = rows(tokens, hidden0, 0)
    chain = [int(ids[logits[-1].argmax()])]
    h = outs[-1:]
    for s in range(1, K):
        o, lg = rows(torch.tensor([chain[-1]], dtype=torch.int32), h, T + s - 1)
        chain.append(int(ids[lg[0].argmax()]))
        h = o
    save_file({"features": feats.contiguous(), "tokens": tokens.contiguous(), "fc_out": hidden0.contiguous(),
               "outputs": outs.contiguous(), "logits": logits.contiguous(),
               "chain": torch.tensor(chain, dtype=torch.int32)},
              os.path.join(out, "reference.safetensors"), metadata={"format": "pt"})
    print(f"make_eagle3_fixture: wrote {out} (T = {T}, chain {chain})")


if __name__ == "__main__":
    main()
