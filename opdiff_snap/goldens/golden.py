"""What the golden store holds and hands back: Golden, GoldenInfo, and its two errors."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..core.errors import OpdiffError
from ..core.safetext import printable
from ..core.verdicts import GoldenState
from ..suite.model import Invocation, RecordedGrads


@dataclass
class Golden:
    """Everything recorded for one (test id, seed).

    `outputs` is a nested value with tensor leaves (see core/trees.py); for pair tests
    it is {"a": ..., "b": ...}. `grads` holds the gradients of a `grad: true` test.
    `baseline` is Preset.to_json() plus "name". `reference` and `reference_note` are None
    on goldens recorded before references existed (their check keeps the configured
    tolerances only).
    """

    test_id: str
    seed: int
    spec_hash: str
    suite: str
    definition: dict[str, Any]
    test_type: str
    baseline: dict[str, Any]
    env: dict[str, Any]
    created: str                     # ISO 8601 UTC
    invocation: Invocation
    outputs: Any
    grads: RecordedGrads | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # float64 reference minus outputs, nested like `outputs` (None leaves where there is
    # none); `reference_note` says why a golden has no reference at all
    reference: Any = None
    reference_note: str | None = None


@dataclass(frozen=True)
class GoldenInfo:
    """A golden's metadata, read without touching its arrays.

    `problem` is non-empty when the golden's metadata cannot be read (it is corrupt);
    the other fields then hold what could be recovered ("" / {} otherwise).
    """

    test_id: str
    seed: int
    spec_hash: str
    suite: str
    test_type: str
    baseline: str                    # the baseline preset's name
    env: dict[str, Any]
    created: str
    key: str                         # the golden's directory name in the store
    problem: str = ""


class MissingGolden(OpdiffError):
    """No golden stored for this (test id, seed)."""

    def __init__(self, test_id: str, seed: int, root: Path | str):
        self.test_id, self.seed = test_id, seed
        super().__init__(f"no golden for test '{test_id}' seed {seed} in the golden store {root}. "
                         f"Record it with `opdiff record --test-ids '{test_id}'`, or point "
                         "--goldens at the store that has it.")


class CorruptGolden(OpdiffError):
    """A golden failed verification: it must be reported (CORRUPT), never compared."""

    def __init__(self, test_id: str, seed: int, array: str, reason: str, path: Path | str | None = None):
        """`array`: the tensor whose bytes failed ("" when the metadata or a chunk did).
        What the store read is data: control characters in it are shown escaped."""
        self.test_id, self.seed, self.array, self.reason, self.path = test_id, seed, array, printable(reason), path
        at = f" ({printable(str(path))})" if path is not None else ""
        shown = printable(test_id)
        super().__init__(f"the golden of test '{shown}' seed {seed} is corrupt{at}: {self.reason}. "
                         "It will not be compared. Re-record it with "
                         f"`opdiff record --test-ids '{shown}' --force`.")


def golden_state(info: GoldenInfo, current: Mapping[str, str] | None) -> GoldenState:
    """What the suites say of one golden: CORRUPT (unreadable metadata), ORPHAN (its test
    no longer exists), STALE (its test or file: module changed), OK, or UNKNOWN when there
    are no suites to tell. `current`: test id -> spec hash of the project's tests."""
    if info.problem:
        return GoldenState.CORRUPT
    if current is None:
        return GoldenState.UNKNOWN
    if info.test_id not in current:
        return GoldenState.ORPHAN
    return GoldenState.STALE if info.spec_hash != current[info.test_id] else GoldenState.OK


def golden_digest(golden: Golden) -> str:
    """What a replay bundle holds its entry to: a golden re-recorded since, or recorded from
    another definition, has another digest (its recording time, spec hash and outputs)."""
    import hashlib

    import torch

    from ..core.trees import flatten

    h = hashlib.sha256(f"{golden.test_id}\0{golden.seed}\0{golden.spec_hash}\0{golden.created}".encode())
    for leaf in flatten(golden.outputs)[1]:
        h.update(f"{tuple(leaf.shape)}{leaf.dtype}".encode())
        h.update(leaf.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
