#!/usr/bin/env python3
"""Summarise `ncu --csv --metrics gpu__time_duration.sum` of one whole-model prefill (kiln bench model's
profiler range): the layers' kernels by their position in a layer (so two GEMMs that share a cuBLASLt kernel
stay apart), layer 1's time and all layers' total, then every kernel family (name and grid) with its count and
total time, largest first. Usage: prefill_breakdown.py NCU.csv LAYERS"""
import csv
import sys


def short(name):
    name = name.split("(")[0]
    return name if len(name) <= 70 else name[:67] + "..."


UNIT_US = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
rows = []
with open(sys.argv[1], newline="") as f:
    lines = [l for l in f if l.startswith('"')]
for r in csv.DictReader(lines):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    us = float(r["Metric Value"].replace(",", "")) * UNIT_US[r["Metric Unit"]]
    rows.append((short(r["Kernel Name"]), r["Grid Size"], us))
layers = int(sys.argv[2])
total = sum(u for _, _, u in rows)
print(f"{len(rows)} kernels, {total / 1e3:.2f} ms of kernel time (serialized by ncu, no launch gaps)")


def period():
    # The layers repeat one kernel sequence of p launches; a few launches before (embedding) and after (final
    # norm, LM head) them.
    names = [n for n, _, _ in rows]
    for extra in range(0, 16):
        if (len(rows) - extra) % layers:
            continue
        p = (len(rows) - extra) // layers
        for s in range(0, extra + 1):
            if all(names[s + i] == names[s + i + p] for i in range(p * (layers - 1))):
                return p, s
    return 0, 0


per_layer, start = period()
print(f"\nthe layers' kernels by position ({per_layer} a layer, from launch {start}): layer 1's us, all layers' ms")
for i, (name, grid, us) in enumerate(rows[start:start + per_layer]):
    tot = sum(rows[start + l * per_layer + i][2] for l in range(layers))
    print(f"  {us:9.1f}  {tot / 1e3:8.2f}  {name}  grid {grid}")
fam = {}
for name, grid, us in rows:
    k = (name, grid)
    c, t = fam.get(k, (0, 0.0))
    fam[k] = (c + 1, t + us)
print("\nby kernel and grid, total us (share):")
for (name, grid), (c, t) in sorted(fam.items(), key=lambda kv: -kv[1][1]):
    print(f"  {t:10.1f} ({100 * t / total:4.1f} %)  x{c:<4d} {name}  grid {grid}")
