"""What every bundle runner shares: the bundle's entries for one runtime family, each
entry's inputs, the timed calls, and the outputs and device record written back.
Needs only NumPy; see docs/bundles.md for the format."""

import argparse
import json
import os
import platform
import socket
import statistics
import sys
import time
import traceback
from importlib import metadata

import numpy as np

FORMAT = 1


def arguments(family):
    parser = argparse.ArgumentParser(description=f"Run a bundle's {family} entries and write their outputs.")
    parser.add_argument("bundle", nargs="?", default=os.path.dirname(os.path.abspath(sys.argv[0])),
                        help="the bundle folder (default: this script's)")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per entry (default 5)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed calls first (default 1)")
    parser.add_argument("--only", default="", help="run only the entries with these ids (comma-separated)")
    args = parser.parse_args()
    if args.repeats < 1 or args.warmup < 0:
        parser.error("--repeats must be at least 1 and --warmup at least 0")
    return args


def entries(bundle, family, only=""):
    with open(os.path.join(bundle, "manifest.json")) as f:
        manifest = json.load(f)
    if manifest.get("format") != FORMAT:
        sys.exit(f"{bundle}: bundle format {manifest.get('format')!r}; this runner reads format {FORMAT}")
    wanted = {x for x in only.split(",") if x}
    return [e for e in manifest["entries"] if e["family"] == family and (not wanted or e["id"] in wanted)]


def artifact(bundle, entry, suffix):
    """The entry's artifact: the one file (or package) in its folder ending in `suffix`."""
    folder = os.path.join(bundle, entry["artifact"])
    found = sorted(name for name in os.listdir(folder) if name.endswith(suffix))
    if len(found) != 1:
        raise RuntimeError(f"{folder} holds {len(found)} {suffix} artifacts; a bundle holds one per folder")
    return os.path.join(folder, found[0])


def inputs(bundle, entry):
    with np.load(os.path.join(bundle, entry["inputs"]), allow_pickle=False) as npz:
        return [np.asarray(npz[f"in{i}"]) for i in range(len(npz.files))]


def versions(*names):
    out = {}
    for name in ("numpy", *names):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def run_all(bundle, family, args, load, call, environment):
    """For each entry: `load(entry)` -> a model, `call(model, arrays)` -> output arrays;
    warm-up, timed repeats, outputs to outputs/<id>.npz; the record to device-<family>.json."""
    results = {}
    todo = entries(bundle, family, args.only)
    os.makedirs(os.path.join(bundle, "outputs"), exist_ok=True)
    for n, entry in enumerate(todo, 1):
        result = results[entry["id"]] = {}
        try:
            t0 = time.perf_counter()
            model = load(entry)
            result["load_ms"] = (time.perf_counter() - t0) * 1e3
        except Exception as exc:
            result.update(failed="load", error=_why(exc), error_class=type(exc).__name__)
            print(f"[{n}/{len(todo)}] {entry['test']} {entry['preset']}: load failed", flush=True)
            continue
        try:
            arrays = inputs(bundle, entry)
            times = []
            for i in range(args.warmup + args.repeats):
                t0 = time.perf_counter()
                outputs = call(model, arrays)
                if i >= args.warmup:
                    times.append((time.perf_counter() - t0) * 1e3)
            out = {f"out{i}": np.asarray(o) for i, o in enumerate(outputs)}
            np.savez(os.path.join(bundle, "outputs", f"{entry['id']}.npz"), **out)
            result["infer_ms_all"] = times
            print(f"[{n}/{len(todo)}] {entry['test']} {entry['preset']}: {statistics.median(times):.3f} ms",
                  flush=True)
        except Exception as exc:
            result.update(failed="infer", error=_why(exc), error_class=type(exc).__name__)
            print(f"[{n}/{len(todo)}] {entry['test']} {entry['preset']}: inference failed", flush=True)
    env = {"os": platform.system(), "os_version": os_version(), "machine": platform.machine(),
           "host": socket.gethostname(), "python": platform.python_version(), **environment,
           "runner": {"family": family, "repeats": args.repeats, "warmup": args.warmup}}
    record = {"format": FORMAT, "environment": env, "results": results}
    path = os.path.join(bundle, f"device-{family}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(record, f, indent=1)
    os.replace(path + ".tmp", path)
    failed = sum(1 for r in results.values() if r.get("failed"))
    print(f"{len(results) - failed} of {len(results)} {family} entries ran; outputs in "
          f"{os.path.join(bundle, 'outputs')}, the device record in {path}")
    return 0


def _why(exc):
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()[-4000:]


def os_version():
    if sys.platform == "darwin":
        return f"macOS {platform.mac_ver()[0]}"
    return f"{platform.system()} {platform.release()}"
