"""The standalone repro kit: real modules whose source a repro file carries.

A repro of a scheduler-tier failure (:mod:`fuzz.repro.scheduler`) is one
pytest file that imports vLLM, pytest and the standard library only. Its
code is copied out of these modules with :func:`inspect.getsource`, only the
definitions its failing claim needs, so the kit is linted and tested as code
and no Python lives in string templates:

* :mod:`fuzz.kit._params`: the constants the file defines at its top (the
  drawn configuration; async scheduling, speculation, whether there is a
  connector and its role, the request features the program uses and the
  prefill cadence are data here, not variants of the code);
* :mod:`fuzz.kit._connector`: the scripted KV connector, where the
  program needs one (its store's ``saved_prefix`` is the harness's too:
  ``fuzz.model._kv``);
* :mod:`fuzz.kit._build`: the scheduler and its requests;
* :mod:`fuzz.kit._watch`: what the file watches the scheduler do;
* :mod:`fuzz.kit._driver`: the engine step loop and the closing drain;
* :mod:`fuzz.kit._worker`: what the model runner knows and samples;
* :mod:`fuzz.kit._outputs`: the ModelRunnerOutput it returns (built as the
  harness's replay builds it, ``fuzz.adapter._oplog``);
* :mod:`fuzz.kit._contents`: what each block holds (the suite's model);
* ``fuzz.adapter._events``: the KV events a router replays (the suite's own);
* ``fuzz.model._hits``, ``fuzz.adapter._hits``: the hit the index allows a
  lookup, and the index read as the lookup begins; ``fuzz.model._evictions``,
  ``fuzz.adapter._evictions``: vLLM's free order, and the watch of every
  free and eviction (the suite's own, for :mod:`fuzz.kit._hits`'s claims);
* the claims a file can state. Where the watch keeps what a claim reads
  under the suite's names and types (the records of ``fuzz.model._contents``;
  :class:`fuzz.kit._hits.HitLookup` for a lookup,
  :class:`fuzz.kit._admissions.Admission` for an admission and
  :class:`fuzz.kit._ownership.StepOwnership` for block ownership, each the
  fields of the suite's observation that the check reads), the file carries
  the suite's check itself (:data:`SUITE_CHECK_MODULES`): what blocks hold
  (:mod:`invariants.contents`), what the cache promises
  (:mod:`invariants.promises`, reads in flight included), hit lengths and
  the eviction order (:mod:`invariants.hits`), admission and the step loop
  (:mod:`invariants.scheduler`). The others are restated
  here, one room each as the suite's invariants, until their observations
  are the watch's: :mod:`fuzz.kit._checks_scheduler` (liveness),
  :mod:`fuzz.kit._checks_connector`,
  :mod:`fuzz.kit._checks_ownership` (which reads blocks with the suite's
  own ``read_indices``);
* :mod:`fuzz.kit._truncation` (constants in ``_truncation_params``): the
  repro of a ``truncate_computed_blocks`` failure, at the manager level.

The kit's modules may import vLLM, pytest, the standard library,
:data:`COPIED_MODULES` (which do the same) and :data:`SUITE_CHECK_MODULES`
(whose definitions a file takes, never their imports);
tests/findings/test_repro_kit.py holds them to it.
"""

from __future__ import annotations


__all__ = [
    "COPIED_MODULES", "KIT_MODULES", "SUITE_CHECK_MODULES", "TRUNCATION_KIT_MODULES",
]

# In the order a file carries their definitions.
KIT_MODULES = (
    "fuzz.kit._params",
    "fuzz.kit._connector",
    "fuzz.kit._build",
    "fuzz.adapter._reports",
    "fuzz.model._violations",
    "fuzz.model._kv",
    "fuzz.model._contents",
    "fuzz.model._outputs",
    "fuzz.adapter._identity",
    "fuzz.adapter._clean_reads",
    "fuzz.adapter._contents",
    "fuzz.adapter._events",
    "fuzz.model._hits",
    "fuzz.adapter._hits",
    "fuzz.model._evictions",
    "fuzz.adapter._evictions",
    "fuzz.kit._index",
    "fuzz.kit._hits",
    "fuzz.kit._admissions",
    "fuzz.kit._loads",
    "fuzz.kit._contents",
    "fuzz.model._ownership",
    "fuzz.kit._ownership",
    "fuzz.kit._watch",
    "fuzz.kit._worker",
    "fuzz.kit._outputs",
    "fuzz.kit._preempt",
    "fuzz.kit._driver",
    "fuzz.kit._checks_scheduler",
    "fuzz.kit._checks_connector",
    "invariants.ownership",
    "fuzz.kit._checks_ownership",
    "invariants.contents",
    "invariants.promises",
    "invariants.hits",
    "invariants.scheduler",
)
# A truncation repro's (fuzz.repro): its constants, and the manager-level test.
TRUNCATION_KIT_MODULES = ("fuzz.kit._truncation_params", "fuzz.kit._truncation")
# The suite's own modules a file carries as they are (standard library only).
COPIED_MODULES = (
    "fuzz.model._violations", "fuzz.model._kv", "fuzz.model._contents", "fuzz.model._outputs", "fuzz.model._ownership", "fuzz.adapter._reports", "fuzz.adapter._identity",
    "fuzz.adapter._clean_reads", "fuzz.adapter._contents",
    "fuzz.adapter._events", "fuzz.model._hits", "fuzz.adapter._hits", "fuzz.model._evictions", "fuzz.adapter._evictions",
)
# The suite's checks a file carries as they are: their claims' records are
# the watch's, under the suite's names and types (fuzz.model), so the check
# in the file is the suite's invariant itself. Their module imports the
# vocabulary (fuzz.model) and its own room; a file takes only the
# definitions it reaches, which import nothing of the suite.
SUITE_CHECK_MODULES = (
    "invariants.contents", "invariants.promises", "invariants.hits", "invariants.ownership", "invariants.scheduler",
)
