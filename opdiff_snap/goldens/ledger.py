"""The ledger of baseline failures: why record could not write the golden of a (test,
seed), kept in the golden store itself so that check says BASELINE_FAIL with the reason
(never "no golden; record it", which would fail again) wherever the goldens travel.

One small object per entry, `.baseline-failures/<golden key>.json`: two records of other
tests never overwrite each other's entries. Stores written before keep the entries in the
root group's `baseline_failures` attribute, which is still read, and cleaned as entries
are forgotten. Every entry is checked like golden data; one that is not what record writes
is left out and named by `problems`, and a stored reason is cut at REASON_MAX_CHARS.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from ..core.safetext import printable
from ..storage import StorageError
from ..storage.place import Place
from .keys import store_key
from .packed import META

FAILURES = "baseline_failures"   # root attribute of older stores: store key -> entry
LEDGER = ".baseline-failures"    # one object per (test, seed) the baseline failed on: <key>.json
ENTRY_MAX_BYTES = 1 << 16
REASON_MAX_CHARS = 4000          # of a stored reason, as written and as read


@dataclass(frozen=True)
class BaselineFailure:
    """Why record could not write the golden of (test_id, seed)."""

    test_id: str
    seed: int
    spec_hash: str
    baseline: str
    reason: str
    at: str           # when (UTC, ISO 8601)

    @classmethod
    def from_json(cls, raw: Any) -> "BaselineFailure":
        """An entry as stored, checked field by field like golden data (ValueError says
        what is wrong); its reason capped at REASON_MAX_CHARS."""
        if not isinstance(raw, dict):
            raise ValueError(f"an entry must be a mapping, not {type(raw).__name__}")
        fields = {"test_id": str, "seed": int, "spec_hash": str, "baseline": str, "reason": str, "at": str}
        missing = [f for f in fields if f not in raw]
        if missing:
            raise ValueError(f"an entry lacks {', '.join(missing)}")
        for name, kind in fields.items():
            value = raw[name]
            if not isinstance(value, kind) or isinstance(value, bool):
                raise ValueError(f"its {name} is {type(value).__name__}, not {kind.__name__}")
        return cls(**{f: raw[f] for f in fields}).capped()

    def capped(self) -> "BaselineFailure":
        if len(self.reason) <= REASON_MAX_CHARS:
            return self
        cut = len(self.reason) - REASON_MAX_CHARS
        return dataclasses.replace(self, reason=f"{self.reason[:REASON_MAX_CHARS]} [... {cut} more characters]")


class Ledger:
    """The baseline failures of one golden store's place (see the module docstring)."""

    def __init__(self, place: Place):
        self.place = place
        self._failures: dict[str, BaselineFailure] | None = None
        self._problems: list[str] = []

    def failures(self) -> dict[str, BaselineFailure]:
        """Store key -> entry, read once."""
        if self._failures is None:
            self._failures, self._problems = {}, []
            try:
                attrs = json.loads(self.place.get(META)).get("attributes", {})
            except (StorageError, OSError, ValueError, AttributeError):
                attrs = {}
            legacy = attrs.get(FAILURES) if isinstance(attrs, dict) else None
            if legacy is not None and not isinstance(legacy, dict):
                self._problems.append(f"the root attribute {FAILURES} is a {type(legacy).__name__}, not a "
                                      "mapping of golden keys to entries; it is ignored")
                legacy = None
            for key, raw in (legacy or {}).items():
                self._take(key, raw, f"{FAILURES}[{key!r}]")
            try:
                entries = self.place.list(LEDGER)
            except (StorageError, OSError):
                entries = []
            for entry in entries:
                name = entry.key.rsplit("/", 1)[-1]
                if not name.endswith(".json") or name.startswith("."):
                    continue
                try:
                    raw = json.loads(self.place.get(entry.key, max_bytes=ENTRY_MAX_BYTES))
                except (StorageError, OSError, ValueError) as exc:
                    self._problems.append(f"{printable(entry.key)}: unreadable ({type(exc).__name__}); it is ignored")
                    continue
                self._take(name.removesuffix(".json"), raw, printable(entry.key))
        return self._failures

    def problems(self) -> list[str]:
        """What is wrong with the stored entries (each one left out)."""
        self.failures()
        return list(self._problems)

    def _take(self, key: str, raw: Any, where: str) -> None:
        try:
            failure = BaselineFailure.from_json(raw)
        except ValueError as exc:
            self._problems.append(f"{where}: {exc}; it is ignored")
            return
        belongs = store_key(failure.test_id, failure.seed)
        if belongs != key:
            self._problems.append(f"{where}: it names test {failure.test_id!r} seed {failure.seed}, whose "
                                  f"entry belongs under {belongs}; it is ignored")
            return
        assert self._failures is not None
        self._failures[key] = failure

    def note(self, key: str, failure: BaselineFailure | None) -> None:
        """Remember an entry, or forget it (None); raises OSError or StorageError."""
        known = self.failures()
        if failure is None:
            if key not in known:
                return
            known.pop(key, None)
            self.place.delete(f"{LEDGER}/{key}.json")
            self._forget_legacy(key)
        else:
            failure = failure.capped()
            known[key] = failure
            self.place.put(f"{LEDGER}/{key}.json", json.dumps(dataclasses.asdict(failure)).encode())

    def _forget_legacy(self, key: str) -> None:
        """Drop `key` from an older store's root attribute, where it may still be."""
        body = json.loads(self.place.get(META))
        attrs = body.get("attributes")
        legacy = attrs.get(FAILURES) if isinstance(attrs, dict) else None
        if not isinstance(legacy, dict) or key not in legacy:
            return
        legacy.pop(key)
        if not legacy:
            attrs.pop(FAILURES)
        self.place.put(META, json.dumps(body, separators=(",", ":")).encode())
