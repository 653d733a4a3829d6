#!/usr/bin/env bash
# Issue 16's GPU half on the H200: kiln serve on the Qwen3-4B shape (random bf16 weights) with
# --max-running-requests 512, `kiln bench serve` at C = 256 and 512 (1024 in / 256 out), and the server's CPU
# time per streamed token by thread: the engine thread ("kiln-engine", which also waits on the GPU) apart from
# the HTTP layer (the I/O threads and the handler pool: every other thread of the process but the CUDA
# driver's). Tokens are kiln_generation_tokens_total's rise over the same window (warm-ups included on both
# sides). Usage (GPU machine): OUT=DIR bench/http_scale_device.sh   Env: KILN (binary), LEVELS ("256 512").
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/kiln-out}
mkdir -p "$out"
export PATH=/usr/local/cuda/bin:$PATH
K=${KILN:-build/device/bin/kiln}
[[ -n ${KILN:-} ]] || bash scripts/device_build.sh kiln 2>&1 | tail -2
source bench/serve_lib.sh
m=/tmp/kiln-qwen3-4b-shape
shape_model $m 4b
ulimit -n 65536 2>/dev/null || true
port=8131
serve_start scale $port --model $m --load-format random --device cuda --served-model-name shape \
  --max-running-requests 512 || exit 1

# cpu_by_role: "engine_ticks http_ticks driver_ticks" summed over the server's threads now.
cpu_by_role() {
  local e=0 h=0 d=0 t comm ticks
  for t in /proc/$SERVE_PID/task/*; do
    comm=$(cat "$t/comm" 2>/dev/null) || continue
    # utime + stime: fields 14 and 15 of stat, counted after the ")" that ends comm.
    ticks=$(sed 's/.*) //' "$t/stat" 2>/dev/null | awk '{print $12 + $13}') || continue
    case $comm in
      kiln-engine) e=$((e + ticks)) ;;
      cuda*) d=$((d + ticks)) ;;
      *) h=$((h + ticks)) ;;
    esac
  done
  echo "$e $h $d"
}
gen_tokens() { curl -s http://127.0.0.1:$port/metrics | awk '/^kiln_generation_tokens_total/ {print $2}'; }
hz=$(getconf CLK_TCK)
summary=()
for C in ${LEVELS:-256 512}; do
  read -r e0 h0 d0 < <(cpu_by_role)
  g0=$(gen_tokens)
  t0=$(date +%s.%N)
  $K bench serve --base-url http://127.0.0.1:$port --input-len 1024 --output-len 256 --concurrency $C \
    --num-prompts $((2 * C)) --warmups 32 --out "$out/scale_c$C" --no-progress >"$out/scale_c$C.txt" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  read -r e1 h1 d1 < <(cpu_by_role)
  g1=$(gen_tokens)
  running=$(curl -s http://127.0.0.1:$port/metrics | grep -E '^kiln_(preemptions|requests_finished)' | tr '\n' ' ')
  line=$(python3 - "$e0" "$h0" "$d0" "$e1" "$h1" "$d1" "$g0" "$g1" "$hz" "$t0" "$t1" <<'PY'
import sys
e0, h0, d0, e1, h1, d1 = map(int, sys.argv[1:7])
g0, g1 = float(sys.argv[7]), float(sys.argv[8])
hz, t0, t1 = int(sys.argv[9]), float(sys.argv[10]), float(sys.argv[11])
tok = max(1.0, g1 - g0)
us = lambda ticks: ticks / hz * 1e6 / tok
print(f"tokens {tok:.0f} in {t1 - t0:.1f} s; CPU per streamed token: HTTP layer {us(h1 - h0):.2f} us, "
      f"engine thread {us(e1 - e0):.2f} us, CUDA driver threads {us(d1 - d0):.2f} us "
      f"(tick {1e6 / hz:.0f} us)")
PY
)
  summary+=("C=$C rc=$rc: $line")
  summary+=("  $(grep -E "^\| [0-9]" "$out/scale_c$C.txt" | head -2)")
  summary+=("  $running")
done
curl -s http://127.0.0.1:$port/metrics | grep -E '^kiln_(running|waiting|kv_pages)' | head -6
serve_stop
echo "---- http scale summary"
printf '%s\n' "${summary[@]}"
