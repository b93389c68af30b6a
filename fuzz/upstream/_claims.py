"""The general claims, in vLLM's words, that an upstream-form repro's
docstring states for the checks whose facts it asserts (others: the
check's docstring, which speaks of the harness)."""

from __future__ import annotations

__all__ = ["CLAIMS"]

CLAIMS = {
    "cache-keeps-entries": "Freeing a request keeps its full blocks' prefix-cache entries: only reusing a block, "
                           "evict_blocks or a reset drops an entry, so the same prompt sent again hits them.",
    "caching-off-caches-nothing": "An engine started with enable_prefix_caching=False files no block in its "
                                  "prefix-cache index.",
    "hit-reaches-model": "A lookup serves every full block of the request's prefix that the prefix cache still "
                         "holds, up to the hit limit.",
    "request-in-one-place": "After every step, a request that has neither finished nor been aborted is in exactly "
                            "one of the scheduler's places: running, waiting or kv_holding_waiting.",
    "unblocked-request-admitted": "A waiting request is admitted (or its KV load started) by the first schedule() "
                                  "that finds nothing blocking it: nothing running, the pool free, its connector "
                                  "answer decided.",
    "events-carry-tokens": "Every block a BlockStored event announces carries, in its block_size slice of "
                           "token_ids, the tokens of the block its key stands for.",
    "events-carry-namespace": "Every block a BlockStored event announces names the LoRA adapter its request was "
                              "computed under (lora_name, lora_id), as its key does.",
    "hand-off-names-computed-blocks": "request_finished hands the KV connector exactly the blocks that hold the "
                                      "request's computed KV: per attention group, the first "
                                      "cdiv(num_computed_tokens, block_size) blocks of its table.",
    "encoder-outputs-held": "The scheduler frees an encoder output (free_encoder_mm_hashes) only once no request "
                            "still reads it.",
    "keys-name-one-prefix": "A prefix-cache key names one prefix: two requests get one block hash only for the "
                            "same tokens up to there, in the same namespace (cache salt, LoRA adapter, images).",
    "hit-matches-index": "A prefix-cache lookup serves exactly the longest hit the cached blocks allow: the full "
                         "blocks of the prefix every group holds within its attention span, cut to the hit "
                         "alignment and the lookup's limit.",
    "reads-written": "Below where a request's step computes from, it reads only blocks that hold its own prefix's "
                     "KV: a hit adopts a block only when it was filled from the same tokens under the same prefix.",
    "hits-within-namespace": "A prefix-cache hit stays within its namespace: a request adopts only blocks computed "
                             "for the same cache_salt, LoRA adapter, prompt embeddings and images, which vLLM folds "
                             "into the block hashes.",
    "hits-after-reset": "After a reset_prefix_cache() that succeeded, no lookup serves KV computed before it: the "
                        "reset invalidates every cached block (RLHF flows call it after a weight update).",
    "preempted-resumable": "A preempted request restarts: right after the schedule() that preempts it, it is "
                           "PREEMPTED with num_computed_tokens 0, no output placeholders, no drafts and no blocks, "
                           "so that admitted again it reads only what its own lookup gives it.",
    "eviction-order": "The block pool evicts cached blocks in its documented free order: a request's free returns "
                      "its blocks tail first, blocks with no key are reused before cached ones, earlier frees before "
                      "later ones. A block evicted while one ahead of it stays cached is a hit lost.",
    "index-names-its-prefix": "Every prefix-cache entry names a block that holds exactly its key's prefix: a block "
                              "reused for other tokens leaves no key of its old prefix behind.",
    "in-flight-reads-held": "Under async scheduling, the blocks the step still in flight reads stay out of the free "
                            "pool until its output is fed back: a sliding window's skipped blocks are freed on the "
                            "processed-token basis (num_computed_tokens - num_in_flight_tokens).",
    "index-written": "Every prefix-cache entry names a block that holds the KV its key covers: vLLM caches a "
                     "block in the schedule() of the step that fills it, an async load's blocks once the load "
                     "lands, and a Mamba entry moves with the state it names.",
    "same-step-hazard": "No block written in a step is read by another request in that step before the write: "
                        "no Mamba group adopts as a cache hit the state another request writes in the same step.",
    "running-request-progresses": "A RUNNING request is scheduled again or finishes: once a schedule() with "
                                  "nothing in flight and nothing arriving leaves it out, every later one does.",
    # Speculative decoding's.
    "lookahead-allocated": "A drafter with its own forward pass (EAGLE) writes KV num_lookahead_tokens positions "
                           "past each step it drafts from: the schedule() of that step allocates them, so every "
                           "attention group's table covers them (up to max_model_len).",
    "rejected-drafts-rolled-back": "update_from_output() takes a request's num_computed_tokens down by exactly the "
                                   "drafts the model runner rejected: their positions hold KV of tokens the request "
                                   "does not have, and the next step computes them again.",
    "kv-matches-tokens": "The tokens vLLM records for a request (all_token_ids) are the ones the model runner "
                         "computed its KV from: with accepted drafts, every token sampled, in order.",
    # What the scheduler tells the connector, and the model runner.
    "external-contiguous": "The connector loads the range its answer counts from: the scheduler asks "
                           "get_num_new_matched_tokens from the local part it keeps, and update_state_after_alloc "
                           "gets exactly the tokens the connector answered, within the prompt.",
    "told-external-accounted": "update_state_after_alloc gets the num_external_computed_tokens the scheduler "
                               "gave allocate_slots (0 once an async load has landed).",
    "load-blocks-cover": "The blocks update_state_after_alloc hands the connector hold the external range it loads: "
                         "a real block (not the null block) at each index the load writes, and a Mamba group's "
                         "state block at the resume boundary.",
    "dropped-answer-loads-nothing": "A connector answer the scheduler drops is never loaded: where the local hit "
                                    "ends in a sub-block tail the answer does not exceed, the scheduler keeps the "
                                    "tail and update_state_after_alloc gets 0 external tokens.",
    "computed-below-num-tokens": "Every request schedule() hands the model runner new or resumed leaves at least "
                                 "one token to compute: num_computed_tokens < num_tokens, the last token's logits "
                                 "sample the next one.",
    # Block ownership, KV events, stale outputs and leaks.
    "events-replay-index": "Replaying the KV events (BlockStored, BlockRemoved, AllBlocksCleared) rebuilds the "
                           "prefix-cache index: an entry the index drops, by eviction or a reset, is withdrawn by "
                           "an event, so a KV-aware router never routes to a hit that is gone.",
    "events-chain": "Every BlockStored event names as parent_block_hash the key of the block before its first, "
                    "which an earlier event announced: a router that keeps the cache as a tree of prefixes hangs "
                    "each announced block under its parent.",
    "stale-output-dropped": "A request preempted while a step that scheduled it still runs gets none of that "
                            "step's sampled tokens where the scheduler drops stale output (requires_kv_delivery): "
                            "its num_tokens is unchanged by that update_from_output.",
    "no-leaked-blocks": "Once every request has finished, every block but the null block is back in the free "
                        "pool and no block keeps a reference (ref_cnt 0).",
    "lookup-within-limit": "A prefix-cache lookup never hits past the limit its caller passes: a waiting "
                           "request's hit stops before its last prompt token (num_tokens - 1), so that its step "
                           "computes at least one token.",
}
