"""How a repro script judges its outputs: as `opdiff check` does (compare/numerics.py,
compare/bounds.py), from the rules the writer stores with the data."""

import math
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:   # what the writer generates
    from .generated import (
        BIAS_MIN_ELEMENTS,
        BIAS_SHIFT,
        DRIFT_BOUND,
        DRIFT_CLIP,
        MISMATCH,
        PASS,
        SHAPE_MISMATCH,
        STRUCTURE_MISMATCH,
        T_QUANTILE,
    )

# ---------------------------------------------------------------- script text


def flatten(out):
    """Output tensors in order (tuples, lists and dict values walked, and the children of a
    type registered with torch.utils._pytree); complex as real [..., 2]."""
    if isinstance(out, torch.Tensor):
        return [torch.view_as_real(out) if out.is_complex() else out]
    if isinstance(out, dict):
        out = list(out.values())
    elif not isinstance(out, (tuple, list)) and type(out) in torch.utils._pytree.SUPPORTED_NODES:
        out = torch.utils._pytree.SUPPORTED_NODES[type(out)].flatten_fn(out)[0]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in flatten(o)]
    return []


def ulps(values, u, tiny):
    """One unit in the last place at each value, for a precision of unit roundoff u."""
    _, exponent = torch.frexp(values.abs().clamp_min(tiny))
    return torch.ldexp(torch.full_like(values, u), exponent)


def bands(rule, e):
    """(centre, width) pairs: an element passes when |actual - centre| <= width for any."""
    tol = lambda c: rule["atol"] + rule["rtol"] * c.abs()  # noqa: E731
    if rule["kind"] == "elementwise":
        r = rule["reference"]
        allowed = rule["ulps"] * ulps(r, rule["u"], rule["tiny"])
        allowed = torch.where(r.abs() < rule["tiny"], allowed.clamp_min(rule["tiny"]), allowed)
        return [(r, allowed), (e, torch.full_like(e, rule["atol"]))]
    out = [(e, tol(e))]
    if rule["bound"] is not None and rule["reference"] is not None:
        out += [(e, torch.full_like(e, rule["bound"])), (rule["reference"], tol(rule["reference"]))]
    return out


def torch_multiple(rule, af):
    """The output's error against the float64 reference as a multiple of torch eager's own
    at the target's precision (its RMS and largest error, each with the floor); None when
    the rule has no such allowance (compare/rules.py, TorchError)."""
    own, r = rule.get("torch"), rule.get("reference")
    if own is None or r is None:
        return None
    ok = torch.isfinite(af) & torch.isfinite(r)
    if not bool(ok.any()):
        return None
    d = (af[ok] - r[ok]).abs()
    slack = own["floor"] / own["factor"] if own["factor"] > 0 else own["floor"]

    def ratio(value, mine):
        if mine + slack > 0:
            return value / (mine + slack)
        return 0.0 if value == 0 else math.inf

    return max(ratio(float(d.square().mean().sqrt()), own["rms"]), ratio(float(d.max()), own["largest"]))


def blocks_of(n, row):
    """Index blocks for batch means: the rows of the last dimension (4 to 32 of them, consecutive
    rows merged), or 4 contiguous chunks when there are fewer than 4 rows."""
    rows = n // row if row > 0 else 0
    if rows < 4 or rows * row != n:
        return list(torch.tensor_split(torch.arange(n), 4))
    return [g.reshape(-1) for g in torch.tensor_split(torch.arange(n).reshape(rows, row), min(rows, 32))]


def mean_and_bound(x, floor, blocks):
    """The mean over the blocks' elements, and what it may be: the floor, or T_QUANTILE standard
    errors of it by the block means when larger."""
    blocks = [b for b in blocks if b.numel()]
    means = torch.stack([x[b].mean() for b in blocks])
    spread = means.std(correction=1).item() / math.sqrt(len(blocks))
    return x[torch.cat(blocks)].mean().item(), max(floor, T_QUANTILE[len(blocks) - 4] * spread)


def biased(rule, e, a, row):
    """Whether the errors point one way (the bias bound): the mean error, and the mean error in
    ulps toward +inf and away from zero, each within its bound."""
    centre = {"expected": e, "reference": rule["reference"], "own": rule["bias_centre"]}.get(rule["bias_on"])
    if centre is None:
        return False
    usable = torch.isfinite(a) & torch.isfinite(centre)
    a, centre = a[usable], centre[usable]
    n = a.numel()
    if n < BIAS_MIN_ELEMENTS:
        return False
    magnitude = centre.abs().max().item()
    if magnitude == 0.0 or not math.isfinite(magnitude):
        return False
    diff, k = a - centre, rule["kernel_ulps"]
    shrunk = torch.sign(diff) * (diff.abs() - rule["atol"]).clamp_min(0.0)
    shift, shift_bound = mean_and_bound(shrunk, BIAS_SHIFT * k * rule["u"] * magnitude, blocks_of(n, row))
    if abs(shift) > shift_bound:
        return True
    unit = ulps(centre, rule["u"], rule["tiny"])
    seen = unit > rule["atol"]          # the mean error in ulps, where the tolerance resolves an ulp
    if int(seen.sum()) < BIAS_MIN_ELEMENTS:
        return False
    z = (diff / unit).clamp(-DRIFT_CLIP, DRIFT_CLIP)
    blocks = [b[seen[b]] for b in blocks_of(n, row)]
    if sum(1 for b in blocks if b.numel()) < 4:
        return False
    up, up_bound = mean_and_bound(z, DRIFT_BOUND * k, blocks)
    out, out_bound = mean_and_bound(z * torch.sign(centre), DRIFT_BOUND * k, blocks)
    return max(abs(up) / up_bound, abs(out) / out_bound) > 1.0


