// The official openai client (v4) against kiln serve. argv: BASE EMBED_BASE API_KEY
'use strict';
const assert = require('node:assert/strict');
const mod = require('openai');
const OpenAI = mod.OpenAI || mod.default || mod;
const [base, embBase, key] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: key, maxRetries: 0, timeout: 120000 });
const chatReq = { model: 'demo', messages: [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: 'Name a colour.' }],
                  max_tokens: 5, temperature: 0 };

async function expectError(promise, cls, status, param) {
  try {
    await promise;
  } catch (e) {
    assert.ok(e instanceof cls, `expected ${cls.name}, got ${e.constructor.name}: ${e.message}`);
    assert.equal(e.status, status);
    if (param !== undefined) assert.equal(e.param, param);
    assert.equal(typeof e.error?.message, 'string');
    return;
  }
  assert.fail(`expected ${cls.name}`);
}

async function collect(stream) {
  let text = '', finish = null, usage = null, chunks = 0;
  for await (const ch of stream) {
    chunks++;
    if (ch.usage) usage = ch.usage;
    for (const c of ch.choices) {
      text += c.delta ? (c.delta.content ?? '') : (c.text ?? '');
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  return { text, finish, usage, chunks };
}

async function main() {
  const models = await client.models.list();
  assert.equal(models.data[0].id, 'demo');

  // Chat, non-streaming: shape and usage.
  const r = await client.chat.completions.create(chatReq);
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 5);
  assert.ok(r.usage.prompt_tokens > 10);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + 5);
  assert.equal(typeof r.usage.prompt_tokens_details.cached_tokens, 'number');
  const content = r.choices[0].message.content;
  assert.ok(content.length > 0);

  // Chat, streaming, with usage: same greedy text, one finish_reason, usage last.
  const s = await collect(await client.chat.completions.create({ ...chatReq, stream: true, stream_options: { include_usage: true } }));
  assert.equal(s.text, content);
  assert.equal(s.finish, 'length');
  assert.equal(s.usage.completion_tokens, 5);
  assert.equal(s.usage.prompt_tokens, r.usage.prompt_tokens);

  // Chat logprobs in OpenAI's shape.
  const lp = await client.chat.completions.create({ ...chatReq, max_tokens: 3, logprobs: true, top_logprobs: 2 });
  const entries = lp.choices[0].logprobs.content;
  assert.equal(entries.length, 3);
  for (const e of entries) {
    assert.equal(typeof e.token, 'string');
    assert.ok(e.logprob <= 0);
    assert.ok(Array.isArray(e.bytes));
    assert.equal(e.top_logprobs.length, 2);
    assert.ok(e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob);
  }

  // Completions: non-streaming and streaming agree; a stop string trims the text.
  const cReq = { model: 'demo', prompt: 'Once upon a time', max_tokens: 8, temperature: 0, ignore_eos: true };
  const c = await client.completions.create(cReq);
  assert.equal(c.object, 'text_completion');
  assert.equal(c.usage.completion_tokens, 8);
  const text = c.choices[0].text;
  const cs = await collect(await client.completions.create({ ...cReq, stream: true }));
  assert.equal(cs.text, text);
  assert.equal(cs.finish, 'length');
  const cps = Array.from(text);  // code points: never split a surrogate pair
  const cut = Math.max(1, Math.floor(cps.length / 2));
  const stop = cps.slice(cut, cut + 2).join('');
  const st = await client.completions.create({ ...cReq, stop: [stop] });
  assert.equal(st.choices[0].text, text.slice(0, text.indexOf(stop)));
  assert.equal(st.choices[0].finish_reason, 'stop');
  const sts = await collect(await client.completions.create({ ...cReq, stop: [stop], stream: true }));
  assert.equal(sts.text, st.choices[0].text);
  assert.equal(sts.finish, 'stop');

  // n choices, penalties and logit_bias through the SDK (random weights: the bias makes the output known).
  const nReq = { ...chatReq, n: 3, temperature: 1, seed: 11, max_tokens: 6, ignore_eos: true,
                 presence_penalty: 1, frequency_penalty: 0.5, repetition_penalty: 1.3 };
  const nr = await client.chat.completions.create(nReq);
  assert.equal(nr.choices.length, 3);
  nr.choices.forEach((ch, i) => assert.equal(ch.index, i));
  assert.equal(new Set(nr.choices.map((ch) => ch.message.content)).size, 3, 'three seeded samples, three texts');
  assert.equal(nr.usage.prompt_tokens, r.usage.prompt_tokens);  // the prompt counted once
  assert.equal(nr.usage.completion_tokens, 18);
  const ns = await client.chat.completions.create({ ...nReq, n: 2, stream: true, stream_options: { include_usage: true } });
  const texts = ['', ''];
  let nUsage = null;
  for await (const ch of ns) {
    if (ch.usage) nUsage = ch.usage;
    for (const c of ch.choices) texts[c.index] += c.delta.content ?? '';
  }
  assert.equal(texts[0], nr.choices[0].message.content);  // same seeds, same samples
  assert.equal(texts[1], nr.choices[1].message.content);
  assert.equal(nUsage.completion_tokens, 12);
  const forced = await client.completions.create({ model: 'demo', prompt: 'Once', max_tokens: 3, logprobs: 1,
                                                   logit_bias: { 9707: 100 }, ignore_eos: true });
  const ft = forced.choices[0].logprobs;
  assert.deepEqual(ft.tokens, [ft.tokens[0], ft.tokens[0], ft.tokens[0]]);
  assert.equal(forced.choices[0].text, 'Hello'.repeat(3));  // token 9707 is "Hello"
  ft.token_logprobs.forEach((x) => assert.ok(x > -1e-3, `logprob ${x} of the processed distribution`));

  // Errors arrive as the SDK's error classes, with OpenAI's fields.
  await expectError(client.chat.completions.create({ ...chatReq, n: 17 }), OpenAI.BadRequestError, 400, 'n');
  await expectError(client.chat.completions.create({ ...chatReq, presence_penalty: 3 }), OpenAI.BadRequestError, 400,
                    'presence_penalty');
  await expectError(client.chat.completions.create({ ...chatReq, response_format: { type: 'xml' } }),
                    OpenAI.BadRequestError, 400, 'response_format');
  await expectError(client.chat.completions.create({ ...chatReq, temperature: -1 }), OpenAI.BadRequestError, 400, 'temperature');
  await expectError(client.completions.create({ model: 'demo', prompt: '' }), OpenAI.BadRequestError, 400, 'prompt');
  await expectError(client.chat.completions.create({ ...chatReq, model: 'gpt-4o' }), OpenAI.NotFoundError, 404, 'model');
  const wrongKey = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'nope', maxRetries: 0 });
  await expectError(wrongKey.models.list(), OpenAI.AuthenticationError, 401);

  // Embeddings (Qwen3Model fixture): the SDK asks for base64 by default and decodes it.
  const emb = new OpenAI({ baseURL: `${embBase}/v1`, apiKey: 'unused', maxRetries: 0 });
  const e1 = await emb.embeddings.create({ model: 'embed', input: ['hello world', 'goodbye'] });
  assert.equal(e1.data.length, 2);
  for (const d of e1.data) {
    assert.equal(d.embedding.length, 256);
    const norm = Math.sqrt(d.embedding.reduce((a, x) => a + x * x, 0));
    assert.ok(Math.abs(norm - 1) < 1e-4, `norm ${norm}`);
  }
  assert.ok(e1.usage.prompt_tokens > 0 && e1.usage.total_tokens === e1.usage.prompt_tokens);
  const e2 = await emb.embeddings.create({ model: 'embed', input: 'hello world', encoding_format: 'float' });
  e2.data[0].embedding.forEach((x, i) => assert.ok(Math.abs(x - e1.data[0].embedding[i]) < 1e-6));
  const dot = e1.data[0].embedding.reduce((a, x, i) => a + x * e1.data[1].embedding[i], 0);
  assert.ok(dot < 0.9999, 'different inputs must give different embeddings');
  const e3 = await emb.embeddings.create({ model: 'embed', input: 'hello world', dimensions: 32, encoding_format: 'float' });
  assert.equal(e3.data[0].embedding.length, 32);
  await expectError(emb.chat.completions.create({ ...chatReq, model: 'embed' }), OpenAI.BadRequestError, 400);
  console.log(`openai client checks passed (chat '${content}', completion '${text}', stop ${JSON.stringify(stop)})`);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
