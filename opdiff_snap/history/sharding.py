"""Split the planned jobs of a check into N shards, deterministically and evenly by
expected cost; the N shards together cover every (test, seed, preset) exactly once.

Cost of a job: what its latest result in the history took (export + load + every timed
and warm-up call, plus a fixed dispatch cost), where the history has one; otherwise the
median of the known costs of its preset; with no history at all every job costs the
same (an even split by count). Items decided without running (NO_GOLDEN, STALE, SKIPPED,
...) cost nothing. The split is the longest-processing-time rule: jobs in decreasing
cost (ties by key) each go to the shard with the least cost so far (ties: the lowest
shard). The split keeps each shard's expected cost; the check reports the longest shard
over the mean, and `opdiff runs` the same measured from the shards' own durations.

The shards of one group must agree on the split, but each reads the history when it
starts, and a shard that finished earlier changes the history. So the first shard to plan
stores the split in the history store (`shards/<digest>.json`, written create-only) and
every other shard of the same plan and group uses it.
"""

from __future__ import annotations

import hashlib
import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

from ..core.errors import OpdiffError
from ..core.limits import SHARDS
from ..core.verdicts import PLANNED
from ..storage import StorageError, open_place
from .runs import over_mean, read_run

Key = tuple[str, int, str]          # (test id, seed, preset)
DISPATCH_MS = 25.0                  # a job's cost beyond its own timings: pickling, the pipe, judging
HISTORY_RUNS = 30                   # the newest check runs whose results give costs
PLANNED_STATUSES = {v.value for v in PLANNED}   # decided by planning: no latency to learn from


def parse_shard(text: str) -> tuple[int, int]:
    """`K/N` (1 <= K <= N <= SHARDS.high) -> (K, N)."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text or "")
    if m and len(m.group(2)) > 9:     # no int() of an arbitrarily long digit string
        raise OpdiffError(f"--shard {text!r}: the number of shards N is out of range; give "
                          f"{SHARDS.describe()}.")
    if not m or len(m.group(1)) > 9 or not (1 <= int(m.group(1)) <= int(m.group(2))):
        raise OpdiffError(f"--shard {text!r}: write K/N with 1 <= K <= N, e.g. --shard 2/4 for the second "
                          "of four shards.")
    why = SHARDS.problem(int(m.group(2)))
    if why:
        raise OpdiffError(f"--shard {text!r}: the number of shards N is {why}.")
    return int(m.group(1)), int(m.group(2))


def job_cost(item: dict, repeats: int, warmup: int) -> float | None:
    """Milliseconds a history item's job took, or None when it did not run."""
    if item.get("status") in PLANNED_STATUSES:
        return None
    times = [t for t in (item.get("infer_ms_all") or []) if isinstance(t, (int, float))]
    infer = item.get("infer_ms") if isinstance(item.get("infer_ms"), (int, float)) else None
    if times:
        median = statistics.median(times)
        calls = median * (repeats + warmup)
    else:
        calls = (infer or 0.0) * (repeats + warmup)
    parts = [item.get("export_ms"), item.get("load_ms")]
    return DISPATCH_MS + calls + sum(p for p in parts if isinstance(p, (int, float)))


def history_costs(history_dir: Path | None, repeats: int, warmup: int) -> dict[tuple[str, str], float]:
    """(test id, preset) -> cost of its latest result among the newest check runs."""
    if history_dir is None:
        return {}
    runs = sorted((Path(history_dir) / "runs").glob("*.jsonl"), reverse=True)
    out: dict[tuple[str, str], float] = {}
    seen = 0
    for path in runs:
        try:
            run = read_run(path)
        except OSError:
            continue
        if (run.meta or {}).get("command") != "check":
            continue
        seen += 1
        for item in reversed(run.items):
            key = (str(item.get("id")), str(item.get("preset")))
            if key in out:
                continue
            cost = job_cost(item, repeats, warmup)
            if cost is not None:
                out[key] = cost
        if seen >= HISTORY_RUNS:
            break
    return out


