#!/usr/bin/env bash
# The HTTP layer's own CPU per streamed token (issue 16, item 6): `kiln serve` on the CPU demo checkpoint
# (the engine computes on its own thread: KILN_NUM_THREADS=1, so every other thread of the process is the
# HTTP layer: I/O threads, handler workers, main), driven by `kiln bench serve` with short prompts (cheap
# engine steps, many tokens per second), for /generate (SGLang, cumulative frames) and /v1/completions
# (OpenAI, incremental chunks) at each concurrency. Per window: utime and stime of the non-engine threads
# (/proc/PID/task/*/stat) over kiln_generation_tokens_total's rise, and the engine thread's own CPU per
# token for reference. CPU time, not wall time, so a busy machine changes little; repeat (REPEAT=N) to see
# the noise. FAKE_SERVE=BIN: the same over kiln_fake_serve instead (tests/e2e/fake_serve.cpp: the real server
# and the demo tokenizer over a fake engine that steps every STEP_MS ms (default 30) and echoes the prompt),
# fast enough for C=256 on a CPU where the demo checkpoint's steps take seconds.
#   scripts/http_cpu_per_token.sh
#   FAKE_SERVE=build/cpu/tests/e2e/kiln_fake_serve STEP_MS=1 scripts/http_cpu_per_token.sh
# Env: KILN (binary, default build/cpu/bin/kiln), MODEL (demo checkpoint dir, written if missing),
#   LEVELS ("64 256"), APIS ("generate completions"), INPUT_LEN (16), OUTPUT_LEN (256), PROMPTS (2C a level),
#   REPEAT (1), SERVE_ARGS (extra `kiln serve` flags; with FAKE_SERVE only --stream-interval N is read), OUT
#   (logs, default a temp dir).
set -uo pipefail
cd "$(dirname "$0")/.."
K=${KILN:-build/cpu/bin/kiln}
MODEL=${MODEL:-/tmp/kiln-http-cpu-demo}
out=${OUT:-$(mktemp -d /tmp/kiln-http-cpu.XXXXXX)}
mkdir -p "$out"
[[ -x $K ]] || { echo "http_cpu_per_token: $K not found (cmake --build --preset cpu --target kiln)" >&2; exit 1; }
[[ -f $MODEL/config.json ]] || "$K" demo-model "$MODEL" >/dev/null
ulimit -n 65536 2>/dev/null || true

if [[ -n ${FAKE_SERVE:-} ]]; then
  # shellcheck disable=SC2086
  "$FAKE_SERVE" serve --model "$MODEL" --port 0 --echo --step-ms "${STEP_MS:-30}" ${SERVE_ARGS:-} \
    >"$out/serve.out" 2>"$out/serve.log" &
else
  # shellcheck disable=SC2086
  KILN_NUM_THREADS=1 "$K" serve --model "$MODEL" --device cpu --port 0 --max-running-requests 256 \
    ${SERVE_ARGS:-} >"$out/serve.out" 2>"$out/serve.log" &
fi
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null' EXIT
base=
for _ in $(seq 1 600); do
  base=$(sed -n 's/^READY //p' "$out/serve.out" 2>/dev/null)
  [[ -n $base ]] && break
  kill -0 $pid 2>/dev/null || break
  sleep 0.1
done
[[ -n $base ]] || { echo "server did not start:"; tail -20 "$out/serve.log"; exit 1; }

# "engine_user engine_sys http_user http_sys engine_ns http_ns", summed over the server's threads now:
# utime and stime in clock ticks (stat fields 14 and 15, counted after the ")" that ends comm), and the
# scheduler's run time in ns (schedstat's first field: user + sys, finer than a tick).
cpu_ticks() {
  local t comm
  for t in /proc/$pid/task/*; do
    comm=$(cat "$t/comm" 2>/dev/null) || continue
    echo "$([[ $comm == kiln-engine ]] && echo 1 || echo 0) $(sed 's/.*) //' "$t/stat" 2>/dev/null |
      awk '{print $12, $13}') $(awk '{print $1}' "$t/schedstat" 2>/dev/null)"
  done | awk 'NF == 4 { if ($1) { eu += $2; es += $3; en += $4 } else { hu += $2; hs += $3; hn += $4 } }
              END { printf "%d %d %d %d %.0f %.0f\n", eu, es, hu, hs, en, hn }'
}
gen_tokens() { curl -s "$base/metrics" | awk '/^kiln_generation_tokens_total/ {print $2}'; }

hz=$(getconf CLK_TCK)
printf '%-12s %5s %8s %9s | %10s %10s %10s | %12s\n' api C tokens "wall s" "http user" "http sys" \
  "http total" "engine (us)"
for rep in $(seq 1 "${REPEAT:-1}"); do
  for api in ${APIS:-generate completions}; do
    for C in ${LEVELS:-64 256}; do
      read -r eu0 es0 hu0 hs0 en0 hn0 < <(cpu_ticks)
      g0=$(gen_tokens)
      t0=$(date +%s.%N)
      "$K" bench serve --base-url "$base" --api "$api" --input-len "${INPUT_LEN:-16}" \
        --output-len "${OUTPUT_LEN:-256}" --concurrency "$C" --num-prompts "${PROMPTS:-$((2 * C))}" \
        --warmups 0 --no-flush --no-progress --out "$out/${api}_c${C}_r$rep" >"$out/${api}_c${C}_r$rep.txt" 2>&1
      rc=$?
      t1=$(date +%s.%N)
      read -r eu1 es1 hu1 hs1 en1 hn1 < <(cpu_ticks)
      g1=$(gen_tokens)
      python3 - "$api" "$C" "$rc" "$hz" "$t0" "$t1" "$g0" "$g1" "$eu0" "$es0" "$hu0" "$hs0" "$eu1" "$es1" \
        "$hu1" "$hs1" "$en0" "$hn0" "$en1" "$hn1" <<'PY'
import sys
api, C, rc, hz = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
t0, t1, g0, g1 = map(float, sys.argv[5:9])
eu0, es0, hu0, hs0, eu1, es1, hu1, hs1, en0, hn0, en1, hn1 = map(int, sys.argv[9:21])
tok = max(1.0, g1 - g0)
us = lambda ticks: ticks / hz * 1e6 / tok
hu, hs = us(hu1 - hu0), us(hs1 - hs0)
note = "" if rc == 0 else f"  (bench rc {rc})"
print(f"{api:<12} {C:>5} {tok:>8.0f} {t1 - t0:>9.1f} | {hu:>10.2f} {hs:>10.2f} {(hn1 - hn0) / 1e3 / tok:>10.2f} | "
      f"{(en1 - en0) / 1e3 / tok:>12.2f}{note}")
PY
    done
  done
done
echo "(us of CPU per streamed token. user, sys: from ticks of $((1000000 / hz)) us; total: schedstat run time," \
  "in ns; logs in $out)"
