#!/usr/bin/env python3
"""Summarise an ncu source page (`ncu -i REP --page source --csv --print-source sass`): warp stall samples
by reason over the whole kernel, then the TOP instructions with the most samples (their index, samples,
executions, top two reasons, SASS), and the opcode mix of instructions FIRST..LAST (e.g. a loop) when given.
Usage: ncu_source_top.py SOURCE.csv [TOP] [FIRST LAST]"""
import csv
import sys


def num(x):
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0


# The CUDA view prints, per source file, a '"File Name","PATH"' line and then that file's own header and rows
# (only "Line No" and "Source" where ncu gives no metrics: every file in the runs of docs/PERF.md E17, E18);
# the SASS view one header. The widest header is the one with the metric columns: only its sections' rows are
# summarised, each keeping the file it came from (key "file").
raw, header, file, section = [], None, "", None
for rec in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"') and not l.startswith('"Kernel Name"')):
    if rec and rec[0] == "File Name":
        file, section = (rec[1] if len(rec) > 1 else ""), None
    elif section is None or rec == section:
        section = rec
        if header is None or len(rec) > len(header):
            header = rec
    else:
        raw.append((section, rec, file))
rows = [dict(zip(sec, rec), file=f) for sec, rec, f in raw if sec == header]
if not rows:
    sys.exit("no CSV rows with metric columns")
cols = list(header)
line_col = next((c for c in cols if c and c.strip() in ("#", "Line", "Line No", "Line Number")), None)
src = next((c for c in cols if c and c.strip() == "Source"), None)
samples = next((c for c in cols if c and "Warp Stall Sampling (All" in c), None)
executed = next((c for c in cols if c and c.strip() == "Instructions Executed"), None)
reasons = [c for c in cols if c.startswith("stall_") and "Not Issued" not in c]
if not (src and samples):
    sys.exit("columns not found; the header is: " + " | ".join(cols))
total = sum(num(r[samples]) for r in rows)
print(f"# {len(rows)} rows (SASS instructions or CUDA lines), {total:.0f} stall samples")
if reasons:
    by = sorted(((sum(num(r[c]) for r in rows), c) for c in reasons), reverse=True)
    for v, c in by[:12]:
        print(f"#   {c:40s} {v:8.0f} {100 * v / total:5.1f} %")
top = int(sys.argv[2]) if len(sys.argv) > 2 else 30
print("# index | samples | executed | top reasons | instruction")
for i, r in sorted(enumerate(rows), key=lambda ir: -num(ir[1][samples]))[:top]:
    rs = sorted(((num(r[c]), c) for c in reasons), reverse=True)[:2]
    why = ", ".join(f"{c.split(':')[-1].strip()} {v:.0f}" for v, c in rs if v > 0)
    ex = num(r[executed]) if executed else 0
    where = f"{r['file'].split('/')[-1]}:{r[line_col]} " if r["file"] and line_col else ""
    print(f"{i} | {num(r[samples]):.0f} | {ex:.0f} | {why} | {where}{r[src].strip()}")
if len(sys.argv) > 4:
    first, last = int(sys.argv[3]), int(sys.argv[4])
    mix = {}
    for r in rows[first:last + 1]:
        op = r[src].strip().split()
        op = [t for t in op if not t.startswith("@")]
        k = op[0].split(".")[0] if op else "?"
        mix[k] = mix.get(k, 0) + 1
    print(f"# opcodes of instructions {first}-{last}: " +
          ", ".join(f"{k} {v}" for k, v in sorted(mix.items(), key=lambda kv: -kv[1])[:16]))
