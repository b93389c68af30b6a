"""What the test modules share and no test module owns: the search for the
first example that breaks a claim under a planted bug (:mod:`.search`) and
the one way a test builds a scheduler harness by hand (:mod:`.harnesses`).

Test modules import from here (and from the other non-test modules beside
them), never from one another: tests/tooling/test_test_house.py holds them
to it.
"""
