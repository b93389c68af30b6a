"""Session-wide set-up: Hypothesis profiles, vLLM's hash seed, markers.

Profiles (choose with HYPOTHESIS_PROFILE):
  dev      fast local iteration (default outside CI)
  ci       derandomized, fixed example budget, no deadline, no database writes
  nightly  long randomized runs with the example database
  fuzz     what `python -m fuzz run` uses: effectively unbounded examples,
           the wall-clock budget is enforced by the runner
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, Phase, Verbosity, settings

_COMMON = dict(
    deadline=None,  # scheduler steps vary with machine load; never a timing flake
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("dev", max_examples=30, **_COMMON)
settings.register_profile(
    "ci",
    max_examples=int(os.environ.get("FUZZ_CI_EXAMPLES", "150")),
    derandomize=True,
    database=None,
    print_blob=True,
    # No target/explain phases: on a failing release they keep re-running the
    # failing example (seen: 516 s and 3.3 GB to report a crash found in 1.3 s).
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
    **_COMMON,
)
settings.register_profile("nightly", max_examples=20_000, print_blob=True, **_COMMON)
settings.register_profile(
    "fuzz",
    max_examples=10**9,
    print_blob=True,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
    **_COMMON,
)
settings.register_profile("debug", max_examples=10, verbosity=Verbosity.verbose, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


def pytest_configure(config: pytest.Config) -> None:
    # Importing the adapter sets vLLM's offline environment before vLLM loads.
    try:
        from fuzz import adapter
    except (ImportError, AttributeError) as exc:
        # A vLLM whose API moved under the adapter: one line, not a traceback
        # (the campaign runner shows that line and exits 2).
        from fuzz.outcomes import adapter_import_failure

        raise pytest.UsageError(adapter_import_failure(exc)) from None

    adapter.init_hashing()


# FUZZ_TEST_ORDER_SEED=N runs the collected tests in an order shuffled by N
# (scripts/stress-tests.sh): a test that passes only after another has run is
# caught, and the printed seed replays the same order.
ORDER_SEED = "FUZZ_TEST_ORDER_SEED"


def pytest_report_header(config: pytest.Config) -> list[str]:
    from fuzz import adapter

    lines = [f"vllm {adapter.VLLM_VERSION}; hypothesis profile {settings._current_profile}"]
    if os.environ.get(ORDER_SEED):
        lines.append(f"test order shuffled with {ORDER_SEED}={os.environ[ORDER_SEED]}")
    return lines


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    seed = os.environ.get(ORDER_SEED)
    if not seed:
        return
    import random

    try:
        rng = random.Random(int(seed))
    except ValueError:
        raise pytest.UsageError(f"{ORDER_SEED}={seed!r}: expected an integer seed") from None
    rng.shuffle(items)


@pytest.fixture(autouse=True, scope="session")
def _derandomized_searches_ignore_imports():  # type: ignore[no-untyped-def]
    """Under a derandomized profile (``ci``), Hypothesis mines no literal
    constants from the loaded modules (:func:`fuzz.hunting.without_module_constants`):
    otherwise every seeded or derandomized search in the tests draws
    different examples depending on which test files ran before it, so a
    planted bug found in one file order is missed in another. Campaigns
    (the ``fuzz`` profile) keep mining them."""
    if not settings.default.derandomize:
        yield
        return
    from fuzz.hunting import without_module_constants

    with without_module_constants():
        yield
