"""vl_compare.py DIR: the defaults' greedy image chats against the unfused and eager servers', one and eight in
flight: identical token sequences, or where one splits, the token and the default run's top-2 margin there."""
import json, sys
d = sys.argv[1]
for other, seq in [(o, s) for s in ["", "_seq"] for o in ["unfused", "eager"]]:
    ref = json.load(open(f"{d}/check_defaults{seq}.json"))
    got = json.load(open(f"{d}/check_{other}{seq}.json"))
    same, notes = 0, []
    for i, (a, b) in enumerate(zip(ref, got)):
        if "error" in a or "error" in b:
            notes.append(f"#{i} error {a.get('error', '')}{b.get('error', '')}"[:160])
        elif a["tokens"] == b["tokens"]:
            same += 1
        else:
            k = next(k for k in range(min(len(a["tokens"]), len(b["tokens"]))) if a["tokens"][k] != b["tokens"][k])
            top = a["top"][k]
            margin = top[0][1] - top[1][1] if len(top) > 1 else float("nan")
            notes.append(f"#{i} splits at token {k}: {a['tokens'][k]!r} vs {b['tokens'][k]!r}, default top-2 margin {margin:.4f}")
    print(f"defaults vs {other}, {'one' if seq else 'eight'} in flight: {same}/{len(ref)} identical greedy token sequences; " + "; ".join(notes[:6]))
