"""The measured loop, and the objects one trial builds for it.

Keep :meth:`TrialLoop.run` tiny and obvious: every number the tuner reports depends on it. It
never synchronises the device, never touches storage (the prune rule is a pure function of
the window; what the search records happens after the trial), and agrees failures between
ranks at the step boundaries so that no rank waits forever for another.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import TYPE_CHECKING, Any, Iterator

import torch

from tuner.harness import distributed
from tuner.harness.comm import CommTimer
from tuner.harness.metrics import Window, window_rate
from tuner.harness.probe_core import ProbeCore
from tuner.harness.system.flops import holds_convolutions
from tuner.stats.prune import checks as prune_checks
from tuner.trial.data import cycle, make_loader, shutdown, to_device, warmup_steps
from tuner.trial.engines import build_engine, stages
from tuner.trial.failures import TrialStop, classify
from tuner.trial.trial_result import Instruments, PruneRule, State

if TYPE_CHECKING:
    from torch.utils.data import DataLoader

    from tuner.harness.distributed import DistContext
    from tuner.inputs.plan import Plan
    from tuner.inputs.recipe import Recipe


def compile_seconds() -> float | None:
    """Seconds dynamo and inductor have spent compiling in this process so far (frames and
    their backward graphs: ``calculate_time_spent()["total_wall_time"]``, 26.85 s of a
    26.91 s first step here), or ``None`` where this torch does not keep the count."""
    try:
        from torch._dynamo.utils import calculate_time_spent

        return float(calculate_time_spent().get("total_wall_time", 0.0))
    except Exception:  # noqa: BLE001 - a private counter: missing or changed, fall back to the clock
        return None


class TrialLoop:
    """The objects one trial builds (loader, engine), and the loop over them."""

    def __init__(
        self, recipe: "Recipe", config: "Plan", ctx: "DistContext", prune: PruneRule | None, instruments: Instruments
    ) -> None:
        self.recipe, self.config, self.ctx, self.prune = recipe, config, ctx, prune
        self.instruments = instruments
        self.timer = CommTimer()
        self.losses: list[torch.Tensor] = []
        self.batch_norm = False
        self.convolutions = False
        """The model holds convolutions (cuDNN runs fp32 ones in TF32 by default: the MFU peak)."""
        self.loader: DataLoader | None = None
        self.batches: Iterator[Any] | None = None
        self.engine: Any = None
        self.bad: torch.Tensor | None = None
        self.last_batch: Any = None
        self.warmup_s = 0.0
        self.window_start = 0.0
        self.measured_steps = 0
        self.first_step_s: float | None = None
        self.compiled_before: float | None = None
        self.batch_checks = stages.batch_checks(config)
        """The levers' checks of each micro-batch before its forward (CUDA graphs' shapes)."""

    def build(self) -> None:
        recipe, config, ctx = self.recipe, self.config, self.ctx
        assert recipe.task is not None
        if config.world_size != ctx.world_size:
            raise ValueError(f"the configuration was made for {config.world_size} rank(s) and this job has "
                             f"{ctx.world_size}: make it with the job's world size (recipe.configs)")
        torch.manual_seed(recipe.seed)  # same initial weights on every rank and every trial
        dataset = recipe.task.build_dataset(recipe.task_args)
        self.loader = make_loader(dataset, config, ctx, recipe.seed, recipe.task.collate)
        self.engine = build_engine(recipe.task, recipe.task_args, config, ctx.device)
        module = getattr(self.engine.model, "module", self.engine.model)
        # the private base of every BatchNorm class (torch names no public one)
        batch_norm = torch.nn.modules.batchnorm._BatchNorm  # noqa: SLF001
        self.batch_norm = any(isinstance(m, batch_norm) for m in module.modules())
        self.convolutions = holds_convolutions(module)
        self.bad = torch.zeros((), dtype=torch.bool, device=ctx.device)

    def run(self) -> Window:
        """The measured loop. Keep it tiny: every number depends on it."""
        steps, config, engine, bad = self.recipe.steps, self.config, self.engine, self.bad
        assert self.loader is not None and bad is not None
        start = time.perf_counter()
        self.compiled_before = compile_seconds() if config.compile else None
        warmup = warmup_steps(steps.warmup, config)
        probe = ProbeCore(warmup, steps.measure, self.ctx.device, comm=self.timer, collectives=False,
                          nvtx=self.instruments.nvtx, monitors=False, comm_profile=False)  # run.py profiles its own
        nvtx = probe.nvtx
        self.batches = cycle(self.loader)
        batches = probe.loader(self.batches, transfer=self._transfer())
        # this rank's share of the global batch: the ranks of one model copy (tensor and
        # pipeline parallel) train the same samples, so together they count them once
        samples = config.micro_batch_size * config.grad_accum_steps * config.layout.dp \
            / self.ctx.world_size
        checks = prune_checks(steps.most) if self.prune is not None else frozenset()
        step_loss = torch.zeros((), device=self.ctx.device)
        with contextlib.ExitStack() as stack:
            stack.enter_context(engine.time_collectives(self.timer))
            profiler = stack.enter_context(self._trace(warmup)) if self.instruments.trace_dir else None
            while not probe.done:
                for micro in range(config.grad_accum_steps):
                    last = micro == config.grad_accum_steps - 1
                    self.last_batch = next(batches)
                    nvtx.push("forward")
                    loss = self.forward(self.last_batch, last)
                    nvtx.pop()
                    nvtx.push("backward")
                    engine.backward(loss, last)
                    nvtx.pop()
                    bad |= ~torch.isfinite(loss.detach())
                    step_loss += loss.detach().float()
                self.losses.append(step_loss / config.grad_accum_steps)  # on the device: no sync
                step_loss = torch.zeros((), device=self.ctx.device)
                nvtx.push("optimizer step")
                engine.optimizer_step()
                nvtx.pop()
                probe.step(samples)
                if self.first_step_s is None:  # compiles happen in it: outside the window
                    self.first_step_s = time.perf_counter() - start
                if profiler is not None:
                    profiler.step()
                if probe.measuring_step and probe.measured in checks:
                    self._prune_here(probe.window, probe.measured)
        probe.close()
        window = probe.finish()
        self.window_start = probe.window_start or start
        self.warmup_s = self.window_start - start
        self.measured_steps = len(window.step_times)
        self._lever_costs(window)
        return window

    def _lever_costs(self, window: Window) -> None:
        """What compile and checkpointing cost: the seconds dynamo's own counters say it
        spent compiling in this trial (forward and backward graphs), and the recompute
        inside the window. The first step's excess over a measured one, the fallback where
        the counters are missing, also holds the loader workers' start and, on a GPU, lazy
        CUDA module loading."""
        if self.config.compile:
            spent = compile_seconds()
            if spent is not None and self.compiled_before is not None:
                window.compile_s = max(0.0, spent - self.compiled_before)
            elif self.first_step_s is not None and window.step_times:
                window.compile_s = max(0.0, self.first_step_s - statistics.median(window.step_times))
        if self.engine.recompute is not None:  # blocks are checkpointed
            window.recompute_s = self.engine.recompute.between(self.window_start, self.window_start + window.wall_s)
        if self.engine.pipeline is not None:  # a pipeline: its stages' idle time
            window.bubble_s = self.engine.pipeline.clock.idle_s(self.window_start, self.window_start + window.wall_s)

    def extra_step(self, batches: Iterator[Any]) -> None:
        """One optimizer step outside the measured loop (stall-free ceiling, profiler window)."""
        accum = self.config.grad_accum_steps
        for micro in range(accum):
            loss = self.forward(next(batches), micro == accum - 1)
            self.engine.backward(loss, micro == accum - 1)
        self.engine.optimizer_step()

    def forward(self, batch: Any, last: bool) -> torch.Tensor:
        """Forward on every rank, then agree: if one rank failed, all stop here, before
        any of them waits in the backward's collectives for a rank that will never come.

        Where the engine runs no collective before the last micro-batch's backward
        (:attr:`~tuner.trial.engines.base.Engine.quiet_until_last`), the ranks agree once a
        step, at the last micro-batch's forward; a rank that fails earlier agrees at once
        and the others meet it there (one agreement each: the collectives pair up)."""
        loss, failure = None, None
        try:
            for check in self.batch_checks:
                check(batch)
            with stages.forward(self.config, self.ctx.device):
                loss = self.engine.forward(batch, last)
        except Exception as exc:  # noqa: BLE001 - classified, agreed, then raised as TrialStop
            failure = classify(exc)
        if failure is None and not last and self.engine.quiet_until_last:
            assert loss is not None  # nothing collective before the last micro-batch: agreed there
            return loss
        start = time.perf_counter()
        with self.timer.own():
            agreed = distributed.agree(failure)
        if self.ctx.world_size > 1:
            # Blocked here is waiting for the slowest rank's forward: exposed communication
            # the job would see anyway, in its first all-reduce, were the tuner not there.
            self.timer.add(time.perf_counter() - start)
        if agreed is not None:
            raise TrialStop(*agreed)
        assert loss is not None
        return loss

    def _prune_here(self, window: Window, steps: int) -> None:
        """Rank 0 applies the rule to its window's steps that the device has finished (on a
        GPU the host runs ahead: its clock says when steps were queued, not run); every
        rank follows its decision."""
        decision = (self.ctx.is_main and self.prune is not None and len(window.step_times) >= 2
                    and self.prune(window))
        if distributed.broadcast(decision):
            stop = TrialStop(State.PRUNED, f"slower than the best so far after {steps} measured steps")
            stop.pruned_at = (steps, window_rate(window, self.ctx.world_size))
            raise stop

    def read_losses(self) -> list[float]:
        """The loss of every step so far, on the host (one device sync, after the loop):
        the global batch's, each rank's mean over the ranks. One rank's share would make
        a layout's curve another batch than data parallelism's (a tensor-parallel rank
        trains the whole batch, a data-parallel one a slice), and the precision guard
        compares curves across configurations. Every rank calls it, at the same point."""
        own = [float(x) for x in torch.stack(self.losses).cpu()] if self.losses else []
        return distributed.mean(own)

    def nonfinite(self) -> bool:
        """Whether any rank saw a non-finite loss (one device sync, after the window)."""
        return distributed.any_rank(bool(self.bad))

    def _transfer(self) -> Any:
        """The copy to the device (on a CPU, none), in channels-last format when the config
        asks (then on a CPU too: the conversion is a copy the input pipeline pays)."""
        formatted = self.config.channels_last
        if self.ctx.device.type == "cpu" and not formatted:
            return None
        device, non_blocking = self.ctx.device, self.config.pin_memory
        return lambda batch: to_device(batch, device, non_blocking, formatted)

    def _trace(self, warmup: int) -> Any:
        """A profiler that records exactly the measured steps and writes them out."""
        from torch.profiler import ProfilerActivity, profile, schedule

        out = self.instruments.trace_dir
        assert out is not None
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"trace_rank{self.ctx.rank}.json"
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.ctx.device.type == "cuda" else [])
        return profile(
            activities=activities,
            schedule=schedule(wait=max(0, warmup - 1), warmup=min(1, warmup), active=self.recipe.steps.most,
                              repeat=1),
            on_trace_ready=lambda prof: prof.export_chrome_trace(str(path)),
        )

    def close(self) -> None:
        """Shut workers down and destroy the engine, whatever state the trial is in."""
        shutdown(self.loader, self.batches)
        if self.engine is not None:
            self.engine.close()
        self.loader = self.batches = self.engine = self.bad = self.last_batch = None
        self.losses = []
