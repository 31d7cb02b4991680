"""One torch thread for every numeric check, whatever the machine: the figures a check reports depend on it.

On CPU, torch splits a matmul's or a reduction's work by its intra-op thread count, and the order of the
partial sums changes the last bits: the same check on the same schedule gave ``kl=3.3e-16`` on one
thread and ``3.6e-16`` on four, another worst request, another bitwise share.  A grading worker, a Ray
node and a laptop have different counts, so every check runs with the count pinned (``pinned``) and
restored after it, and results.json is the same on every machine.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

import torch

__all__ = ["NUMERICS_THREADS", "pinned"]

NUMERICS_THREADS = 1
"""The intra-op thread count every check computes with (the small models are latency-bound anyway)."""

F = TypeVar("F", bound=Callable[..., Any])


def pinned(fn: F) -> F:
    """``fn`` run with torch's intra-op thread count set to ``NUMERICS_THREADS``, restored when it returns
    (or raises)."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        previous = torch.get_num_threads()
        if previous != NUMERICS_THREADS:
            torch.set_num_threads(NUMERICS_THREADS)
        try:
            return fn(*args, **kwargs)
        finally:
            if torch.get_num_threads() != previous:
                torch.set_num_threads(previous)

    return run  # type: ignore[return-value]
