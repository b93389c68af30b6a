"""The suite's own tests, by what they test:

* ``invariants/``: every check fails on its planted bug, and only it does;
* ``strategies/``: what the strategies and the spec-kind table draw, how
  often the targets reach each branch, and the engine-reachable planner;
* ``harness/``: the adapter driving and observing vLLM (its reports, the
  operation log, the block-contents model, a vLLM it was not written for);
* ``findings/``: what becomes of a failure (outcome classes, deduplication,
  triage against known bugs, repros in vLLM's idiom);
* ``engine/``: the engine tier's oracle, store and strategies;
* ``tooling/``: ``python -m fuzz`` and its campaigns, databases, shards,
  coverage, bench, matrix, and the repository's docs and set-up files;
* ``known_bugs/``: real vLLM defects pinned as strict xfails, and the
  registry that names them.
"""
