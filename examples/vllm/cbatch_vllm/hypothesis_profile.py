"""A pytest plugin module registering the hypothesis profile of the live vLLM server job.

``pytest -p cbatch_vllm.hypothesis_profile --hypothesis-profile=cbatch-vllm-server ...``:
the kit's ``ci`` settings (derandomized: the same traces for everyone, no
example database) with 20 examples instead of 100, because every generated
trace is replayed in real time against the server (about 2-3 s each on a
2-core CPU machine).
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

PROFILE = "cbatch-vllm-server"

settings.register_profile(PROFILE, max_examples=20, derandomize=True, database=None, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                 HealthCheck.filter_too_much])
