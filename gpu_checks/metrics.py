"""Per-position comparison of two runs' logits.

All metrics are computed in float64 on the records' device.  KL is
``KL(ref || sut)`` over the full vocabulary at each position; a position whose
logits are not all finite counts in ``nonfinite`` and gets KL and |Δ| = inf,
so it can never hide below a threshold (``nan > tol`` is False).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from .streams import Records

__all__ = ["Metrics", "compare"]


@dataclass
class Metrics:
    """What one comparison measured.  ``bitwise_frac`` is None across dtypes."""

    n_positions: int
    max_kl: float
    mean_kl: float
    max_abs: float
    top1_agree: float
    hard_flips: int
    nonfinite: int
    bitwise_frac: float | None
    worst: dict[str, Any] = field(default_factory=dict)

    @property
    def finite(self) -> bool:
        """True when every compared logit is finite (explicit, not via a threshold)."""
        return self.nonfinite == 0 and math.isfinite(self.max_kl) and math.isfinite(self.max_abs)


def compare(sut: Records, ref: Records, *, flip_margin: float, positional: bool = False) -> Metrics:
    """Compare every record of ``sut`` with ``ref``'s record of the same (request, position).

    ``positional=True`` pairs records by index instead (same schedule run
    twice).  ``hard_flips`` counts argmax disagreements where ``ref``'s
    top-1/top-2 margin exceeds ``flip_margin``.  Raises ValueError when ``ref``
    lacks a position or has non-finite logits itself.
    """
    if positional:
        if len(sut) != len(ref) or sut.request != ref.request or sut.position != ref.position:
            raise ValueError("positional comparison of runs that computed different positions")
        ref_logits = ref.logits
    else:
        index = ref.index_of()
        missing = [k for k in zip(sut.request, sut.position) if k not in index]
        if missing:
            raise ValueError(f"reference lacks {len(missing)} positions, e.g. {missing[0]}")
        rows = torch.tensor([index[k] for k in zip(sut.request, sut.position)], dtype=torch.long,
                            device=ref.logits.device)
        ref_logits = ref.logits[rows]
    n = len(sut)
    if n == 0:
        return Metrics(0, 0.0, 0.0, 0.0, 1.0, 0, 0, 1.0)
    b = ref_logits.to(torch.float64)
    if not bool(torch.isfinite(b).all()):
        raise ValueError("reference logits are not finite")
    a = sut.logits.to(device=b.device, dtype=torch.float64)
    finite = torch.isfinite(a).all(dim=-1)
    logp_b = torch.log_softmax(b, dim=-1)
    kl = (logp_b.exp() * (logp_b - torch.log_softmax(a, dim=-1))).sum(-1)
    inf = torch.tensor(float("inf"), dtype=torch.float64, device=b.device)
    kl = torch.where(finite, kl.clamp(min=0.0), inf)
    diff = torch.where(finite, (a - b).abs().amax(-1), inf)
    top = b.topk(2, dim=-1).values
    agree = a.argmax(-1) == b.argmax(-1)
    flips = finite & ~agree & (top[:, 0] - top[:, 1] > flip_margin)
    bitwise = None
    if sut.logits.dtype == ref_logits.dtype:
        same = (sut.logits.to(b.device) == ref_logits).all(dim=-1)
        bitwise = float(same.double().mean())
    w = int(torch.argmax(torch.where(kl == kl.max(), diff, -inf)))
    return Metrics(
        n_positions=n,
        max_kl=float(kl.max()),
        mean_kl=float(kl.mean()),
        max_abs=float(diff.max()),
        top1_agree=float((agree & finite).double().mean()),
        hard_flips=int(flips.sum()),
        nonfinite=int((~finite).sum()),
        bitwise_frac=bitwise,
        worst={"request": sut.request[w], "position": sut.position[w], "step": sut.step[w],
               "phase": sut.phase[w], "kl": float(kl[w]), "abs": float(diff[w])},
    )
