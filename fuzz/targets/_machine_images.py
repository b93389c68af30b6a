"""The scheduler state machine's rule for an image sent again
(``fuzz/targets/target_scheduler.py``'s ``SchedulerMachine`` inherits it).

vLLM's encoder cache keeps an image's output after the last request that
read it finishes, for a later request carrying the same picture; it holds
``max(max_num_batched_tokens, largest item)`` embeddings (the adapter sizes
it as ``MultiModalBudget`` does). Whether an output is taken back, held
while read, and evicted only once no request holds it is decided only when
a later request carries the same image while another image needs room: a
state the machine's general draws reach rarely, built here.
"""

from __future__ import annotations

from hypothesis import event, note
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

__all__ = ["IMAGE_SENT_AGAIN", "ImageRules"]

# The label of a run whose share_image rule sent an image again.
IMAGE_SENT_AGAIN = "image sent again beside another"


class ImageRules:
    """``SchedulerMachine``'s rule that sends an image again (see the module)."""

    def _presses_encoder_cache(self) -> bool:
        """Two of the run's images fit a prompt, and not the encoder cache
        (``max(budget, image)`` embeddings)."""
        harness = getattr(self, "harness", None)
        length = self.image_len  # type: ignore[attr-defined]
        return harness is not None and 2 * length + 2 < harness.max_model_len and (
            2 * length > max(harness.draw.max_num_batched_tokens, length))

    def _own_tokens(self, n: int) -> list[int]:
        self.salt += 1  # type: ignore[attr-defined]
        return [8_000 + 64 * (self.salt % 60) + j for j in range(n)]  # type: ignore[attr-defined]

    @precondition(lambda self: self._live() and self.draws_images and not getattr(self, "_image_shared", False)
                  and self._presses_encoder_cache())
    @rule(data=st.data())
    def share_image(self, data: st.DataObject) -> None:
        """A request carrying one image (a picture of the run's size) is
        stepped to completion with whatever else runs: its output stays in
        the encoder cache, held by no request. Then a request on tokens
        nobody shares (no KV hit: it must read that output) carries the
        same picture and, 0 to half a block after it, another one, so one
        step's tokens can reach both. Only where images are larger than
        half the token budget: the cache cannot hold both outputs while the
        first is read, and vLLM must hold the second image back, or evict
        an output no request holds (elsewhere the general draws take cached
        outputs back). Once a run: it costs two prefills, the second of up
        to four blocks."""
        harness, block, length = self.harness, self.block, self.image_len  # type: ignore[attr-defined]
        self._image_shared = True
        room = harness.max_model_len - 1
        first, second = data.draw(st.sampled_from((("image-a", "image-b"), ("image-c", "image-a"))), label="pictures")
        at = data.draw(st.integers(0, max(0, min(block, room - length - 1))), label="first image offset")
        tokens = self._own_tokens(at + length + 1)
        rid = harness.add_request(tokens, max_tokens=1, mm=((first, at, length),))
        note(f"add_request({rid}, {len(tokens)} own tokens, mm={((first, at, length),)!r}) then step until it ends")
        for _ in range(64):
            if not self._live() or rid not in harness.live_request_ids or harness.stalled or harness.going_nowhere:
                break
            self.step(1)  # type: ignore[attr-defined]
        if not self._live() or rid in harness.live_request_ids:  # type: ignore[attr-defined]
            return
        gap = data.draw(st.integers(0, max(0, min(block // 2, room - 2 * length - 1))), label="gap between images")
        start = data.draw(st.integers(0, max(0, min(2, room - 2 * length - gap - 1))), label="again at")
        mm = ((first, start, length), (second, start + length + gap, length))
        tokens = self._own_tokens(start + 2 * length + gap + 1)
        rid = harness.add_request(tokens, max_tokens=1, mm=mm)
        note(f"add_request({rid}, {len(tokens)} own tokens, mm={mm!r})")
        self.labels.add(IMAGE_SENT_AGAIN)  # type: ignore[attr-defined]
        event(IMAGE_SENT_AGAIN)
