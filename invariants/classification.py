"""The single source of truth for how each KV-cache spec type must truncate.

``truncate_computed_blocks`` treats groups differently by spec type, and vLLM
keys that on ``isinstance(spec, MambaSpec)``. A new spec type with whole-state
semantics would hit the attention assert; a new attention-like type wrongly
treated as whole-state would be silently clamped. So every spec class vLLM
defines must be listed here, by fully qualified name, as one of:

* ``MUST_COVER``: token-proportional (attention-like). Must hold a block for
  every ``block_size`` tokens up to the aligned endpoint, or the call fails.
* ``MAY_BE_SHORT``: a whole recurrent state. May be shorter than the endpoint
  (an external hit can supply the state); never longer than needed.
* ``SCRATCH``: not prefix-cacheable. A lookup never carries its blocks.
* ``UNWRAPPED``: a worker-side wrapper the engine replaces by its per-layer
  spec before the scheduler sees it; the inner spec's class decides.

or listed in :data:`EXEMPT` with the reason it can never sit in a scheduler's
prefix-cached KV-cache group. ``tests/test_spec_guard.py`` fails, naming the
class, for anything reachable in the installed vLLM that is in neither table,
and checks every entry here against what vLLM itself declares
(``prefix_cacheable``, ``get_kv_cache_spec_kind``, its manager registry).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum

__all__ = [
    "Behaviour",
    "CLASSIFIED",
    "EXEMPT",
    "KNOWN_UNBUILDABLE",
    "UnclassifiedSpec",
    "behaviour_of",
    "provisional",
    "question_for",
]

_KI = "vllm.v1.kv_cache_interface."


class Behaviour(str, Enum):
    MUST_COVER = "must-cover"
    MAY_BE_SHORT = "may-be-short"
    SCRATCH = "scratch"
    UNWRAPPED = "unwrapped"


@dataclass(frozen=True)
class Classification:
    behaviour: Behaviour
    why: str


CLASSIFIED: dict[str, Classification] = {
    _KI + "FullAttentionSpec": Classification(
        Behaviour.MUST_COVER, "one KV entry per token"
    ),
    _KI + "MLAAttentionSpec": Classification(
        Behaviour.MUST_COVER, "latent KV per token, full-attention manager"
    ),
    _KI + "HiddenStateCacheSpec": Classification(
        Behaviour.MUST_COVER, "per-token hidden states, full-attention manager"
    ),
    _KI + "RSWASpec": Classification(
        Behaviour.MUST_COVER, "prefill tokens stay globally visible"
    ),
    _KI + "SinkFullAttentionSpec": Classification(
        Behaviour.MUST_COVER, "full attention plus sink tokens"
    ),
    _KI + "SlidingWindowSpec": Classification(
        Behaviour.MUST_COVER,
        "token-proportional; out-of-window positions are null-padded, not absent",
    ),
    _KI + "SlidingWindowMLASpec": Classification(
        Behaviour.MUST_COVER, "sliding-window MLA: as sliding window"
    ),
    _KI + "ChunkedLocalAttentionSpec": Classification(
        Behaviour.MUST_COVER, "token-proportional; past chunks null-padded"
    ),
    _KI + "MambaSpec": Classification(
        Behaviour.MAY_BE_SHORT,
        "one recurrent state per boundary; an external hit can supply it",
    ),
    _KI + "CircularBufferSpec": Classification(
        Behaviour.SCRATCH, "one ring block per request covering no token range"
    ),
    _KI + "UniformTypeKVCacheSpecs": Classification(
        Behaviour.UNWRAPPED,
        "generate_scheduler_kv_cache_config replaces it with one of its layers' specs",
    ),
}

# Classes that can never be a prefix-cached group in a scheduler's config.
EXEMPT: dict[str, str] = {
    _KI + "AttentionSpec": "abstract base: no manager is registered for it",
    _KI + "EncoderOnlyAttentionSpec": (
        "encoder-only layers need no KV cache; no manager is registered"
    ),
    _KI + "CrossAttentionSpec": (
        "CrossAttentionManager raises NotImplementedError('does not support "
        "caching'): it never takes part in prefix caching"
    ),
    _KI + "HiSparseHotSpec": (
        "not prefix-cacheable, and only built by vllm/v1/hisparse/layout.py next "
        "to a HiSparse source group: standalone, its manager asserts it has a "
        "coordinator (single_type_kv_cache_manager.py, add_local_computed_blocks)"
    ),
    _KI + "HiSparseResidentSpec": (
        "not prefix-cacheable, and only built by vllm/v1/hisparse/layout.py next "
        "to a HiSparse source group and a host pool; a standalone group fails "
        "the resident manager's allocation assert"
    ),
}

# Classified classes vLLM cannot build into a manager today, with the reason.
# Strategies skip them; each has a strict-xfail test that turns red once vLLM
# can build them (then delete the entry).
KNOWN_UNBUILDABLE: dict[str, str] = {
    _KI + "SinkFullAttentionSpec": (
        "vLLM 0.33.0 defect: KVCacheCoordinator passes needs_kv_cache_zeroing= "
        "to every manager, SinkFullAttentionManager.__init__ does not accept it "
        "(TypeError); see tests/known_bugs/test_sink_full_attention_manager.py"
    ),
}


class UnclassifiedSpec(LookupError):
    """A spec class that is neither classified nor exempted."""


def question_for(qualname: str, facts: object | None = None) -> str:
    """The decision a contributor adding ``qualname`` has to make."""
    hint = f" vLLM says: {facts}." if facts is not None else ""
    return (
        f"{qualname} is a KVCacheSpec subclass this suite does not classify.{hint} "
        "Decide in invariants/classification.py: must truncate_computed_blocks "
        "cover the aligned endpoint for it (MUST_COVER, token-proportional like "
        "attention), may it be shorter because one block is a whole recurrent "
        "state an external hit can supply (MAY_BE_SHORT, like Mamba), is it "
        "not prefix-cacheable (SCRATCH), or can it never be a scheduler group "
        "(EXEMPT, with the reason)?"
    )


def behaviour_of(qualname: str) -> Behaviour:
    """The expected truncation behaviour of a group whose spec class is ``qualname``."""
    try:
        return CLASSIFIED[qualname].behaviour
    except KeyError:
        raise UnclassifiedSpec(question_for(qualname)) from None


@contextlib.contextmanager
def provisional(qualname: str, behaviour: Behaviour) -> Iterator[None]:
    """Classify ``qualname`` as ``behaviour`` for the duration (a hypothesis to
    test against vLLM's current code, never a substitute for a table entry)."""
    previous = CLASSIFIED.get(qualname)
    CLASSIFIED[qualname] = Classification(behaviour, "provisional hypothesis")
    try:
        yield
    finally:
        if previous is None:
            del CLASSIFIED[qualname]
        else:
            CLASSIFIED[qualname] = previous
