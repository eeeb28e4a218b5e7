"""`check --outputs-from DIR`: the outputs a device returned in a replay bundle, judged as
check judges its own (run/judge.py, the expectations, the history), with the device's
record as the run's environment.

Before anything is judged, the bundle is read whole: its manifest, the digest of every
artifact and input file against it (a bundle changed after it was written is refused,
exit 2). Then per (test, seed, preset): an entry whose golden was re-recorded since is
STALE; one the device reported failing is LOAD_FAIL or INFER_FAIL with its message; one
without outputs is UNAVAILABLE; outputs that do not fit the manifest are
STRUCTURE_MISMATCH; the rest go to a worker with the outputs in place of running the
artifact, which computes what the judge compares them with (references, precision
control, an int8 preset's quantized reference) from the golden. Nothing in the bundle is
executed here."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ..compare.results import Result
from ..core.bundle_format import (
    BundleError,
    DeviceRecord,
    Entry,
    Manifest,
    bytes_for,
    digest_path,
    inside,
    read_arrays,
    read_device,
    read_manifest,
)
from ..core.errors import OpdiffError
from ..core.verdicts import Verdict
from ..execution.bundling import Returned
from ..execution.runner import Job
from ..goldens.golden import golden_digest
from .judge import Pending
from .requests import CheckRequest

Key = tuple[str, int, str]


@dataclass
class Replay:
    """A bundle brought back: its manifest, entries by key, and each family's device record."""

    root: Path
    manifest: Manifest
    devices: dict[str, DeviceRecord]

    def __post_init__(self) -> None:
        self._entries = {(e.test, e.seed, e.preset): e for e in self.manifest.entries}
        self._left = {(x.test, x.seed, x.preset): x for x in self.manifest.left_out}
        self._items = {(k[0], k[1]) for k in [*self._entries, *self._left]}

    @property
    def presets(self) -> list[str]:
        return list(self.manifest.presets)

    def test_ids(self) -> list[str]:
        return sorted({e.test for e in self.manifest.entries} | {x.test for x in self.manifest.left_out})

    def covers(self, test_id: str, seed: int) -> bool:
        return (test_id, seed) in self._items

    def work(self, job: Job, pending: Pending) -> Result | tuple[Job, Pending]:
        """The job with the device's outputs in place of running it, or the result decided
        without a worker."""
        item, preset = pending.item, pending.preset

        def decided(verdict: Verdict, message: str, error_class: str | None = None) -> Result:
            return Result.of(item.case, item.test_id, item.seed, preset.name, verdict, message,
                             baseline=item.baseline, tolerance=pending.tol, error_class=error_class)

        key = (item.test_id, item.seed, preset.name)
        entry = self._entries.get(key)
        if entry is None:
            left = self._left.get(key)
            if left is not None:
                return decided(Verdict(left.verdict), left.message, left.error_class or None)
            return decided(Verdict.UNAVAILABLE, f"the bundle {self.root} holds no entry for test '{item.test_id}' "
                                                f"seed {item.seed} on {preset.name}; bundle it to check it there.")
        if entry.golden != golden_digest(pending.golden):
            return decided(Verdict.STALE, f"the bundle's entry {entry.id} was made from another golden of test "
                                          f"'{item.test_id}' seed {item.seed} (re-recorded since); its outputs are "
                                          f"not judged. Bundle it again (`opdiff bundle -b {preset.name}`) and run it.")
        device = self.devices.get(entry.family)
        ran = device.results.get(entry.id) if device is not None else None
        runner = f"run_{entry.family}.py"
        if ran is None:
            return decided(Verdict.UNAVAILABLE, f"the device returned nothing for entry {entry.id} (test "
                                                f"'{item.test_id}'): run `python {runner}` in the bundle on the "
                                                "device, then bring the folder back.")
        if ran.failed:
            verdict = Verdict.LOAD_FAIL if ran.failed == "load" else Verdict.INFER_FAIL
            where = device.environment.get("host") if device is not None else None
            return decided(verdict, f"on the device ({where}), {runner}: {ran.error.strip() or 'no message'}",
                           ran.error_class or None)
        outputs = self.root / entry.outputs_path()
        if not outputs.exists():
            return decided(Verdict.UNAVAILABLE, f"the device record lists entry {entry.id} (test '{item.test_id}') "
                                                f"but {outputs} is missing: run `python {runner}` again.")
        try:
            arrays = read_arrays(outputs, "out", bytes_for(entry.outputs))
        except BundleError as exc:
            return decided(Verdict.CORRUPT, f"the returned outputs of entry {entry.id} cannot be read: {exc}")
        wrong = _misfit(arrays, entry)
        if wrong:
            return decided(Verdict.STRUCTURE_MISMATCH, f"the device's outputs for entry {entry.id} do not fit the "
                                                       f"manifest: {wrong}")
        import torch

        returned = Returned([torch.from_numpy(a.copy()) for a in arrays], ran.infer_ms_all, ran.load_ms,
                            entry.calibration)
        return dataclasses.replace(job, returned=returned, alone=True), pending

    def request(self, request: CheckRequest) -> CheckRequest:
        """`request` on the bundle's presets (with the options they were bundled with) and,
        unless it narrows them, the bundle's tests."""
        options = dict(request.preset_options or {})
        for name in self.presets:
            options.setdefault(name, dict(self.manifest.presets[name].get("options") or {}))
        selection = request.selection
        if not selection.narrowed:
            selection = dataclasses.replace(selection, test_ids=self.test_ids())
        return dataclasses.replace(request, backends=list(request.backends or self.presets), preset_options=options,
                                   selection=selection)

    def environment(self) -> dict[str, Any]:
        """The run's environment: the device's (OS, machine, host, runtime versions), over
        the versions the artifacts were built with; the build's whole record under `build`."""
        env: dict[str, Any] = {k: v for k, v in self.manifest.build.items() if k not in ("cpu", "threads")}
        env["build"] = dict(self.manifest.build)
        for record in self.devices.values():
            device = dict(record.environment)
            env.update({k: v for k, v in (device.pop("runtime", None) or {}).items()})
            env.update(device)
        env["executable"] = None
        return env

    def settings(self) -> dict[str, Any]:
        return {"outputs_from": str(self.root), "bundle_created": self.manifest.created,
                "devices": sorted(self.devices)}


