"""What an expectations file says of the shipped suites on the presets it is kept for on a
CPU-only machine: those presets, taken from the registry; each OpInfo and zoo test's known
verdict and reason on them; how many hand-written tests it names per preset."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..backends import registry
from ..suite.given import given_cases
from .entries import Expectations
from .file import load

COVERAGE = {"opinfo": "OpInfo samples", "zoo": "Model zoo"}   # the suites nobody here wrote, by tag
# the presets on which the expectations file holds the known failures of suites/opinfo and
# suites/zoo (hours of checking per preset here, so a chosen few)
COVERAGE_PRESETS = ("torch_cpu_fp16", "torch_cpu_bf16", "onnx_cpu_fp32", "onnx_cpu_fp16", "executorch_cpu_fp32",
                    "executorch_cpu_fp16", "coreml_any_fp16")


def page_presets() -> list[str]:
    """Every preset that runs on a CPU-only machine (it needs nothing beyond a CPU), then
    those that only convert there: CoreML's float presets on the device that lets CoreML
    choose (its conversion runs anywhere, its prediction needs macOS). Registry order."""
    presets = registry.all_presets()
    runs = [p.name for p in presets if not registry.requirements(p)]
    converts = [p.name for p in presets if p.family == "coreml" and p.device == "any" and p.scheme is None]
    return runs + converts


def load_known(path: Path) -> Expectations:
    """The expectations file at `path`, its preset names checked against the registry."""
    return load(path, registry.preset_names())


@dataclass(frozen=True)
class Known:
    """What the expectations file says of one seed of one OpInfo or zoo test on one preset:
    `verdict` None where it has no entry (the test passes there; on a preset that only
    converts here, it converts)."""

    source: str
    test: str
    preset: str
    verdict: str | None
    reason: str


def coverage_known(exps: Expectations, presets: list[str], suites: list[Path]) -> list[Known]:
    """Each seed of each OpInfo and zoo test of `suites` on each preset."""
    known = []
    for case in given_cases(suites, suites[0]):
        source = next((tag for tag in COVERAGE if tag in case.tags), None)
        if source is None:
            continue
        for seed in case.seeds:
            for preset in presets:
                e = exps.match(preset, case.id, seed)
                known.append(Known(source, case.id, preset, None if e is None else str(e.verdict),
                                   "" if e is None else e.reason))
    return known


def known_hand_written(exps: Expectations, presets: list[str]) -> dict[str, int]:
    """preset -> how many entries of the expectations file name a hand-written test on it."""
    return {p: sum(1 for e in exps.entries if e.preset == p and not e.test.startswith(("opinfo.", "zoo_")))
            for p in presets}
