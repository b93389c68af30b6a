"""The KV connector of an upstream-form repro: ``MockKVConnector``'s config
that answers as the run's connector first did (:mod:`fuzz.upstream._answers`
says how it changes), and the small subclass a file declares where vLLM's
mock is not enough (the hybrid allocator's hand-off, the blocks or finish
calls it hears, what the scheduler passed it, a store's answers)."""

from __future__ import annotations

import textwrap

from fuzz.model import OpLog
from fuzz.upstream._answers import connector_answers
from fuzz.upstream._file import UNIT, File, Unwritable

__all__ = ["RECORDS", "connector_config", "declare_recorder"]


def connector_config(log: OpLog, config: tuple[int, bool, int] | None = None) -> dict[str, object]:
    """``MockKVConnector``'s extra config that answers as the run's
    connector did at first (or as ``config`` says: matched tokens, async,
    'not yet' answers; a step may change it: :func:`connector_answers`)."""
    answers = connector_answers(log)
    if answers is None:
        raise Unwritable("connector answers no config states")
    for add in log.requests:
        decided = [a for a in log.answers_for(add.request_id) if a.answer is not None]
        if add.reply is not None and add.reply.kind not in ("zero", "store", "undecided"):
            raise Unwritable(f"a {add.reply.kind!r} store reply")
        if add.reply is not None and not decided and add.reply.store_len:
            raise Unwritable("a store answer the run never gave")
    matched, is_async, defers = config or next(iter(answers.configs.values()), (0, False, 0))
    extra: dict[str, object] = {"matched_tokens": matched, "is_async": is_async}
    if defers:
        extra["num_defers_before_matching"] = defers
    if log.config.draw.divergent_hits and len(log.config.draw.layout.groups) > 1:
        extra["supports_divergent_local_hybrid_hits"] = True
    return extra


# What the recording connector keeps of the scheduler's calls: its attribute ->
# (the fact subject that reads it, the method, its arguments, the value kept
# per request, its name in the class docstring).
ALLOC_CALL = ("update_state_after_alloc", "request, blocks, num_external_tokens")
RECORDS = {
    "asked": ("connector-asked", "get_num_new_matched_tokens", "request, num_computed_tokens",
              "num_computed_tokens", "num_computed_tokens"),
    "told": ("connector-told", *ALLOC_CALL, "num_external_tokens", "num_external_tokens"),
    "blocks": ("connector-load-blocks", *ALLOC_CALL, "blocks.get_block_ids()", "block ids"),
}


def declare_recorder(f: File, producer: bool, keeps: bool, counts: bool = False, records: tuple[str, ...] = (),
              hand_off: bool = True, store: bool = False) -> None:
    """A ``MockKVConnector`` that supports the hybrid allocator's hand-off
    (``SupportsHMA``), keeping the block ids it is handed, or the requests
    it hears finished, where a fact reads them; that records, per request,
    what the scheduler last passed it (``records``: keys of
    :data:`RECORDS`); answering as a store of ``matched_tokens`` prompt
    tokens where the run's answers need one (``store``)."""
    if store and "asked" in records:
        raise Unwritable("a store answer beside the recorded question")
    f.need(UNIT, "MockKVConnector")
    told = f"the {' and '.join(RECORDS[r][4] for r in records)} it is passed per request"
    doc = "The mock connector"
    if hand_off:
        f.need("vllm.distributed.kv_transfer.kv_connector.v1.base", "SupportsHMA")
        doc += (" with the hybrid allocator's hand-off"
                + (", keeping the block ids each finished request is handed" if keeps
                   else ", recording each request it hears finished" if counts else ""))
    doc += (f"{';' if hand_off else ','} recording {told}" if records else "") + (
        "; answering as a store of the first matched_tokens tokens of each prompt" if store else "") + "."
    lines = [f"class {'HandOffRecorder' if hand_off else 'CallRecorder'}(MockKVConnector"
             + (", SupportsHMA):" if hand_off else "):"),
             *(f"    {line}" for line in (textwrap.wrap(f'"""{doc}"""', 92) if records or store else [f'"""{doc}"""'])), ""]
    fields = [*(["handed"] if keeps else []), *records]
    if fields or counts:
        lines += ["    def __init__(self, *args, **kwargs):",
                  "        super().__init__(*args, **kwargs)",
                  *(["        self." + ", self.".join(fields) + " = " + ", ".join("{}" for _ in fields)]
                    if fields else []),
                  *(["        self.finished = []"] if counts else []),
                  ""]
    if store:
        lines += ["    def get_num_new_matched_tokens(self, request, num_computed_tokens):",
                  "        # An external store holding the first matched_tokens tokens of each prompt.",
                  "        stored, is_async = super().get_num_new_matched_tokens(request, num_computed_tokens)",
                  "        if stored is None:",
                  "            return None, is_async",
                  "        return max(0, min(stored, request.num_tokens - 1) - num_computed_tokens), is_async",
                  ""]
    for method, arguments in dict.fromkeys(RECORDS[r][1:3] for r in records):
        lines.append(f"    def {method}(self, {arguments}):")
        lines += [f"        self.{r}[request.request_id] = {RECORDS[r][3]}" for r in records if method in RECORDS[r]]
        lines += [f"        return super().{method}({arguments})", ""]
    if hand_off:
        lines += [
            "    def request_finished_all_groups(self, request, block_ids):",
            *(["        self.handed[request.request_id] = block_ids"] if keeps else []),
            *(["        self.finished.append(request.request_id)"] if counts else []),
            "        return " + ("True, None  # a producer holds the blocks until their send is reported done"
                               if producer else "False, None"),
        ]
    f.top += lines if lines[-1] else lines[:-1]