def read_replay(root: Path, backends: Sequence[str]) -> Replay:
    """The bundle at `root`, every digest checked, with the device records of the families
    of `backends` (every preset of the bundle when none). Raises OpdiffError (exit 2)."""
    try:
        manifest = read_manifest(root)
    except BundleError as exc:
        raise OpdiffError(f"--outputs-from {root}: {exc}") from None
    unknown = [b for b in backends if b not in manifest.presets]
    if unknown:
        raise OpdiffError(f"--outputs-from {root}: the bundle holds no entries for {', '.join(unknown)} (it holds "
                          f"{', '.join(manifest.presets)}); check those presets, or bundle these.")
    if backends:
        manifest = dataclasses.replace(
            manifest, presets={k: v for k, v in manifest.presets.items() if k in backends},
            entries=[e for e in manifest.entries if e.preset in backends],
            left_out=[x for x in manifest.left_out if x.preset in backends])
    _check_digests(root, manifest)
    devices = {}
    try:
        for family in sorted({e.family for e in manifest.entries}):
            record = read_device(root, family)
            if record is not None:
                devices[family] = record
    except BundleError as exc:
        raise OpdiffError(f"--outputs-from {root}: {exc}") from None
    hosts = {(r.environment.get("host"), r.environment.get("os")) for r in devices.values()}
    if len(hosts) > 1:
        raise OpdiffError(f"--outputs-from {root}: its device records come from {len(hosts)} machines "
                          f"({', '.join(f'{h} ({o})' for h, o in sorted(hosts, key=str))}); a run has one "
                          "environment, so judge one family at a time (-b with that family's presets).")
    return Replay(root, manifest, devices)


def _check_digests(root: Path, manifest: Manifest) -> None:
    seen: dict[str, str] = {}
    for e in manifest.entries:
        for rel, digest, what in ((e.artifact, e.artifact_sha256, "artifact"), (e.inputs, e.inputs_sha256, "inputs")):
            try:
                path = inside(root, rel, what)
            except BundleError as exc:
                raise OpdiffError(f"--outputs-from {root}: {exc}") from None
            if not path.exists():
                raise OpdiffError(f"--outputs-from {root}: entry {e.id} ({e.test}): its {what} {rel} is missing; "
                                  "the bundle is not whole. Bring the whole folder back, or bundle again.")
            found = seen.get(rel) or digest_path(path)
            seen[rel] = found
            if found != digest:
                raise OpdiffError(f"--outputs-from {root}: entry {e.id} ({e.test}): its {what} {rel} does not "
                                  f"match the manifest's digest (sha256 {found[:12]}..., the manifest says "
                                  f"{digest[:12]}...): it changed after `opdiff bundle` wrote it, so the outputs "
                                  "cannot be said to come from what was bundled. Nothing was judged; bundle again.")


def _misfit(arrays: list[Any], entry: Entry) -> str:
    """Why the returned arrays do not fit the manifest's outputs ("": they do)."""
    if len(arrays) != len(entry.outputs):
        return f"{len(arrays)} outputs returned, the golden has {len(entry.outputs)}"
    for i, (a, spec) in enumerate(zip(arrays, entry.outputs)):
        if tuple(a.shape) != spec.shape:
            return f"out{i} has shape {tuple(a.shape)}, the golden's is {spec.shape}"
        if a.dtype.kind not in "fcbiu" or (a.dtype.kind in "fc") != (spec.dtype.startswith(("float", "complex"))):
            return f"out{i} is {a.dtype}, the golden's is {spec.dtype}"
    return ""
