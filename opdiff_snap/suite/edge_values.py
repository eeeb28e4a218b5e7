"""The values each input profile (suite/profiles.py) rewrites a sampled floating tensor to,
element by element, from the generator it is given; the docstring of each says which."""

from __future__ import annotations

import math
from typing import Callable

import torch

from .profiles import NORMAL, split, variant_dtype


def _pick(t: torch.Tensor, g: torch.Generator, share: float) -> torch.Tensor:
    return torch.rand(t.shape, generator=g, dtype=torch.float64) < share


def _signs(t: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    return torch.where(torch.rand(t.shape, generator=g, dtype=torch.float64) < 0.5, -1.0, 1.0)


def _wide(t: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Every element's magnitude log-uniform over the dtype's normal range, at most 2**±24
    (float16: 2**±14), signs as sampled."""
    info = torch.finfo(t.dtype)
    span = min(24, int(math.log2(info.max)) - 1)
    exps = (torch.rand(t.shape, generator=g, dtype=torch.float64) * 2 - 1) * span
    sign = torch.where(t.double() < 0, -1.0, 1.0)
    return (sign * torch.exp2(exps)).to(t.dtype)


def _subnormal(t: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """A tenth of the elements ±0, four tenths subnormal, a quarter tiny normals up to 256
    times the smallest normal, a quarter as sampled."""
    info = torch.finfo(t.dtype)
    u = torch.rand(t.shape, generator=g, dtype=torch.float64)
    sign = _signs(t, g)
    sub = sign * info.smallest_normal * torch.rand(t.shape, generator=g, dtype=torch.float64)
    tiny = sign * info.smallest_normal * torch.exp2(8 * torch.rand(t.shape, generator=g, dtype=torch.float64))
    out = torch.where(u < 0.1, sign * 0.0, torch.where(u < 0.5, sub, torch.where(u < 0.75, tiny, t.double())))
    return out.to(t.dtype)


def _signed_zero(t: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Half the elements +0.0 or -0.0, the rest as sampled."""
    zeros = _signs(t, g) * 0.0
    return torch.where(_pick(t, g, 0.5), zeros, t.double()).to(t.dtype)


def _max_finite(t: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Half the elements between half the dtype's largest finite value and that value (a
    tenth of them exactly ±max), signs random, the rest as sampled."""
    info = torch.finfo(t.dtype)
    sign = _signs(t, g)
    big = sign * info.max * (0.5 + 0.5 * torch.rand(t.shape, generator=g, dtype=torch.float64))
    big = torch.where(_pick(t, g, 0.1), sign * info.max, big)
    big = big.to(t.dtype)   # rounding to a narrower dtype may pass max: clamp after the cast
    big = torch.clamp(big, -info.max, info.max)
    return torch.where(_pick(t, g, 0.5), big, t)


def _nonfinite(t: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """A sixth each +inf, -inf and NaN, the rest as sampled."""
    u = torch.rand(t.shape, generator=g, dtype=torch.float64)
    out = torch.where(u < 1 / 6, float("inf"), torch.where(u < 2 / 6, float("-inf"),
                                                            torch.where(u < 3 / 6, float("nan"), t.double())))
    return out.to(t.dtype)


REWRITES: dict[str, Callable[[torch.Tensor, torch.Generator], torch.Tensor]] = {
    "wide": _wide,
    "subnormal": _subnormal,
    "signed_zero": _signed_zero,
    "max_finite": _max_finite,
    "nonfinite": _nonfinite,
}


def apply_profile(profile: str, t: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """`t` (a sampled input) rewritten by `profile`; unchanged for normal and for a tensor
    that is not floating. A precision variant (`subnormal.f16`) rewrites a real floating
    tensor with the values of its dtype (float16's largest finite, its subnormals), the
    ones kept rounded to it too, and keeps the tensor's own dtype: every value is one the
    narrower dtype holds exactly, so a target that casts to it computes on the very inputs
    the golden saw. A complex tensor keeps its own values (no preset casts it)."""
    fn = None if profile == NORMAL else REWRITES[split(profile)[0]]
    if fn is None or not (t.is_floating_point() or t.is_complex()) or t.numel() == 0:
        return t
    narrow = variant_dtype(profile)
    if narrow is not None and t.is_floating_point():
        return fn(t.to(getattr(torch, narrow)), g).to(t.dtype)
    if t.is_complex():
        parts = torch.view_as_real(t)
        return torch.complex(fn(parts[..., 0], g), fn(parts[..., 1], g))
    return fn(t, g)
