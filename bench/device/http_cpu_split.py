"""http_cpu_split.py start PID PORT > FILE, then http_cpu_split.py end PID PORT FILE: the server's CPU time per
streamed token between the two calls, by thread role (threads named kiln-engine; cuda*, the driver's; every
other thread is the HTTP layer: I/O threads and handler pool), over kiln_generation_tokens_total's rise."""
import glob
import sys
import time
import urllib.request


def ticks(pid):
    roles = {"engine": 0, "http": 0, "driver": 0}
    for t in glob.glob(f"/proc/{pid}/task/*"):
        try:
            comm = open(f"{t}/comm").read().strip()
            fields = open(f"{t}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        n = int(fields[11]) + int(fields[12])  # utime + stime (fields 14 and 15 of stat)
        role = "engine" if comm == "kiln-engine" else "driver" if comm.startswith("cuda") else "http"
        roles[role] += n
    return roles


def tokens(port):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    for line in text.splitlines():
        if line.startswith("kiln_generation_tokens_total"):
            return float(line.split()[-1])
    return 0.0


what, pid, port = sys.argv[1], sys.argv[2], sys.argv[3]
now = {"t": time.time(), "tokens": tokens(port), **ticks(pid)}
if what == "start":
    print(" ".join(f"{k}={v}" for k, v in now.items()))
    sys.exit(0)
before = dict(kv.split("=") for kv in open(sys.argv[4]).read().split())
hz = __import__("os").sysconf("SC_CLK_TCK")
tok = max(1.0, now["tokens"] - float(before["tokens"]))
us = {r: (now[r] - int(before[r])) / hz * 1e6 / tok for r in ("http", "engine", "driver")}
print(f"tokens {tok:.0f} in {now['t'] - float(before['t']):.1f} s; CPU a streamed token: HTTP layer "
      f"{us['http']:.2f} us, engine thread {us['engine']:.2f} us, CUDA driver {us['driver']:.2f} us "
      f"(tick {1e6 / hz:.0f} us)")
