"""The optional request fields the live client adds, and what to do when a server refuses them.

The client asks every server for a fixed output length (``ignore_eos``), the
token ids of each frame (``return_token_ids``) and a running usage count
(``stream_options.continuous_usage_stats``).  None is part of the OpenAI API;
vLLM knows them all, other servers refuse unknown fields outright (HTTP 400 or
422: ``transformers serve`` answers 422 "Unexpected fields in the request").

When a request carrying them is refused with 400 or 422, the client sends it
once more without them (``stream_options`` keeps only ``include_usage``).  If
that succeeds, the server's route is remembered as one that refuses them, for
the rest of the process: later requests go without them from the start, and
reports say so (:meth:`RouteFields.note`).  Without ``ignore_eos`` the server
may end a request early at an end-of-sequence token; without token ids or a
running count, tokens are counted from the server's final usage.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["OPTIONAL_FIELDS", "REFUSAL_STATUSES", "RouteFields", "for_route"]

OPTIONAL_FIELDS = ("ignore_eos", "return_token_ids", "stream_options.continuous_usage_stats")
REFUSAL_STATUSES = (400, 422)


def _without_optional(payload: dict[str, Any]) -> dict[str, Any]:
    body = {k: v for k, v in payload.items() if k not in ("ignore_eos", "return_token_ids")}
    options = body.get("stream_options")
    if isinstance(options, dict) and "continuous_usage_stats" in options:
        body["stream_options"] = {k: v for k, v in options.items() if k != "continuous_usage_stats"}
    return body


@dataclass
class RouteFields:
    """What one server route accepts of the optional fields; ``refusal`` is its answer that taught it."""

    url: str
    refused: bool = False
    refusal: str = ""

    def prepare(self, payload: dict[str, Any]) -> dict[str, Any]:
        """``payload`` as this route takes it: without the optional fields once it refused them."""
        return _without_optional(payload) if self.refused else payload

    def can_retry(self, payload: dict[str, Any], status: int) -> bool:
        """Whether a refusal with ``status`` of ``payload`` is worth one retry without the optional fields."""
        return not self.refused and status in REFUSAL_STATUSES and _without_optional(payload) != payload

    def retry_body(self, payload: dict[str, Any]) -> dict[str, Any]:
        return _without_optional(payload)

    def learn(self, refusal: str) -> None:
        """The retry without the optional fields succeeded: remember the route refuses them."""
        self.refused, self.refusal = True, refusal

    def note(self) -> str | None:
        """What reports should tell the user about this route, or None when it took every field."""
        if not self.refused:
            return None
        return (f"{self.url} refused the client's optional fields ({', '.join(OPTIONAL_FIELDS)}): {self.refusal}; "
                f"requests were sent without them, so output length could not be forced (a request may end early "
                f"at an end-of-sequence token, finish_reason 'stop') and tokens are counted from what the stream "
                f"itself carries")


_ROUTES: dict[str, RouteFields] = {}


def for_route(url: str) -> RouteFields:
    """The process-wide record of route ``url`` (created on first use)."""
    return _ROUTES.setdefault(url, RouteFields(url))
