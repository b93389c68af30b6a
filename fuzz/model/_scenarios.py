"""The scenarios the runners play, as data: what a strategy draws and a
runner, a repro writer or a pinned test replays. The strategies that draw
them live in :mod:`strategies`.

* :class:`TruncationScenario` (with its :class:`EndpointRule`): prompts
  sharing prefixes, a per-group eviction plan, a replay and the endpoint
  ``truncate_computed_blocks`` is asked about;
* :class:`SingleShotScenario` (with its :class:`PromptDraw` prompts): fill a
  scheduler's cache, optionally probe and evict, then replay one request;
* :class:`FixedRun` (with its :class:`FixedPrompt` prompts): a hand-written
  scheduler run beside a planted bug the search rarely meets, the run that
  shows the bug caught (``fuzz.adapter.FIXED_RUNS``).
"""

from __future__ import annotations

from dataclasses import dataclass

from fuzz.model._kv import EagleDraw, LayoutDraw
from fuzz.model._replies import ExternalReply
from fuzz.model._scheduler import SchedulerDraw

__all__ = ["EndpointRule", "FixedPrompt", "FixedRun", "PromptDraw", "SingleShotScenario", "TruncationScenario"]

_SUFFIX_BASE = 2_000  # own-suffix tokens live above the shared vocabulary


