"""Suites from torch's OpInfo database: each op's sample inputs as tests, called as
OpInfo calls them, with the inputs written into the suite as values.

    op_db --sample_inputs (seeded)--> (fn, input, args, kwargs) --encode--> TorchCall tests
          --write YAML--> load it back through the suite loader --> keep what reproduces

A sample becomes a test only when the suite format can say it exactly: its tensors are
real (no complex), small enough to write out (`max_elements`), its other arguments are
values the TorchCall form holds, the call gives the same bits twice (no random or
uninitialised output), its output holds a tensor, the golden it makes would say something
(the caller's `proves_nothing` rule), and the written test, loaded back and materialized
like any suite test, rebuilds the same input bits and gives the same output. Everything
else is skipped with its reason. Runs are deterministic: samples are drawn under a seed
derived from the op's name, in an interpreter whose string hashing is fixed, so importing
twice writes identical files.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import sys
import tempfile
import warnings
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from ..core.errors import OpdiffError
from ..suite.profiles import EDGE, NORMAL, expand
from .opinfo_samples import DTYPES, VACUOUS, OpRow, ProvesNothing, Sample, collect, output_tensors, same_values
from .yamlwrite import dump_suite

DEFAULTS = {"seeds": 1, "tolerance": {"fp16": {"atol": 1.0e-3}, "bf16": {"atol": 1.0e-2}}}


@dataclass
class ImportReport:
    rows: list[OpRow]
    files: list[Path]

    @property
    def ops(self) -> int:
        return sum(1 for r in self.rows if sum(r.kept.values()))

    @property
    def samples(self) -> int:
        return sum(sum(r.kept.values()) for r in self.rows)

    def skip_reasons(self) -> Counter:
        out: Counter = Counter()
        for r in self.rows:
            if r.reason:
                out["op: " + r.reason] += 1
            for why, n in r.skipped.items():
                out["sample: " + why] += n
            for profile, n in r.dropped_profiles.items():
                out[f"{profile} profile of a sample: {VACUOUS}"] += n
        return out


def profile_names(profiles: Sequence[str]) -> list[str]:
    """The input profiles asked for (`edge` for every one), beyond normal; OpdiffError names
    one that is not a profile."""
    try:
        return [p for p in expand(list(profiles)) if p != NORMAL]
    except ValueError as exc:
        raise OpdiffError(f"--profiles: '{exc}' is not an input profile; give edge, or some of "
                          f"{', '.join(EDGE)}, comma-separated (docs/suite-format.md, input profiles).") from None


def _file_of(name: str) -> str:
    """The suite file of an op: its namespace (nn.functional, linalg, special...), and the
    plain torch ops by first letter, so one op's change touches one small file."""
    if name.startswith("torch.ops."):
        return "torch.ops.yaml"
    if "." in name:
        return name.rsplit(".", 1)[0] + ".yaml"
    first = name.lstrip("_")[:1].lower() or "_"
    return f"torch.{first}.yaml"


def _run_case(case) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """A loaded test's inputs and outputs, materialized and called as record calls it."""
    from ..suite.construct import build_modules
    from ..suite.materialize import materialize

    inv = materialize(case, case.seeds[0])
    module = build_modules(case)["a"]
    return list(inv.args), output_tensors(module(*[t.clone() for t in inv.args]))


def _reproduces(sample: Sample, case) -> str | None:
    """None when the loaded test rebuilds the sample's inputs and output bit for bit."""
    try:
        args, got = _run_case(case)
    except Exception as exc:
        return f"the written test raised {type(exc).__name__}"
    if not same_values(args, sample.tensors):
        return "its values do not survive the suite format"
    return None if same_values(got, sample.output) else "the written test gives other output bits"


def _drop_profiles_that_prove_nothing(sample: Sample, cases: dict, proves_nothing: ProvesNothing) -> None:
    """Keep only the input profiles whose golden would say something: an edge profile of a
    one-element sample often gives all NaN, or a relu of only negative values all zeros."""
    profiles = sample.test.get("profiles")
    if not profiles:
        return
    kept = [NORMAL]
    for profile in profiles[1:]:
        try:
            _, out = _run_case(cases[f"{sample.test['id']}@{profile}"])
            empty = proves_nothing([t.resolve_conj() for t in out])
        except Exception:     # an op may refuse an edge value (a NaN index): that says something
            empty = None
        if empty:
            sample.row.dropped_profiles[profile] += 1
        else:
            kept.append(profile)
    if len(kept) > 1:
        sample.test["profiles"] = kept
    else:
        del sample.test["profiles"]


