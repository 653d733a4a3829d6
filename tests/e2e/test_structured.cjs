// Structured output through the official openai client (v4) and zod. argv: BASE
'use strict';
const assert = require('node:assert/strict');
const mod = require('openai');
const OpenAI = mod.OpenAI || mod.default || mod;
const { zodResponseFormat, zodFunction } = require('openai/helpers/zod');
const { z } = require('zod');
const [base] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'none', maxRetries: 0, timeout: 120000 });

const Film = z.object({
  title: z.string().regex(/^[a-z]{1,8}$/),  // (zod's max() counts UTF-16 units, JSON Schema's maxLength code points)
  year: z.number().int().min(1900).max(2100),
  genre: z.enum(['drama', 'comedy', 'horror']),
  seen: z.boolean(),
});
const noThinking = { chat_template_kwargs: { enable_thinking: false } };

async function main() {
  // 1. .parse() with a zod response format: every seed's reply parses and validates (the SDK parses
  //    message.content into message.parsed; a reply cut by max_tokens would throw instead).
  for (let seed = 0; seed < 4; seed++) {
    const r = await client.beta.chat.completions.parse({
      model: 'demo', messages: [{ role: 'user', content: 'A film, as JSON.' }], temperature: 1, seed,
      max_tokens: 400, response_format: zodResponseFormat(Film, 'film'), ...noThinking,
    });
    const c = r.choices[0];
    assert.equal(c.finish_reason, 'stop', JSON.stringify(r));
    assert.ok(c.message.parsed, JSON.stringify(r));
    Film.parse(c.message.parsed);
    assert.deepEqual(Object.keys(c.message.parsed), ['title', 'year', 'genre', 'seen']);  // the schema's order
  }
  // 2. A strict zod tool forced with tool_choice "required": parsed_arguments follow the schema.
  const Weather = z.object({ city: z.enum(['Paris', 'Oslo']), days: z.number().int().min(1).max(7) });
  const r = await client.beta.chat.completions.parse({
    model: 'demo', messages: [{ role: 'user', content: 'Weather?' }], temperature: 1, seed: 5, max_tokens: 400,
    tools: [zodFunction({ name: 'get_weather', parameters: Weather })], tool_choice: 'required',
    parallel_tool_calls: false, ...noThinking,
  });
  const c = r.choices[0];
  assert.equal(c.finish_reason, 'tool_calls', JSON.stringify(r));
  assert.equal(c.message.tool_calls.length, 1);
  assert.equal(c.message.tool_calls[0].function.name, 'get_weather');
  Weather.parse(c.message.tool_calls[0].function.parsed_arguments);
  // 3. A keyword the engine cannot enforce is a 400 naming the field.
  await assert.rejects(
    client.chat.completions.create({
      model: 'demo', messages: [{ role: 'user', content: 'x' }], max_tokens: 5,
      response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'string', not: { const: 'a' } } } },
    }),
    (e) => e.status === 400 && e.error?.param === 'response_format' && /'not'/.test(e.message));
  console.log('structured output: ok');
}

main().catch((e) => { console.error(e); process.exit(1); });
