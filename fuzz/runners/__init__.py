"""Running scenarios on real vLLM objects, without Hypothesis decorators:
the targets, the campaign's registry and the benchmarks wrap these.

* :mod:`fuzz.runners.truncation`: one truncation scenario on a real
  ``KVCacheManager``;
* :mod:`fuzz.runners.scheduler`: the one scheduler step loop
  (:class:`~fuzz.runners.scheduler.Stepper`) and single-shot scenarios.
"""
