"""Chaos traffic for test_chaos.sh: `python3 chaos.py PORT PHASE`. Loopback only, bounded counts and times.

Phases:
  mixed   normal streaming and non-streaming requests on several threads, clients vanishing mid-stream,
          and hostile requests among them (JSON nested 100,000 deep in several fields, Transfer-Encodings
          other than chunked, image URLs naming private addresses); /health polled throughout. Every
          hostile request must get its 4xx; every normal one a complete reply (or a 503 when busy).
  cap     CAP idle connections hold --max-connections while /health and /metrics are polled (200 each)
          and work past the cap gets 503.
  engine  image bombs and broken images (each a 4xx within 2 s), a 1-token text request answered while a
          large valid image is processed, a client gone during a long prefill counted aborted with every
          KV page back. Needs CHAOS_PHOTO (tests/fixtures/vision/images/photo.jpg).
  streams start long streams and keep reading them (the SIGTERM comes meanwhile); each stream must end
          with a finish_reason or an error frame and [DONE], never cut.
Prints one line per check failure and exits 1 if any; prints a summary line otherwise.
"""
import base64
import http.client
import json
import os
import socket
import struct
import sys
import threading
import zlib
import time

PORT = int(sys.argv[1])
PHASE = sys.argv[2]
CAP = int(sys.argv[3]) if len(sys.argv) > 3 else 0
failures = []
counts = {}
lock = threading.Lock()


def note(kind):
    with lock:
        counts[kind] = counts.get(kind, 0) + 1


def bad(msg):
    with lock:
        failures.append(msg)
    print("chaos: " + msg, file=sys.stderr)


def post(path, body, timeout=60, headers=None):
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=timeout)
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    c.request("POST", path, body=body if isinstance(body, (bytes, str)) else json.dumps(body), headers=h)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


def get(path, timeout=10):
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=timeout)
    c.request("GET", path)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


def raw(request, timeout=10):
    """One raw request; everything until the server closes."""
    s = socket.create_connection(("127.0.0.1", PORT), timeout=timeout)
    s.sendall(request)
    out = b""
    try:
        while True:
            b = s.recv(65536)
            if not b:
                break
            out += b
    except socket.timeout:
        bad("raw request: the server did not close the connection")
    s.close()
    return out


def chat(extra=None, stream=False, max_tokens=4):
    b = {"model": "demo", "messages": [{"role": "user", "content": "Say something."}], "max_tokens": max_tokens,
         "temperature": 0.7, "stream": stream}
    b.update(extra or {})
    return b


def sse_frames(data):
    text = data.decode("utf-8", "replace")
    return [f[6:] for f in text.split("\n\n") if f.startswith("data: ")]


def check_stream_body(data, what):
    frames = sse_frames(data)
    if not frames or frames[-1] != "[DONE]":
        bad(f"{what}: stream without [DONE]: {data[-200:]!r}")
        return
    ends = [json.loads(f) for f in frames[:-1]]  # a usage chunk (no choices) may follow the finish
    finished = any("error" in f or any(c.get("finish_reason") for c in f.get("choices", [])) for f in ends)
    if not finished:
        bad(f"{what}: no frame has a finish_reason or an error: {frames[-2][:200] if len(frames) > 1 else ''}")


# --- hostile inputs (expected: 400 naming the limit, the server unharmed) ---------------------------------
DEEP = "[" * 100000 + "]" * 100000


def deep_bodies():
    base = '{"model": "demo", "max_tokens": 1, "messages": [{"role": "user", "content": "hi", %s}]}'
    yield base % ('"x": ' + DEEP)
    yield ('{"model": "demo", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}], "tools": '
           '[{"type": "function", "function": {"name": "f", "parameters": ' + DEEP + '}}]}')
    yield ('{"model": "demo", "max_tokens": 1, "messages": [{"role": "assistant", "content": "", "tool_calls": '
           '[{"type": "function", "function": {"name": "f", "arguments": ' + DEEP + '}}]}, {"role": "user", '
           '"content": "hi"}]}')
    yield '{"model": "demo", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}], "documents": ' + DEEP + '}'
    yield ('{"model": "demo", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}], '
           '"chat_template_kwargs": {"k": ' + DEEP + '}}')
    yield '{"model": "demo", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}], "logit_bias": {"1": ' + DEEP + '}}'


def hostile_deep():
    for body in deep_bodies():
        status, data = post("/v1/chat/completions", body)
        if status != 400 or b"nests deeper than 128 levels" not in data:
            bad(f"deep JSON: status {status}: {data[:200]!r}")
        note("deep")


def hostile_te():
    smuggled = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    for te in (b"gzip", b"chunked, gzip", b"gzip, chunked", b"identity"):
        out = raw(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: " + te + b"\r\n\r\n" + smuggled)
        if not out.startswith(b"HTTP/1.1 400") or out.count(b"HTTP/1.1 ") != 1:
            bad(f"Transfer-Encoding {te!r}: {out[:200]!r}")
        note("transfer-encoding")


def hostile_images():
    for url in ("http://127.0.0.1:%d/metrics" % PORT, "http://10.0.0.1/x.png", "http://169.254.169.254/latest",
                "http://[::1]:%d/health" % PORT, "http://localhost:%d/health" % PORT):
        body = chat({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "what is this"}, {"type": "image_url", "image_url": {"url": url}}]}]})
        status, data = post("/v1/chat/completions", body)
        if status != 400 or b"--image-url-allow-private" not in data:
            bad(f"image URL {url}: status {status}: {data[:300]!r}")
        note("private-image-url")


