// Tool calling and reasoning through the official openai client (v4). argv: BASE
'use strict';
const assert = require('node:assert/strict');
const mod = require('openai');
const OpenAI = mod.OpenAI || mod.default || mod;
const [base] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'none', maxRetries: 0, timeout: 60000 });

const tools = [
  { type: 'function', function: { name: 'get_weather', description: 'Weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string' }, unit: { type: 'string' } }, required: ['city'] } } },
  { type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: { tz: { type: 'string' } } } } },
];
const question = [{ role: 'user', content: 'What is the weather and the time in Paris?' }];

function checkCalls(calls) {
  assert.equal(calls.length, 2);
  assert.equal(calls[0].type, 'function');
  assert.equal(calls[0].function.name, 'get_weather');
  assert.deepEqual(JSON.parse(calls[0].function.arguments), { city: 'Paris', unit: '°C' });
  assert.equal(calls[1].function.name, 'get_time');
  assert.deepEqual(JSON.parse(calls[1].function.arguments), { tz: 'CET' });
  assert.match(calls[0].id, /^call_/);
  assert.notEqual(calls[0].id, calls[1].id);
}

async function stream(req) {
  const s = await client.chat.completions.create({ ...req, stream: true });
  const out = { content: '', reasoning: '', calls: [], finish: null };
  for await (const ch of s) {
    for (const c of ch.choices) {
      const d = c.delta;
      out.content += d.content ?? '';
      out.reasoning += d.reasoning_content ?? '';
      for (const tc of d.tool_calls ?? []) {
        const cur = out.calls[tc.index] ?? (out.calls[tc.index] = { id: '', type: '', function: { name: '', arguments: '' } });
        if (tc.id) cur.id = tc.id;
        if (tc.type) cur.type = tc.type;
        cur.function.name += tc.function?.name ?? '';
        cur.function.arguments += tc.function?.arguments ?? '';
      }
      if (c.finish_reason) out.finish = c.finish_reason;
    }
  }
  return out;
}

async function main() {
  // 1. The call, non-streaming.
  const r = await client.chat.completions.create({ model: 'demo', messages: question, tools });
  const m = r.choices[0].message;
  assert.equal(r.choices[0].finish_reason, 'tool_calls');
  assert.equal(m.content, 'Let me check.');
  assert.equal(m.reasoning_content, 'I need the weather and the time, é中.');
  checkCalls(m.tool_calls);

  // 2. The same, streaming: deltas assemble into the same calls.
  const s = await stream({ model: 'demo', messages: question, tools });
  assert.equal(s.finish, 'tool_calls');
  assert.equal(s.content, 'Let me check.');
  assert.equal(s.reasoning, 'I need the weather and the time, é中.');
  checkCalls(s.calls);

  // 3. Round trip: the assistant's calls and the tool results go back through the chat template.
  const history = [...question, m,
    { role: 'tool', tool_call_id: m.tool_calls[0].id, content: '{"temp": 18}' },
    { role: 'tool', tool_call_id: m.tool_calls[1].id, content: '12:00' }];
  const a = await client.chat.completions.create({ model: 'demo', messages: history, tools });
  assert.equal(a.choices[0].finish_reason, 'stop');
  assert.equal(a.choices[0].message.content, 'It is 18°C in Paris, and 12:00 (CET).');
  assert.equal(a.choices[0].message.reasoning_content, 'The tool said 18°C.');
  assert.equal(a.choices[0].message.tool_calls, undefined);
  const as = await stream({ model: 'demo', messages: history, tools });
  assert.equal(as.reasoning, 'The tool said 18°C.');
  assert.equal(as.content, 'It is 18°C in Paris, and 12:00 (CET).');
  assert.equal(as.finish, 'stop');

  // 4. tool_choice: none leaves the tags in content; required and a named function are accepted (this scripted
  // fake engine replays its script: the grammar that forces the calls is checked on the real engine by
  // test_server_structured_output and e2e_structured).
  const n = await client.chat.completions.create({ model: 'demo', messages: question, tools, tool_choice: 'none' });
  assert.equal(n.choices[0].finish_reason, 'stop');
  assert.match(n.choices[0].message.content, /^Let me check\.\n<tool_call>\n\{"name": "get_weather"/);
  for (const tool_choice of ['required', { type: 'function', function: { name: 'get_time' } }]) {
    const r = await client.chat.completions.create({ model: 'demo', messages: question, tools, tool_choice });
    for (const c of r.choices[0].message.tool_calls || []) assert.equal(typeof JSON.parse(c.function.arguments), 'object');
  }
  try {  // a named function that is not among the tools
    await client.chat.completions.create({ model: 'demo', messages: question, tools,
                                           tool_choice: { type: 'function', function: { name: 'nope' } } });
    assert.fail('expected a 400');
  } catch (e) {
    assert.ok(e instanceof OpenAI.BadRequestError, `${e.constructor.name}: ${e.message}`);
    assert.equal(e.param, 'tool_choice');
  }
  // parallel_tool_calls false: only the first call (vLLM), streaming and not.
  for (const req of [{ model: 'demo', messages: question, tools, parallel_tool_calls: false }]) {
    const one = await client.chat.completions.create(req);
    assert.equal(one.choices[0].finish_reason, 'tool_calls');
    assert.deepEqual(one.choices[0].message.tool_calls.map((c) => c.function.name), ['get_weather']);
    const os = await stream(req);
    assert.deepEqual(os.calls.map((c) => c.function.name), ['get_weather']);
    assert.equal(os.content, 'Let me check.');
  }
  // 5. Thinking off: the template closes <think> in the prompt; nothing is split out.
  const off = await client.chat.completions.create({ model: 'demo', messages: [{ role: 'user', content: 'hi' }],
    chat_template_kwargs: { enable_thinking: false } });
  assert.equal(off.choices[0].message.reasoning_content, undefined);
  assert.match(off.choices[0].message.content, /^<think>/);
  console.log('openai tool-call checks passed');
}

main().catch((e) => { console.error(e); process.exit(1); });