def expected_costs(keys: Sequence[Key], known: dict[tuple[str, str], float],
                   decided: Iterable[Key] = ()) -> dict[Key, float]:
    """A cost for every key: its history, else its preset's median, else 1 (counts)."""
    decided = set(decided)
    by_preset: dict[str, list[float]] = {}
    for (_, preset), c in known.items():
        by_preset.setdefault(preset, []).append(c)
    every = [c for cs in by_preset.values() for c in cs]
    fallback = statistics.median(every) if every else 1.0
    medians = {p: statistics.median(cs) for p, cs in by_preset.items()}
    out = {}
    for key in keys:
        if key in decided:
            out[key] = 0.0
        else:
            out[key] = known.get((key[0], key[2]), medians.get(key[2], fallback))
    return out


def partition(keys: Sequence[Key], costs: dict[Key, float], n: int) -> list[list[Key]]:
    """N lists of keys, each key in exactly one, balanced by cost (see the module doc)."""
    shards: list[list[Key]] = [[] for _ in range(n)]
    loads = [0.0] * n
    for key in sorted(set(keys), key=lambda k: (-costs.get(k, 1.0), k)):
        i = min(range(n), key=lambda j: (loads[j], j))
        shards[i].append(key)
        loads[i] += costs.get(key, 1.0)
    return [sorted(s) for s in shards]


@dataclass(frozen=True)
class Split:
    """N shards of keys and what each is expected to cost."""

    shards: list[list[Key]]
    expected_ms: list[float]      # per shard: the sum of its jobs' expected costs
    from_history: int = 0         # jobs costed from their own latest result (the rest: estimates)

    @property
    def jobs(self) -> int:
        return sum(map(len, self.shards))

    def longest_over_mean(self) -> float | None:
        return over_mean(self.expected_ms)

    def describe(self, k: int) -> str:
        """What shard `k` (1-based) takes of the split, for the user."""
        n = len(self.shards)
        text = f"shard {k}/{n}: {len(self.shards[k - 1])} of {self.jobs} jobs"
        ratio = self.longest_over_mean()
        if self.expected_ms and ratio is not None:
            text += (f", expected {self.expected_ms[k - 1] / 1000:.1f} s of {sum(self.expected_ms) / 1000:.1f} s; "
                     f"the longest shard is {ratio:.2f}x the mean")
        costed = (f"{self.from_history} of {self.jobs} jobs costed from their own latest result in the history, "
                  "the rest estimated" if self.from_history else "no job has a result in the history yet: the "
                  "split is by count")
        return f"{text} ({costed})"


def split_jobs(keys: Sequence[Key], known: dict[tuple[str, str], float], decided: Iterable[Key],
               n: int) -> Split:
    """Cost every key (`expected_costs`) and partition them into N shards."""
    decided = set(decided)
    costs = expected_costs(keys, known, decided)
    shards = partition(keys, costs, n)
    from_history = sum(1 for k in set(keys) if (k[0], k[2]) in known and k not in decided)
    return Split(shards, [sum(costs[k] for k in s) for s in shards], from_history)


def split_digest(keys: Sequence[Key], n: int, group: str) -> str:
    blob = json.dumps([sorted([list(k) for k in set(keys)]), n, group]).encode()
    return hashlib.sha256(blob).hexdigest()[:24]


def agreed_split(store: Path | str, keys: Sequence[Key], n: int, group: str,
                 compute: Callable[[], Split]) -> tuple[Split, bool]:
    """The split the shards of `group` use for exactly these keys: the stored one, or
    `compute()` stored now (create-only, so the first shard's split wins). Returns the
    split and whether this call stored it."""
    place = open_place(store)
    name = f"shards/{split_digest(keys, n, group)}.json"

    def load() -> Split | None:
        try:
            data = json.loads(place.get(name))
            shards = [[(str(t), int(s), str(p)) for t, s, p in shard] for shard in data["shards"]]
            expected = [float(c) for c in data.get("expected_ms") or []]
            return Split(shards, expected if len(expected) == len(shards) else [], int(data.get("from_history", 0)))
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as exc:
            raise OpdiffError(f"the stored shard split {place.where(name)} is unreadable ({exc}); delete "
                              "it and start the shards of this group again.") from None

    try:
        found = load()
        if found is not None:
            return found, False
        split = compute()
        body = json.dumps({"group": group, "count": n, "shards": [[list(k) for k in s] for s in split.shards],
                           "expected_ms": split.expected_ms, "from_history": split.from_history})
        if place.put(name, body.encode(), create=True):
            return split, True
        found = load()
        return (found if found is not None else split), False
    except (StorageError, OSError) as exc:
        raise OpdiffError(f"cannot agree on the shard split in the history store {store}: {exc}") from None
