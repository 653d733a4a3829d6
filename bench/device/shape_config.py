"""shape_config.py CONFIG 4b|0.6b|8b|30b-a3b: rewrites the demo checkpoint's config.json with a Qwen3 shape (head_dim
128, the 151,936-id vocabulary; tied embeddings but for 8b and 30b-a3b, untied as Qwen ships them) so that
--load-format random serves that shape with the demo tokenizer. The architecture (Qwen3ForCausalLM, the embedding
layout's Qwen3Model, or Qwen3MoeForCausalLM from `kiln demo-model --arch moe` for 30b-a3b) is kept."""
import json
import sys

path, shape = sys.argv[1], sys.argv[2]
shapes = {
    "4b": dict(hidden_size=2560, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
               intermediate_size=9728),
    "0.6b": dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                 intermediate_size=3072),
    "8b": dict(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
               intermediate_size=12288, tie_word_embeddings=False),
    # Qwen3-30B-A3B: every layer sparse, 128 experts, top-8 (issue 44's shape)
    "30b-a3b": dict(hidden_size=2048, num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4,
                    intermediate_size=6144, moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
                    decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True, tie_word_embeddings=False),
}
if shape not in shapes:
    sys.exit(f"shape_config.py: unknown shape '{shape}' ({', '.join(shapes)})")
c = json.load(open(path))
if ("num_experts" in shapes[shape]) != ("num_experts" in c):
    sys.exit(f"shape_config.py: shape '{shape}' and {path}'s architecture {c['architectures']} differ in MoE layers")
c.update(dict(tie_word_embeddings=True), **shapes[shape])
c.update(head_dim=128, vocab_size=151936, max_position_embeddings=40960)
c.pop("layer_types", None)  # the demo's list has its own layer count
json.dump(c, open(path, "w"), indent=2)
