"""Compare the items of two history run files apart from timings, ids (a dead worker's
process id among them), the time and process id in a library's log lines (and where a log's tail happens to be cut), the
folder of the checkout that made them, and keys written as null.

usage: python same_items.py A.jsonl B.jsonl
"""
import json
import re
import sys

# a library's log line (glog style) carries the time and the process id
STAMP = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+")   # a runtime's own log time
LOG_LINE = re.compile(r"^[WIEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ .*$", re.M)

# a path into the checkout the run came from (source lines of a survey): two checkouts differ there
CHECKOUT = re.compile(r"/[^\s\"']*?/opdiff_snap/")
# what a worker's log says after a failure is its tail, cut at a byte count: where the first
# line is cut depends on the length of the process ids before it
TAIL = re.compile(r"(backend output:\n)[^\n]*\n")
# an object's address in a library's log line ("<torch.fx.graph.Graph object at 0x7fd27fb45d10>")
ADDRESS = re.compile(r" at 0x[0-9a-f]{6,}")
# the process id of a worker that died ("... while running the job (pid 5452)")
PID = re.compile(r"\(pid \d+\)")

# timings, ids, whether the result came from the artifact cache (a cached failure says so), and the
# size of the batch that compiled its artifact
DROP = {"run_id", "ts", "times_all", "export_ms", "load_ms", "infer_ms", "infer_ms_all", "repro", "cache_hit", "batch"}


def clean(value):
    if isinstance(value, dict):
        # a key written as null is a key not written: a field one version adds (null where it
        # does not apply) compares equal to the line of a version without it
        return {k: clean(v) for k, v in value.items() if k not in DROP and not k.endswith("_ms") and v is not None}
    if isinstance(value, list):
        return [clean(v) for v in value]
    if isinstance(value, str):
        value = CHECKOUT.sub("<checkout>/opdiff_snap/", TAIL.sub(r"\1<cut line>\n", value))
        value = PID.sub("(pid <pid>)", value)
        return ADDRESS.sub(" at <address>", STAMP.sub("<time>", LOG_LINE.sub("<log line>", value)))
    return value


def items(path):
    out = {}
    for line in open(path):
        d = json.loads(line)
        if d.get("type") == "item":
            out[(d["id"], d["seed"], d["preset"])] = clean(d)
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
