"""figures.py: the figures bench/device.sh's summary rows quote, read from saved outputs.

  figures.py serve PREFIX.json               one line a level of a `kiln bench serve --out PREFIX` run
  figures.py value PREFIX.json METRIC [C]    one number of level C (default: the first level), or n/a
  figures.py model FILE prefill|tpot         a `kiln bench model` output's prefill ms, or its batch-1 TPOT
                                             (CUDA graph + PDL) in ms, or n/a
  figures.py verdict VALUE OP TARGET         met / missed / n/a (OP: <= or >=)

METRIC: out_tok_s, req_s, ttft_p50, tpot_p50, e2e_p50, e2e_p99 (ms for the latencies). An invalid level (a failed
or miscounted request) gives n/a: its figures are not a measurement of the asked workload. Exit status 0, also
for n/a, so that a summary row is written whatever the run left behind."""
import json
import re
import sys

METRICS = {
    "out_tok_s": lambda lv: lv["output_throughput_tok_s"],
    "req_s": lambda lv: lv["request_throughput_req_s"],
    "ttft_p50": lambda lv: lv["ttft_ms"]["median"],
    "tpot_p50": lambda lv: lv["tpot_ms"]["median"],
    "e2e_p50": lambda lv: lv["e2e_ms"]["median"],
    "e2e_p99": lambda lv: lv["e2e_ms"]["p99"],
}


def levels(path):
    try:
        with open(path) as f:
            return json.load(f)["levels"]
    except (OSError, ValueError, KeyError) as e:
        return f"no result ({path}: {e.__class__.__name__})"


def serve_line(lv):
    head = f"C={lv['concurrency']}, {lv['num_prompts']} prompts"
    if not lv.get("valid"):
        notes = "; ".join(lv.get("notes", [])[:2])
        return f"{head}: INVALID ({lv.get('failed', '?')} failed, {lv.get('mismatched', '?')} miscounted: {notes})"
    return (f"{head}: {lv['output_throughput_tok_s']:,.1f} out tok/s, {lv['request_throughput_req_s']:.2f} req/s, "
            f"TTFT p50 {lv['ttft_ms']['median']:.1f} ms, TPOT p50 {lv['tpot_ms']['median']:.3f} ms, "
            f"E2E p50 {lv['e2e_ms']['median']:.1f} / p99 {lv['e2e_ms']['p99']:.1f} ms")


def serve(path):
    lvs = levels(path)
    if isinstance(lvs, str):
        return lvs
    return "; ".join(serve_line(lv) for lv in lvs) or f"no levels in {path}"


def value(path, metric, conc=None):
    if metric not in METRICS:
        sys.exit(f"figures.py: unknown metric '{metric}' ({', '.join(METRICS)})")
    lvs = levels(path)
    if isinstance(lvs, str) or not lvs:
        return "n/a"
    lv = next((lv for lv in lvs if conc is None or str(lv["concurrency"]) == conc), None)
    if lv is None or not lv.get("valid"):
        return "n/a"
    return f"{METRICS[metric](lv):.3f}".rstrip("0").rstrip(".")


# `kiln bench model` lines: "prefill 8192 tokens: 129.65 ms = ..." and
# "decode TPOT at context 1024 (CUDA graph + PDL): median 4.434 ms (min 4.418); ..."
MODEL_LINES = {
    "prefill": re.compile(r"^prefill \d+ tokens: ([0-9.]+) ms"),
    "tpot": re.compile(r"^decode TPOT at context \d+ \(CUDA graph \+ PDL\): median ([0-9.]+) ms"),
}


def model(path, what):
    if what not in MODEL_LINES:
        sys.exit(f"figures.py: model takes prefill or tpot, got '{what}'")
    try:
        with open(path, errors="replace") as f:
            for line in f:
                m = MODEL_LINES[what].match(line)
                if m:
                    return m.group(1)
    except OSError:
        pass
    return "n/a"


def verdict(val, op, target):
    if op not in ("<=", ">="):
        sys.exit(f"figures.py: verdict takes <= or >=, got '{op}'")
    try:
        v, t = float(val), float(target)
    except ValueError:
        return "n/a"
    return "met" if (v <= t if op == "<=" else v >= t) else "missed"


def main(argv):
    cmd = argv[1] if len(argv) > 1 else ""
    if cmd == "serve" and len(argv) == 3:
        print(serve(argv[2]))
    elif cmd == "value" and len(argv) in (4, 5):
        print(value(argv[2], argv[3], argv[4] if len(argv) == 5 else None))
    elif cmd == "model" and len(argv) == 4:
        print(model(argv[2], argv[3]))
    elif cmd == "verdict" and len(argv) == 5:
        print(verdict(argv[2], argv[3], argv[4]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
