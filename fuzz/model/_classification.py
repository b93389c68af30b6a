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
prefix-cached KV-cache group. ``tests/strategies/test_spec_guard.py`` fails, naming the
class, for anything reachable in the installed vLLM that is in neither table,
and checks every entry here against what vLLM itself declares
(``prefix_cacheable``, ``get_kv_cache_spec_kind``, its manager registry).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, replace

from fuzz.model._kv import Behaviour, Span

__all__ = [
    "Behaviour",
    "CLASSIFIED",
    "EXEMPT",
    "Classification",
    "Exemption",
    "Param",
    "Span",
    "UnclassifiedSpec",
    "behaviour_of",
    "classification_of_kind",
    "provisional",
    "question_for",
]

_KI = "vllm.v1.kv_cache_interface."


@dataclass(frozen=True)
class Param:
    """A class-specific integer constructor field, in whole blocks: drawn as
    ``block_size * k`` for ``k`` in ``blocks``; ``sample`` blocks when vLLM is
    asked about a sample instance."""

    name: str
    blocks: tuple[int, int] = (1, 4)
    sample: int = 2


@dataclass(frozen=True)
class Classification:
    """One spec class's row: the expected truncation behaviour and the facts
    the strategies, the adapter and the invariants need to draw, build and
    judge its groups.

    * ``params``: integer constructor fields the class needs (drawn);
    * ``span``: the param that is its attention span, and how it skips;
    * ``extra``: constant constructor arguments beyond the family defaults
      the adapter supplies (attention head geometry, Mamba state shapes);
    * ``one_block_size``: vLLM requires every group of a layout holding it to
      share one block size;
    * ``wraps``: for the uniform-type wrapper, the layer kinds it may wrap;
    * ``refuses_eagle_drop``: vLLM's manager for it refuses a lookup that
      drops the EAGLE block, so no EAGLE-style drafter runs beside it;
    * ``speculative_blocks``: the constructor field counting its extra state
      blocks per speculative token, which vLLM sets when speculating.
    """

    behaviour: Behaviour
    why: str
    params: tuple[Param, ...] = ()
    span: tuple[str, Span] | None = None
    extra: tuple[tuple[str, int], ...] = ()
    one_block_size: bool = False
    wraps: tuple[str, ...] = ()
    refuses_eagle_drop: bool = False
    speculative_blocks: str | None = None


@dataclass(frozen=True)
class Exemption:
    """Why a spec class can never be a prefix-cached scheduler group; ``params``
    and ``extra`` let the guard build a sample to ask vLLM about it."""

    why: str
    params: tuple[Param, ...] = ()
    extra: tuple[tuple[str, int], ...] = ()


_WINDOW = Param("sliding_window")
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
        Behaviour.MUST_COVER, "prefill tokens stay globally visible", params=(Param("rswa_window"),)
    ),
    _KI + "SinkFullAttentionSpec": Classification(
        # sink_len is optional in the dataclass but asserted by its manager.
        Behaviour.MUST_COVER, "full attention plus sink tokens", params=(Param("sink_len", sample=1),)
    ),
    _KI + "SlidingWindowSpec": Classification(
        Behaviour.MUST_COVER,
        "token-proportional; out-of-window positions are null-padded, not absent",
        params=(_WINDOW,),
        span=("sliding_window", Span.WINDOW),
    ),
    _KI + "SlidingWindowMLASpec": Classification(
        Behaviour.MUST_COVER,
        "sliding-window MLA: as sliding window",
        params=(_WINDOW,),
        span=("sliding_window", Span.WINDOW),
    ),
    _KI + "ChunkedLocalAttentionSpec": Classification(
        Behaviour.MUST_COVER,
        "token-proportional; past chunks null-padded",
        params=(Param("attention_chunk_size"),),
        span=("attention_chunk_size", Span.CHUNK),
        # ChunkedLocalAttentionManager.find_longest_cache_hit asserts "KV cache
        # groups with different block sizes are not compatible with chunked
        # local attention now".
        one_block_size=True,
        # It also asserts "Hybrid KV cache is not supported for eagle +
        # chunked local attention" when asked to drop the EAGLE block.
        refuses_eagle_drop=True,
    ),
    _KI + "MambaSpec": Classification(
        Behaviour.MAY_BE_SHORT,
        "one recurrent state per boundary; an external hit can supply it",
        # MambaBase.get_kv_cache_spec: num_speculative_tokens, or 0 under ReplaySSM.
        speculative_blocks="num_speculative_blocks",
    ),
    _KI + "CircularBufferSpec": Classification(
        Behaviour.SCRATCH, "one ring block per request covering no token range"
    ),
    _KI + "UniformTypeKVCacheSpecs": Classification(
        Behaviour.UNWRAPPED,
        "generate_scheduler_kv_cache_config replaces it with one of its layers' specs",
        wraps=("FullAttentionSpec", "MLAAttentionSpec"),
    ),
}

# Classes that can never be a prefix-cached group in a scheduler's config.
EXEMPT: dict[str, Exemption] = {
    _KI + "AttentionSpec": Exemption("abstract base: no manager is registered for it"),
    _KI + "EncoderOnlyAttentionSpec": Exemption(
        "encoder-only layers need no KV cache; no manager is registered"
    ),
    _KI + "CrossAttentionSpec": Exemption(
        "CrossAttentionManager raises NotImplementedError('does not support "
        "caching'): it never takes part in prefix caching"
    ),
    _KI + "HiSparseHotSpec": Exemption(
        "not prefix-cacheable, and only built by vllm/v1/hisparse/layout.py next "
        "to a HiSparse source group: standalone, its manager asserts it has a "
        "coordinator (single_type_kv_cache_manager.py, add_local_computed_blocks)",
        extra=(("page_size", 64), ("blocks_per_request", 4)),
    ),
    _KI + "HiSparseResidentSpec": Exemption(
        "not prefix-cacheable, and only built by vllm/v1/hisparse/layout.py next "
        "to a HiSparse source group and a host pool; a standalone group fails "
        "the resident manager's allocation assert",
        extra=(("page_size", 64),),
    ),
}

class UnclassifiedSpec(LookupError):
    """A spec class that is neither classified nor exempted."""


def question_for(qualname: str, facts: object | None = None) -> str:
    """The decision a contributor adding ``qualname`` has to make."""
    hint = f" vLLM says: {facts}." if facts is not None else ""
    return (
        f"{qualname} is a KVCacheSpec subclass this suite does not classify.{hint} "
        "Decide in fuzz/model/_classification.py: must truncate_computed_blocks "
        "cover the aligned endpoint for it (MUST_COVER, token-proportional like "
        "attention), may it be shorter because one block is a whole recurrent "
        "state an external hit can supply (MAY_BE_SHORT, like Mamba), is it "
        "not prefix-cacheable (SCRATCH), or can it never be a scheduler group "
        "(EXEMPT, with the reason)?"
    )


def classification_of_kind(kind: str) -> Classification:
    """The row of the classified class whose bare name is ``kind`` (what a
    :class:`fuzz.model.SpecDraw` holds)."""
    suffix = "." + kind
    for qualname, row in CLASSIFIED.items():
        if qualname.endswith(suffix):
            return row
    raise UnclassifiedSpec(question_for(kind))


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
    CLASSIFIED[qualname] = (
        Classification(behaviour, "provisional hypothesis")
        if previous is None
        else replace(previous, behaviour=behaviour, why="provisional hypothesis")
    )
    try:
        yield
    finally:
        if previous is None:
            del CLASSIFIED[qualname]
        else:
            CLASSIFIED[qualname] = previous