# --- engine-side inputs: image bombs, a large image beside a short request, a disconnect mid-prefill -------
def png_chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def zero_png(width, height, rows):
    """An 8-bit RGB PNG of width x height whose IDAT is `rows` all-zero rows (tests/unit/test_vision_decode_limits.cpp)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(bytes(rows * (1 + 3 * width)), 9)
    return b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", idat) + png_chunk(b"IEND", b"")


def jpeg_claiming(width, height):
    """photo.jpg (83 x 61, the issue's 3.7 KB file) with its frame header claiming width x height."""
    jpeg = bytearray(open(os.environ["CHAOS_PHOTO"], "rb").read())
    for i in range(2, len(jpeg) - 9):
        if jpeg[i] == 0xFF and jpeg[i + 1] in (0xC0, 0xC2):
            jpeg[i + 5:i + 9] = struct.pack(">HH", height, width)
            return bytes(jpeg)
    raise RuntimeError("no frame header in photo.jpg")


def image_chat(data, mime, max_tokens=1):
    url = "data:%s;base64,%s" % (mime, base64.b64encode(data).decode())
    return chat({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this"}, {"type": "image_url", "image_url": {"url": url}}]}]},
        max_tokens=max_tokens)


def metrics():
    _, m = get("/metrics")
    v = {}
    for line in m.decode().splitlines():
        if line and not line.startswith("#"):
            k, _, x = line.rpartition(" ")
            v[k.replace('model_name="demo",', "").replace('{model_name="demo"}', "")] = float(x)
    return v


def hostile_image_bytes():
    photo = open(os.environ["CHAOS_PHOTO"], "rb").read()
    small = zero_png(64, 64, 64)
    cases = [("JPEG whose SOF claims 9000x9000", jpeg_claiming(9000, 9000), "image/jpeg", 400),
             ("9000x9000 PNG with 16 rows of data", zero_png(9000, 9000, 16), "image/png", 400),
             ("100000x100000 PNG header", zero_png(100000, 100000, 1), "image/png", 413),
             ("truncated JPEG", photo[:len(photo) // 2], "image/jpeg", 400),
             ("truncated PNG", small[:len(small) // 2], "image/png", 400)]
    for what, data, mime, want in cases:
        t0 = time.monotonic()
        status, body = post("/v1/chat/completions", image_chat(data, mime))
        dt = time.monotonic() - t0
        if status != want or dt > 2.0:
            bad(f"{what}: status {status} after {dt:.2f} s (expected {want} within 2 s): {body[:200]!r}")
        note("image-bomb-%d" % status)
        print(f"chaos engine: {what}: {status} in {dt * 1000:.0f} ms")


def text_beside_a_large_image():
    """The issue's all-zero 2048x2048 PNG is a valid image: it must be served, and a 1-token text request sent
    while it is decoded and encoded must not wait for it."""
    result = {}

    def big():
        result["image"] = post("/v1/chat/completions", image_chat(zero_png(2048, 2048, 2048), "image/png"))

    t = threading.Thread(target=big)
    t.start()
    time.sleep(0.05)  # the image request first (the text one's bound holds in either order)
    t0 = time.monotonic()
    status, body = post("/v1/chat/completions", chat(max_tokens=1))
    dt = time.monotonic() - t0
    t.join()
    if status != 200 or dt > 5.0:
        bad(f"1-token text beside a 2048x2048 image: status {status} after {dt:.2f} s: {body[:200]!r}")
    print(f"chaos engine: a 1-token text request beside the 2048x2048 image: {status} in {dt:.2f} s")
    if result["image"][0] != 200:
        bad(f"the 2048x2048 all-zero PNG: status {result['image'][0]}: {result['image'][1][:200]!r}")
    note("text-beside-image")


def disconnect_mid_prefill():
    """A streamed completion with a ~6,000-token prompt; the client resets the connection once the server has
    accepted it (the prefill runs in time-bounded steps, and decode follows for up to 1,500 tokens): the
    request must end as aborted and every KV page must come back."""
    aborted_key = 'kiln_server_requests_finished_total{outcome="aborted"}'
    before = metrics()
    aborted0 = before[aborted_key]
    accepted0 = before["kiln_server_requests_accepted_total"]
    body = json.dumps({"model": "demo", "prompt": "lorem ipsum dolor " * 2000, "max_tokens": 1500,
                       "stream": True, "ignore_eos": True}).encode()
    s = socket.create_connection(("127.0.0.1", PORT), timeout=30)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    deadline = time.monotonic() + 10
    while metrics()["kiln_server_requests_accepted_total"] <= accepted0:
        if time.monotonic() > deadline:
            bad("the long prompt was never accepted")
            break
        time.sleep(0.02)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # reset
    s.close()
    t0 = time.monotonic()
    # The engine has moved past the aborted prompt once a 1-token request sent now is answered (the page
    # counts on /metrics are published between steps: only then do they say the pages are back).
    status, data = post("/v1/chat/completions", chat(max_tokens=1), timeout=30)
    if status != 200 or time.monotonic() - t0 > 10:
        bad(f"a 1-token request after the reset: status {status} after {time.monotonic() - t0:.2f} s")
    while True:
        v = metrics()
        done = (v[aborted_key] > aborted0 and
                v["kiln_server_active_requests"] == 0 and v["kiln_kv_pages_used"] == 0)
        if done:
            break
        if time.monotonic() - t0 > 10:
            bad(f"client gone mid-prefill: not aborted with its pages freed after 10 s: aborted "
                f"{v[aborted_key]:.0f} (was {aborted0:.0f}), "
                f"active {v['kiln_server_active_requests']:.0f}, pages used {v['kiln_kv_pages_used']:.0f}")
            break
        time.sleep(0.05)
    note("disconnect-mid-prefill")
    print("chaos engine: the vanished long prompt was aborted and its pages freed %.2f s after the reset"
          % (time.monotonic() - t0))


def phase_engine():
    run_threads([(hostile_image_bytes, ())])
    text_beside_a_large_image()
    disconnect_mid_prefill()


# --- normal traffic ----------------------------------------------------------------------------------------
def normal_worker(n, seed):
    for i in range(n):
        kind = (seed + i) % 4
        try:
            if kind == 0:
                status, data = post("/v1/chat/completions", chat())
                if status == 200:
                    json.loads(data)["choices"][0]["finish_reason"]
            elif kind == 1:
                status, data = post("/v1/chat/completions", chat(stream=True, extra={"stream_options": {"include_usage": True}}))
                if status == 200:
                    check_stream_body(data, "stream")
            elif kind == 2:
                status, data = post("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 4})
            else:
                status, data = post("/generate", {"text": "Hello", "sampling_params": {"max_new_tokens": 3}})
            if status not in (200, 503):
                bad(f"normal request kind {kind}: status {status}: {data[:200]!r}")
            note("normal-%d" % status)
        except Exception as e:  # noqa: BLE001 - any failure to get a reply is a failure
            bad(f"normal request kind {kind}: {e!r}")


def vanishing_worker(n):
    """Streams abandoned after the first bytes: the server must abort them and free their pages."""
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", PORT), timeout=30)
        body = json.dumps(chat(stream=True, max_tokens=64)).encode()
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        got = s.recv(4096)
        if not got.startswith(b"HTTP/1.1 200"):
            if not got.startswith(b"HTTP/1.1 503"):
                bad(f"vanishing stream: {got[:120]!r}")
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # reset
        s.close()
        note("vanished")


def health_poller(stop):
    while not stop.is_set():
        try:
            status, _ = get("/health", timeout=5)
            if status != 200:
                bad(f"/health answered {status} during traffic")
        except Exception as e:  # noqa: BLE001
            bad(f"/health: {e!r} (did the server die?)")
        note("health")
        time.sleep(0.2)


def run_threads(targets):
    ts = [threading.Thread(target=t, args=a) for t, a in targets]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def phase_mixed():
    stop = threading.Event()
    poller = threading.Thread(target=health_poller, args=(stop,))
    poller.start()
    run_threads([(normal_worker, (8, 0)), (normal_worker, (8, 1)), (normal_worker, (8, 2)),
                 (vanishing_worker, (6,)), (hostile_deep, ()), (hostile_te, ()), (hostile_images, ())])
    stop.set()
    poller.join()


def phase_cap():
    idle = [socket.create_connection(("127.0.0.1", PORT)) for _ in range(CAP)]
    time.sleep(0.3)
    for i in range(10):
        path = "/health" if i % 2 == 0 else "/metrics"
        status, _ = get(path)
        if status != 200:
            bad(f"{path} past the connection cap: {status}")
        note("probe-past-cap")
    out = raw(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
    if not out.startswith(b"HTTP/1.1 503"):
        bad(f"work past the cap: {out[:120]!r}")
    for s in idle:
        s.close()


def stream_to_the_end(i):
    try:
        status, data = post("/v1/chat/completions", chat(stream=True, max_tokens=200), timeout=30)
        if status == 200:
            check_stream_body(data, f"stream {i} across SIGTERM")
        elif status != 503:
            bad(f"stream {i}: status {status}")
        note("sigterm-stream-%d" % status)
    except Exception as e:  # noqa: BLE001
        bad(f"stream {i} across SIGTERM: {e!r}")


def phase_streams():
    run_threads([(stream_to_the_end, (i,)) for i in range(4)])


{"mixed": phase_mixed, "cap": phase_cap, "engine": phase_engine, "streams": phase_streams}[PHASE]()
print("chaos %s: %s" % (PHASE, json.dumps(counts, sort_keys=True)))
sys.exit(1 if failures else 0)
