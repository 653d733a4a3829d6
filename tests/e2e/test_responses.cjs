// /v1/responses through the official openai client (v4: client.responses). argv: MODE BASE
//   MODE demo: the CPU demo checkpoint (random weights): shapes, streaming events, stored responses, errors.
//   MODE tools: kiln_fake_serve (scripted Qwen3 output): reasoning items, function_call items, and the
//   tool round trip through previous_response_id and function_call_output items.
'use strict';
const assert = require('node:assert/strict');
const mod = require('openai');
const OpenAI = mod.OpenAI || mod.default || mod;
const [mode, base] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'none', maxRetries: 0, timeout: 120000 });

// The streamed events, checked for order and agreement; returns the final response and the event types.
async function streamed(req) {
  const s = await client.responses.create({ ...req, stream: true });
  const types = [];
  let last = -1, final = null, text = '', reasoning = '';
  const args = {};
  for await (const ev of s) {
    types.push(ev.type);
    assert.equal(ev.sequence_number, last + 1, `sequence_number after ${types.at(-2)}`);
    last = ev.sequence_number;
    if (ev.type === 'response.output_text.delta') text += ev.delta;
    if (ev.type === 'response.reasoning_summary_text.delta') reasoning += ev.delta;
    if (ev.type === 'response.function_call_arguments.delta') args[ev.item_id] = (args[ev.item_id] ?? '') + ev.delta;
    if (ev.type === 'response.output_text.done') assert.equal(ev.text, text);
    if (['response.completed', 'response.incomplete', 'response.failed'].includes(ev.type)) final = ev.response;
  }
  assert.equal(types[0], 'response.created');
  assert.equal(types[1], 'response.in_progress');
  assert.ok(final, 'no final response event');
  for (const item of final.output)
    if (item.type === 'function_call') assert.equal(args[item.id], item.arguments);
  return { final, types, text, reasoning };
}

async function expectError(promise, status, param) {
  try {
    await promise;
  } catch (e) {
    assert.equal(e.status, status, e.message);
    if (param !== undefined) assert.equal(e.param, param, e.message);
    return;
  }
  assert.fail(`expected an error ${status}`);
}

async function demo() {
  const req = { model: 'demo', instructions: 'Be terse.', input: 'Name a colour.', max_output_tokens: 6, temperature: 0 };
  const r = await client.responses.create(req);
  assert.equal(r.object, 'response');
  assert.match(r.id, /^resp_/);
  assert.equal(r.model, 'demo');
  assert.equal(r.instructions, 'Be terse.');
  assert.equal(r.usage.output_tokens, 6);
  assert.ok(r.usage.input_tokens > 5);
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + 6);
  assert.equal(r.status, 'incomplete');  // the length limit: random weights never stop before 6 tokens
  assert.equal(r.incomplete_details.reason, 'max_output_tokens');
  const msg = r.output.find((o) => o.type === 'message');
  assert.ok(msg, JSON.stringify(r.output));
  assert.equal(msg.role, 'assistant');
  assert.equal(msg.content[0].type, 'output_text');
  assert.equal(r.output_text, msg.content[0].text);  // the SDK's convenience field
  assert.ok(r.output_text.length > 0);

  // Streaming: the same greedy text, every event of a message item, in order.
  const s = await streamed(req);
  assert.equal(s.text, r.output_text);
  assert.equal(s.final.status, 'incomplete');
  assert.equal(s.final.usage.output_tokens, 6);
  for (const t of ['response.output_item.added', 'response.content_part.added', 'response.output_text.delta',
                   'response.output_text.done', 'response.content_part.done', 'response.output_item.done'])
    assert.ok(s.types.includes(t), `missing ${t}: ${s.types.join(' ')}`);
  assert.ok(s.types.indexOf('response.output_item.added') < s.types.indexOf('response.output_text.delta'));
  assert.equal(s.types.at(-1), 'response.incomplete');

  // Input as items (input_text parts), the same prompt as the string form: same tokens and text.
  const items = await client.responses.create({ ...req, input: [{ role: 'user', content: [{ type: 'input_text', text: 'Name a colour.' }] }] });
  assert.equal(items.usage.input_tokens, r.usage.input_tokens);
  assert.equal(items.output_text, r.output_text);

  // Stored: retrievable, and continued by previous_response_id (the prompt holds the first turn).
  const got = await client.responses.retrieve(r.id);
  assert.equal(got.id, r.id);
  assert.equal(got.output_text ?? got.output[0].content[0].text, r.output_text);
  const next = await client.responses.create({ model: 'demo', input: 'And another?', previous_response_id: r.id, max_output_tokens: 2 });
  assert.equal(next.previous_response_id, r.id);
  assert.ok(next.usage.input_tokens > r.usage.input_tokens, `${next.usage.input_tokens} vs ${r.usage.input_tokens}`);
  // store: false is not kept.
  const nostore = await client.responses.create({ ...req, store: false });
  assert.equal(nostore.store, false);
  await expectError(client.responses.retrieve(nostore.id), 404);
  await expectError(client.responses.create({ model: 'demo', input: 'x', previous_response_id: nostore.id }), 404, 'previous_response_id');

  // Errors name the Responses field.
  await expectError(client.responses.create({ model: 'demo', input: 'x', tools: [{ type: 'web_search_preview' }] }), 400, 'tools[0].type');
  await expectError(client.responses.create({ model: 'demo', input: 'x', max_output_tokens: 100000000 }), 400, 'max_output_tokens');
  await expectError(client.responses.create({ model: 'demo', input: [{ type: 'file_search_call' }] }), 400, 'input[0].type');
  await expectError(client.responses.create({ model: 'nope', input: 'x' }), 404, 'model');
}

