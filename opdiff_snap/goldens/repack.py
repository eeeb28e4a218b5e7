"""`opdiff goldens pack`: fold the store's small loose goldens into packs (goldens/packs.py),
one pack per suite, and rewrite the packs whose goldens changed.

Safe to interrupt at any point and to run again: new packs are published whole beside the
old ones and read back byte for byte before anything is removed; then the packs they
replace go, then the loose goldens they now hold (each only if its zarr.json is still the
one that was packed: a golden recorded meanwhile stays). A loose golden wins over a packed
copy of its key, so every state in between reads the same goldens. Running it on a store
already packed writes and removes nothing. Damaged loose goldens and goldens of more than
PACK_MAX_GOLDEN tensor bytes stay loose; a damaged pack stops it before it changes anything.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from ..core.errors import OpdiffError
from .golden import CorruptGolden
from .packed import META, PackError, parse_metadata
from .packs import PACK_MAX_GOLDEN, Packs, encode_pack, group_of
from .store import GoldenStore

Content = dict[str, dict[str, tuple[bytes, bytes]]]   # group -> key -> (attributes JSON, data)


@dataclass
class PackReport:
    """What one run of `pack` did."""

    packed: int = 0                       # goldens in packs afterwards
    folded: int = 0                       # loose goldens moved into packs
    written: list[str] = field(default_factory=list)    # packs written
    removed: list[str] = field(default_factory=list)    # packs removed (replaced)
    large: int = 0                        # loose goldens left loose for their size
    damaged: list[tuple[str, str]] = field(default_factory=list)   # (key, why) left loose, unread
    kept_newer: int = 0                   # loose goldens replaced while packing, left loose
    seconds: float = 0.0


def repack(store: GoldenStore) -> PackReport:
    """Pack the store (see the module's text). Raises OpdiffError, having removed nothing,
    when a pack cannot be read or a written pack does not read back as written."""
    started, report = time.perf_counter(), PackReport()
    loose = store.loose()
    if store.packs.problems:
        name, why = next(iter(store.packs.problems.items()))
        raise OpdiffError(f"the golden store {store.root} holds a damaged pack, {name}: {why}. Nothing was "
                          "changed; delete that pack's folder and record its goldens again (`opdiff goldens "
                          "verify` lists them), then pack.")
    old = dict(store.packs.lengths)
    content: Content = {}
    folded = _fold_loose(store, loose, content, report)
    for key, entry in store.packs.entries().items():
        if key not in folded:
            content.setdefault(store.packs.groups[entry.pack], {})[key] = _packed_bytes(store, entry)
    made = {group: encode_pack(group, [(k, a, d) for k, (a, d) in goldens.items()])
            for group, goldens in content.items()}
    for name, objects in made.values():
        if name not in old:
            store.place.publish(name, objects, META, fresh=True)
            report.written.append(name)
    _read_back(store, content, {group: name for group, (name, _) in made.items()})
    for name in sorted(set(old) - {name for name, _ in made.values()}):
        store.place.remove(name, META)
        report.removed.append(name)
    for key, marker in folded.items():
        if store.remove_loose(key, marker):
            report.folded += 1
        else:
            report.kept_newer += 1
    store.packs.forget()
    report.packed = sum(len(goldens) for goldens in content.values())
    report.seconds = time.perf_counter() - started
    return report


def _fold_loose(store: GoldenStore, loose: list[str], content: Content, report: PackReport) -> dict[str, bytes]:
    """Every loose golden that reads cleanly and is small enough, added to `content` by
    its suite's group: key -> the zarr.json it had."""
    infos = {info.key: info for info in store.index(only=set(loose))}
    folded = {}
    for key in loose:
        try:
            attrs, data, marker = _loose_golden(store, key, infos.get(key))
        except CorruptGolden as exc:
            report.damaged.append((key, exc.reason))
            continue
        if len(data) > PACK_MAX_GOLDEN:
            report.large += 1
            continue
        content.setdefault(group_of(attrs.get("suite")), {})[key] = (_json(attrs), data)
        folded[key] = marker
    return folded


def _loose_golden(store: GoldenStore, key: str, info: Any) -> tuple[dict[str, Any], bytes, bytes]:
    """(attributes, data, zarr.json bytes) of a loose golden, checked as check reads it."""
    if info is None or info.problem:
        raise CorruptGolden(key, 0, "", info.problem if info else "it is not listed", store.where(key))
    try:
        marker = store.units.marker_of(key)
        meta = parse_metadata(marker)
        store.read(info.test_id, info.seed)             # every check check makes
        data = store.loose_data(key, meta)
        if store.units.marker_of(key) != marker:
            raise PackError("it was replaced while being packed")
    except (PackError, OSError) as exc:
        raise CorruptGolden(info.test_id, info.seed, "", str(exc), store.where(key)) from None
    return meta["attributes"], data, marker


def _packed_bytes(store: GoldenStore, entry: Any) -> tuple[bytes, bytes]:
    try:
        return store.packs.read(entry)
    except PackError as exc:
        raise OpdiffError(f"the golden store {store.root} holds a damaged pack: {exc}. Nothing was changed; "
                          "`opdiff goldens verify` lists the goldens it holds.") from None


def _read_back(store: GoldenStore, content: Content, names: dict[str, str]) -> None:
    """Every golden read back from the pack written for it, byte for byte."""
    fresh = Packs(store.place, lambda name: store.place.get(f"{name}/{META}"))
    fresh.load(names.values())
    for group, goldens in content.items():
        for key, expected in goldens.items():
            entry = fresh.entries().get(key)
            try:
                same = entry is not None and entry.pack == names[group] and fresh.read(entry) == expected
            except PackError:
                same = False
            if not same or fresh.problems:
                raise OpdiffError(f"the pack {names[group]} written into {store.root} does not read back golden "
                                  f"{key} as it was written; nothing was removed, every golden is still there. "
                                  "Check the disk or service, then run `opdiff goldens pack` again.")


def _json(attrs: dict[str, Any]) -> bytes:
    return json.dumps(attrs, separators=(",", ":")).encode("utf-8")
