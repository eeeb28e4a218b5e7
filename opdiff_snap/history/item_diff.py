"""Two run files' items compared apart from what differs between runs by nature: to show
that a change of the tool changed no result.

Left out: timings (every `*_ms` key, `infer_ms_all`, `times_all`), ids (`run_id`), time
stamps, the artifact cache's hits (a cached failure says so), the size of the batch that
compiled an artifact, repro paths, and keys written as null (a field one version adds,
null where it does not apply, compares equal to the line of a version without it). In
text: what the runtime printed during the job (`backend output:`, which depends on the
cache and carries times), worker process ids, object addresses, a library's log lines and
times, temporary paths, the folder of the checkout that made the run, and the line of the
tool's own code that calls an op test's op (its survey's source).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .runs import ItemKey, item_key, read_run

DROPPED = {"run_id", "ts", "type", "times_all", "infer_ms_all", "repro", "cache_hit", "batch"}
VOLATILE = [
    (re.compile(r"\nbackend output:.*?(?=\nopdiff:|\Z)", re.S), ""),     # the runtime's own output
    (re.compile(r"^[WIEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ .*$", re.M), "<log line>"),   # glog style
    (re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+"), "<time>"),       # a runtime's own log time
    (re.compile(r"/[^\s\"']*?/opdiff_snap/"), "<checkout>/opdiff_snap/"),  # source lines of a survey
    # an op test's source is the line of the tool's own wrapper that calls it: it moves with
    # any edit of the tool (execution/prepare.py's forward)
    (re.compile(r"(<checkout>/opdiff_snap/[\w/]+\.py):\d+"), r"\1:<line>"),
    (re.compile(r"^prepare\.py:\d+ in forward: .*$", re.S), "prepare.py:<line> in forward: <the tool's call>"),
    (re.compile(r"/tmp/[^\s'\"]+"), "/tmp/..."),
    (re.compile(r"pid \d+"), "pid <pid>"),                                # a worker that died
    (re.compile(r"0x[0-9a-f]{6,}"), "<address>"),
]


def normalized(value: Any) -> Any:
    """`value` without what differs between two runs of the same results."""
    if isinstance(value, dict):
        return {k: normalized(v) for k, v in value.items()
                if k not in DROPPED and not k.endswith("_ms") and v is not None}
    if isinstance(value, list):
        return [normalized(v) for v in value]
    if isinstance(value, str):
        for pattern, repl in VOLATILE:
            value = pattern.sub(repl, value)
    return value


def run_items(path: Path) -> dict[ItemKey, dict[str, Any]]:
    """(test, seed, preset) -> the normalized item of a run file (the last, where one repeats)."""
    out = {}
    for item in read_run(path).items:
        key = item_key(item)
        if key is not None:
            out[key] = normalized(item)
    return out


@dataclass
class ItemDiff:
    """What two run files' items differ in: keys only one has, and per common key the
    fields whose values differ (field -> (value in a, value in b))."""

    items_a: int
    items_b: int
    both: int
    only_a: list[ItemKey] = field(default_factory=list)
    only_b: list[ItemKey] = field(default_factory=list)
    differing: dict[ItemKey, dict[str, tuple[Any, Any]]] = field(default_factory=dict)

    @property
    def same(self) -> bool:
        return not (self.only_a or self.only_b or self.differing)

    def lines(self, most: int = 50) -> list[str]:
        """The differences (at most `most`), then a summary line."""
        out = [f"only in A: {k}" for k in self.only_a] + [f"only in B: {k}" for k in self.only_b]
        out += [f"{k} {f}: {a!r} != {b!r}" for k, fields in self.differing.items() for f, (a, b) in fields.items()]
        return out[:most] + [f"items: {self.items_a} in A, {self.items_b} in B; {len(self.only_a)} only in A, "
                             f"{len(self.only_b)} only in B; {len(self.differing)} differ apart from timings and ids"
                             f" of {self.both} in both"]


def item_diff(a: Path, b: Path) -> ItemDiff:
    """The items of run files `a` and `b` compared, each normalized (`normalized`)."""
    left, right = run_items(a), run_items(b)
    both = sorted(left.keys() & right.keys())
    diff = ItemDiff(len(left), len(right), len(both), sorted(left.keys() - right.keys()),
                    sorted(right.keys() - left.keys()))
    for key in both:
        x, y = left[key], right[key]
        fields = {f: (x.get(f), y.get(f)) for f in sorted(x.keys() | y.keys()) if x.get(f) != y.get(f)}
        if fields:
            diff.differing[key] = fields
    return diff