def import_opinfo(out_dir: Path, ops: Sequence[str] = (), dtypes: Sequence[str] = ("float32",),
                  max_samples: int = 2, max_elements: int = 256,
                  progress: Callable[[str], None] | None = None, profiles: Sequence[str] = (),
                  profile_dtypes: Sequence[str] = (), proves_nothing: ProvesNothing | None = None) -> ImportReport:
    """Write the OpInfo suites into `out_dir` and say what was kept. Only suites an earlier
    import wrote are replaced or removed; a hand-written suite in the way is an error.
    `profiles` (edge, or some of its profiles): the input profiles the samples of
    elementwise ops get beyond normal, each a golden of its own (`<id>@subnormal`), in the
    dtypes `profile_dtypes` names (empty: every dtype imported). `proves_nothing`: a
    sample, or a profile of one, whose golden it flags is left out."""
    from ..suite import load_suites

    if max_samples < 1 or max_elements < 1:
        raise OpdiffError("--max-samples and --max-elements must be at least 1.")
    if not dtypes:
        raise OpdiffError(f"--dtypes names no dtype; give one or more of {', '.join(DTYPES)}, comma-separated "
                          "(default float32). Nothing was imported or removed.")
    extra = profile_names(profiles)
    on = list(profile_dtypes) or list(dtypes)
    if profile_dtypes and not extra:
        raise OpdiffError(f"--profile-dtypes {','.join(profile_dtypes)} without --profiles does nothing: give "
                          "--profiles edge (or some profiles) too; nothing was imported or removed.")
    if extra and set(on) - set(dtypes):
        raise OpdiffError(f"--profile-dtypes {','.join(profile_dtypes)}: give dtypes --dtypes imports "
                          f"({','.join(dtypes)}); nothing was imported or removed.")
    stale = _generated_files(out_dir)
    if sys.flags.hash_randomization:
        return _with_fixed_string_hashes(Path(out_dir).resolve(), ops=list(ops), dtypes=list(dtypes),
                                         max_samples=max_samples,
                                         max_elements=max_elements, profiles=list(profiles),
                                         profile_dtypes=list(profile_dtypes), proves_nothing=proves_nothing)
    with warnings.catch_warnings():   # deprecations of the ops sampled are not the user's business
        warnings.simplefilter("ignore")
        items = collect(ops, dtypes, max_samples, max_elements, progress, extra, on, proves_nothing)
    rows = [i for i in items if isinstance(i, OpRow)]
    samples = [i for i in items if isinstance(i, Sample)]
    header = (f"Generated by `opdiff import opinfo` from torch {torch.__version__.split('+')[0]}'s OpInfo "
              f"database (dtypes {', '.join(dtypes)}; at most {max_samples} samples per op and dtype, "
              f"{max_elements} input elements per sample"
              + (f"; the elementwise ops' {'' if on == list(dtypes) else ', '.join(on) + ' '}samples also on the "
                 f"input profiles {', '.join(extra)}" if extra else "")
              + "). Do not edit: import again.")
    with tempfile.TemporaryDirectory() as tmp:
        written = _write(Path(tmp), samples, header)
        cases = {c.id: c for c in load_suites(written)}
        kept = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            checked = [(s, _reproduces(s, cases[s.test["id"]])) for s in samples]
            for s, why in checked:
                if why:
                    s.row.skipped[why] += 1
                    continue
                kept.append(s)
                s.row.kept[s.test["tags"][1]] += 1
                if proves_nothing is not None:
                    _drop_profiles_that_prove_nothing(s, cases, proves_nothing)
    if not kept:
        common = ImportReport(rows, []).skip_reasons().most_common(3)
        said = "; ".join(f"{n} {w}" for w, n in common) or "the ops declare none of these dtypes"
        raise OpdiffError(f"no OpInfo sample of --ops {';'.join(ops) or '(every op)'} in --dtypes "
                          f"{', '.join(dtypes)} could be kept ({said}); nothing was written, and '{out_dir}' "
                          "is unchanged. Widen --ops or --dtypes.")
    ours = {f.name for f in stale}
    foreign = sorted(n for n in {_file_of(s.row.op) for s in kept} if (out_dir / n).exists() and n not in ours)
    if foreign:
        raise OpdiffError(f"--out '{out_dir}' already holds {', '.join(foreign)}, which `opdiff import opinfo` did "
                          "not write (no generated header); the import would overwrite it. Nothing was written. "
                          "Give --out a folder of its own (the default is suites/opinfo).")
    out_dir.mkdir(parents=True, exist_ok=True)
    files = _write(out_dir, kept, header)
    for old in stale:
        if old not in files:
            old.unlink(missing_ok=True)
    for r in rows:
        if not r.reason and not sum(r.kept.values()) and not r.skipped:
            r.reason = "no sample in the dtypes asked for"
    return ImportReport(rows, files)


