"""The code paths of loaded tests that only an import can settle, for `opdiff validate`
to import in workers (execution/probe.py): what parsing cannot tell a path names
(suite/locate.py), every path with a `config` mapping (its keys are known only to its
class), and with `imports` every path outside torch."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .locate import Kind, NotFound, locate_path
from .model import TestCase


@dataclass(frozen=True)
class CodePath:
    key: str                              # the path, where it is looked up, its kind and config
    case: TestCase                        # the first test that constructs it
    path: str
    module: bool                          # a module path (an nn.Module is wanted) or a construct path
    config: Mapping[str, Any] | None


def unsettled_paths(cases: Sequence[TestCase], imports: bool = False) -> list[CodePath]:
    """Each such path once, in the order the tests construct them."""
    found: dict[str, CodePath] = {}
    for case in cases:
        for path, module, config in case.code_paths():
            if path.startswith("torch.") and config is None:
                continue
            key = f"{path}\0{case.suite_dir}\0{module}\0{json.dumps(config, sort_keys=True)}"
            if key in found:
                continue
            if not imports and config is None:   # a config's keys are known only to its class
                try:
                    if locate_path(path, case.suite_dir).kind is not Kind.UNKNOWN:
                        continue
                except NotFound:
                    continue   # load_suites has reported it
            found[key] = CodePath(key, case, path, module, config)
    return list(found.values())
