"""What a KV-event consumer reads of an announced block, set against what
the harness knows that block holds (fuzz/adapter/_event_payloads.py)."""

from __future__ import annotations

import dataclasses

__all__ = ["PAYLOAD_TOKENS", "EventPayload"]

# The fields of BlockStored that say what a block holds; the rest
# (lora_id, lora_name, extra_keys, medium) say under what it was computed.
PAYLOAD_TOKENS = frozenset({"token_ids", "block_size"})


@dataclasses.dataclass(frozen=True)
class EventPayload:
    """A block a ``BlockStored`` event announces whose ``field`` reads
    ``announced`` where the harness's record gives ``expected``: the key
    stands for the first ``num_tokens`` tokens of ``request_id`` (the
    request the harness saw carry that hash), the block is the event's
    ``index``-th."""

    group: int | None
    key: object  # as events spell it
    index: int
    request_id: str
    num_tokens: int
    field: str
    announced: object
    expected: object

    @property
    def tokens(self) -> bool:
        """A disagreement over what the block holds (not under what)."""
        return self.field in PAYLOAD_TOKENS

    def describe(self) -> str:
        return (
            f"group {self.group}: BlockStored announces key {self.key!r} (block {self.index} of the event) with "
            f"{self.field}={self.announced!r}, but the key stands for the first {self.num_tokens} tokens of request "
            f"{self.request_id}, whose block there gives {self.field}={self.expected!r}"
        )
