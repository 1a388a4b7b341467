"""Test-suite settings shared by every module.

Hypothesis: under CI (the CI variable is set) examples are derandomized, so a submission's CI run is
reproducible; locally each run explores new examples. Failing examples found locally are pinned with
``@example`` in the test that found them.

The quick loop (plain ``python -m pytest``: pyproject's marker expression, ``QUICK_MARKEXPR``) runs a
third of each hypothesis test's examples (``quick_examples``; at least 10, or all of them when a test
asks for 10 or fewer); any other selection, such as the README's test command that CI runs, keeps every
test's own count. Each local quick run draws new examples, so the loop still explores over time.
"""

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

QUICK_MARKEXPR = "not slow and not trainers"   # pyproject.toml's addopts (tests/test_fast_loop.py checks it)
QUICK_SHARE = 3
QUICK_MIN = 10


def quick_examples(n: int) -> int:
    """The examples the quick loop runs of a hypothesis test that asks for ``n``."""
    return max(min(n, QUICK_MIN), -(-n // QUICK_SHARE))


def is_quick_loop(config) -> bool:
    return config.getoption("markexpr") == QUICK_MARKEXPR


def pytest_collection_modifyitems(config, items):
    """In the quick loop, each collected hypothesis test runs ``quick_examples`` of its examples."""
    if not is_quick_loop(config):
        return
    done = set()
    for item in items:
        test = getattr(item, "obj", None)
        test = getattr(test, "__func__", test)   # a method's function holds its settings
        if not getattr(test, "is_hypothesis_test", False) or id(test) in done:
            continue
        done.add(id(test))   # parametrized items share one function: scale it once
        # hypothesis keeps a test's settings here (hypothesis/core.py); no public API sets them after
        # decoration. A missing attribute fails the collection rather than silently running all examples.
        current = test._hypothesis_internal_use_settings
        test._hypothesis_internal_use_settings = settings(current, max_examples=quick_examples(current.max_examples))


# Every plan the test suite makes is emitted, read back and predicted again (issue 11 item 3):
# planner.search.plan.plan (and planner.plan) round-trip each plan they return, before any test
# module imports them (tests/roundtrip_check.py).
import planner  # noqa: E402
import planner.search.plan as _plan_module  # noqa: E402
from roundtrip_check import checked_plan  # noqa: E402

if not getattr(_plan_module.plan, "round_trip", False):
    _plan_module.plan = checked_plan(_plan_module.plan)
    planner.plan = _plan_module.plan
