"""Can a backend lower one ATen op alone? The evidence behind every list of ops a backend
cannot take, and the cache that keeps it.

An op is tried as a one-op module (execution.prepare_call of the OpOverload on the values
of one recorded call) through the backend's own `export` and, where this machine can run
the preset, its `load`. Nothing runs: a wrong number is not a lowering question. Where
the preset only converts here (CoreML on Linux), converting is the whole test, so a
prediction that is merely unavailable never counts against an op.

Answers are cached per (preset, the versions of torch, of the family's runtime packages
and of opdiff-snap, op, input signature), one small JSON file each under
`<cache>/op-support/<preset>/`, so a second model, or the next run, asks only about ops it
has not seen. An upgrade changes the key; the entries of the old versions stay, and
`opdiff ops --changes` compares them.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from ..backends.base import Backend, Preset
from ..core.errors import error_text, headline
from ..core.verdicts import Verdict
from ..storage.local import write_json_whole
from .cache import runtime_versions
from .export_load import export_and_load

if TYPE_CHECKING:
    from .prepare import Prepared


@dataclass
class OpVerdict:
    """One op with one input signature on one preset: does it lower alone, and if not, at
    which stage and why."""

    preset: str
    op: str                   # "aten::diff.default"
    signature: str            # "f32[1, 8], 1, -1": what the call reads, constants included
    lowers: bool
    stage: str | None = None  # EXPORT_FAIL or LOAD_FAIL when it does not
    error: str = ""           # the informative line of what the backend said
    versions: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0      # how long asking took (0 when the answer came from the cache)
    cached: bool = False
    asked: float = field(default_factory=time.time)   # when (orders answers across upgrades)

    @classmethod
    def from_json(cls, data: Any) -> "OpVerdict":
        """An answer as the cache stores it, checked field by field (ValueError when it is not
        what `OpSupportCache.put` writes: the op is then asked again); its error text cut."""
        if not isinstance(data, dict):
            raise ValueError("an answer must be a mapping")
        texts = {k: data.get(k) for k in ("preset", "op", "signature")}
        if not all(isinstance(v, str) for v in texts.values()) or not isinstance(data.get("lowers"), bool):
            raise ValueError("an answer's preset, op, signature or lowers is of another type")
        stage, error, versions = data.get("stage"), data.get("error", ""), data.get("versions", {})
        if stage not in (None, "EXPORT_FAIL", "LOAD_FAIL") or not isinstance(error, str):
            raise ValueError("an answer's stage or error is of another type")
        if not isinstance(versions, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                     for k, v in versions.items()):
            raise ValueError("an answer's versions are not names and version strings")
        numbers = [data.get("seconds", 0.0), data.get("asked", 0.0)]
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in numbers):
            raise ValueError("an answer's seconds or asked is not a number")
        return cls(str(texts["preset"]), str(texts["op"]), str(texts["signature"]), data["lowers"], stage, error[:2000],
                   dict(versions), float(numbers[0]), bool(data.get("cached", False)), float(numbers[1]))


@dataclass
class UnsupportedOp:
    """One ATen op of a test's graph that the backend cannot lower alone, and where it
    comes from in the model's code. What the history keeps per result and SQL unnests."""

    op: str                   # "aten::diff.default"
    count: int                # nodes of the graph with this op that fail alone
    stage: str                # EXPORT_FAIL or LOAD_FAIL
    error: str                # what the backend said, for the first of them
    signatures: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)   # "modeling_gpt2.py:812 in forward: ..."
    source_paths: list[str] = field(default_factory=list)   # "/abs/modeling_gpt2.py:812"
    modules: list[str] = field(default_factory=list)   # "h.0.attn (GPT2Attention)"

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "UnsupportedOp":
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass
class Survey:
    """What lowering a graph's ops alone found on one preset (op_survey.py makes it)."""

    preset: str
    ops: list[UnsupportedOp] = field(default_factory=list)
    calls: int = 0              # distinct (op, signature) pairs of the graph
    asked: int = 0              # of those, lowered now (the rest came from the cache)
    seconds: float = 0.0
    note: str = ""              # why the list is empty, or could not be made

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Survey:
        return cls(str(data["preset"]), [UnsupportedOp.from_json(u) for u in data.get("ops") or []],
                   int(data.get("calls") or 0), 0, 0.0, str(data.get("note") or ""))

    @property
    def lasting(self) -> bool:
        """Whether the answer can be kept: no op's answer came from a crash or a timeout."""
        return not any(u.stage in (Verdict.CRASH.value, Verdict.TIMEOUT.value) for u in self.ops)


