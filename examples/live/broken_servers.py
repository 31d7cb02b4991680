"""Embedded servers broken on purpose, each caught by a client-observable clause.

* :class:`DuplicateTokenServer` sends one data frame twice (same token, same
  running usage count): the client sees output index 2 repeated
  (``no_duplicate_emission``), one token more than asked
  (``finished_outputs_complete``) and a usage count that disagrees with the
  frames (``usage_agrees``).
* :class:`InventedTokenServer` streams an invented first token the moment a
  request arrives, before the scheduler has run its prompt: a fake TTFT, also
  for a stream the trace cancels before its real first token.  A client
  cannot tell an invented token from a real one on its own, but the server's
  own running count numbers its first real token 1 again
  (``no_duplicate_emission``).
* :class:`KeepsClosedStreamsServer` never cancels a request whose client
  went away: a closed stream keeps running to its ``max_tokens`` and holds its
  pages all that time (the abort check, ``pytest_cbatch.live.abort``, fails it).
  Its twin in pages only, a server that cancels but never frees, needs no
  class: ``create_server(release_delay=10**9)`` keeps every cancelled
  request's pages for a billion ticks.

Build one with ``create_server(server_class=DuplicateTokenServer, ...)``.
"""

from __future__ import annotations

from typing import Any, Iterator

from pytest_cbatch.live.backends import Sample
from pytest_cbatch.live.engine import Job, Seq
from pytest_cbatch.live.server import OpenAIServer, Request


class DuplicateTokenServer(OpenAIServer):
    """Sends the frame that carries each request's second token twice (however many tokens it carries:
    a writer that fell behind puts several in one frame)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._repeated: set[str] = set()

    def frames(self, req: Request, rid: str, seq: Seq, samples: list[Sample]) -> Iterator[dict[str, Any]]:
        for frame in super().frames(req, rid, seq, samples):
            yield frame
            if seq.read >= 2 and seq.rid not in self._repeated:
                self._repeated.add(seq.rid)
                yield frame


class InventedTokenServer(OpenAIServer):
    """Streams a made-up token before any real work (no usage count on that frame)."""

    async def opening(self, resp: Any, req: Request, job: Job, rid: str) -> None:
        await super().opening(resp, req, job, rid)
        invented = self.choice(req, job.seqs[0], [Sample(0, -1.0)], None)
        await self.send(resp, self.chunk(req, rid, [invented], None))


class KeepsClosedStreamsServer(OpenAIServer):
    """Cancels nothing when a handler ends: a request whose client disconnected runs on to its max_tokens."""

    def closed(self, job: Job) -> None:
        pass
