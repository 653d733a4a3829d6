# Shared by the device serving scripts (sourced): a Qwen3 shape with random weights, and kiln serve on it.
# Needs K (the kiln binary) set by the caller.

# shape_model DIR 4b|0.6b|demo: the demo checkpoint's tokenizer with a Qwen3 shape's config.json (--load-format
# random fills the weights on the GPU; the demo tokenizer's ids are all < the shape's vocabulary); demo: as is.
shape_model() {
  local dir=$1 shape=$2
  "$K" demo-model "$dir" >/dev/null
  [[ $shape == demo ]] && return 0
  python3 - "$dir/config.json" "$shape" <<'PY'
import json, sys
p, shape = sys.argv[1], sys.argv[2]
c = json.load(open(p))
shapes = {
    "4b": dict(hidden_size=2560, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
               intermediate_size=9728),
    "0.6b": dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                 intermediate_size=3072),
}
c.update(shapes[shape], head_dim=128, vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=40960)
c.pop("layer_types", None)  # the demo's list has its own layer count
json.dump(c, open(p, "w"), indent=2)
PY
}

# serve_start NAME PORT ARGS...: kiln serve in the background (pid in SERVE_PID, log in SERVE_LOG), waits for
# READY (120 s).
serve_start() {
  local name=$1 port=$2
  shift 2
  SERVE_LOG="$out/$name.log"
  "$K" serve --port "$port" "$@" >"$out/$name.out" 2>"$SERVE_LOG" &
  SERVE_PID=$!
  for _ in $(seq 1 1200); do
    grep -q '^READY ' "$out/$name.out" 2>/dev/null && return 0
    kill -0 $SERVE_PID 2>/dev/null || break
    sleep 0.1
  done
  echo "server $name did not start:"
  tail -20 "$out/$name.log"
  return 1
}

# serve_stop: SIGTERM, wait, print the server's accounting line.
serve_stop() {
  kill -TERM $SERVE_PID 2>/dev/null
  wait $SERVE_PID
  grep -h 'stopped. accepted\|captured' "$SERVE_LOG" | tail -2
}
