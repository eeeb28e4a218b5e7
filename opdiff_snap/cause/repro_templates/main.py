"""A repro script's last part: export, load and run as the preset does, then compare."""

import json
import sys
import traceback
from typing import TYPE_CHECKING

from .compare import compare
from .flat import Flat

if TYPE_CHECKING:   # what the writer generates
    from .generated import EXPORT_FAIL, INFER_FAIL, LOAD_FAIL, PASS, build, export, load, load_data

# ---------------------------------------------------------------- script text


def failed(verdict, exc):
    """A step of the backend raised: the traceback, then the verdict `opdiff check` gives it."""
    traceback.print_exception(exc)
    print(verdict)
    print(json.dumps({"verdict": verdict, "error": f"{type(exc).__name__}: {exc}"}))
    return 1


def main():
    """Export, load and run as the preset does, then compare. The last line printed is
    JSON: {"verdict": ..., "metrics": {...}} (or "error" when a step failed)."""
    data = load_data()
    module = Flat(build(data)).eval()
    inputs = data["inputs"]
    try:
        artifact = export(module, inputs)
    except Exception as exc:
        return failed(EXPORT_FAIL, exc)
    try:
        runnable = load(artifact)
    except Exception as exc:
        return failed(LOAD_FAIL, exc)
    try:
        actual = list(runnable(inputs))
    except Exception as exc:
        return failed(INFER_FAIL, exc)
    verdict, metrics = compare(data["expected"], actual, data["rules"])
    print(verdict)
    print(json.dumps({"verdict": verdict, "metrics": metrics}))
    return 0 if verdict == PASS else 1


if __name__ == "__main__":
    sys.exit(main())
