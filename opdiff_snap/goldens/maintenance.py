"""The golden store against the project's suites: each test's goldens and their state
(`opdiff goldens ls`), the orphans (`goldens prune`) and verification (`goldens verify`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..core.config import Settings
from ..core.errors import OpdiffError
from ..core.verdicts import GoldenState, worst_state
from ..suite import load_suites, suite_paths
from ..suite.reader import SuiteReader
from ..suite.selection import id_matches, parse_patterns
from .golden import GoldenInfo, golden_state
from .store import Finding, GoldenStore


@dataclass
class GoldenRow:
    """The goldens of one test, and what the suites say of them (goldens.golden.golden_state):
    the worst state of its goldens."""

    test_id: str
    infos: list[GoldenInfo]
    state: GoldenState


def current_hashes(settings: Settings) -> dict[str, str] | None:
    """test id -> spec hash of every test in the project's suites (None: there are none)."""
    reader = SuiteReader()
    paths = suite_paths(None, settings.suites, reader)
    return {c.id: c.spec_hash for c in load_suites(paths, check_names=False, reader=reader)} if paths else None


def golden_rows(settings: Settings | None = None, test_ids: Sequence[str] | None = None) -> list[GoldenRow]:
    """Every golden (of the tests `test_ids` selects) grouped by test, with its state against
    the suites."""
    settings = settings or Settings()
    current = current_hashes(settings)
    grouped: dict[str, list[GoldenInfo]] = {}
    for info in GoldenStore(settings.goldens).index():
        if test_ids and not id_matches(info.test_id, parse_patterns(test_ids)):
            continue
        grouped.setdefault(info.test_id, []).append(info)
    return [GoldenRow(tid, infos, worst_state([golden_state(i, current) for i in infos]))
            for tid, infos in grouped.items()]


def prune(settings: Settings | None = None, delete: bool = False) -> list[GoldenInfo]:
    """The goldens whose tests no longer exist in the suites; deleted with `delete`."""
    settings = settings or Settings()
    current = current_hashes(settings)
    if current is None:
        raise OpdiffError(f"no suites under {settings.suites}: refusing to prune, since every golden would "
                          "look orphaned. Pass --suites DIR.")
    store = GoldenStore(settings.goldens)
    orphans = [i for i in store.index() if golden_state(i, current) is GoldenState.ORPHAN]
    if delete:
        for info in orphans:
            store.delete_key(info.key)
    return orphans


def verify(settings: Settings | None = None) -> tuple[list[Finding], int]:
    """(findings, number of goldens): a Finding for everything verification says (CORRUPT,
    STALE, UNCHECKED), as check would read them. No store, or a store without a golden
    (emptied, or the wrong location), is an OpdiffError: there is nothing to verify."""
    where = (settings or Settings()).goldens
    store = GoldenStore(where)
    if not store.exists():
        raise OpdiffError(f"no golden store at {where}, so there is nothing to verify. If it should be "
                          "there, it was deleted or --goldens names another location; `opdiff record` "
                          "records the goldens again.")
    infos = store.index()
    if not infos:
        raise OpdiffError(f"the golden store {where} holds no goldens, so there is nothing to verify. If it "
                          "should hold some, they were deleted or --goldens names another location; "
                          "`opdiff record` records them again.")
    return store.findings(), len(infos)


def pack(settings: Settings | None = None):
    """goldens/repack.py: the store's small loose goldens folded into packs; its PackReport."""
    from .repack import repack

    where = (settings or Settings()).goldens
    store = GoldenStore(where)
    if not store.exists():
        raise OpdiffError(f"no golden store at {where}, so there is nothing to pack; point --goldens at it.")
    return repack(store)
