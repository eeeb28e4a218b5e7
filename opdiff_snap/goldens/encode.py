"""A Golden <-> the attributes of its Zarr group plus its named tensors.

Tensor leaves of each nested value are named `<section>.<i>`: `args.i`, `kwargs.i`,
`outputs.i`, `grads.i`, `reference.i` (float64 reference minus output), and
`state.<side>.i` for module parameters and buffers. The
nested structures (core/trees.py JSON) and a `tensors` table (name -> where its bytes lie in
the packed array, shape, dtypes, sha256) sit in the golden array's attributes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..core import trees
from ..suite.model import Invocation, RecordedGrads
from .golden import Golden, GoldenInfo
from .packed import PackError, TensorRecord

if TYPE_CHECKING:
    import torch

FORMAT = 1
MARK = "opdiff_snap_golden"   # attribute that marks a group as a golden, value: the format version


def encode(golden: Golden) -> tuple[dict[str, Any], list[tuple[str, torch.Tensor]]]:
    """(attributes without the `tensors` table, [(tensor name, tensor)])."""
    import torch

    named: list[tuple[str, torch.Tensor]] = []

    def section(name: str, value: Any) -> Any:
        structure, leaves = trees.flatten(value, f"the {name} of test '{golden.test_id}'")
        named.extend((f"{name}.{i}", t) for i, t in enumerate(leaves))
        return structure

    inv = golden.invocation
    states: dict[str, list[list[str]]] = {}
    for side, state in inv.states.items():
        entries = []
        for i, (param, tensor) in enumerate(state.items()):
            if not isinstance(tensor, torch.Tensor):
                raise TypeError(f"state '{side}' entry '{param}' is a {type(tensor).__name__}, not a tensor")
            entries.append([str(param), f"state.{side}.{i}"])
            named.append((f"state.{side}.{i}", tensor))
        states[str(side)] = entries
    attrs = {
        MARK: FORMAT,
        "test_id": golden.test_id, "seed": int(golden.seed), "spec_hash": golden.spec_hash,
        "suite": str(golden.suite), "test_type": golden.test_type, "created": golden.created,
        "baseline": dict(golden.baseline), "env": dict(golden.env),
        "definition": golden.definition, "extra": dict(golden.extra or {}),
        "args": section("args", list(inv.args)), "kwargs": section("kwargs", dict(inv.kwargs)),
        "states": states,
        "outputs": section("outputs", golden.outputs),
        "grads": None if golden.grads is None else section("grads", golden.grads.to_nested()),
    }
    if golden.reference is not None:
        attrs["reference"] = {"kind": "float64", "residuals": section("reference", golden.reference)}
    elif golden.reference_note is not None:
        attrs["reference"] = {"kind": "none", "reason": golden.reference_note}
    return attrs, named


def info_from_attrs(attrs: dict[str, Any], key: str) -> GoldenInfo:
    """Raises KeyError/TypeError/ValueError on malformed attributes."""
    if attrs.get(MARK) != FORMAT:
        raise ValueError(f"attribute {MARK!r} is {attrs.get(MARK)!r}, expected {FORMAT}")
    env = attrs["env"]
    baseline = attrs["baseline"]
    if not isinstance(env, dict) or not isinstance(baseline, dict):
        raise TypeError("env and baseline must be JSON objects")
    return GoldenInfo(test_id=str(attrs["test_id"]), seed=int(attrs["seed"]),
                      spec_hash=str(attrs["spec_hash"]), suite=str(attrs["suite"]),
                      test_type=str(attrs["test_type"]), baseline=str(baseline.get("name", "")),
                      env=env, created=str(attrs["created"]), key=key)


def tensor_records(attrs: dict[str, Any]) -> dict[str, TensorRecord]:
    table = attrs["tensors"]
    if not isinstance(table, dict):
        raise TypeError("'tensors' must be a JSON object")
    records = {}
    for name, rec in table.items():
        try:
            records[str(name)] = TensorRecord.from_json(rec)
        except PackError as exc:
            raise ValueError(f"tensor '{name}': {exc}") from None
    return records


def decode(attrs: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Golden:
    """Raises KeyError/TypeError/ValueError when the attributes do not fit the arrays."""

    def section(name: str, structure: Any) -> Any:
        count = trees.count_tensors(structure)
        return trees.unflatten(structure, [tensors[f"{name}.{i}"] for i in range(count)])

    states = {side: {param: tensors[array] for param, array in entries}
              for side, entries in attrs["states"].items()}
    reference = attrs.get("reference") or {}
    if not isinstance(reference, dict):
        raise TypeError("'reference' must be a JSON object")
    kind = reference.get("kind")
    args = section("args", attrs["args"])
    kwargs = section("kwargs", attrs["kwargs"])
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise TypeError("args must be a list and kwargs a dict")
    return Golden(
        test_id=attrs["test_id"], seed=int(attrs["seed"]), spec_hash=attrs["spec_hash"],
        suite=attrs["suite"], definition=attrs["definition"], test_type=attrs["test_type"],
        baseline=attrs["baseline"], env=attrs["env"], created=attrs["created"],
        invocation=Invocation(args=args, kwargs=kwargs, states=states),
        outputs=section("outputs", attrs["outputs"]),
        grads=None if attrs.get("grads") is None else RecordedGrads.from_nested(section("grads", attrs["grads"])),
        extra=attrs.get("extra") or {},
        reference=section("reference", reference["residuals"]) if kind == "float64" else None,
        reference_note=str(reference.get("reason", "")) if kind == "none" else None,
    )
