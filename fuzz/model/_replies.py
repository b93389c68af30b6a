"""What the scheduler tier's scripted KV connector answers for one request
(:class:`ExternalReply`) and the kinds of answer it gives."""

from __future__ import annotations

import dataclasses

__all__ = ["REPLY_KINDS", "ExternalReply"]

# "store":     a remote store (what a prefill instance computed) holds the
#              first ``store_len`` prompt tokens; the reply is what lies past
#              the local hit, capped so at least the last token is recomputed
#              for a sync load (how real sync connectors answer); an async
#              load may cover the whole prompt.
# "saved":     the connector's own store (an offloading connector): the
#              longest prefix of the prompt, in whole saved blocks, that
#              requests of this scheduler computed and finished, as the
#              connector saved them; otherwise as "store". Honest by
#              construction: nothing is answered that was not computed.
# "zero":      no external hit.
# "undecided": ``None`` ("ask again later") for the first ``undecided``
#              queries, then the "store" answer.
# "over":      over-reports: the whole rest of the prompt plus ``extra``
#              tokens, breaking the connector contract on purpose.
REPLY_KINDS = ("store", "zero", "undecided", "over", "saved")


@dataclasses.dataclass(frozen=True)
class ExternalReply:
    """What the external store answers for one request."""

    kind: str = "zero"
    store_len: int = 0
    undecided: int = 0
    extra: int = 0
    load_async: bool = False

    def __post_init__(self) -> None:
        if self.kind not in REPLY_KINDS:
            raise ValueError(f"kind={self.kind!r} is not one of {REPLY_KINDS}")

    def answer(self, num_tokens: int, num_computed: int, asked_before: int, saved: int = 0,
               whole_prompt_sent: bool = False) -> int | None:
        """The token count to return to vLLM (``None`` = cannot decide yet);
        ``saved``: how much of the prompt the connector's own store holds;
        ``whole_prompt_sent``: an async load of the whole prompt was already
        allocated for this request."""
        if self.kind == "saved":
            return dataclasses.replace(self, kind="store", store_len=saved).answer(
                num_tokens, num_computed, 0, whole_prompt_sent=whole_prompt_sent)
        if self.kind == "zero":
            return 0
        if self.kind == "over":
            return num_tokens - num_computed + self.extra
        if self.kind == "undecided" and asked_before < self.undecided:
            return None
        # A sync load leaves the last token to compute (how sync connectors
        # answer); an async load may bring the whole prompt (P/D decode side),
        # which vLLM trims to num_tokens - 1 when the load lands. That is a
        # one-shot remote prefill: vLLM's P/D connectors answer it once per
        # request (NIXL clears do_remote_prefill in update_state_after_alloc,
        # nixl/pull_scheduler.py), and every store connector stops at
        # num_tokens - 1 (offloading_connector.py, example_connector.py,
        # hf3fs, umbp, mooncake store). A 1-token prompt is asked again after
        # its load lands (vLLM sets num_computed_tokens = 0 there): it gets
        # a store's answer then, not the whole prompt a second time.
        limit = num_tokens if self.load_async and not whole_prompt_sent else num_tokens - 1
        return max(0, min(self.store_len, limit) - num_computed)

    @property
    def honest(self) -> bool:
        return self.kind != "over"

    def __repr__(self) -> str:
        if self.kind == "zero":
            return "zero"
        if self.kind == "over":
            return f"over(+{self.extra})"
        if self.kind == "saved":
            return "saved" + (" async" if self.load_async else "")
        text = f"store({self.store_len})"
        if self.kind == "undecided":
            text = f"undecided({self.undecided})->{text}"
        return text + (" async" if self.load_async else "")