def lower_alone(backend: Backend, preset: Preset, op: str, fn: Callable[..., Any], args: list[Any],
                kwargs: dict[str, Any], signature: str, threads: int = 0) -> OpVerdict:
    """Export (and load, where this machine runs the preset) `fn(*args, **kwargs)` alone."""
    from .prepare import prepare_call

    t0 = time.perf_counter()
    try:
        prepared = prepare_call({"a": fn}, list(args), dict(kwargs), f"op {op}")
    except Exception as exc:   # the op does not even run eagerly on these values: not the backend's
        return answer(preset, op, signature, Verdict.EXPORT_FAIL,
                      f"the op does not run eagerly alone: {error_text(exc)}", time.perf_counter() - t0)
    stage, error = lowers(backend, preset, prepared, backend.availability(preset).can_run, threads)
    return answer(preset, op, signature, stage, error, time.perf_counter() - t0)


def lowers(backend: Backend, preset: Preset, prepared: Prepared, can_run: bool,
           threads: int = 0) -> tuple[Verdict | None, str]:
    """Whether the flat module `prepared` exports on `preset` and, with `can_run`, loads:
    (None, "") or the stage that failed and what the backend said. Nothing runs."""
    with tempfile.TemporaryDirectory(prefix="opdiff-op-") as tmp:
        step = export_and_load(backend, preset, prepared, Path(tmp), load=can_run, threads=threads)
        stage, error = step.status, step.error
        del step   # the runtime lets go of the artifact before its folder is removed
    return stage, "" if error is None else error_text(error)


def answer(preset: Preset, op: str, signature: str, stage: Verdict | None, error: str = "",
           seconds: float = 0.0) -> OpVerdict:
    """The answer for (op, signature) on `preset` under this machine's versions."""
    return OpVerdict(preset.name, op, signature, stage is None, None if stage is None else stage.value,
                     headline(error, 300), runtime_versions(preset), seconds)


class OpSupportCache:
    """The answers of lower_alone, by preset, versions, op and signature (see the module
    docstring). A cache behind a URL keeps them in its local folder only."""

    def __init__(self, root: Path | str):
        from ..storage import open_tiers

        self.dir = open_tiers(root).root / "op-support"

    @staticmethod
    def key(preset: Preset, op: str, signature: str) -> str:
        material = {"preset": {"name": preset.name, **preset.to_json()}, "versions": runtime_versions(preset),
                    "op": op, "signature": signature}
        return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()

    def _path(self, preset: Preset, op: str, signature: str) -> Path:
        return self.dir / preset.name / f"{self.key(preset, op, signature)}.json"

    def get(self, preset: Preset, op: str, signature: str) -> OpVerdict | None:
        try:
            data = json.loads(self._path(preset, op, signature).read_text())
            found = OpVerdict.from_json(data)
        except (OSError, ValueError, TypeError):
            return None     # absent, or a torn or foreign file: ask again
        found.cached, found.seconds = True, 0.0
        return found

    def put(self, preset: Preset, answer: OpVerdict) -> None:
        """Write one answer atomically; a cache that cannot be written only costs the next run."""
        write_json_whole(self._path(preset, answer.op, answer.signature),
                         {**asdict(answer), "cached": False, "seconds": round(answer.seconds, 4)})

    def entries(self) -> Iterator[OpVerdict]:
        """Every answer kept, of every version."""
        for path in sorted(self.dir.glob("*/*.json")):
            try:
                yield OpVerdict.from_json(json.loads(path.read_text()))
            except (OSError, ValueError, TypeError):
                continue
