"""Input profiles: the values a test's floating inputs take beyond random normals.

A test lists its profiles (`profiles: [normal, subnormal]`); each profile other than
`normal` records its own golden under `<id>@<profile>`: the test's own weights and
inputs (the same seed), its floating inputs then rewritten element by element from a
generator of the profile's own, so a divergence that random normals hide has a golden
of its own. A profile rewrites the floating tensors of the call's inputs, sampled or
given by `value` (real and complex); module weights, integer and boolean inputs and
Python scalars stay as written. Values are those of the input's own dtype (float16's
largest finite for a float16 input).

Edge values belong to one precision: float32's largest finite is inf in float16, its
subnormals are 0 there. So a test whose floating inputs are float32 (or float64) gets
each edge profile in every precision a target computes in: `<id>@subnormal` (its own
dtype's values), `<id>@subnormal.f16` and `<id>@subnormal.bf16` (float16's / bfloat16's
edge values, and the values kept rounded to that dtype, in the test's own dtype: every
input is one the narrower dtype holds exactly, so an fp16 target computes on the very
inputs the golden saw). Each is judged only on the presets computing in its precision
(`precision_skip`): elsewhere it is SKIPPED, with why.
"""

from __future__ import annotations

from typing import Any, Iterable

NORMAL = "normal"
# every profile, normal first (suite/edge_values.py rewrites the inputs for the others)
PROFILES = (NORMAL, "wide", "subnormal", "signed_zero", "max_finite", "nonfinite")
# what `profiles: [edge]` stands for: every profile but normal
EDGE = PROFILES[1:]
# the precision variants of an edge profile: id suffix -> the dtype whose values it writes
VARIANTS = {"f16": "float16", "bf16": "bfloat16"}
# the precision (a preset's word) of inputs of each floating dtype; any other is fp32's
_PRECISION_OF = {"float16": "fp16", "bfloat16": "bf16"}
_SUFFIX_OF = {"fp16": "f16", "bf16": "bf16"}


def expand(names: list[str]) -> list[str]:
    """The profiles `names` stand for (`edge`: every one but normal), in order, each once.
    ValueError carries a name that is not a profile."""
    out: list[str] = []
    for name in names:
        if name not in PROFILES and name != "edge":
            raise ValueError(name)
        out.extend(p for p in (EDGE if name == "edge" else (name,)) if p not in out)
    return out


def split(profile: str) -> tuple[str, str | None]:
    """A profile id as (profile, variant suffix or None): `subnormal.f16` -> (subnormal, f16)."""
    base, dot, suffix = profile.partition(".")
    return (base, suffix) if dot and suffix in VARIANTS else (profile, None)


def variant_dtype(profile: str) -> str | None:
    """The dtype whose values a precision variant writes into the real floating inputs
    (None: the inputs' own)."""
    suffix = split(profile)[1]
    return None if suffix is None else VARIANTS[suffix]


def in_precisions(profile: str, input_dtypes: Iterable[str]) -> list[str]:
    """The profile ids one listed profile makes for a test whose floating tensor inputs
    have `input_dtypes`: itself, and where those are all float32 or float64 (real or
    complex, some real), its fp16 and bf16 variants too."""
    dtypes = set(input_dtypes)
    wide = bool(dtypes) and dtypes <= {"float32", "float64", "complex64", "complex128"} \
        and bool(dtypes & {"float32", "float64"})
    if profile == NORMAL or not wide:
        return [profile]
    return [profile, *(f"{profile}.{suffix}" for suffix in VARIANTS)]


def floating_dtypes(node: Any) -> list[str]:
    """The dtypes of the floating and complex tensors resolved input nodes make (what a
    profile rewrites); module nodes and constants are not inputs a profile touches."""
    if isinstance(node, dict):
        if node.get("type") in ("tensor", "scalar_tensor", "const_tensor"):
            dtype = str(node["dtype"])
            return [dtype] if dtype.startswith(("float", "bfloat", "complex")) else []
        if node.get("type") in ("module", "construct", "const"):
            return []
        return [d for v in node.values() for d in floating_dtypes(v)]
    if isinstance(node, (list, tuple)):
        return [d for v in node for d in floating_dtypes(v)]
    return []


def judged_in(profile: str, input_dtypes: Iterable[str]) -> str | None:
    """The precision (fp32, fp16, bf16) a profile's edge values belong to: a variant's,
    else that of the test's real floating inputs (fp32 for float32 and float64); None
    when it rewrites complex inputs only, which no preset casts."""
    own = variant_dtype(profile)
    if own is not None:
        return _PRECISION_OF[own]
    found = {_PRECISION_OF.get(d, "fp32") for d in input_dtypes if not d.startswith("complex")}
    return next((p for p in ("fp16", "bf16", "fp32") if p in found), None)


def precision_skip(test_id: str, profile: str, input_dtypes: Iterable[str], precision: str) -> str | None:
    """Why an edge profile is not judged on a preset computing in `precision` (None: it
    is). Edge values are judged only where the target computes in their precision: a
    float32 profile's values are not fp16 or bf16 values (a cast makes them others), and
    an fp16 or bf16 variant is judged on the presets of its own precision (an fp32 preset
    is judged on the test's own profile)."""
    if profile == NORMAL:
        return None
    dtypes = list(input_dtypes)
    own = judged_in(profile, dtypes)
    target = precision if precision in ("fp16", "bf16") else "fp32"
    if own is None or own == target:
        return None
    # the reason names no test, so that a run's summary gives one line per reason
    base, suffix = split(profile)
    if target == "fp32":
        return (f"{own} edge values are judged on {own} presets only; a preset computing in {precision} is "
                f"judged on the test's own profile (<id>@{base})")
    word = own if own != "fp32" or suffix is not None else \
        "/".join(sorted({d for d in dtypes if d in ("float32", "float64")}))
    counterpart = f"<id>@{base}.{_SUFFIX_OF[target]}" if suffix is not None or own == "fp32" else None
    told = f"; {precision} presets are judged on {counterpart}" if counterpart else ""
    return (f"the {word} edge values of profile '{base}' are not {precision} values: the target would "
            f"compute on other inputs than the golden{told}")


def id_with_profile(test_id: str, profile: str) -> str:
    return test_id if profile == NORMAL else f"{test_id}@{profile}"


def base_id(test_id: str, profile: str) -> str:
    """The id of the test a profile varies (the inverse of id_with_profile)."""
    suffix = f"@{profile}"
    return test_id[:-len(suffix)] if profile != NORMAL and test_id.endswith(suffix) else test_id
