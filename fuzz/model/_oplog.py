"""The operation log: everything a scheduler run did to vLLM, in the suite's
own types (no vLLM objects).

The scheduler harness (:mod:`fuzz.adapter._scheduler`) appends to an
:class:`OpLog` as it goes: the configuration it built (:class:`RunConfig`),
each request with its tokens, sampling parameters and arrival step
(:class:`AddRequest`), aborts (:class:`Abort`), hand-picked evictions
(:class:`Evict`, the search shortcut; every other block leaves the cache on a
path vLLM takes itself: LRU pressure, preemption, a KV-load failure fed in a
step's output), prefix-cache resets (:class:`ResetPrefixCache`), and each engine step (:class:`Step`): what ``schedule()``
returned (:class:`ScheduledOutput`), every connector answer it asked for
(:class:`ConnectorAnswer`), and the ``ModelRunnerOutput`` fed back through
``update_from_output()`` (:class:`FedOutput`), with finished async loads,
failed ones and invalid blocks.

The log is the source of truth of a scheduler finding: its repro
(:mod:`fuzz.upstream`) is written from it, its sidecar keeps it for
``python -m fuzz replay``, and replaying it (:func:`fuzz.adapter.replay_oplog`) gives the same
``SchedulerOutput`` s.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Generic, TypeVar, Union

from fuzz.model._kv import GroupInfo
from fuzz.model._replies import ExternalReply
from fuzz.model._scheduler import SchedulerDraw

__all__ = [
    "Abort",
    "AddRequest",
    "ConnectorAnswer",
    "Evict",
    "FedOutput",
    "OpLog",
    "OpVisitor",
    "ResetPrefixCache",
    "RunConfig",
    "ScheduledOutput",
    "Step",
]


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """What the scheduler was built with, as the engine core resolved it."""

    draw: SchedulerDraw  # layout (groups, pool), scheduler limits, connector capability, model runner
    model_json: str  # the model's config.json (written locally; never a hub)
    block_size: int  # CacheConfig.block_size: the smallest prefix-cacheable group block
    prefix_match_unit: int | None
    scheduler_block_size: int  # LCM of the group block sizes
    hash_block_size: int
    max_model_len: int
    # What KV-cache planning writes onto the KVCacheConfig (name, value), for
    # the fields the installed release has.
    kv_config_fields: tuple[tuple[str, int | None], ...] = ()
    groups: tuple[GroupInfo, ...] = ()  # as the built manager has them
    null_block_id: int = 0


@dataclasses.dataclass(frozen=True)
class AddRequest:
    """``scheduler.add_request`` before step ``arrival_step`` + 1."""

    request_id: str
    token_ids: tuple[int, ...]
    max_tokens: int
    reply: ExternalReply | None  # the external store's rule for this request
    arrival_step: int
    ignore_eos: bool = True
    # SamplingParams(skip_reading_prefix_cache=True): the request reads
    # neither the local prefix cache nor an external hit.
    skip_reading_prefix_cache: bool = False
    # The request's cache_salt (vLLM folds it into its first block's hash,
    # so that its prefix-cache entries are its tenant's alone); None: none.
    cache_salt: str | None = None
    # The LoRA adapter it runs under (by name: fuzz.adapter's lora_request
    # builds it; vLLM folds its name and path into every block's hash); None: none.
    lora: str | None = None
    # The request sends prompt embeddings instead of token ids, the ones
    # named by this tag (fuzz.adapter's prompt_embedding_rows builds them;
    # vLLM hashes each block's slice into its key); token_ids are then the
    # zeros vLLM records for such a prompt. None: token ids.
    embeds: str | None = None
    # The multimodal items its prompt carries, (identifier, placeholder
    # offset, placeholder length) each, in prompt order (fuzz.adapter's
    # mm_features builds them; vLLM folds each identifier, with its offset in
    # the block, into the hash of every block its placeholder overlaps).
    mm: tuple[tuple[str, int, int], ...] = ()


@dataclasses.dataclass(frozen=True)
class Abort:
    """``scheduler.finish_requests(request_id, FINISHED_ABORTED)`` between
    steps, or (``during_step``) while the model runs the next step: the
    engine core applies such aborts right before that step's
    ``update_from_output`` (``EngineCore._process_aborts_queue``), or after
    the step when it feeds nothing back."""

    request_id: str
    step: int
    during_step: bool = False


@dataclasses.dataclass(frozen=True)
class Evict:
    """``kv_cache_manager.evict_blocks(block_ids)`` by hand (the search shortcut)."""

    block_ids: tuple[int, ...]
    step: int


@dataclasses.dataclass(frozen=True)
class ResetPrefixCache:
    """``scheduler.reset_prefix_cache(reset_running_requests=reset_running)``
    between steps, right before step ``step + 1``'s ``schedule()``: what the
    engine core's utility call of that name does (``LLM.reset_prefix_cache``,
    after a weight update in RLHF flows). With ``reset_running`` vLLM first
    preempts every running request, dropping its output still in flight."""

    step: int
    reset_running: bool = False


@dataclasses.dataclass(frozen=True)
class ConnectorAnswer:
    """One ``get_num_new_matched_tokens(request, num_computed_tokens)`` and its answer."""

    request_id: str
    num_computed_tokens: int
    answer: int | None
    load_async: bool


@dataclasses.dataclass(frozen=True)
class ScheduledOutput:
    """A ``SchedulerOutput`` in the suite's words (what replay compares)."""

    # (request id, num_computed_tokens, block ids per group)
    new_requests: tuple[tuple[str, int, tuple[tuple[int, ...], ...]], ...]
    # (request id, num_computed_tokens, resumed)
    cached_requests: tuple[tuple[str, int, bool], ...]
    num_scheduled: tuple[tuple[str, int], ...]
    preempted: tuple[str, ...]
    finished: tuple[str, ...]
    copies: tuple[tuple[int, int], ...]


