// The official openai client (v4) sending images to kiln serve (demo Qwen3-VL checkpoint). argv: BASE IMAGES_DIR
'use strict';
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const mod = require('openai');
const OpenAI = mod.OpenAI || mod.default || mod;
const [base, images] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'none', maxRetries: 0, timeout: 120000 });
const dataUrl = (name, mime) => `data:${mime};base64,${fs.readFileSync(path.join(images, name)).toString('base64')}`;
const ask = (parts, extra = {}) => client.chat.completions.create({
  model: 'demo-vl', messages: [{ role: 'user', content: parts }], max_tokens: 4, temperature: 0, logprobs: true,
  top_logprobs: 2, ...extra });

async function main() {
  const png = dataUrl('odd_rgb.png', 'image/png');
  const jpg = dataUrl('photo.jpg', 'image/jpeg');
  const text = { type: 'text', text: 'Describe it.' };
  const plain = await ask([text]);
  const a = await ask([{ type: 'image_url', image_url: { url: png } }, text]);
  // 53x37 -> 320x224 (min 65536 pixels) -> 20 x 14 patches -> 70 merged tokens, plus <|vision_start|> and <|vision_end|>.
  assert.equal(a.usage.prompt_tokens, plain.usage.prompt_tokens + 72);
  assert.equal(a.usage.completion_tokens, 4);
  const again = await ask([{ type: 'image_url', image_url: { url: png } }, text]);
  assert.equal(again.choices[0].message.content, a.choices[0].message.content, 'same image, same greedy text');
  assert.deepEqual(again.choices[0].logprobs.content.map((t) => t.logprob), a.choices[0].logprobs.content.map((t) => t.logprob));
  const b = await ask([{ type: 'image_url', image_url: { url: jpg } }, text]);
  // 83x61 -> 320x224 as well: 70 tokens.
  assert.equal(b.usage.prompt_tokens, plain.usage.prompt_tokens + 72);
  assert.notEqual(b.choices[0].logprobs.content[0].logprob, a.choices[0].logprobs.content[0].logprob,
                  'a different image changes the first token distribution');
  const two = await ask([{ type: 'image_url', image_url: { url: png } }, { type: 'image_url', image_url: { url: jpg } }, text]);
  assert.equal(two.usage.prompt_tokens, plain.usage.prompt_tokens + 72 + 72);
  // Streaming with an image.
  const stream = await ask([{ type: 'image_url', image_url: { url: png } }, text], { stream: true, logprobs: false, top_logprobs: undefined });
  let streamed = '';
  for await (const ch of stream) for (const c of ch.choices) streamed += c.delta?.content ?? '';
  assert.equal(streamed, a.choices[0].message.content);
  // A bad image is a 400 with its code; the server keeps serving.
  try {
    await ask([{ type: 'image_url', image_url: { url: 'data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAA==' } }, text]);
    assert.fail('expected a 400');
  } catch (e) {
    assert.ok(e instanceof OpenAI.BadRequestError, `got ${e.constructor.name}: ${e.message}`);
    assert.equal(e.code, 'invalid_image');
  }
  const after = await ask([text]);
  assert.equal(after.choices[0].message.content, plain.choices[0].message.content);
  console.log('vision checks passed');
}
main().catch((e) => { console.error(e); process.exit(1); });