def compare(expected, actual, rules):
    """Print per-output metrics; return the verdict and the metrics over all outputs together,
    judged exactly as `opdiff check` judges them (docs/check.md, "When a result passes"): each
    element within one of its bands (the tolerance, the rounding bound, the float64 reference;
    or for one elementwise op on fp16/bf16 a few ulps of the exact answer), NaN and Inf at the
    same places, integers and bools equal, and no bias."""
    if len(actual) != len(expected):
        print(f"{MISMATCH}: {len(actual)} outputs, expected {len(expected)}")
        return STRUCTURE_MISMATCH, None
    verdict = PASS
    total = {"max_abs": 0.0, "max_rel": 0.0, "mean_abs": 0.0, "mismatched": 0, "numel": 0, "failed_bound": None}
    sum_abs, counted = 0.0, 0
    for i, (e, a, rule) in enumerate(zip(expected, actual, rules)):
        a = a.detach().cpu()
        if tuple(a.shape) != tuple(e.shape):
            print(f"output {i}: {MISMATCH} shape {tuple(a.shape)}, expected {tuple(e.shape)}")
            verdict = SHAPE_MISMATCH
            continue
        ef, af = e.double().reshape(-1), a.to(e.dtype).double().reshape(-1)
        finite = torch.isfinite(ef) & torch.isfinite(af)
        if rule is None:                              # integers, bools: exact
            bad, failed = e.reshape(-1) != a.to(e.dtype).reshape(-1), "exact"
        else:
            excess = None
            for centre, width in bands(rule, ef):
                x = (af - centre).abs() - width
                excess = x if excess is None else torch.minimum(excess, x)
            en, an = torch.isnan(ef), torch.isnan(af)
            nonfinite = (en != an) | (~finite & ~en & ~an & (ef != af))
            if rule.get("overflow"):   # the answer lies past the target precision's largest finite
                answer = rule["reference"].reshape(-1) if rule["kind"] == "elementwise" else ef
                past = answer.abs() >= rule["overflow"]
                edge = torch.isinf(af) | (af.abs() == rule["largest"])   # inf, or saturated
                over = edge & past & (torch.sign(af) == torch.sign(answer))
                nonfinite &= ~over
                excess = torch.where(over, torch.clamp(excess, max=0.0), excess)
            bad = nonfinite | (finite & (excess > 0))
            failed = "nonfinite" if bool(nonfinite.any()) else rule["kind"]
            multiple = torch_multiple(rule, af)
            if multiple is not None:
                print(f"output {i}: error {multiple:.3g}x torch eager's own in {rule['precision']} "
                      f"(at most {rule['torch']['factor']:g}x allowed)")
                if multiple <= rule["torch"]["factor"] and not bool(nonfinite.any()):
                    bad = torch.zeros_like(bad)   # as good as torch's own at this precision
            if not bool(bad.any()) and rule["bias_on"] is not None and \
                    biased(rule, ef, af, e.shape[-1] if e.dim() else 1):
                failed = "bias"
        if e.dim() and e.shape[-1] == 2 and rule is not None and rule.get("complex"):
            bad = bad.reshape(-1, 2).any(dim=1)
        diff, size = (af - ef).abs()[finite], ef.abs()[finite]
        rel = diff[size > 0] / size[size > 0]
        max_abs = float(diff.max()) if diff.numel() else 0.0
        max_rel = float(rel.max()) if rel.numel() else 0.0
        n_bad = int(bad.sum())
        print(f"output {i}: {e.dtype} shape {tuple(e.shape)} max_abs={max_abs:.6g} max_rel={max_rel:.6g} "
              f"mismatched={n_bad}/{bad.numel()}" + (f" ({failed} bound)" if n_bad or failed == "bias" else ""))
        total["max_abs"], total["max_rel"] = max(total["max_abs"], max_abs), max(total["max_rel"], max_rel)
        total["mismatched"] += n_bad
        total["numel"] += bad.numel()
        sum_abs, counted = sum_abs + float(diff.sum()), counted + diff.numel()
        if (n_bad or failed == "bias") and verdict == PASS:
            verdict, total["failed_bound"] = MISMATCH, failed
    total["mean_abs"] = sum_abs / counted if counted else 0.0
    return verdict, total