@dataclasses.dataclass(frozen=True)
class FedOutput:
    """The ``ModelRunnerOutput`` fed back through ``update_from_output``."""

    req_ids: tuple[str, ...]
    sampled_token_ids: tuple[tuple[int, ...], ...]
    finished_recving: tuple[str, ...] = ()
    failed_recving: tuple[str, ...] = ()
    invalid_block_ids: tuple[int, ...] = ()
    # A producer's hand-offs reported done: vLLM frees their held blocks.
    finished_sending: tuple[str, ...] = ()
    # Speculative decoding, sync: the drafts handed over right after it
    # (``update_draft_token_ids(DraftTokenIds)``, EngineCore.post_step), per
    # request id.
    drafts: tuple[tuple[str, tuple[int, ...]], ...] = ()


@dataclasses.dataclass(frozen=True)
class Step:
    """One ``schedule()`` + ``update_from_output()`` (``index`` counts from 1)."""

    index: int
    output: ScheduledOutput | None  # None: schedule() raised
    answers: tuple[ConnectorAnswer, ...]
    fed: FedOutput | None  # None: nothing was fed back (schedule() raised, or the output is pending)
    error: str | None = None  # "ExcType: message"
    error_where: str | None = None  # "schedule" or "update_from_output"
    left: tuple[str, ...] = ()  # requests that finished in update_from_output
    # Whose output ``fed`` is (None: this step's own). With async scheduling
    # the engine's batch queue may feed the previous step's output after this
    # step's schedule(), and keep this step's pending (``fed`` None, no error).
    fed_step: int | None = None


Op = Union[AddRequest, Abort, Evict, ResetPrefixCache, Step]

R = TypeVar("R")


class OpVisitor(Generic[R]):
    """What to do with each kind of operation, dispatched in one place.

    :meth:`visit` picks the method of ``op``'s kind (``on_<kind>``); one
    without an override goes to :meth:`other`, which refuses it, so a handler
    that must know every kind (a replay, a repro writer) fails loudly on a
    new one, and one that reads a few kinds overrides :meth:`other` to pass
    over the rest. A new kind of operation is a dataclass above, a member of
    :data:`Op`, a row of ``_METHODS`` and an ``on_`` method here, plus the
    handlers that must act on it."""

    _METHODS: ClassVar[dict[type, str]] = {
        AddRequest: "on_add_request",
        Abort: "on_abort",
        Evict: "on_evict",
        ResetPrefixCache: "on_reset_prefix_cache",
        Step: "on_step",
    }

    def visit(self, op: Op) -> R:
        method = self._METHODS.get(type(op))
        if method is None:
            kinds = ", ".join(k.__name__ for k in self._METHODS)
            raise TypeError(f"{type(op).__name__} {op!r} is not an operation of the log (one of {kinds})")
        return getattr(self, method)(op)  # type: ignore[no-any-return]

    def on_add_request(self, op: AddRequest) -> R:
        return self.other(op)

    def on_abort(self, op: Abort) -> R:
        return self.other(op)

    def on_evict(self, op: Evict) -> R:
        return self.other(op)

    def on_reset_prefix_cache(self, op: ResetPrefixCache) -> R:
        return self.other(op)

    def on_step(self, op: Step) -> R:
        return self.other(op)

    def other(self, op: Any) -> R:
        """An operation of a kind this visitor has no method for."""
        raise TypeError(f"{type(self).__name__} has no rule for a {type(op).__name__} operation")


@dataclasses.dataclass
class OpLog:
    """A run's configuration and operations, in order."""

    config: RunConfig
    ops: list[Op] = dataclasses.field(default_factory=list)

    @property
    def steps(self) -> list[Step]:
        return [op for op in self.ops if isinstance(op, Step)]

    @property
    def requests(self) -> list[AddRequest]:
        return [op for op in self.ops if isinstance(op, AddRequest)]

    def until_step(self, index: int) -> OpLog:
        """The log up to and including step ``index`` (what led to it)."""
        out = []
        for op in self.ops:
            out.append(op)
            if isinstance(op, Step) and op.index == index:
                break
        return OpLog(self.config, out)

    def answers_for(self, request_id: str) -> list[ConnectorAnswer]:
        return [a for s in self.steps for a in s.answers if a.request_id == request_id]

    def size(self) -> dict[str, int]:
        """Groups, blocks (the pool), requests and ``schedule()`` steps."""
        return {
            "groups": len(self.config.draw.layout.groups),
            "blocks": self.config.draw.layout.num_blocks,
            "requests": len(self.requests),
            "steps": len(self.steps),
        }
