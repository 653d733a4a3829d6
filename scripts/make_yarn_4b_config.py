#!/usr/bin/env python3
"""Writes DIR/config.json: Qwen3-4B's shape with the YaRN block Qwen's model card documents for 131,072-token
contexts (rope_type yarn, factor 4, original_max_position_embeddings 32768). With no weights beside it, kiln's
random load format serves it, e.g. for issue 17's 128k measurement on the device machine:
    python3 scripts/make_yarn_4b_config.py /tmp/qwen3_4b_yarn
    build/device/bin/kiln bench model --model /tmp/qwen3_4b_yarn --context 131000 --prefill 131072 --steps 32
"""
import json
import os
import sys

cfg = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "bos_token_id": 151643, "dtype": "bfloat16",
    "eos_token_id": [151645, 151643], "head_dim": 128, "hidden_act": "silu", "hidden_size": 2560,
    "intermediate_size": 9728, "max_position_embeddings": 40960, "model_type": "qwen3", "num_attention_heads": 32,
    "num_hidden_layers": 36, "num_key_value_heads": 8, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
    "use_sliding_window": False, "vocab_size": 151936,
    "rope_parameters": {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
                        "original_max_position_embeddings": 32768},
}
if len(sys.argv) != 2:
    sys.exit("usage: make_yarn_4b_config.py DIR")
os.makedirs(sys.argv[1], exist_ok=True)
with open(os.path.join(sys.argv[1], "config.json"), "w") as f:
    json.dump(cfg, f, indent=2)
print(f"wrote {sys.argv[1]}/config.json (Qwen3-4B shape, YaRN factor 4: context 131072)")
