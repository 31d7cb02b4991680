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

Build one with ``create_server(server_class=DuplicateTokenServer, ...)``.
"""

from __future__ import annotations

from typing import Any, Iterator

from pytest_cbatch.live.backends import Sample
from pytest_cbatch.live.engine import Job, Seq
from pytest_cbatch.live.server import OpenAIServer, Request


class DuplicateTokenServer(OpenAIServer):
    """Sends the frame of each request's second token twice."""

    def frames(self, req: Request, rid: str, seq: Seq, samples: list[Sample]) -> Iterator[dict[str, Any]]:
        for frame in super().frames(req, rid, seq, samples):
            yield frame
            if seq.read == 2 and len(samples) == 1:
                yield frame


class InventedTokenServer(OpenAIServer):
    """Streams a made-up token before any real work (no usage count on that frame)."""

    async def opening(self, resp: Any, req: Request, job: Job, rid: str) -> None:
        await super().opening(resp, req, job, rid)
        invented = self.choice(req, job.seqs[0], [Sample(0, -1.0)], None)
        await self.send(resp, self.chunk(req, rid, [invented], None))
