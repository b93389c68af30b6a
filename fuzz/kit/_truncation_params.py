"""The constants a truncation repro defines at its top (:mod:`fuzz.repro.truncation`
writes them); :mod:`fuzz.kit._truncation` reads them. Defaults: one small
full-attention layout, so that the kit imports and lints on its own."""

from __future__ import annotations

from typing import Any

SPECS: list[Any] = []
HASH_BLOCK_SIZE = 4
SCHEDULER_BLOCK_SIZE = 4
NUM_BLOCKS = 16
MAX_MODEL_LEN = 64
PREFILL_CHUNK = 0
PROMPTS: list[list[int]] = []
REPLAY: list[int] = []
EVICT_FROM: list[int | None] = []
ENDPOINT = 0
# Several groups: the hybrid coordinator's per-group lookup; one: the unitary one's.
HYBRID = False
# How the replay's computed blocks are looked up: "joint", "per_group" or "connector".
LOOKUP = "joint"
# The call must fail loudly (a must-cover group short, or the endpoint misaligned);
# otherwise it returns EXPECTED_LENGTHS blocks per group.
LOUD_FAILURE = False
EXPECTED_LENGTHS: list[int] = []
# An EAGLE-style drafter: the manager is built with use_eagle and DRAFTER_KWARGS.
USE_EAGLE = False
DRAFT_GROUPS: list[int] = []
DRAFTER_KWARGS: dict[str, Any] = {}
