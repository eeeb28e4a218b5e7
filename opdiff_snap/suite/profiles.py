"""Input profiles: the values a test's floating inputs take beyond random normals.

A test lists its profiles (`profiles: [normal, subnormal]`); each profile other than
`normal` records its own golden under `<id>@<profile>`: the test's own weights and
inputs (the same seed), its floating inputs then rewritten element by element from a
generator of the profile's own, so a divergence that random normals hide has a golden
of its own. A profile rewrites the floating tensors of the call's inputs, sampled or
given by `value` (real and complex); module weights, integer and boolean inputs and
Python scalars stay as written. Values are those of the input's own dtype (float16's
largest finite for a float16 input).
"""

from __future__ import annotations

NORMAL = "normal"
# every profile, normal first (suite/edge_values.py rewrites the inputs for the others)
PROFILES = (NORMAL, "wide", "subnormal", "signed_zero", "max_finite", "nonfinite")
# what `profiles: [edge]` stands for: every profile but normal
EDGE = PROFILES[1:]


def expand(names: list[str]) -> list[str]:
    """The profiles `names` stand for (`edge`: every one but normal), in order, each once.
    ValueError carries a name that is not a profile."""
    out: list[str] = []
    for name in names:
        if name not in PROFILES and name != "edge":
            raise ValueError(name)
        out.extend(p for p in (EDGE if name == "edge" else (name,)) if p not in out)
    return out


def id_with_profile(test_id: str, profile: str) -> str:
    return test_id if profile == NORMAL else f"{test_id}@{profile}"


def base_id(test_id: str, profile: str) -> str:
    """The id of the test a profile varies (the inverse of id_with_profile)."""
    suffix = f"@{profile}"
    return test_id[:-len(suffix)] if profile != NORMAL and test_id.endswith(suffix) else test_id