def _with_fixed_string_hashes(out_dir: Path, **options: Any) -> ImportReport:
    """The import, run in a child interpreter whose string hashing is not randomised.

    Some of OpInfo's sample generators iterate a set of strings (meshgrid's indexings), and
    that order follows the interpreter's hash seed: without this, which sample is `.0` and
    which `.1` would change from one import to the next."""
    try:
        return _fixed_hash_child().submit(_import_in_child, out_dir, **options).result()
    except BrokenProcessPool:
        _fixed_hash_child.cache_clear()
        raise OpdiffError("the interpreter the OpInfo import runs in (with string hashing fixed) died before it "
                          f"reported back; if it was writing, '{out_dir}' may hold part of the import. Run the "
                          "import again (it replaces what an import wrote), or run it with PYTHONHASHSEED=0 set, "
                          "which imports in this process.") from None


def _import_in_child(out_dir: Path, **options: Any) -> ImportReport:
    if sys.flags.hash_randomization:   # python -E or -I: the child ignored PYTHONHASHSEED too
        raise OpdiffError("the OpInfo import needs string hashing fixed, and this Python ignores PYTHONHASHSEED "
                          "(it runs with -E or -I); run `opdiff import opinfo` without those flags. Nothing "
                          "was imported or removed.")
    try:
        return import_opinfo(out_dir, **options)
    except OpdiffError as exc:   # as plain text: a subclass with its own fields may not unpickle
        raise OpdiffError(str(exc)) from None


@functools.lru_cache(maxsize=1)
def _fixed_hash_child() -> ProcessPoolExecutor:
    """One child per process, started on first use and kept: torch's OpInfo database takes
    seconds to import, and a second import in the same process should not pay that again."""
    saved = os.environ.get("PYTHONHASHSEED")
    os.environ["PYTHONHASHSEED"] = "0"
    try:
        child = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        child.submit(int).result()            # started now, under the seed set above
    finally:
        if saved is None:
            os.environ.pop("PYTHONHASHSEED", None)
        else:
            os.environ["PYTHONHASHSEED"] = saved
    return child


GENERATED = "# Generated by `opdiff import opinfo`"


def _generated_files(out_dir: Path) -> list[Path]:
    """The suites in `out_dir` an earlier import wrote (they open with its header): the only
    files an import replaces or removes. Refuses an `out_dir` that is, or lies under, a file."""
    for place in (out_dir, *out_dir.parents):
        if place.exists() and not place.is_dir():
            what = "is a file" if place == out_dir else f"lies under '{place}', which is a file"
            raise OpdiffError(f"--out '{out_dir}' {what}; give a folder for the generated suites (the default "
                              "is suites/opinfo). Nothing was imported.")
    if not out_dir.is_dir():
        return []
    found = []
    for path in sorted(out_dir.glob("*.yaml")):
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                first = fh.readline()
        except OSError:
            continue
        if first.startswith(GENERATED) and not path.is_symlink():
            found.append(path)
    return found


def _write(folder: Path, samples: list[Sample], header: str) -> list[Path]:
    by_file: dict[str, list[dict]] = {}
    for s in samples:
        by_file.setdefault(_file_of(s.row.op), []).append(s.test)
    paths = []
    for fname in sorted(by_file):
        path = folder / fname
        path.write_text(dump_suite(header, DEFAULTS, by_file[fname]), encoding="utf-8")
        paths.append(path)
    return paths
