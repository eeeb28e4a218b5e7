"""Import a suite's paths in a worker, for `opdiff validate` when parsing cannot settle
what a path names (suite/locate.py) or whether a `config` mapping fits its class
(suite/fromconfig.py), or with `--imports` for every path."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..core.verdicts import Verdict
from .job import WorkerContext


@dataclass
class ProbeResult:
    key: str
    problem: str | None               # None: it imports and names what the test needs


@dataclass
class ImportProbe:
    """Import one path as a test would, and say what is wrong with it (see job.Task)."""

    path: str
    suite_dir: Path
    import_dirs: tuple[Path, ...]
    module: bool                      # a module path (an nn.Module is wanted) or a construct path
    key: str = ""
    config: Mapping[str, Any] | None = None   # the path's config mapping: its keys and values checked too

    def run(self, context: WorkerContext = WorkerContext()) -> ProbeResult:
        from ..core.errors import error_text
        from ..suite.construct import import_path
        from ..suite.fromconfig import config_problem
        from ..suite.locate import Located, kind_of, problem

        try:
            obj = import_path(self.path, self.suite_dir, self.import_dirs)
        except Exception as exc:
            return ProbeResult(self.key, error_text(exc))
        why = problem(Located(kind_of(obj)), self.path, self.module)
        if why is None and self.config is not None:
            why = config_problem(obj, self.path, self.config)
        return ProbeResult(self.key, why)

    def failed(self, status: Verdict, error_class: str | None, message: str) -> ProbeResult:
        how = {Verdict.CRASH: "the worker died", Verdict.TIMEOUT: "it hangs"}.get(status, "it exits at import")
        return ProbeResult(self.key, f"importing it in a worker failed, {how}: {message}")
