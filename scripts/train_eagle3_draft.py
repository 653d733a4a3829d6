#!/usr/bin/env python3
"""Trains an EAGLE-3 draft for a Qwen3 target (scripts/train_small_qwen3.py's model, or any Qwen3 in the HF
layout) on the target's own hidden states, and saves it as the hub and SpecForge ship EAGLE-3 drafts:

  config.json   architectures ["LlamaForCausalLMEagle3"], model_type llama, one layer, draft_vocab_size,
                target_hidden_size, eagle_config.eagle_aux_hidden_state_layer_ids (the three target layers)
  model.safetensors (bf16; d2t int64, t2d bool):
    fc.weight                          [H, 3 * H_target]   over cat(h_low, h_mid, h_high) of the target
    midlayer.input_layernorm.weight    [H]   normalises the token embedding
    midlayer.hidden_norm.weight        [H]   normalises the hidden state
    midlayer.self_attn.{q,k,v}_proj.weight  [*, 2 H]  over cat(normed embedding, normed hidden)
    midlayer.self_attn.o_proj.weight, midlayer.post_attention_layernorm.weight, midlayer.mlp.{gate,up,down}_proj.weight
    norm.weight                        [H]
    lm_head.weight                     [draft_vocab, H]
    d2t                                [draft_vocab]  target id = draft id + d2t[draft id]
    t2d                                [vocab]        whether a target id is in the draft vocabulary
  The embeddings are the target's (frozen, not saved), as in SpecForge.

The three target layers: (2, L // 2, L - 3) as SGLang and vLLM default, each the residual stream entering that
layer (transformers' hidden_states[i]). The midlayer: residual = hidden; x = cat(input_layernorm(embed),
hidden_norm(hidden)); hidden = residual + o_proj(attn(x)); hidden = hidden + mlp(post_attention_layernorm(hidden));
logits = lm_head(norm(hidden)). Step 1 at position t takes fc(target features at t) and the embedding of token
t + 1 and predicts token t + 2. Later steps (training-time test, as EAGLE-3 trains) take the previous step's
midlayer output as the hidden state and the next token; a query of step s at position t attends to step 1's keys
at positions <= t and to its own chain's earlier steps at t (what chain drafting sees at inference). Rotary
position of step s at t: t + s - 1. Loss: cross-entropy against the target's next-token distribution restricted to
the draft vocabulary (positions whose target argmax is outside it masked), weighted 0.8^(s-1).

Data: the Python sources on this machine, split into train and held-out files exactly as train_small_qwen3.py
splits them (its python_sources). Evaluation: the target generates greedy continuations of held-out files;
along them, the draft's chain of k tokens is checked against the target's greedy tokens at every position: the
acceptance length (1 + kept drafts per verify) that chain drafting with k = --eval-k would reach.

Usage (repo root, on the GPU machine, after train_small_qwen3.py in the same device call or machine):
    python3 scripts/train_eagle3_draft.py --target build/small_qwen3 --out build/small_qwen3_eagle3 --minutes 4
The draft is small (about 2 H^2 * 6 + draft_vocab * H parameters: ~50 MB in bf16 for H = 768 and a 16k draft
vocabulary), so it can come back from a device call.
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_small_qwen3 import python_sources, read, tokenize_files  # noqa: E402  the same files and held-out split


def log(*a):
    print("[train_eagle3_draft]", *a, flush=True)


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        dt = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dt)


def rope(x, pos, theta):
    """NeoX half-split rotary embedding. x [B, heads, T, D], pos [T] (int)."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = pos.float()[:, None] * inv[None, :]
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1).to(x.dtype), torch.cat([ang.sin(), ang.sin()], -1).to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class Eagle3Draft(nn.Module):
    def __init__(self, H, Ht, I, heads, kv_heads, head_dim, draft_vocab, eps, theta):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.theta = heads, kv_heads, head_dim, theta
        self.fc = nn.Linear(3 * Ht, H, bias=False)
        m = nn.Module()
        m.input_layernorm, m.hidden_norm, m.post_attention_layernorm = RMSNorm(H, eps), RMSNorm(H, eps), RMSNorm(H, eps)
        a = nn.Module()
        a.q_proj = nn.Linear(2 * H, heads * head_dim, bias=False)
        a.k_proj = nn.Linear(2 * H, kv_heads * head_dim, bias=False)
        a.v_proj = nn.Linear(2 * H, kv_heads * head_dim, bias=False)
        a.o_proj = nn.Linear(heads * head_dim, H, bias=False)
        m.self_attn = a
        p = nn.Module()
        p.gate_proj, p.up_proj = nn.Linear(H, I, bias=False), nn.Linear(H, I, bias=False)
        p.down_proj = nn.Linear(I, H, bias=False)
        m.mlp = p
        self.midlayer = m
        self.norm = RMSNorm(H, eps)
        self.lm_head = nn.Linear(H, draft_vocab, bias=False)

    def qkv(self, emb, hidden, pos):
        m = self.midlayer
        x = torch.cat([m.input_layernorm(emb), m.hidden_norm(hidden)], -1)
        B, T, _ = x.shape
        q = m.self_attn.q_proj(x).view(B, T, self.heads, self.head_dim).transpose(1, 2)
        k = m.self_attn.k_proj(x).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        v = m.self_attn.v_proj(x).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        rep = self.heads // self.kv_heads
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        return rope(q, pos, self.theta), rope(k, pos, self.theta), v

    def finish(self, hidden, attn):
        m = self.midlayer
        B, _, T, _ = attn.shape
        h = hidden + m.self_attn.o_proj(attn.transpose(1, 2).reshape(B, T, -1))
        x = m.post_attention_layernorm(h)
        h = h + m.mlp.down_proj(F.silu(m.mlp.gate_proj(x)) * m.mlp.up_proj(x))
        return h, self.lm_head(self.norm(h))

    def unroll(self, feats, embeds, steps):
        """feats [B, T, 3 Ht] target features; embeds [B, T + steps, H] token embeddings (token t + s for step s at
        position t). Returns per step the draft logits [B, T, draft_vocab] (step s at t predicts token t + s + 1)."""
        B, T, _ = feats.shape
        hidden = self.fc(feats)
        scale = 1.0 / math.sqrt(self.head_dim)
        causal = torch.ones(T, T, device=feats.device, dtype=torch.bool).tril()
        k1 = v1 = None
        diag_k, diag_v, outs = [], [], []
        base = torch.arange(T, device=feats.device)
        for s in range(1, steps + 1):
            q, k, v = self.qkv(embeds[:, s:s + T], hidden, base + (s - 1))
            if s == 1:
                k1, v1 = k, v
                scores = (q @ k1.transpose(-1, -2)) * scale
                scores = scores.masked_fill(~causal, float("-inf"))
                attn = torch.softmax(scores.float(), -1).to(q.dtype) @ v1
            else:
                diag_k.append(k)
                diag_v.append(v)
                sc1 = ((q @ k1.transpose(-1, -2)) * scale).masked_fill(~causal, float("-inf"))
                scd = torch.stack([(q * dk).sum(-1) * scale for dk in diag_k], -1)  # [B, heads, T, s - 1]
                p = torch.softmax(torch.cat([sc1, scd], -1).float(), -1).to(q.dtype)
                attn = p[..., :T] @ v1 + (p[..., T:].unsqueeze(-1) * torch.stack(diag_v, -2)).sum(-2)
            hidden, logits = self.finish(hidden, attn)
            outs.append(logits)
        return outs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True, help="the target's HF folder (config.json, safetensors, tokenizer.json)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--minutes", type=float, default=4.0)
    ap.add_argument("--draft-vocab", type=int, default=16384)
    ap.add_argument("--ttt-steps", type=int, default=3, help="training-time-test unroll depth")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--data-bytes", type=int, default=60_000_000)
    ap.add_argument("--eval-k", type=int, default=3)
    ap.add_argument("--eval-prompts", type=int, default=32)
    args = ap.parse_args()
    assert torch.cuda.is_available(), "needs a GPU"
    dev = "cuda"
    torch.backends.cuda.matmul.allow_tf32 = True

    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    tok = Tokenizer.from_file(os.path.join(args.target, "tokenizer.json"))
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.bfloat16).to(dev).eval()
    for p in target.parameters():
        p.requires_grad_(False)
    tc = target.config
    L, Ht, V = tc.num_hidden_layers, tc.hidden_size, tc.vocab_size
    layer_ids = [2, L // 2, L - 3]
    assert L >= 6, "EAGLE-3's default layers (2, L/2, L-3) need at least 6 target layers"
    rp = getattr(tc, "rope_parameters", None) or {}
    theta = float(rp.get("rope_theta", getattr(tc, "rope_theta", 1_000_000.0)))
    eps = float(tc.rms_norm_eps)

    # The same split as train_small_qwen3.py (by a hash of each path): the target never saw the held-out files.
    files, heldout_files = python_sources(args.data_bytes)
    eos = tok.token_to_id("<|endoftext|>")
    data = tokenize_files(tok, files, eos, limit_tokens=args.data_bytes // 4)
    log(f"{data.numel():,} training tokens; target {L} layers, hidden {Ht}, features from layers {layer_ids}")

    # Draft vocabulary: the most frequent target tokens in the data.
    counts = torch.bincount(data.long(), minlength=V)
    D = min(args.draft_vocab, V)
    d2t_ids = torch.sort(torch.topk(counts, D).indices).values  # draft id -> target id, ascending
    coverage = counts[d2t_ids].sum().item() / counts.sum().item()
    log(f"draft vocabulary {D} covers {coverage:.4f} of the training tokens")
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[d2t_ids] = True
    d2t_ids_dev, t2d_dev = d2t_ids.to(dev), t2d.to(dev)

    H = Ht
    heads, kv_heads = tc.num_attention_heads, tc.num_key_value_heads
    head_dim = getattr(tc, "head_dim", None) or H // heads
    I = tc.intermediate_size
    torch.manual_seed(0)
    draft = Eagle3Draft(H, Ht, I, heads, kv_heads, head_dim, D, eps, theta).to(dev)
    embed = target.get_input_embeddings()
    opt = torch.optim.AdamW(draft.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0, fused=True)
    S = args.ttt_steps
    g = torch.Generator().manual_seed(0)

    def batch_tokens(bsz, seq):
        starts = torch.randint(0, data.numel() - seq - 1, (bsz,), generator=g)
        return torch.stack([data[s:s + seq].long() for s in starts.tolist()]).to(dev)

    @torch.no_grad()
    def target_pass(x):
        out = target(input_ids=x, output_hidden_states=True)
        feats = torch.cat([out.hidden_states[i] for i in layer_ids], -1)
        return feats, out.logits

    def losses(x, feats, tlogits):
        T = x.shape[1] - S - 1  # positions with a target for every step
        with torch.autocast("cuda", dtype=torch.bfloat16):
            outs = draft.unroll(feats[:, :T], embed(x), S)
        total, accs = 0.0, []
        for s, logits in enumerate(outs, start=1):
            # Step s at position t predicts token t + s + 1: the target's distribution at position t + s.
            tl = tlogits[:, s:s + T].float()
            mask = t2d_dev[tl.argmax(-1)]
            p = torch.softmax(tl[..., d2t_ids_dev], -1)
            lp = torch.log_softmax(logits.float(), -1)
            ce = -(p * lp).sum(-1)
            total = total + (0.8 ** (s - 1)) * (ce * mask).sum() / mask.sum().clamp(min=1)
            accs.append(((d2t_ids_dev[logits.argmax(-1)] == tl.argmax(-1)) & mask).float().sum().item() /
                        max(mask.sum().item(), 1))
        return total, accs

    budget, start, step = args.minutes * 60.0, time.time(), 0
    while time.time() - start < budget:
        frac = (time.time() - start) / budget
        lr = args.lr * min(1.0, frac / 0.05) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for grp in opt.param_groups:
            grp["lr"] = lr
        x = batch_tokens(args.batch, args.seq + S + 1)
        feats, tlogits = target_pass(x)
        loss, accs = losses(x, feats, tlogits)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        if step % 50 == 0:
            log(f"step {step} loss {loss.item():.3f} top-1 agreement by step {[round(a, 3) for a in accs]} "
                f"{time.time() - start:.0f} s")
    log(f"trained {step} steps in {time.time() - start:.0f} s")

    # Acceptance along the target's own greedy continuations of held-out files.
    draft.eval()
    prompts = []
    for p in heldout_files:
        t = read(p)
        if t and len(t) > 600:
            prompts.append(tok.encode(t[:1500]).ids[-256:])
        if len(prompts) >= args.eval_prompts:
            break
    k = args.eval_k
    acc_lengths = []
    with torch.no_grad():
        for i in range(0, len(prompts), 8):
            batch = [torch.tensor(p) for p in prompts[i:i + 8] if len(p) == 256]
            if not batch:
                continue
            x = torch.stack(batch).to(dev)
            seqs = target.generate(x, max_new_tokens=128, do_sample=False, pad_token_id=eos)
            if seqs.shape[1] < x.shape[1] + k + 2:
                continue
            feats, _ = target_pass(seqs)
            T = seqs.shape[1] - k - 1
            with torch.autocast("cuda", dtype=torch.bfloat16):
                outs = draft.unroll(feats[:, :T], embed(seqs), k)
            ok = torch.ones(seqs.shape[0], T, dtype=torch.bool, device=dev)
            kept = torch.zeros(seqs.shape[0], T, device=dev)
            for s, logits in enumerate(outs, start=1):
                ok = ok & (d2t_ids_dev[logits.argmax(-1)] == seqs[:, s + 1:s + 1 + T])
                kept += ok.float()
            gen = slice(x.shape[1] - 1, T)  # verify positions inside the generated continuation
            acc_lengths.append((1.0 + kept[:, gen]).mean().item())
    acc = sum(acc_lengths) / max(len(acc_lengths), 1)
    log(f"held-out greedy chain acceptance length at k = {k}: {acc:.3f} tokens per verify")

    os.makedirs(args.out, exist_ok=True)
    sd = {n: p.detach().to(torch.bfloat16).contiguous().cpu() for n, p in draft.state_dict().items()}
    sd["d2t"] = (d2t_ids - torch.arange(D)).to(torch.int64)
    sd["t2d"] = t2d
    from safetensors.torch import save_file
    save_file(sd, os.path.join(args.out, "model.safetensors"), metadata={"format": "pt"})
    cfg = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": H,
        "target_hidden_size": Ht, "intermediate_size": I, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "head_dim": head_dim, "num_hidden_layers": 1, "rms_norm_eps": eps,
        "rope_theta": theta, "max_position_embeddings": int(tc.max_position_embeddings), "vocab_size": V,
        "draft_vocab_size": D, "tie_word_embeddings": False, "hidden_act": "silu", "dtype": "bfloat16",
        "torch_dtype": "bfloat16",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": layer_ids, "use_aux_hidden_state": True},
        "bos_token_id": tc.bos_token_id, "eos_token_id": tc.eos_token_id,
    }
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    with open(os.path.join(args.out, "train_summary.json"), "w") as f:
        json.dump({"steps": step, "minutes": args.minutes, "draft_vocab": D, "coverage": coverage,
                   "ttt_steps": S, "eval_k": k, "acceptance_length": acc}, f, indent=1)
    log(f"saved to {args.out}")


if __name__ == "__main__":
    sys.exit(main())
