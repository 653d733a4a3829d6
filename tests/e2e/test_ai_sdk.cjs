// The Vercel AI SDK (ai 6, @ai-sdk/openai 3) with its default OpenAI provider, which posts to /v1/responses.
// argv: MODE BASE. MODE demo: the CPU demo checkpoint (text, streaming and not, usage, finish reason).
// MODE tools: kiln_fake_serve (scripted Qwen3 output): reasoning and tool calls as the SDK's parts.
'use strict';
const assert = require('node:assert/strict');
const { generateText, streamText, jsonSchema, tool } = require('ai');
const { createOpenAI } = require('@ai-sdk/openai');
const [mode, base] = process.argv.slice(2);
const openai = createOpenAI({ baseURL: `${base}/v1`, apiKey: 'none' });

async function demo() {
  const req = { model: openai('demo'), system: 'Be terse.', prompt: 'Name a colour.', maxOutputTokens: 5, temperature: 0, maxRetries: 0 };
  const r = await generateText(req);
  assert.ok(r.text.length > 0);
  assert.equal(r.finishReason, 'length');
  assert.equal(r.usage.outputTokens, 5);
  assert.ok(r.usage.inputTokens > 5);
  const s = streamText(req);
  let text = '';
  for await (const part of s.textStream) text += part;
  assert.equal(text, r.text);
  assert.equal(await s.finishReason, 'length');
  assert.equal((await s.usage).outputTokens, 5);
}

async function toolsMode() {
  const tools = {
    get_weather: tool({ description: 'Weather in a city',
      inputSchema: jsonSchema({ type: 'object', properties: { city: { type: 'string' }, unit: { type: 'string' } }, required: ['city'] }) }),
    get_time: tool({ inputSchema: jsonSchema({ type: 'object', properties: { tz: { type: 'string' } } }) }),
  };
  const req = { model: openai('demo'), prompt: 'What is the weather and the time in Paris?', tools, maxRetries: 0 };
  const check = (calls, reasoning, finish) => {
    assert.deepEqual(calls.map((c) => c.toolName), ['get_weather', 'get_time']);
    assert.deepEqual(calls[0].input, { city: 'Paris', unit: '°C' });
    assert.equal(reasoning, 'I need the weather and the time, é中.');
    assert.equal(finish, 'tool-calls');
  };
  const r = await generateText(req);
  check(r.toolCalls, r.reasoningText, r.finishReason);
  const s = streamText(req);
  const calls = [];
  let reasoning = '';
  for await (const part of s.fullStream) {
    if (part.type === 'tool-call') calls.push(part);
    if (part.type === 'reasoning-delta') reasoning += part.text;
    if (part.type === 'error') throw part.error;
  }
  check(calls, reasoning, await s.finishReason);
}

(mode === 'tools' ? toolsMode() : demo()).then(
  () => console.log(`ai sdk checks passed (${mode})`),
  (e) => { console.error(e); process.exit(1); });
