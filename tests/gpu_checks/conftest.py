"""Fixtures for the gpu_checks tests."""

from __future__ import annotations

from typing import Iterator

import pytest


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread() -> Iterator[None]:
    """The tiny model is latency-bound: one thread is faster and immune to CPU contention."""
    try:
        import torch
    except ImportError:
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

