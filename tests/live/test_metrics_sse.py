"""Metric formulas on hand-made timestamp sequences, SSE parsing and token counting, ulp and verdicts."""

from __future__ import annotations

import math

import pytest

from pytest_cbatch.live.invariance import Run, ladder, ulp_distance, verdict
from pytest_cbatch.live.metrics import RequestRecord, e2el, itl, knee, percentile, summarize, tpot, ttft
from pytest_cbatch.live.prometheus import labelled_total
from pytest_cbatch.live.sse import SSEDecoder, StreamFormatError, choice_tokens, parse_data


def rec(frames: list[tuple[float, int]], *, sent: float = 1.0, last: float | None = None, usage: int | None = None,
        status: str = "finished", prompt: int = 4) -> RequestRecord:
    return RequestRecord(sent=sent, prompt_tokens=prompt, frame_times=[t for t, _ in frames],
                         frame_tokens=[n for _, n in frames], last_frame=last if last is not None else
                         (frames[-1][0] if frames else None), usage_tokens=usage, status=status)


def test_one_token_output_has_ttft_no_itl_no_tpot() -> None:
    r = rec([(1.25, 1)])
    assert ttft(r) == 0.25 and itl(r) == [] and tpot(r) is None and e2el(r) == 0.25


def test_multi_token_frames_give_one_itl_entry_per_frame() -> None:
    # 16 tokens in 14 frames (two frames carry 2 tokens), as measured on a vLLM stream
    frames = [(1.0 + 0.5 + 0.125 * i, 2 if i in (3, 7) else 1) for i in range(14)]
    r = rec(frames, usage=16)
    assert len(itl(r)) == 13 and all(gap == pytest.approx(0.125) for gap in itl(r))
    assert tpot(r) == pytest.approx((frames[-1][0] - 1.0 - 0.5) / 15)   # n - 1 = 15, not frames - 1


def test_zero_token_and_cancelled_requests_are_failures_without_latency() -> None:
    good = rec([(1.5, 1), (2.0, 1)])
    zero = rec([], last=1.4)                        # the stream finished without a single token
    cancelled = rec([(1.5, 1)], status="cancelled")
    out = summarize([good, zero, cancelled], duration=2.0)
    assert out["completed"] == 1 and out["failed"] == 2
    assert out["mean_ttft_ms"] == pytest.approx(500.0)      # 0 ms TTFTs would pull this down
    assert out["total_output_tokens"] == 2 and out["output_throughput"] == pytest.approx(1.0)
    assert out["p99_itl_ms"] == pytest.approx(500.0)


def test_empty_content_frames_carry_no_token() -> None:
    assert choice_tokens({"index": 0, "delta": {"role": "assistant", "content": ""}}).count == 0
    assert choice_tokens({"index": 0, "text": "", "finish_reason": "length"}).count == 0
    # a partial UTF-8 byte: empty text, but the token ids say one token
    assert choice_tokens({"index": 0, "text": "", "token_ids": [17]}).count == 1


def test_token_count_prefers_ids_then_logprobs_then_text() -> None:
    assert choice_tokens({"text": "ab", "token_ids": [1, 2, 3]}).count == 3
    assert choice_tokens({"text": "ab", "logprobs": {"tokens": ["a", "b"], "token_logprobs": [-1, -2]}}).count == 2
    chat = {"delta": {"content": "x"}, "logprobs": {"content": [{"token": "x", "logprob": -0.5}] * 2}}
    assert choice_tokens(chat).count == 2 and choice_tokens(chat).logprobs == [-0.5, -0.5]
    assert choice_tokens({"text": "hello"}).count == 1
    with pytest.raises(StreamFormatError, match="token_ids"):
        choice_tokens({"text": "a", "token_ids": ["1"]})


def test_usage_count_wins_for_tpot() -> None:
    r = rec([(1.5, 1), (2.5, 1)], usage=3)   # the server says 3 tokens, frames show 2
    assert tpot(r) == pytest.approx(0.5)


def test_percentile_is_linear_interpolation() -> None:
    xs = [1.0, 2.0, 3.0, 4.0, 10.0]
    assert percentile(xs, 50) == 3.0 and percentile(xs, 90) == pytest.approx(7.6) and percentile([], 99) == 0.0


def test_goodput_counts_requests_meeting_every_slo() -> None:
    fast, slow = rec([(1.1, 1), (1.2, 1)]), rec([(2.0, 1), (2.1, 1)])
    out = summarize([fast, slow], 1.0, slo_ms={"ttft": 500})
    assert out["request_goodput"] == 1.0


def test_knee_is_first_level_below_threshold_of_linear() -> None:
    assert knee([1, 2, 4, 8], [100, 195, 380, 420], 0.5) == 3
    assert knee([1, 2, 4], [100, 200, 400], 0.5) is None


def test_sse_decoder_joins_data_lines_and_skips_comments() -> None:
    d = SSEDecoder()
    got = [x for line in [b": ping\n", b"data: {\"a\":\n", b"data: 1}\n", b"\n", b"data: [DONE]\n", b"\n"]
           for x in d.feed(line)]
    assert got == ['{"a":\n1}', "[DONE]"]
    assert parse_data(got[0]) == {"a": 1} and parse_data(got[1]) is None


@pytest.mark.parametrize("data, match", [
    ("{not json", "not JSON"), ("[1, 2]", "not a JSON object"), ('{"choices": 3}', "not a list"),
    ('{"error": {"message": "boom"}}', "boom"),
])
def test_malformed_frames_are_named(data: str, match: str) -> None:
    with pytest.raises(StreamFormatError, match=match):
        parse_data(data)


def test_ulp_distance_and_verdicts() -> None:
    import struct

    one_up = struct.unpack("<f", struct.pack("<I", 0x3F800001))[0]
    assert ulp_distance(1.0, one_up) == 1 and ulp_distance(-0.0, 0.0) == 0
    assert ulp_distance(0.1, math.nextafter(0.1, 1.0)) == 1          # not a float32: counted in float64
    base = Run([1, 2, 3], [-1.0, -2.0, -3.0])
    assert verdict(base, Run([1, 2, 3], [-1.0, -2.0, -3.0]))["verdict"] == "bitwise"
    drift = verdict(base, Run([1, 2, 3], [-1.0, -2.0, -one_up * 3]))
    assert drift["verdict"] == "drift" and drift["max_ulp"] > 0
    assert verdict(base, Run([1, 5, 3], [-1.0, -2.0, -3.0])) == {
        "verdict": "diverged", "first_divergent_token": 1, "max_ulp": None}
    assert ladder(8) == [1, 2, 4, 8] and ladder(6) == [1, 2, 4, 6] and ladder(1) == [1]


def test_labelled_total_selects_one_label_value() -> None:
    samples = {'vllm:request_success_total{engine="0",finished_reason="abort",model_name="tiny"}': 2.0,
               'vllm:request_success_total{engine="0",finished_reason="length",model_name="tiny"}': 5.0,
               'vllm:request_success_total_created{finished_reason="abort"}': 9.0}
    assert labelled_total(samples, "vllm:request_success_total", "finished_reason", "abort") == 2.0
    assert labelled_total(samples, "vllm:request_success_total", "finished_reason", "stop") == 0.0