const tools = [
  { type: 'function', name: 'get_weather', description: 'Weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string' }, unit: { type: 'string' } }, required: ['city'] } },
  { type: 'function', name: 'get_time', parameters: { type: 'object', properties: { tz: { type: 'string' } } } },
];

function checkCallTurn(r) {
  assert.deepEqual(r.output.map((o) => o.type), ['reasoning', 'message', 'function_call', 'function_call']);
  assert.equal(r.output[0].summary[0].type, 'summary_text');
  assert.equal(r.output[0].summary[0].text, 'I need the weather and the time, é中.');
  assert.equal(r.output[1].content[0].text, 'Let me check.');
  const [w, t] = r.output.slice(2);
  assert.equal(w.name, 'get_weather');
  assert.deepEqual(JSON.parse(w.arguments), { city: 'Paris', unit: '°C' });
  assert.equal(t.name, 'get_time');
  assert.match(w.call_id, /^call_/);
  assert.notEqual(w.call_id, t.call_id);
  assert.equal(r.status, 'completed');
}

async function toolsMode() {
  const req = { model: 'demo', input: 'What is the weather and the time in Paris?', tools };
  const r = await client.responses.create(req);
  checkCallTurn(r);
  const s = await streamed(req);
  checkCallTurn(s.final);
  assert.equal(s.reasoning, 'I need the weather and the time, é中.');
  for (const t of ['response.reasoning_summary_part.added', 'response.reasoning_summary_text.delta',
                   'response.reasoning_summary_text.done', 'response.function_call_arguments.delta',
                   'response.function_call_arguments.done', 'response.completed'])
    assert.ok(s.types.includes(t), `missing ${t}`);

  // parallel_tool_calls false: the first call only.
  const one = await client.responses.create({ ...req, parallel_tool_calls: false, store: false });
  assert.deepEqual(one.output.map((o) => o.type), ['reasoning', 'message', 'function_call']);
  assert.equal(one.parallel_tool_calls, false);

  // The tool results as function_call_output items after previous_response_id: the answer.
  const calls = r.output.filter((o) => o.type === 'function_call');
  const answer = await client.responses.create({
    model: 'demo', tools, previous_response_id: r.id,
    input: [{ type: 'function_call_output', call_id: calls[0].call_id, output: '18°C' },
            { type: 'function_call_output', call_id: calls[1].call_id, output: '12:00' }] });
  assert.equal(answer.output_text, 'It is 18°C in Paris, and 12:00 (CET).');
  assert.equal(answer.output[0].type, 'reasoning');
  // The same turn given whole (function_call items in the input) without a stored response.
  const whole = await client.responses.create({
    model: 'demo', tools, store: false,
    input: [{ role: 'user', content: 'What is the weather and the time in Paris?' }, ...calls.map(({ call_id, name, arguments: a }) => ({ type: 'function_call', call_id, name, arguments: a })),
            { type: 'function_call_output', call_id: calls[0].call_id, output: '18°C' }] });
  assert.equal(whole.output_text, 'It is 18°C in Paris, and 12:00 (CET).');
}

(mode === 'tools' ? toolsMode() : demo()).then(
  () => console.log(`responses checks passed (${mode})`),
  (e) => { console.error(e); process.exit(1); });
