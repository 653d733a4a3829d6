"""vl_config.py CONFIG: the demo Qwen3-VL checkpoint's config.json with Qwen3-VL-4B-Instruct's text and vision
sizes, for --load-format random (bench/device.sh vl-serve)."""
import json, sys
p = sys.argv[1]
c = json.load(open(p))
c["text_config"].update(hidden_size=2560, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                        head_dim=128, intermediate_size=9728, vocab_size=151936, max_position_embeddings=40960)
c["text_config"].pop("layer_types", None)
c["text_config"]["rope_scaling"]["mrope_section"] = [24, 20, 20]
c["vision_config"].update(depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16, out_hidden_size=2560,
                          deepstack_visual_indexes=[5, 11, 17])
json.dump(c, open(p, "w"), indent=2)
