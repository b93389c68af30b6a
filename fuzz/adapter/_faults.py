"""The faults the scheduler harness injects, and what vLLM made of them.

A connector's loads can fail two ways: an async load reported in
``failed_recving``, a synchronous one reported block by block in
``invalid_block_ids``. :class:`Faults` arms either on request, picks the
loads and blocks to fail from what the connector was told, and records each
failed load as vLLM handled it (:class:`fuzz.model.FailedLoad`), with the
requests it rolled back to recompute. It also holds the client aborts that
arrive while the model runs a step (``EngineCore``'s aborts queue).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from vllm.v1.request import Request, RequestStatus  # noqa: E402

from fuzz.model import AdmissionObservation, ConnectorAlloc, FailedLoad, GroupInfo  # noqa: E402

__all__ = ["Faults"]


class Faults:
    """Failing loads and aborts during a step, for one harness's scheduler.

    ``requests`` is the harness's registry of every request it added (read
    only here: a failed load's request may have left the scheduler).
    """

    def __init__(self, scheduler: Any, groups: tuple[GroupInfo, ...], null_block_id: int, policy: str,
                 requests: Mapping[str, Request]) -> None:
        self.scheduler = scheduler
        self.pool = scheduler.kv_cache_manager.block_pool
        self.groups = groups
        self.null_block_id = null_block_id
        self.policy = policy
        self.requests = requests
        self.load_failures: set[str] = set()  # async loads to report failed when they land
        self.fail_sync_loads = False
        self.fail_async_next = False
        self.invalid_blocks_reported: list[tuple[str, tuple[int, ...]]] = []
        # Failed loads: each async load's start and blocks (from its
        # update_state_after_alloc), the sync loads reported failed this step
        # (first failed token, block ids), failed async loads not yet taken
        # out of WAITING_FOR_REMOTE_KVS, and this step's FailedLoad records.
        self.async_loads: dict[str, tuple[int, tuple[tuple[int, ...], ...]]] = {}
        self.sync_failures: dict[str, tuple[int, int, tuple[int, ...], int]] = {}
        self.failed_async: dict[str, FailedLoad] = {}
        self.step_failed_loads: list[FailedLoad] = []
        # Request id -> the token count a failed synchronous load had brought
        # it to before vLLM rolled it back (recompute policy).
        self.recomputing: dict[str, int] = {}
        self.recomputed_failed_load: set[str] = set()  # ever rolled back by a failed load's blocks (its own or shared)
        # Request id -> where it had been when a failed load rolled it back
        # past the load's end (the tokens of a step in flight), until it
        # computes past that again; and its computed tokens right before the update.
        self.past_load: dict[str, int] = {}
        self._computed_before: dict[str, tuple[int, int]] = {}
        self.status_before: dict[str, str] = {}  # per failed load reported, its request's status then
        # Aborts that arrive while the model runs the next step.
        self.aborts_during_step: list[str] = []
        self._watch_failed_landing()

    # -- arming ---------------------------------------------------------------
    def fail_async_load(self, request_id: str) -> None:
        self.load_failures.add(request_id)

    def fail_next_async_loads(self) -> None:
        self.fail_async_next = True

    def fail_next_sync_loads(self) -> None:
        self.fail_sync_loads = True

    def abort_during_step(self, request_id: str) -> None:
        self.aborts_during_step.append(request_id)

    def process_aborts(self) -> None:
        """The aborts queued while the step ran, as ``EngineCore`` processes
        its aborts queue."""
        ids, self.aborts_during_step = self.aborts_during_step, []
        if ids:
            self.scheduler.finish_requests(ids, RequestStatus.FINISHED_ABORTED)

    # -- a step ----------------------------------------------------------------
    def new_step(self) -> frozenset[str]:
        """Start a step's records; the requests still recomputing what a
        rolled-back synchronous load had covered (from the step after the
        rollback until they compute past the load's end and the failed
        step's own tokens, over as many steps as their chunks take)."""
        self.step_failed_loads = []
        live = self.scheduler.requests
        for rid in [r for r, end in self.recomputing.items() if r not in live or live[r].num_computed_tokens >= end]:
            del self.recomputing[rid]
        for rid in [r for r, end in self.past_load.items() if r not in live or live[r].num_computed_tokens >= end]:
            del self.past_load[rid]
        return frozenset(self.recomputing)

    def load_started(self, alloc: ConnectorAlloc) -> None:
        """Keep an async load's start and blocks: what fails if it does."""
        self.async_loads[alloc.request_id] = (alloc.alloc_local_tokens or 0, alloc.block_ids)

    def invalid_blocks(self, admissions: Sequence[AdmissionObservation]) -> set[int]:
        """When armed, the blocks of this step's synchronous loads the worker
        fails (armed until a step has a synchronous load to fail)."""
        if not self.fail_sync_loads:
            return set()
        invalid: set[int] = set()
        for adm in admissions:
            # The blocks the connector was told at update_state_after_alloc
            # (the worker loads into those), not the live block table.
            if not adm.admitted or adm.reply_async or not adm.connector_external_tokens or not adm.connector_block_ids:
                continue
            local = (adm.num_computed_tokens or 0) - adm.connector_external_tokens
            (table,) = adm.connector_block_ids
            b = self.groups[0].block_size
            first, end = local // b, -(-(adm.num_computed_tokens or 0) // b)
            ids = tuple(i for i in table[first:end] if i != self.null_block_id)
            if ids:
                self.invalid_blocks_reported.append((adm.request_id, ids))
                # vLLM truncates at the first invalid block of the table; a
                # padded (null) position before it is not reported failed.
                at = next(k for k in range(first, end) if table[k] != self.null_block_id)
                self.sync_failures[adm.request_id] = (local, at * b, ids, adm.num_computed_tokens or 0)
                invalid.update(ids)
        if invalid:
            self.fail_sync_loads = False
        return invalid

    def take_sync_failures(self) -> dict[str, tuple[int, int, tuple[int, ...], int]]:
        """This step's failed synchronous loads, handed to its output."""
        failures, self.sync_failures = self.sync_failures, {}
        return failures

    # -- feeding an output back ----------------------------------------------
    def async_failures(self, landing: set[str]) -> set[str]:
        """Which of the async loads ``landing`` in this output are reported
        failed (armed until a step has an async load landing)."""
        failed = landing & (self.load_failures | (landing if self.fail_async_next else set()))
        if landing:
            self.fail_async_next = False
        self.load_failures.difference_update(landing)
        return failed

    def before_update(self, sync_failures: dict[str, tuple[int, int, tuple[int, ...], int]],
                      failed: Iterable[str], invalid_block_ids: set[int], scheduled: Mapping[str, int]) -> dict[str, int]:
        """Right before ``update_from_output``: take the output's failed
        loads and note their requests' status; return the requests sharing
        reported invalid blocks without a failed load of their own, with
        their computed tokens (vLLM may roll them back too)."""
        failed = set(failed)
        self.sync_failures = sync_failures
        # Past the fed step's own tokens: those of a step still in flight.
        self._computed_before = {
            r: (self.requests[r].num_computed_tokens, self.requests[r].num_computed_tokens - scheduled.get(r, 0))
            for r in sync_failures if r in self.requests
        }
        self.status_before = {
            r: self.requests[r].status.name for r in (*failed, *self.sync_failures) if r in self.requests
        }
        # A local hit on blocks another request's sync load filled: vLLM
        # rolls back async loads still in flight and running requests alike
        # (_handle_invalid_blocks -> _update_requests_with_invalid_blocks over
        # kv_holding_waiting and running).
        return {
            rid: r.num_computed_tokens
            for rid, r in self.scheduler.requests.items()
            if invalid_block_ids
            and rid not in failed
            and rid not in self.sync_failures
            and r.status.name in ("WAITING_FOR_REMOTE_KVS", "RUNNING")
        }

    def after_update(self, failed_async: set[str], sharing: Mapping[str, int], rejected: Mapping[str, int],
                     landed: Iterable[str]) -> None:
        """What the scheduler made of the output's failed loads; which
        requests sharing invalid blocks it rolled back; the async loads that
        ``landed`` whole."""
        self._record_failed_loads(failed_async)
        live = self.scheduler.requests
        for rid, computed in sharing.items():
            # Rolled back (by more than its rejected drafts): recomputing up
            # to where it was.
            if rid in live and live[rid].num_computed_tokens < computed - rejected.get(rid, 0):
                self.recomputing[rid] = computed
                # Rolled back by the failed load's invalid blocks like the
                # loader itself (output skipped, placeholders kept).
                if self.policy == "recompute":
                    self.recomputed_failed_load.add(rid)
        for rid in landed:
            self.async_loads.pop(rid, None)

    def _record_failed_loads(self, failed_async: set[str]) -> None:
        reported = []
        for rid in sorted(failed_async):
            start, table = self.async_loads.pop(rid, (0, ()))
            failed = tuple(
                tuple(i for i in g[start // grp.block_size :] if i != self.null_block_id)
                for g, grp in zip(table, self.groups)
            )
            load = FailedLoad(rid, "failed_recving", self.policy, "reported", start, start, failed, "", 0, (), self.groups)
            reported.append(load)
            self.failed_async[rid] = load
        for rid, (start, first_failed, ids, _) in sorted(self.sync_failures.items()):
            reported.append(
                FailedLoad(
                    rid, "invalid_block_ids", self.policy, "reported", start, first_failed, (ids,), "", 0, (), self.groups
                )
            )
        if self.policy == "recompute":
            # Rolled back to the first invalid block: the request recomputes
            # from there up to where the failed load had brought it.
            for rid, (*_, load_end) in self.sync_failures.items():
                self.recomputed_failed_load.add(rid)
                had, before_fed_step = self._computed_before.get(rid, (0, 0))
                # The rollback discards the failed step's own tokens too, and
                # leaves the tables laid out for where that step ended (a
                # Mamba group's null padding): the recompute runs up to there.
                self.recomputing[rid] = max(load_end, had) if before_fed_step <= load_end else load_end
                if before_fed_step > load_end:
                    self.past_load[rid] = had
        self.sync_failures.clear()
        for load in reported:
            load = dataclasses.replace(load, status_before=self.status_before.get(load.request_id, ""))
            self.step_failed_loads.append(self._failed_load_now(load, self.requests[load.request_id], "reported"))

    def _watch_failed_landing(self) -> None:
        """Observe each failed async load the moment the scheduler takes its
        request out of WAITING_FOR_REMOTE_KVS (inside ``schedule()``, before
        anything else can reuse its freed blocks)."""
        original = getattr(self.scheduler, "_update_waiting_for_remote_kv", None)
        if original is None:  # a release without the method: no landing records
            return

        def update_waiting_for_remote_kv(request: Request) -> Any:
            result = original(request)
            failed = self.failed_async.pop(request.request_id, None)
            if failed is not None:
                self.step_failed_loads.append(self._failed_load_now(failed, request, "landed"))
            return result

        self.scheduler._update_waiting_for_remote_kv = update_waiting_for_remote_kv

    def _failed_load_now(self, load: FailedLoad, request: Request, stage: str) -> FailedLoad:
        blocks = self.pool.blocks
        return dataclasses.replace(
            load,
            stage=stage,
            status_after=request.status.name,
            computed_after=request.num_computed_tokens,
            cached_after=tuple(
                tuple(i for i in g if blocks[i].block_hash is not None) for g in load.failed_block_ids
            ),
        )
