"""Compare the items of two history run files apart from timings and ids.

usage: python same_items.py A.jsonl B.jsonl
"""
import json
import sys

DROP = {"run_id", "ts", "times_all", "export_ms", "load_ms", "infer_ms", "infer_ms_all", "repro"}


def clean(value):
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items() if k not in DROP and not k.endswith("_ms")}
    if isinstance(value, list):
        return [clean(v) for v in value]
    return value


def items(path):
    out = {}
    for line in open(path):
        d = json.loads(line)
        if d.get("type") == "item":
            out[(d["test_id"], d["seed"], d["preset"])] = clean(d)
    return out


a, b = items(sys.argv[1]), items(sys.argv[2])
same = sum(a[k] == b[k] for k in a.keys() & b.keys())
print(f"items: {len(a)} / {len(b)}; keys only in A: {len(a.keys() - b.keys())}, only in B: "
      f"{len(b.keys() - a.keys())}; identical apart from timings and ids: {same} of {len(a.keys() & b.keys())}")
for k in sorted(a.keys() & b.keys()):
    if a[k] != b[k]:
        diff = {f: (a[k].get(f), b[k].get(f)) for f in a[k].keys() | b[k].keys() if a[k].get(f) != b[k].get(f)}
        print("DIFF", k, json.dumps(diff)[:400])
sys.exit(0 if same == len(a) == len(b) else 1)
