"""The ``http://`` kind: a live OpenAI-compatible server, replayed by :mod:`pytest_cbatch.live.replay`.

Claiming a SPEC imports nothing; building one imports the live client (the
``live`` extra, aiohttp), so a run that names no server never loads it.
"""

from __future__ import annotations

from ..impls import Implementation, Kind, SpecRequest

__all__ = ["KIND", "SCHEMES"]

SCHEMES = ("http://", "https://")


def _claims(request: SpecRequest) -> bool:
    return request.spec.startswith(SCHEMES)


def _build(request: SpecRequest) -> Implementation:
    from ..live.replay import HttpImplementation

    return HttpImplementation(request.spec, tick_seconds=request.tick_seconds,
                              timeout=request.bounds.seconds or 86400.0, model=request.model)


KIND = Kind(order=100, form="http://HOST:PORT", claims=_claims, build=_build)
