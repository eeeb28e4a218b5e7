"""What a check run planned, as its history file keeps it, and what holds it to that plan:
a resume must plan exactly the same (`plan_identity` in the meta line, `same_plan`), a
shard takes its part of the split its group agreed on (`shard_keys`), and the end line
goes only under a run that holds every planned result once (`all_present`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from ..backends.base import Preset
from ..core.config import Settings
from ..core.errors import OpdiffError
from ..history import sharding
from ..history.runs import ItemKey, RunFile, readable_dir, resumability
from ..history.writer import RunWriter
from ..suite.model import Tolerance
from .check_plan import CheckPlan
from .requests import Selection


def plan_identity(plan: CheckPlan, suite_paths: Sequence[Path], presets: Sequence[Preset], selection: Selection,
                  *, skips: Sequence[tuple[str, str]] = (), tolerance: Tolerance | None = None,
                  trust_goldens: bool = False, python: Path | None = None) -> dict[str, Any]:
    """What a resumed run must reproduce exactly: the suites, the selection, the planned
    (test, seed, spec hash) items, the presets with their options, the tolerance override,
    and the workers' interpreter when it is not this one. Stored in the run's meta line;
    JSON only."""
    sel = selection
    return json.loads(json.dumps({
        **({"python": str(python)} if python is not None else {}),
        "suites": [str(p) for p in suite_paths],
        "selection": {"test_ids": list(sel.test_ids or []), "tags": list(sel.tags or []), "seeds": sel.seeds,
                      "seed_list": list(sel.seed_list or []), "skips": [list(x) for x in skips],
                      "trust_goldens": bool(trust_goldens)},
        "presets": {p.name: dict(p.options) for p in presets},
        "tolerance": None if tolerance is None else _tolerance_identity(tolerance),
        "items": [[i.test_id, i.seed, (i.case.spec_hash if i.case is not None else None) or
                   (i.info.spec_hash if i.info is not None else "")] for i in plan.items],
    }))


def _tolerance_identity(tolerance: Tolerance) -> dict[str, Any]:
    """The command line's tolerance, as plans have always named it; the int8 fields only
    when set, so a run planned before they existed still resumes."""
    out = {k: getattr(tolerance, k) for k in ("atol", "rtol", "baseline_factor", "precision_factor")}
    out.update({k: getattr(tolerance, k) for k in ("steps", "min_sqnr") if getattr(tolerance, k) is not None})
    return out


def same_plan(run: RunFile, identity: dict[str, Any]) -> None:
    """Refuse to resume unless this invocation plans exactly what the run planned."""
    run_id = run.path.stem
    resumable, why = resumability(run.meta or {})
    if not resumable:
        raise OpdiffError(f"run '{run_id}' cannot be resumed: {why}.")
    meta = run.meta or {}
    differences = plan_differences(meta["plan"], identity)
    if differences:
        argv = " ".join(a for a in (meta.get("argv") or []) if a != "--resume")
        raise OpdiffError(f"run '{run_id}' planned something else, so resuming it with this command "
                          f"would mix two runs: {'; '.join(differences)}. Resume with the original command "
                          f"(`opdiff {argv} --resume {run_id}`), or start a new run.")


def plan_differences(before: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """One phrase per way `now` differs from `before` (plan_identity dicts)."""
    out = []
    for key in ("suites", "presets", "tolerance", "python"):
        if before.get(key) != now.get(key):
            out.append(f"{key} {before.get(key)!r} then, {now.get(key)!r} now")
    derived = ("keys", "expected_ms")   # what the split gave the shard, not what was asked
    shard_then, shard_now = ({k: v for k, v in (d.get("shard") or {}).items() if k not in derived} or None
                             for d in (before, now))
    if shard_then != shard_now:
        out.append(f"shard {shard_then!r} then, {shard_now!r} now")
    for key, value in (now.get("selection") or {}).items():
        was = (before.get("selection") or {}).get(key)
        if was != value:
            out.append(f"{key} {was!r} then, {value!r} now")
    then = {(i[0], i[1]): i[2] for i in before.get("items") or []}
    current = {(i[0], i[1]): i[2] for i in now.get("items") or []}

    def names(keys) -> str:
        keys = sorted(keys)
        shown = ", ".join(f"{t} seed {s}" for t, s in keys[:3])
        return shown + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")

    gone, new = then.keys() - current.keys(), current.keys() - then.keys()
    changed = [k for k in then.keys() & current.keys() if then[k] != current[k]]
    if gone:
        out.append(f"{len(gone)} planned test(s) are not planned now ({names(gone)})")
    if new:
        out.append(f"{len(new)} test(s) are planned now that were not ({names(new)})")
    if changed:
        out.append(f"{len(changed)} test(s) changed since (spec hash: {names(changed)})")
    return out


def shard_keys(plan: CheckPlan, presets: Sequence[Preset], shard: tuple[int, int], group: str,
               settings: Settings) -> tuple[list[sharding.Key], sharding.Split]:
    """This shard's (test, seed, preset) keys, and the split the group's shards agree on."""
    keys = [(i.test_id, i.seed, p.name) for i in plan.items for p in presets]
    decided = [(i.test_id, i.seed, p.name) for i in plan.items for p in presets if i.verdict is not None]

    def compute() -> sharding.Split:
        known = sharding.history_costs(readable_dir(settings.store), settings.repeats, settings.warmup)
        return sharding.split_jobs(keys, known, decided, shard[1])

    split, _ = sharding.agreed_split(settings.store, keys, shard[1], group, compute)
    return split.shards[shard[0] - 1], split


def all_present(writer: RunWriter, planned: set[ItemKey]) -> None:
    """The end line goes only under a run holding every planned item exactly once."""
    missing, foreign = planned - writer.keys, writer.keys - planned
    if not (missing or foreign or writer.duplicates):
        return
    parts = ([f"{len(missing)} planned results missing"] if missing else []) + \
            ([f"{len(foreign)} results that were not planned"] if foreign else []) + \
            ([f"{len(writer.duplicates)} results written twice"] if writer.duplicates else [])
    writer.close()
    raise OpdiffError(f"run '{writer.run_id}' was left without its end line: it holds {', '.join(parts)}. "
                      f"Its file is {writer.path}; `opdiff runs` shows it, and a new check starts clean.")
