// LangChain.js (@langchain/openai 1.6 with @langchain/core 1.4) against kiln serve on the CPU demo checkpoint:
// ChatOpenAI.invoke and .stream (chat completions), usage and finish reason. Not in the default harness: the
// two packages and their dependencies install to ~90 MB (openai 7 alone 35 MB, js-tiktoken 22 MB), too much
// to add to .deps (carried to the device machine); run by hand with NODE_PATH at such an install:
//   NODE_PATH=/path/node_modules node tests/e2e/test_langchain.cjs http://127.0.0.1:PORT
'use strict';
const assert = require('node:assert/strict');
const { ChatOpenAI } = require('@langchain/openai');
const [base] = process.argv.slice(2);

async function main() {
  const llm = new ChatOpenAI({ model: 'demo', apiKey: 'none', configuration: { baseURL: `${base}/v1` },
                               temperature: 0, maxTokens: 6, maxRetries: 0 });
  const r = await llm.invoke([['system', 'Be terse.'], ['human', 'Name a colour.']]);
  assert.equal(typeof r.content, 'string');
  assert.ok(r.content.length > 0);
  assert.equal(r.response_metadata.finish_reason, 'length');
  assert.equal(r.usage_metadata.output_tokens, 6);
  assert.ok(r.usage_metadata.input_tokens > 5);
  let text = '';
  let chunks = 0;
  for await (const chunk of await llm.stream([['system', 'Be terse.'], ['human', 'Name a colour.']])) {
    text += chunk.content;
    ++chunks;
  }
  assert.equal(text, r.content, 'greedy stream == invoke');
  assert.ok(chunks >= 2);
  // Tools bound the LangChain way reach the chat template (the demo's random weights call none).
  const withTools = llm.bindTools([{ type: 'function', function: { name: 'get_weather', description: 'Weather',
                                     parameters: { type: 'object', properties: { city: { type: 'string' } } } } }]);
  const t = await withTools.invoke('Weather in Paris?');
  assert.ok(Array.isArray(t.tool_calls));
  console.log(`langchain: invoke ${JSON.stringify(r.content)}, ${chunks} stream chunks, tools ok`);
}
main().catch((e) => { console.error(e); process.exit(1); });
