"""Engine-native settings and engine log noise, declared by an adapter (``CBATCH_NATIVE_CONFIG``,
``CBATCH_ENGINE_LOGGERS``) and applied by the plugin to a bare ``pytest --cbatch-impl=ENGINE`` run."""

from __future__ import annotations

import pytest

from pytest_cbatch.plugin import suite_dir

# An engine that frees pages at once, declares it, and logs a warning on every run.
NATIVE_ENGINE = """
    import logging

    from pytest_cbatch.reference.scheduler_sim import simulate as _s

    CBATCH_NATIVE_CONFIG = {"release_delay": 0}
    CBATCH_ENGINE_LOGGERS = ("noisy_engine",)
    log = logging.getLogger("noisy_engine.core")

    def simulate(trace, **config):
        log.warning("block size prefers multiples of 32")
        log.error("an engine error worth seeing")
        if config.get("release_delay") != 0:
            raise NotImplementedError("this engine frees pages at once: release_delay must be 0")
        report = _s(trace, **config)
        for row in report["requests"].values():   # TTFT 0 on cancel: a failure, to show its report
            if row["status"] == "cancelled" and not row["token_times"]:
                row["ttft_ticks"] = 0
        return report
"""

SELECTED = "test_contract and (completes or ttft_null_on_cancel) and (demo or release_delay_3) and not serial"


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    pytester.makepyfile(engine=NATIVE_ENGINE)
    others = sorted(p for p in suite_dir().glob("test_*.py") if p.name != "test_contract.py")
    return pytester.runpytest_subprocess("--cbatch-impl=engine.py", "-k", SELECTED, "-rs", *args,
                                         *(f"--ignore={p}" for p in others))


def test_a_bare_run_uses_the_engines_native_settings_and_says_so(pytester: pytest.Pytester) -> None:
    result = run(pytester)
    outcomes = result.parseoutcomes()
    # demo runs at release_delay 0 (completes passes, ttft_null_on_cancel fails on the planted bug);
    # release_delay_3 keeps the delay it exists to test and skips both clauses.
    assert (outcomes["passed"], outcomes["failed"], outcomes["skipped"]) == (1, 1, 2), result.stdout.str()
    result.stdout.fnmatch_lines(["*engine-native settings: release_delay=0, declared by engine.py, used by every "
                                 "workload that does not test them*",
                                 "*release_delay must be 0*"])


def test_cbatch_config_wins_over_a_native_setting(pytester: pytest.Pytester) -> None:
    result = run(pytester, "--cbatch-config", "release_delay=1")
    outcomes = result.parseoutcomes()
    assert (outcomes.get("passed", 0), outcomes["skipped"]) == (0, 4), result.stdout.str()
    assert "engine-native settings" not in result.stdout.str()


def test_engine_log_records_below_error_stay_out_of_failure_reports(pytester: pytest.Pytester) -> None:
    result = run(pytester)
    text = result.stdout.str()
    assert "[ttft_null_on_cancel]" in text, text
    assert "an engine error worth seeing" in text, text
    assert "multiples of 32" not in text, text


def test_an_invalid_native_setting_is_one_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(engine=NATIVE_ENGINE.replace('{"release_delay": 0}', '{"release_delay": -1}'))
    result = pytester.runpytest_subprocess("--cbatch-impl=engine.py", "-k", SELECTED)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + result.stderr.str()
    assert "CBATCH_NATIVE_CONFIG" in result.stderr.str() and "Traceback" not in result.stderr.str()
