"""A real ``Scheduler`` for a :class:`fuzz.model.SchedulerDraw`, constructed
in one place.

The configuration and the sizes the engine resolves come from one of two
planners: :mod:`fuzz.adapter._config` for scheduler-API draws,
:mod:`fuzz.adapter._engine_plan` for draws with an engine (a model's
``config.json`` planned by vLLM's own code). Either way the scheduler is then
constructed as ``EngineCore.__init__`` does it, with the scripted connector
reset for the draw.
"""

from __future__ import annotations

from typing import Any

from fuzz.adapter import _compat, _config, _connector
from fuzz.adapter._specs import refused

from vllm.config import VllmConfig  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

from fuzz.model import SchedulerDraw  # noqa: E402

__all__ = ["BuiltScheduler", "build_scheduler", "scheduler_class"]


def scheduler_class(draw: SchedulerDraw, vllm_config: VllmConfig) -> type[Scheduler]:
    """The scheduler class the engine core builds: ``EngineCore.__init__``
    takes ``vllm_config.scheduler_config.get_scheduler_cls()`` (AsyncScheduler
    when ``async_scheduling``). A sync draw keeps the plain ``Scheduler``."""
    if draw.async_scheduling:
        return vllm_config.scheduler_config.get_scheduler_cls()  # type: ignore[return-value]
    return Scheduler


class BuiltScheduler:
    """A real ``Scheduler`` and the sizes the engine resolved for it."""

    def __init__(self, scheduler: Scheduler, kv_config: Any, scheduler_block_size: int, hash_block_size: int) -> None:
        self.scheduler = scheduler
        self.kv_config = kv_config
        self.scheduler_block_size = scheduler_block_size
        self.hash_block_size = hash_block_size


def build_scheduler(draw: SchedulerDraw) -> BuiltScheduler:
    """The scheduler for ``draw``, with the scripted connector reset for it.

    Raises :class:`InvalidLayout` when vLLM refuses the configuration (its
    config validation, block-size resolver or constructors).
    """
    if draw.engine is None:
        plan: Any = _config.plan_scheduler(draw)
    else:  # engine-reachable: vLLM's planning code decides
        # Imported on first use: the planner pulls in vLLM's model registry
        # and attention backends, which scheduler-API draws can do without
        # (and releases without the planning code cannot import).
        from fuzz.adapter import _engine_plan

        plan = _engine_plan.plan_draw(draw)
    try:
        with _compat.model_runner(draw.model_runner):
            _connector.SCRIPT.reset(divergent_hits=draw.divergent_hits)
            scheduler = scheduler_class(draw, plan.vllm_config)(
                vllm_config=plan.vllm_config,
                kv_cache_config=plan.kv_config,
                structured_output_manager=StructuredOutputManager(plan.vllm_config),
                block_size=plan.scheduler_block_size,
                hash_block_size=plan.hash_block_size,
                # What the engine core hands it: stats unless --disable-log-stats,
                # finished-id sets behind the DP coordinator.
                log_stats=draw.metrics,
                include_finished_set=draw.finished_sets,
            )
    except Exception as exc:  # noqa: BLE001 - vLLM's verdict, or the suite's misfit
        raise refused(exc) from exc
    return BuiltScheduler(scheduler, plan.kv_config, plan.scheduler_block_size, plan.hash_block_size)
