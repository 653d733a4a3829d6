"""shape_config.py CONFIG 4b|0.6b: rewrites the demo checkpoint's config.json with a Qwen3 shape (head_dim 128,
the 151,936-id vocabulary, tied embeddings) so that --load-format random serves that shape with the demo
tokenizer. The architecture (Qwen3ForCausalLM or the embedding layout's Qwen3Model) is kept."""
import json
import sys

path, shape = sys.argv[1], sys.argv[2]
shapes = {
    "4b": dict(hidden_size=2560, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
               intermediate_size=9728),
    "0.6b": dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                 intermediate_size=3072),
}
if shape not in shapes:
    sys.exit(f"shape_config.py: unknown shape '{shape}' (4b or 0.6b)")
c = json.load(open(path))
c.update(shapes[shape], head_dim=128, vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=40960)
c.pop("layer_types", None)  # the demo's list has its own layer count
json.dump(c, open(path, "w"), indent=2)
