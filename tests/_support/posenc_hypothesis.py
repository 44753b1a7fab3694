"""Hypothesis settings profiles for the suite, chosen by the environment (tests/conftest.py loads one).

- ``ci`` (``CI`` set to a true value, as ``scripts/test.sh`` and ``.ci/run`` set it): derandomized, so every run on
  every machine draws the same examples and the README's test command gives the same answer each time; no example
  database (nothing carried between runs); no deadline and no too-slow health check, which a loaded machine can
  trip.
- ``dev`` (otherwise, e.g. a plain ``pytest``): a random search, and the example database in ``.hypothesis/`` keeps
  every failure it finds and replays it first on the next run. Copy a failure it finds into the test as an
  explicit ``@example`` so that CI checks it too. Tests without their own ``max_examples`` draw more here.

``HYPOTHESIS_PROFILE=ci`` or ``=dev`` picks one explicitly.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings
from posenc_ci import in_ci

settings.register_profile("ci", derandomize=True, database=None, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=200, deadline=None)


def profile_name() -> str:
    return os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if in_ci() else "dev")


def examples(ci: int, dev: int) -> int:
    """A test's example count: ``ci`` under the ci profile (derandomized: the same ``ci`` examples every run),
    ``dev`` in a local random search."""
    return ci if profile_name() == "ci" else dev


def load() -> str:
    """Load the profile the environment selects; -> its name."""
    name = profile_name()
    settings.load_profile(name)
    return name
