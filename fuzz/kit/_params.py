"""The data a standalone repro's kit reads: module-level constants.

A generated file defines each of these at its top with the failing run's
values (:mod:`fuzz.repro.scheduler` writes them); the kit's functions read
them as globals, so one definition serves every configuration. The values
here are a small sync configuration, so that the kit imports and lints as a
module of its own.
"""

from __future__ import annotations

from typing import Any

# The model's config.json (a tiny local model: no weights, no hub).
MODEL_CONFIG: dict[str, Any] = {}
# The KV-cache spec of each group (vLLM's *Spec objects).
SPECS: list[Any] = []
# Per group: must-cover, windowed, whole-state or scratch (see the writer).
ROLES: list[str] = []
# Per group, which block indices a request computing [s, e) reads.
READ_RULES: list[tuple[str, int]] = []
# Per group, the spec-kind table's behaviour (Behaviour's value), and its
# attention span: (parameter, value, Span's value) or None.
BEHAVIOURS: list[str] = []
SPANS: list[tuple[str, int, str] | None] = []
NUM_BLOCKS = 16
NULL_BLOCK = 0
BLOCK_SIZE = 4
PREFIX_MATCH_UNIT = 4
SCHEDULER_BLOCK_SIZE = 4
HASH_BLOCK_SIZE = 4
MAX_MODEL_LEN = 64
MAX_NUM_SEQS = 4
MAX_NUM_BATCHED_TOKENS = 64
LONG_PREFILL_TOKEN_THRESHOLD = 0
PREFILL_SCHEDULE_INTERVAL = 1
# Async scheduling: an AsyncScheduler driven as the engine core's batch
# queue drives it (each output fed back one step late).
ASYNC_SCHEDULING = False
# --speculative-config: None, "ngram" or "eagle"; k; the drafts accepted.
SPECULATIVE_METHOD: str | None = None
NUM_SPECULATIVE_TOKENS = 0
DRAFT_ACCEPTANCE: tuple[int, ...] = (0,)
DRAFT_MODEL_CONFIG: dict[str, Any] = {}
# Whether the scheduler has the scripted KV connector (False: the failure
# needs none, and the file carries none of it).
CONNECTOR = True
KV_LOAD_FAILURE_POLICY = "recompute"
KV_ROLE = "kv_both"
KV_CONFIG_FIELDS: dict[str, Any] = {}
DIVERGENT_HITS = False
# --kv-events-config: the block pool queues KV events and update_from_output()
# publishes each step's batch (a null publisher, or the file's EventLog).
KV_EVENTS = False
# --enable-lora --max-loras N (0: LoRA off); a request's adapter is _make_request's lora.
MAX_LORAS = 0
# The engine's metrics (log_stats, as `vllm serve` runs; --kv-cache-metrics;
# per-request spec-decode metrics when speculating), and finished-id sets
# (include_finished_set: a DP engine core behind the coordinator).
ENGINE_METRICS = False
FINISHED_SETS = False
# Whether some request carries a cache_salt, sends prompt embeddings, or
# skips reading the prefix cache (_make_request's options).
CACHE_SALTS = False
PROMPT_EMBEDS = False
# The longest multimodal item's placeholder, where some request carries
# one (the scheduler gets an encoder budget); 0: none does.
MULTIMODAL = 0
SKIPS_PREFIX_CACHE = False
# The external store, per request (see ScriptedConnector).
STORE: dict[str, Any] = {}

# What the file records as it drives the scheduler, beyond what every claim
# needs: the writer turns on only what the failing claim reads, and leaves
# the rest out of the file.
WATCH_POOL = True  # fresh blocks, counts against takes, lookups (_Watch._watch_blocks)
WATCH_TABLES = True  # block tables and pool state right after schedule() (_Watch.hold)
WATCH_CONTENTS = False  # what each block holds (BlockContents)
WATCH_TOKENS = False  # the token each computed position's KV came from (WorkerRecord.settle)
WATCH_UNWRITTEN = True  # reads a step's blocks lack, index entries ahead of them (needs WATCH_CONTENTS)
WATCH_NAMESPACES = False  # each adopted block's last writer's cache salt (needs WATCH_CONTENTS)
WATCH_LOOKAHEAD = False  # the tables handed to the runner against the drafter's lookahead (needs WATCH_CONTENTS)
WATCH_EVENTS = False  # the published KV events replayed against the index (EventLog)
WATCH_INDEX = False  # index entries naming blocks that hold other KV (_misnamed_entries; needs WATCH_CONTENTS)
WATCH_IN_FLIGHT = False  # the tables of the step still in flight as the next is scheduled (_scheduled)
WATCH_PREEMPTED = False  # each request a schedule() preempts, as it left it (_preempted_states)
WATCH_HITS = False  # the index as each lookup begins, and the hit it served (_index_at_lookup)
WATCH_RESETS = False  # the hits after a prefix-cache reset, against what each block held before it (needs WATCH_CONTENTS)
WATCH_EVICTIONS = False  # how each free block came back, each cached block evicted (EvictionWatch)
WATCH_JOINT_HITS = True  # beside each lookup, the joint hit and each group's own (the admission claims)
# Each admission's lookup, allocate_slots arguments and table (_Watch.take_admissions):
# the writer keeps it where the file, written without it, still reads watch.admitting.
WATCH_ADMISSIONS = True
# Each request a step admitted as the suite's admission claims read it
# (fuzz.kit._admissions.Admission): kept likewise where the file reads watch.admissions.
WATCH_ADMITTED = True
# The BlockStored events whose parent no event announced (EventOrphan): kept
# likewise where the file reads watch.event_orphans.
WATCH_ORPHANS = True
# Of WATCH_UNWRITTEN's records, the reads a step's blocks lack (UnwrittenRead)
# and the index entries ahead of their blocks (UnbackedEntry): each kept
# likewise where the file reads it.
WATCH_READS = True
WATCH_UNBACKED = True
# What the run did that most runs do not: loads reported failed, and the
# connector's own store of what finished requests computed.
FAILING_LOADS = False
SAVED_STORE = False
