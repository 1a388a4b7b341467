"""Test-suite settings shared by every module.

Hypothesis: under CI (the CI variable is set) examples are derandomized, so a submission's CI run is
reproducible; locally each run explores new examples. Failing examples found locally are pinned with
``@example`` in the test that found them.
"""

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")
