// Bounded load test. argv: BASE N CONCURRENCY. Exits non-zero unless every request is accounted for.
'use strict';
const assert = require('node:assert/strict');
const mod = require('openai');
const OpenAI = mod.OpenAI || mod.default || mod;
const [base, nArg, concArg] = process.argv.slice(2);
const N = Number(nArg), CONC = Number(concArg);
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 300000 });
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const shared = 'You are a helpful assistant. Answer in one short sentence, please. '.repeat(3);

// Kinds, by i % 10: 0-3 chat stream, 4-5 completion, 6 chat non-stream, 7 stream aborted after 2 chunks,
// 8 non-stream aborted after 150 ms, 9 invalid (rejected with 400, never accepted).
async function one(i) {
  const kind = i % 10;
  const chat = { model: 'demo', messages: [{ role: 'system', content: shared }, { role: 'user', content: `Question ${i}?` }],
                 max_tokens: 3 + (i % 3), temperature: i % 2 ? 0 : 0.7, seed: i };
  if (kind <= 3) {
    const stream = await client.chat.completions.create({ ...chat, stream: true, stream_options: { include_usage: true } });
    let usage = null, finish = null;
    for await (const ch of stream) {
      if (ch.usage) usage = ch.usage;
      for (const c of ch.choices) if (c.finish_reason) finish = c.finish_reason;
    }
    assert.ok(finish === 'length' || finish === 'stop', `finish ${finish}`);
    assert.ok(usage && usage.completion_tokens >= 1 && usage.completion_tokens <= chat.max_tokens);
    return 'completed';
  }
  if (kind <= 5) {
    const r = await client.completions.create({ model: 'demo', prompt: `${shared} Item ${i}:`, max_tokens: 3, temperature: 0 });
    assert.ok(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 3);
    return 'completed';
  }
  if (kind === 6) {
    const r = await client.chat.completions.create(chat);
    assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
    return 'completed';
  }
  if (kind === 7) {
    const stream = await client.chat.completions.create({ ...chat, max_tokens: 400, ignore_eos: true, stream: true });
    let chunks = 0;
    for await (const _ of stream) {
      if (++chunks === 2) {
        stream.controller.abort();
        break;
      }
    }
    return 'aborted_mid_stream';
  }
  if (kind === 8) {
    const ac = new AbortController();
    const p = client.chat.completions.create({ ...chat, max_tokens: 400, ignore_eos: true }, { signal: ac.signal });
    await sleep(150);
    ac.abort();
    try {
      await p;
      return 'completed';  // only if it finished within 150 ms (it cannot: 400 tokens)
    } catch (e) {
      assert.ok(e instanceof OpenAI.APIUserAbortError || /abort/i.test(e.name), `expected an abort, got ${e}`);
      return 'aborted';
    }
  }
  try {
    await client.chat.completions.create({ ...chat, top_p: 5 });
  } catch (e) {
    assert.equal(e.status, 400);
    return 'rejected';
  }
  throw new Error('invalid request was accepted');
}

async function metrics() {
  const text = await (await fetch(`${base}/metrics`)).text();
  const m = {};
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const sp = line.lastIndexOf(' ');
    m[line.slice(0, sp).replace(/model_name="[^"]*",?/, '').replace('{}', '')] = Number(line.slice(sp + 1));
  }
  return m;
}

async function main() {
  const t0 = Date.now();
  // aborted_mid_stream: accepted for sure (chunks arrived); aborted: maybe before the server accepted it.
  const counts = { completed: 0, aborted_mid_stream: 0, aborted: 0, rejected: 0 };
  let next = 0;
  const failures = [];
  await Promise.all(Array.from({ length: CONC }, async () => {
    while (next < N) {
      const i = next++;
      try {
        counts[await one(i)]++;
      } catch (e) {
        failures.push(`request ${i}: ${e.stack || e}`);
      }
    }
  }));
  const secs = (Date.now() - t0) / 1000;
  if (failures.length) {
    console.error(failures.slice(0, 5).join('\n'));
    throw new Error(`${failures.length} requests failed`);
  }
  // Let the aborts land, then check the books.
  let m;
  for (let k = 0; k < 100; k++) {
    m = await metrics();
    if (m.kiln_server_active_requests === 0 && m.kiln_num_running_requests === 0 && m.kiln_num_waiting_requests === 0) break;
    await sleep(100);
  }
  const srv = (o) => m[`kiln_server_requests_finished_total{outcome="${o}"}`];
  const eng = (r) => m[`kiln_requests_finished_total{reason="${r}"}`];
  assert.equal(m.kiln_server_active_requests, 0, 'requests still in flight');
  assert.equal(m.kiln_num_running_requests, 0);
  assert.equal(m.kiln_num_waiting_requests, 0);
  const accepted = m.kiln_server_requests_accepted_total;
  assert.equal(accepted, srv('completed') + srv('aborted') + srv('error'), 'server books');
  assert.equal(srv('completed'), counts.completed, 'completed vs client view');
  const aborted = counts.aborted_mid_stream + counts.aborted;
  assert.ok(srv('aborted') >= counts.aborted_mid_stream && srv('aborted') <= aborted,
            `server aborted ${srv('aborted')} vs client aborts ${counts.aborted_mid_stream} + ${counts.aborted}`);
  assert.equal(srv('error'), 0);
  assert.equal(m['kiln_server_requests_rejected_total{reason="invalid"}'], counts.rejected);
  assert.equal(m.kiln_requests_submitted_total, eng('stop') + eng('length') + eng('abort') + eng('error'), 'engine books');
  assert.equal(eng('abort'), srv('aborted'), 'every accepted abort reached the engine');
  assert.equal(m.kiln_kv_pages_used, 0, 'pages still held by requests');
  assert.equal(m.kiln_kv_pages_used + m.kiln_kv_pages_cached + m.kiln_kv_pages_free, m.kiln_kv_pages_total);
  assert.ok(m.kiln_cached_tokens_total > 0, 'the shared prefix should hit the prefix cache');
  await fetch(`${base}/flush_cache`, { method: 'POST' });
  const after = await metrics();
  assert.equal(after.kiln_kv_pages_free, after.kiln_kv_pages_total, 'pages not free after /flush_cache');
  console.log(`load: ${N} requests at concurrency ${CONC} in ${secs.toFixed(1)} s: completed ${counts.completed}, ` +
              `aborted ${aborted} (${counts.aborted_mid_stream} mid-stream; ${srv('aborted')} reached the engine), rejected ${counts.rejected}; engine submitted ${m.kiln_requests_submitted_total}, ` +
              `generated ${m.kiln_generation_tokens_total} tokens, cached prompt tokens ${m.kiln_cached_tokens_total}, ` +
              `preemptions ${m.kiln_preemptions_total}; pages free ${after.kiln_kv_pages_free}/${after.kiln_kv_pages_total}`);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
