"""vl_ttft.py PORT PNG: TTFT of a streamed one-image chat request, 18 in a row, the first two warm-ups
(bench/device.sh vl-serve)."""
import base64, json, sys, time, http.client, statistics
port, path = sys.argv[1], sys.argv[2]
url = "data:image/png;base64," + base64.b64encode(open(path, "rb").read()).decode()
body = json.dumps({"model": "vl", "stream": True, "max_tokens": 16, "temperature": 0, "messages": [
    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                 {"type": "text", "text": "Describe this image."}]}]})
ttft = []
for i in range(18):
    c = http.client.HTTPConnection("127.0.0.1", int(port), timeout=120)
    t = time.perf_counter()
    c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    first = None
    for line in r:
        text = line.replace(b'"content":""', b"").replace(b'"reasoning_content":""', b"")
        if line.startswith(b"data: ") and (b'"content":"' in text or b'"reasoning_content":"' in text):
            first = time.perf_counter() - t
            break
    r.read()
    c.close()
    if first is not None and i >= 2:  # two warm-ups
        ttft.append(first * 1e3)
if not ttft:
    sys.exit("one-image chat request: no streamed text arrived")
print(f"one-image chat request (448x448, 196 image tokens), TTFT over {len(ttft)}: median {statistics.median(ttft):.1f} ms,"
      f" min {min(ttft):.1f}, max {max(ttft):.1f}")
