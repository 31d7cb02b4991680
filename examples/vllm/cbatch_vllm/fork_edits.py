"""The fork campaign's edits to vLLM 0.32.0's scheduler and KV cache code: one-edit bugs a fork
could ship, and legitimate policy changes it may make (``cbatch_vllm.fork.Edit``).

Each bug names the boundary it breaks; the gate must fail it through a clause, with vLLM's own
assertions off.  Each policy change stays inside what the contract admits; the gate must stay
green on it.  ``benchmarks/fork_campaign.py`` runs the gate on each.
"""

from __future__ import annotations

from .fork import Edit

__all__ = ["EDITS", "edit_named"]

SCHEDULER = "vllm.v1.core.sched.scheduler"

_PRIORITY_VICTIM = """                    if self.policy == SchedulingPolicy.PRIORITY:
                        preempted_req = max(
                            self.running,
                            key=lambda r: (r.priority, r.arrival_time),
                        )
                    else:
                        preempted_req = self.running[-1]
"""
# vLLM's priority branch takes any victim out of the running list and this step's schedule
# correctly; a policy that picks another victim reuses it.
_PRIORITY_REMOVAL = ("                    if self.policy == SchedulingPolicy.PRIORITY:\n"
                     "                        victim_index = self.running.index(preempted_req)",
                     "                    if True:\n"
                     "                        victim_index = self.running.index(preempted_req)")

