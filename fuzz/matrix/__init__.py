"""``python -m fuzz matrix``: run the targets on every supported vLLM.

Each release is installed on demand into its own cached directory
(:mod:`fuzz.matrix.envs`, ``.cache/vllm-envs/VERSION``); a source checkout
(``src:PATH`` or ``--vllm-src PATH``) is used in place, its root first on
``PYTHONPATH``, with no install or build. Every (release, target) pair runs
the target's pytest test in its own subprocess (:mod:`fuzz.matrix.runner`,
with the :mod:`fuzz.matrix.plugin` profile and counters), and the results are
printed as one table: release x target -> pass / violation / skipped / error,
examples run, seconds. Targets are the registry's (:mod:`fuzz.registry`).

Exit codes (:mod:`fuzz.cli`): 0 every supported row passed or skipped; 1 a
violation on a supported release or checkout; 2 a usage or harness error (bad
flag, failed install, a run that did not produce a result, a subprocess that
imported the wrong vLLM). A harness error wins over a violation, since the
table is then incomplete. Rows of a pre-fix reference release
(``--reference``, vLLM 0.27.1) are expected to show violations and never
change the exit code; nor does a violation that matches a documented bug of
its release (:mod:`fuzz.known_bugs`, matched on the failure's structured
facts, shown as ``violation (known)``).

Examples::

    python -m fuzz matrix                           # 0.28.0 ... 0.33.0
    python -m fuzz matrix 0.28.0 0.33.0 --examples 30
    python -m fuzz matrix --reference --generated-only --target truncate-hybrid
    python -m fuzz matrix --vllm-src ~/src/vllm     # supported releases + the checkout
    python -m fuzz matrix src:/path/to/vllm --examples 50
"""

from fuzz.matrix.releases import (
    REFERENCE_RELEASES,
    SUPPORTED_RELEASES,
    Release,
    parse_release,
    releases,
)
from fuzz.matrix.runner import Cell, format_table, incomplete, new_violations, run_matrix

__all__ = [
    "REFERENCE_RELEASES",
    "SUPPORTED_RELEASES",
    "Cell",
    "Release",
    "format_table",
    "incomplete",
    "new_violations",
    "parse_release",
    "releases",
    "run_matrix",
]
