"""vl_check.py PORT IN_FLIGHT OUT IMAGES...: two greedy image chat requests an image (64 tokens, top-2 log-probs)
against /v1/chat/completions, IN_FLIGHT at a time; contents, tokens and top-2 to OUT (bench/device.sh vl-serve)."""
import base64, json, sys, urllib.request, concurrent.futures as cf
port, par, dst, images = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
asks = ["Describe this image.", "What colours do you see?", "Count the objects.", "Write a caption."]
reqs = []
for i, path in enumerate(images):
    kind = "png" if path.endswith(".png") else "jpeg"
    url = f"data:image/{kind};base64," + base64.b64encode(open(path, "rb").read()).decode()
    for j in range(2):
        content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": asks[(i + j) % 4]}]
        reqs.append({"model": "vl", "messages": [{"role": "user", "content": content}], "temperature": 0,
                     "max_tokens": 64, "logprobs": True, "top_logprobs": 2})
def send(body):
    rq = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                                {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(rq, timeout=600) as r:
            j = json.load(r)
        c = j["choices"][0]
        return {"content": c["message"]["content"], "tokens": [t["token"] for t in c["logprobs"]["content"]],
                "top": [[[a["token"], a["logprob"]] for a in t["top_logprobs"]] for t in c["logprobs"]["content"]]}
    except Exception as e:
        return {"error": str(e)}
with cf.ThreadPoolExecutor(par) as ex:
    res = list(ex.map(send, reqs))
json.dump(res, open(dst, "w"))
print(f"{len(res)} requests, {par} in flight, {sum('error' in r for r in res)} errors")