EDITS: tuple[Edit, ...] = (
    Edit("resumed_flag_off_by_one", "bug",
         "only the second and later resumed requests are flagged resumed; the first one's runner appends "
         "its new blocks to its stale table",
         SCHEDULER, (("            if idx >= num_running_reqs:\n                resumed_req_ids.add(req_id)",
                      "            if idx > num_running_reqs:\n                resumed_req_ids.add(req_id)"),)),
    Edit("abort_waiting_never_freed", "bug",
         "an aborted request that is not running leaves the queue but is never freed (it stays in "
         "Scheduler.requests)",
         SCHEDULER, (("            request.status = finished_status\n"
                      "            self._free_request(request, delay_free_blocks=delay_free_blocks)",
                      "            request.status = finished_status\n"
                      "            if request in running_requests_to_remove:\n"
                      "                self._free_request(request, delay_free_blocks=delay_free_blocks)"),)),
    Edit("abort_running_never_freed", "bug",
         "an aborted running request leaves the running list but keeps its blocks and its state",
         SCHEDULER, (("            request.status = finished_status\n"
                      "            self._free_request(request, delay_free_blocks=delay_free_blocks)",
                      "            request.status = finished_status\n"
                      "            if request not in running_requests_to_remove:\n"
                      "                self._free_request(request, delay_free_blocks=delay_free_blocks)"),)),
    Edit("finished_not_told_to_workers", "bug",
         "a finished or aborted request is freed but never named in finished_req_ids, so the runner keeps "
         "its table",
         SCHEDULER, (("        self.finished_req_ids.add(request_id)\n", ""),)),
    Edit("token_budget_plus_one", "bug", "a step may schedule max_num_batched_tokens + 1 tokens",
         SCHEDULER, (("token_budget = self.max_num_scheduled_tokens\n",
                      "token_budget = self.max_num_scheduled_tokens + 1\n"),
                     ("input_budget = self.scheduler_config.max_num_batched_tokens\n",
                      "input_budget = self.scheduler_config.max_num_batched_tokens + 1\n"))),
    Edit("max_num_seqs_off_by_one", "bug", "a waiting request is admitted while max_num_seqs are running",
         SCHEDULER, (("if num_running >= self.max_num_active_reqs:", "if num_running > self.max_num_active_reqs:"),)),
    Edit("preempt_keeps_computed_tokens", "bug",
         "a preempted request keeps its computed-token count, so it resumes without recomputing",
         SCHEDULER, (("        request.status = RequestStatus.PREEMPTED\n        request.num_computed_tokens = 0\n",
                      "        request.status = RequestStatus.PREEMPTED\n"),)),
    Edit("preempt_keeps_blocks", "bug", "a preempted request's blocks are never freed",
         SCHEDULER, (("        self._free_request_blocks(request)\n        self.encoder_cache_manager.free(request)\n"
                      "        self._inflight_prefills.discard(request)\n"
                      "        request.status = RequestStatus.PREEMPTED\n",
                      "        self.encoder_cache_manager.free(request)\n"
                      "        self._inflight_prefills.discard(request)\n"
                      "        request.status = RequestStatus.PREEMPTED\n"),)),
    Edit("slots_rounded_down", "bug",
         "a request gets floor(tokens / block_size) blocks instead of the ceiling, so a partly filled block "
         "has no slot",
         "vllm.v1.core.single_type_kv_cache_manager",
         (("        num_required_blocks = cdiv(num_tokens, self.block_size)\n"
           "        num_new_blocks = num_required_blocks - len(req_blocks)\n",
           "        num_required_blocks = num_tokens // self.block_size\n"
           "        num_new_blocks = num_required_blocks - len(req_blocks)\n"),)),
    Edit("running_chunk_cap_ignored", "bug",
         "a running request's prefill chunk ignores long_prefill_token_threshold",
         SCHEDULER, (("            if 0 < long_prefill_token_threshold < num_new_tokens:\n"
                      "                num_new_tokens = long_prefill_token_threshold\n"
                      "            num_new_tokens = min(\n",
                      "            num_new_tokens = min(\n"),)),
    Edit("token_resent", "bug", "every output after the first carries the previous token again",
         SCHEDULER, (("                        request_id=req_id,\n"
                      "                        new_token_ids=new_token_ids,\n",
                      "                        request_id=req_id,\n"
                      "                        new_token_ids=list(request.output_token_ids[-2:])\n"
                      "                        if len(new_token_ids) == 1 and request.num_output_tokens > 1\n"
                      "                        else new_token_ids,\n"),)),
    Edit("max_tokens_off_by_one", "bug", "a request stops one token after max_tokens",
         "vllm.v1.core.sched.utils", (("or request.num_output_tokens >= request.max_tokens",
                                       "or request.num_output_tokens > request.max_tokens"),)),
    Edit("block_ref_never_released", "bug", "a freed block's ref count never reaches 0, so it never returns",
         "vllm.v1.core.block_pool", (("            block.ref_cnt -= 1\n            if block.ref_cnt == 0 and not",
                                      "            block.ref_cnt -= 1 if block.ref_cnt > 1 else 0\n"
                                      "            if block.ref_cnt == 0 and not"),)),
    Edit("preempt_most_computed", "policy", "preempt the running request with the most computed tokens",
         SCHEDULER, ((_PRIORITY_VICTIM,
                      "                    preempted_req = max(self.running, key=lambda r: r.num_computed_tokens)\n"),
                     _PRIORITY_REMOVAL)),
    Edit("preempt_oldest", "policy", "preempt the oldest running request instead of the newest",
         SCHEDULER, ((_PRIORITY_VICTIM, "                    preempted_req = self.running[0]\n"), _PRIORITY_REMOVAL)),
    Edit("half_prefill_chunks", "policy", "running requests prefill in chunks of half long_prefill_token_threshold",
         SCHEDULER, (("            if 0 < long_prefill_token_threshold < num_new_tokens:\n"
                      "                num_new_tokens = long_prefill_token_threshold\n"
                      "            num_new_tokens = min(\n",
                      "            if 0 < long_prefill_token_threshold < num_new_tokens:\n"
                      "                num_new_tokens = max(1, long_prefill_token_threshold // 2)\n"
                      "            num_new_tokens = min(\n"),)),
)


def edit_named(name: str) -> Edit:
    """The campaign edit called ``name``; KeyError lists the names."""
    for edit in EDITS:
        if edit.name == name:
            return edit
    raise KeyError(f"no edit {name!r}; edits: {', '.join(e.name for e in EDITS)}")
