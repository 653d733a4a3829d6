// The @huggingface/jinja oracle for scripts/chat_template_goldens.py: reads [{source, vars}] as JSON on
// stdin, writes [{out} | {error}] on stdout. Run from the repo root (resolves .deps/npm/node_modules).
import { createRequire } from "node:module";
import { readFileSync } from "node:fs";
import path from "node:path";

const require = createRequire(path.resolve(".deps/npm/package.json"));
const { Template } = require("@huggingface/jinja");
const cases = JSON.parse(readFileSync(0, "utf8"));
const out = cases.map(({ source, vars }) => {
  try {
    return { out: new Template(source).render(vars) };
  } catch (e) {
    return { error: String(e && e.message ? e.message : e) };
  }
});
process.stdout.write(JSON.stringify(out));
