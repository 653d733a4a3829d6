"""embed_load.py --port P --model NAME --ids N --concurrency C --requests R: /v1/embeddings requests whose input
is one flat list of N token ids (one input, as OpenAI reads a list of ints), C in flight, after C warm-ups.
The last line: latency p50 / p99, requests/s and input ids/s. Any failed request fails the run (exit 3) and
names the first error."""
import argparse
import concurrent.futures as cf
import json
import random
import statistics
import sys
import time
import urllib.error
import urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--model", required=True)
ap.add_argument("--ids", type=int, required=True)
ap.add_argument("--concurrency", type=int, default=4)
ap.add_argument("--requests", type=int, default=64)
a = ap.parse_args()
rng = random.Random(1)
url = f"http://127.0.0.1:{a.port}/v1/embeddings"


def body(i):
    ids = [rng.randrange(1000, 30000) for _ in range(a.ids)]
    return json.dumps({"model": a.model, "input": ids}).encode()


def send(data):
    t = time.perf_counter()
    rq = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(rq, timeout=600) as r:
            j = json.load(r)
        if j.get("usage", {}).get("prompt_tokens") != a.ids:
            return None, f"usage.prompt_tokens {j.get('usage')} != {a.ids}"
        return time.perf_counter() - t, None
    except urllib.error.HTTPError as e:
        return None, f"HTTP {e.code}: {e.read()[:200]!r}"
    except Exception as e:  # a dropped connection, a timeout
        return None, str(e)[:200]


bodies = [body(i) for i in range(a.requests + a.concurrency)]
with cf.ThreadPoolExecutor(a.concurrency) as ex:
    list(ex.map(send, bodies[: a.concurrency]))  # warm-ups
    t0 = time.perf_counter()
    res = list(ex.map(send, bodies[a.concurrency:]))
    wall = time.perf_counter() - t0
errors = [e for _, e in res if e]
if errors:
    print(f"{len(errors)} of {len(res)} requests failed; first: {errors[0]}")
    sys.exit(3)
lat = sorted(t * 1e3 for t, _ in res)
p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))]
print(f"{a.ids} ids an input, C={a.concurrency}, {len(res)} requests: p50 {statistics.median(lat):.1f} ms, "
      f"p99 {p99:.1f} ms, {len(res) / wall:.2f} req/s, {len(res) * a.ids / wall:,.0f} ids/s")
