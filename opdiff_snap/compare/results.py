"""The one record of a result: a (run, test, seed, preset) outcome from the moment a
worker's Outcome is judged, through its JSON line in the history, to its row in DuckDB.

`Result` owns its JSON form (`to_json` / `from_json`); the history writes exactly that,
resume and the reports read it back the same way, and the DuckDB schema of the
`results` view is derived from these fields and from compare.Metrics
(analytics/ingest.py), so adding a field touches this class only. The item line keeps
the keys opdiff's own item records have (`id`, `test_type`, `baseline`, `backends[].res`,
`times_all`, `diff_all`), so readers of opdiff's JSONL read ours.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from ..backends.base import Delegation
from ..core.trees import json_safe
from ..core.verdicts import NO_ERROR, Verdict
from ..execution.job import Outcome
from ..execution.op_support import UnsupportedOp
from ..suite.model import TestCase, Tolerance
from .metrics import Metrics

# field name -> key in the item line, where they differ
JSON_KEYS = {"test_id": "id", "verdict": "status", "message": "error_message"}
# the fields repeated in opdiff's per-backend `res` object
RES_FIELDS = ("verdict", "export_ms", "load_ms", "infer_ms", "infer_ms_all", "cache_hit", "batch", "error_class",
              "message", "tolerance", "metrics", "unsupported_ops", "delegation", "precision_limited", "vacuous",
              "calibration", "expected")


@dataclass
class Result:
    """One (run, test, seed, preset) outcome."""

    test_id: str
    seed: int
    preset: str
    verdict: Verdict
    message: str = ""
    test_type: str | None = None       # op, module or pair
    suite: str | None = None           # the suite file the test came from
    spec_hash: str | None = None
    tags: list[str] = field(default_factory=list)
    baseline: str | None = None        # the preset the golden was (or is being) recorded with
    error_class: str | None = None
    export_ms: float | None = None
    load_ms: float | None = None
    infer_ms: float | None = None      # median of infer_ms_all
    infer_ms_all: list[float] = field(default_factory=list)
    cache_hit: bool = False
    batch: int | None = None           # its artifact was compiled with this many tests in one call
    tolerance: Tolerance | None = None
    metrics: Metrics | None = None     # the comparison's, with the control, b vs a and gradients beside
    # EXPORT_FAIL / LOAD_FAIL: every op of the test's graph the preset cannot lower alone
    # (None: not surveyed; empty: none fails alone, and the message says so)
    unsupported_ops: list[UnsupportedOp] | None = None
    # a delegating preset (ExecuTorch with XNNPACK, CoreML, MPS): per op, the nodes the
    # delegate took and those left on the runtime's kernels (None: nothing delegates)
    delegation: Delegation | None = None
    # a MISMATCH on fp16/bf16 that torch eager at the same precision shares (None: not asked)
    precision_limited: bool | None = None
    # why the golden proves nothing (every output near zero, constant, or non-finite); None: it does
    vacuous: str | None = None
    # an int8 preset: the digest of the calibration inputs it was quantized from
    calibration: str | None = None
    # the verdict the expectations file expects of this result (None: none that holds)
    expected: Verdict | None = None

    @classmethod
    def of(cls, case: TestCase | None, test_id: str, seed: int, preset: str, verdict: Verdict,
           message: str = "", **fields: Any) -> "Result":
        """A result for `case` (which fills test type, suite, spec hash and tags; None when
        the test is not known, a corrupt golden say)."""
        if case is not None:
            fields.setdefault("test_type", case.test_type)
            fields.setdefault("suite", str(case.suite))
            fields.setdefault("spec_hash", case.spec_hash)
            fields.setdefault("tags", list(case.tags))
        return cls(test_id, seed, preset, verdict, message, **fields)

    def with_outcome(self, outcome: Outcome) -> "Result":
        """This result with what the worker measured and, when it failed, why."""
        self.export_ms, self.load_ms = outcome.export_ms, outcome.load_ms
        self.infer_ms, self.infer_ms_all = outcome.infer_ms, list(outcome.infer_ms_all)
        self.cache_hit, self.batch = outcome.cache_hit, outcome.batch
        self.error_class = outcome.error_class
        if outcome.error_message:
            self.message = outcome.error_message
        self.delegation = outcome.delegation
        if outcome.quantized is not None:
            self.calibration = outcome.quantized.calibration or None
        survey = outcome.survey
        if survey is not None:
            self.unsupported_ops = list(survey.ops)
            if survey.note:
                self.message = f"{self.message}\nopdiff: {survey.note}".strip()
        return self

    @property
    def key(self) -> tuple[str, int, str]:
        return (self.test_id, self.seed, self.preset)

    # ------------------------------------------------------------ JSON

    def to_json(self) -> dict[str, Any]:
        """The item line's fields (the writer adds type, run_id and ts)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in ("verdict", "expected"):
                value = None if value is None else value.value
            elif f.name == "message":
                value = None if self.verdict in NO_ERROR else (value or None)
            elif f.name == "tolerance":
                value = None if value is None else dataclasses.asdict(value)
            elif f.name in ("tags", "infer_ms_all"):
                value = list(value)
            elif f.name == "unsupported_ops" and value is not None:
                value = [dataclasses.asdict(u) for u in value]
            elif f.name in ("delegation", "metrics") and value is not None:
                value = value.to_json()
            out[JSON_KEYS.get(f.name, f.name)] = value
        out = json_safe(out)
        res = {JSON_KEYS.get(k, k): out[JSON_KEYS.get(k, k)] for k in RES_FIELDS}
        out["backends"] = [{"name": self.preset, "res": res}]
        out["times_all"] = {self.preset: {k: out[k] for k in ("export_ms", "load_ms", "infer_ms")}}
        out["diff_all"] = {self.preset: out["metrics"]}
        return out

    @classmethod
    def from_json(cls, line: Mapping[str, Any]) -> "Result":
        """The inverse of to_json; raises ValueError on a line that is not one of ours."""
        values: dict[str, Any] = {}
        try:
            for f in dataclasses.fields(cls):
                key = JSON_KEYS.get(f.name, f.name)
                if key not in line:
                    continue
                value = line[key]
                if f.name == "verdict":
                    value = Verdict(value)
                elif f.name == "expected" and value is not None:
                    value = Verdict(value)
                elif f.name == "message":
                    value = value or ""
                elif f.name == "tolerance" and value is not None:
                    value = Tolerance(**value)
                elif f.name in ("tags", "infer_ms_all"):
                    value = list(value or [])
                elif f.name == "unsupported_ops" and value is not None:
                    value = [UnsupportedOp.from_json(u) for u in value]
                elif f.name == "delegation" and value is not None:
                    value = Delegation.from_json(value)
                elif f.name == "metrics" and value is not None:
                    value = Metrics.from_json(value)
                values[f.name] = value
            return cls(**values)
        except (TypeError, ValueError, KeyError) as exc:
            raise ValueError(f"not a result line ({exc})") from None


@dataclass
class RunReport:
    run_id: str
    path: Path
    command: str
    results: list[Result]
    wall_s: float

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.results:
            out[r.verdict.value] = out.get(r.verdict.value, 0) + 1
        return out


Listener = Callable[[Result], None]