@dataclass(frozen=True)
class EndpointRule:
    """How to pick ``n`` once the lookup's hits are known.

    ``n = floor(anchor / S) * S + steps * S + remainder`` (clamped at 0), where
    ``S`` is the scheduler block size (LCM of the group block sizes). A
    non-zero ``remainder`` makes the endpoint misaligned on purpose, like the
    scheduler's ``partial_tail`` before it rounds down.
    """

    anchor: str
    steps: int
    remainder: int

    def resolve(self, anchors: dict[str, int], scheduler_block_size: int) -> int:
        """``anchors`` maps every name in ``ANCHORS`` to a token count."""
        s = scheduler_block_size
        base = anchors[self.anchor]
        aligned = max(0, (base // s + self.steps) * s)
        return aligned + self.remainder % s


@dataclass(frozen=True)
class TruncationScenario:
    layout: LayoutDraw
    shared: tuple[int, ...]
    prompts: tuple[tuple[int, int], ...]  # (shared prefix length, suffix length)
    prefill_chunk: int | None
    evict_from: tuple[int | None, ...]  # per group: evict blocks from this index on
    replay: tuple[int, int]  # (shared prefix length, tail length >= 1)
    lookup_mode: str
    endpoint: EndpointRule
    eagle: EagleDraw | None = None  # an EAGLE-style drafter, or no speculative decoding

    def prompt_tokens(self, i: int) -> list[int]:
        keep, suffix = self.prompts[i]
        # Suffix tokens live above the shared vocabulary, so a suffix never
        # matches the replay by accident and each prompt's suffix is its own.
        return list(self.shared[:keep]) + [10_000 + 100 * i + j for j in range(suffix)]

    def replay_tokens(self) -> list[int]:
        keep, tail = self.replay
        return list(self.shared[:keep]) + [9_000 + j for j in range(tail)]

    def __repr__(self) -> str:
        return (
            f"TruncationScenario({self.layout!r}, prompts={list(self.prompts)}, "
            f"chunk={self.prefill_chunk}, evict_from={list(self.evict_from)}, "
            f"replay={self.replay}, lookup={self.lookup_mode!r}, endpoint={self.endpoint}"
            + ("" if self.eagle is None else f", {self.eagle!r}")
            + ")"
        )


@dataclass(frozen=True)
class PromptDraw:
    """``shared[:prefix]`` followed by ``suffix`` tokens of its own."""

    prefix: int
    suffix: int
    max_tokens: int = 1
    reply: ExternalReply = ExternalReply()
    # SamplingParams(skip_reading_prefix_cache=True).
    skip_reading_prefix_cache: bool = False

    def tokens(self, shared: tuple[int, ...], salt: int) -> list[int]:
        own = [_SUFFIX_BASE + 64 * salt + j for j in range(self.suffix)]
        return list(shared[: self.prefix]) + own

    def __repr__(self) -> str:
        skip = ", skip_reading_prefix_cache=True" if self.skip_reading_prefix_cache else ""
        return f"Prompt(shared[:{self.prefix}]+{self.suffix}, max_tokens={self.max_tokens}, ext={self.reply!r}{skip})"


@dataclass(frozen=True)
class SingleShotScenario:
    """Fill the cache, optionally probe inside it, optionally evict by hand,
    then replay one request."""

    config: SchedulerDraw
    shared_len: int
    token_seed: int
    fills: tuple[PromptDraw, ...]
    concurrent: bool  # fills submitted together (churn, preemption) or one by one
    evict_from: tuple[int | None, ...] | None  # per group; None: real paths only
    replay: PromptDraw
    flavour: str = "free"  # how the replay relates to the fills (see strategies.single_shot.FLAVOURS)
    probe: PromptDraw | None = None  # run after the fills, before the replay
    # Identical copies of the replay submitted together: they take the same
    # local hit in one step.
    replay_copies: int = 1

    @property
    def shared(self) -> tuple[int, ...]:
        # Distinct tokens below _SUFFIX_BASE; the seed varies them cheaply.
        return tuple((i * 7 + self.token_seed) % 1_000 for i in range(self.shared_len))

    def fill_tokens(self, i: int) -> list[int]:
        return self.fills[i].tokens(self.shared, salt=i)

    def replay_tokens(self) -> list[int]:
        return self.replay.tokens(self.shared, salt=len(self.fills) + 1)

    def probe_tokens(self) -> list[int]:
        assert self.probe is not None
        return self.probe.tokens(self.shared, salt=len(self.fills))

    @property
    def uses_shortcut(self) -> bool:
        return self.evict_from is not None and any(e is not None for e in self.evict_from)

    def __repr__(self) -> str:
        return (
            f"SingleShot({self.flavour}, {self.config!r}, shared_len={self.shared_len}, "
            f"fills={list(self.fills)}, concurrent={self.concurrent}, "
            f"evict_from={None if self.evict_from is None else list(self.evict_from)}, "
            + (f"probe={self.probe!r}, " if self.probe is not None else "")
            + f"replay={self.replay!r}"
            + (f" x{self.replay_copies}" if self.replay_copies != 1 else "")
            + ")"
        )


@dataclass(frozen=True)
class FixedPrompt:
    """One request of a :class:`FixedRun`: its tokens, how many it decodes,
    and what makes its cache keys its own (a tenant's salt, a LoRA adapter,
    prompt embeddings by tag, multimodal items ``(tag, offset, length)``);
    ``reply``: what the scripted connector answers for it (None: no hit)."""

    tokens: tuple[int, ...]
    max_tokens: int
    cache_salt: str | None = None
    lora: str | None = None
    embeds: str | None = None
    mm: tuple[tuple[str, int, int], ...] = ()
    reply: ExternalReply | None = None


def distinct_prompts(count: int, length: int, max_tokens: int) -> tuple[FixedPrompt, ...]:
    """``count`` prompts of ``length`` tokens sharing no prefix (prompt i is
    ``100 i ..``), each decoding ``max_tokens``."""
    return tuple(FixedPrompt(tuple(range(100 * i, 100 * i + length)), max_tokens) for i in range(count))


@dataclass(frozen=True)
class FixedRun:
    """A scheduler run written by hand: the prompts are added all at once and
    the run is stepped until idle, or (``one_after_another``) each is added
    once the one before has finished. With ``reset_during``, the prefix
    cache is reset (``reset_running_requests=True``) one step after the step
    that admits that prompt.

    What the unmodified run must show, so that it still meets the case it
    was written for (``fuzz.runners.scheduler.run_fixed`` asserts each):
    ``hits``, the local hit of every admission in order; ``events``, at
    least that many KV events of each type; ``label``, a branch label."""

    config: SchedulerDraw
    prompts: tuple[FixedPrompt, ...]
    one_after_another: bool = False
    reset_during: int | None = None
    hits: tuple[int, ...] | None = None
    events: tuple[tuple[str, int], ...] = ()
    label: str | None = None
