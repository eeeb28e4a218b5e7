"""Where in the model's code an exported node comes from."""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>[^\n]+)\n[ \t]*(?P<code>[^\n]*)')
_LIBRARIES = tuple(os.path.dirname(m.__file__ or "") + os.sep for m in (torch,)) + \
    (str(Path(__file__).resolve().parents[1]) + os.sep,)


def source_line(stack_trace: str | None) -> tuple[str, str]:
    """("file.py:LINE in func: code", "/abs/file.py:LINE") of the innermost frame of a node's
    stack trace outside torch and this package (the user's forward), else the innermost."""
    frames = list(_FRAME.finditer(stack_trace or ""))
    if not frames:
        return "", ""
    user = [f for f in frames if not os.path.realpath(f["file"]).startswith(_LIBRARIES)
            and not f["file"].startswith(_LIBRARIES)]
    f = (user or frames)[-1]
    return (f"{Path(f['file']).name}:{f['line']} in {f['func'].strip()}: {f['code'].strip()}",
            f"{f['file']}:{f['line']}")
