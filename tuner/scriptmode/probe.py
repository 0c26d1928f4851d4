"""``tuner.Probe``: the harness's probe as users hold it, in their own loop or script.

Outside the tuner it only measures. Under the tuner's script mode (``TUNER_TRIAL`` set),
the trial file sets the warm-up and the measured window, the second optimizer step is
checked to take global batch / world size samples, the search's prune rule (when the trial
file carries one) is asked at the same points of the window as in the tuner's own loop, and
when the window closes, or the rule cuts it, the summary is written where the trial file
says, for the search to read. The core
(:class:`tuner.harness.probe_core.ProbeCore`) knows none of this: it is installed here as hooks.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import torch
from torch.utils.data import DataLoader

from tuner.harness.metrics import Window, live_figures, unmeasured, window_rate
from tuner.harness.probe_core import ProbeCore
from tuner.harness.system.devices import default_device
from tuner.inputs.script import LOADER_KNOBS
from tuner.scriptmode import trialfile
from tuner.scriptmode.adapters.common import kept_by_script, own_value
from tuner.stats.prune import PruneBar


class Probe(ProbeCore):
    """Times optimizer steps and the data wait inside them::

        probe = tuner.Probe()
        for batch in probe.loader(train_loader):
            ...                      # forward, backward, optimizer.step()
            probe.step()
            if probe.done:
                break
        print(probe.summary())

    Args:
        warmup: steps to skip before measuring (a script-mode trial sets its own).
        measure: steps to measure; ``"auto"`` until samples/s is known within a few
            percent; ``None`` measures every step after warm-up and ``done`` never
            becomes true (a script-mode trial sets its own).
        device: the training device; CUDA step times come from events on its stream.
            Default: this rank's CUDA device where CUDA is available, read at the loop's
            first batch or step (after your ``torch.cuda.set_device``; without one,
            torchrun's ``LOCAL_RANK``), else the host clock; ``cuda`` means the current one.
            The process's peak-memory counters are never reset: ``peak_mem_gib`` is
            ``max_memory_reserved`` since the process started or your own last reset.
        tokens_per_sample: if given, ``tokens_per_s`` is reported.
        flops_per_sample: forward + backward FLOPs of one sample; gives
            ``achieved_tflops``, and ``mfu`` on a GPU of the peak table.
        amp_dtype: the dtype the matmuls run in (``fp32``, ``bf16``, ``fp16``), for the peak.
        nvtx: mark data wait and steps as NVTX ranges (for Nsight Systems).
        monitors: sample host memory (PSS of the process tree) and NVML over the window in
            a background thread, for ``peak_mem_gib``, ``host_mem_gib`` and ``gpu_util``.
        comm_profile: after the window, profile a few steps for ``comm_share``
            (:mod:`tuner.harness.comm_tail`): by default under NCCL with several ranks, where
            the host clock cannot see the collectives (``done`` becomes true after them).
        trace: a folder for a ``torch.profiler`` trace of the measured window,
            ``trace_rank<N>.json`` (Perfetto, ``chrome://tracing``, TensorBoard), written when
            the window closes; what a long step waited on. Under ``tuner.measure --trace DIR``
            a script trial's probe traces its window there without it.
    """

    def __init__(
        self,
        warmup: int = 0,
        measure: int | str | None = None,
        device: torch.device | str | None = None,
        tokens_per_sample: int | None = None,
        *,
        flops_per_sample: float | None = None,
        amp_dtype: str = "fp32",
        nvtx: bool = False,
        monitors: bool = True,
        comm_profile: bool | None = None,
        trace: str | os.PathLike[str] | None = None,
    ) -> None:
        trial = trialfile.read_trial()
        if trial is not None:  # a script-mode trial: the tuner sets the window and its instruments
            warmup, measure = int(trial["warmup"]), trial["measure"]
            nvtx, trace = nvtx or bool(trial.get("nvtx")), trial.get("trace") or trace
        super().__init__(warmup, measure, device if device is not None else default_device(), tokens_per_sample,
                         flops_per_sample=flops_per_sample, amp_dtype=amp_dtype, nvtx=nvtx, monitors=monitors,
                         comm_profile=comm_profile,
                         on_step=_step_check(trial), on_close=_reporter(trial), reset_peaks=False,
                         device_later=default_device if device is None else None)
        self.notes: list[str] = []
        """What the search should know about this trial's numbers (reported with them)."""
        self.unmeasured: dict[str, str] = {}
        """Metrics this loop cannot give, and why (no DataLoader: no data wait): ``None``, never a made-up 0."""
        self._trial = trial
        self._server: Any = None
        self.ran: dict[str, Any] = {}
        """Levers the configuration leaves to the script's library, and what it ran (reported with the numbers)."""
        self.loader_settings: dict[str, Any] = {}
        """The watched DataLoader's own loader levers: what :func:`tuner.diagnose` advises from."""
        self._trace_to = Path(trace) if trace is not None else None
        self._profiler: Any = None
        self.before_report: Callable[[Window], None] | None = None
        """Run on every rank when the window has closed, before its summary is reported: a
        trainer's step on the batch of the largest samples (:attr:`largest_batch_file`)."""
        self._prune = PruneBar.from_json(trial["prune"]) if trial is not None and trial.get("prune") else None
        self._checks = frozenset(trial["prune"]["checks"]) if self._prune is not None else frozenset()

    @property
    def largest_batch_file(self) -> Path | None:
        """Where the run's trials keep the scan of the dataset's sizes, when the trial asks for
        the peak at the batch of the largest samples (``budget.largest_batch``); else ``None``."""
        kept = self._trial.get("largest_batch") if self._trial else None
        return Path(kept) if kept else None

    def live(self) -> dict[str, float]:
        """Figures over the latest steps (up to :data:`RECENT_STEPS`) and totals: what the
        live endpoint serves (:func:`tuner.harness.metrics.live_figures`)."""
        return live_figures(list(self.recent), self.steps_done, self.total_samples, self.total_wait)

    def serve(self, port: int = 9400, addr: str = "127.0.0.1") -> int:
        """Serve the live metrics to Prometheus at ``http://addr:port/metrics`` (needs
        ``prometheus-client``; localhost unless ``addr`` says otherwise); returns the port."""
        from tuner.harness.system.prometheus import serve

        self._server, bound = serve(self.live, port, addr)
        return bound

    def close(self) -> None:
        """Stop the live endpoint, the samplers, the collective timing and a trace whose
        window never closed (nothing written: it would not be the window), whichever run."""
        if self._profiler is not None:
            profiler, self._profiler = self._profiler, None
            profiler.stop()
        super().close()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def step(self, samples: int | None = None) -> None:
        super().step(samples)
        if self._prune is not None and self.measuring_step and self.measured in self._checks:
            self._prune_here()

    def _prune_here(self) -> None:
        """Rank 0 asks the rule on the steps the device has finished; a cut is reported as
        ``pruned`` with the rate at the cut, and the tuner ends the trial's processes."""
        window, rule = self.window, self._prune
        if len(window.step_times) < 2 or rule is None or not rule(window):
            return
        assert self._trial is not None
        self._prune = None
        trialfile.report_pruned(self.measured, window_rate(window, rule.world_size), self._trial)

    def _open_window(self) -> Any:
        """The trace's profiler starts before the window's clock: its start-up is not a step's."""
        if self._trace_to is not None and self._profiler is None:
            from torch.profiler import ProfilerActivity, profile

            cuda = [ProfilerActivity.CUDA] if getattr(self.device, "type", None) == "cuda" else []
            self._profiler = profile(activities=[ProfilerActivity.CPU, *cuda])
            self._profiler.start()
        return super()._open_window()

    def _close_window(self, now: float) -> None:
        """The trace stops after the window's last mark (``now``) and is written before the
        summary is reported, so the trial ends after the file is whole."""
        if self._profiler is not None:
            profiler, self._profiler = self._profiler, None
            profiler.stop()
            assert self._trace_to is not None
            self._trace_to.mkdir(parents=True, exist_ok=True)
            profiler.export_chrome_trace(str(self._trace_to / f"trace_rank{os.environ.get('RANK', '0')}.json"))
        super()._close_window(now)

    def loader(self, iterable: Iterable[Any], transfer: Callable[[Any], Any] | None = None) -> Iterator[Any]:
        """As :meth:`ProbeCore.loader`; in a trial, a DataLoader's own loader settings that
        differ from the trial's are recorded as what ran (the script set them itself)."""
        if isinstance(iterable, DataLoader):  # what the verdicts' advice reads (tuner.diagnose)
            self.loader_settings = {n: own_value(iterable, n) for n in LOADER_KNOBS}
        if self._trial is not None and isinstance(iterable, DataLoader):
            kept = kept_by_script(iterable, self._trial.get("knobs") or {})
            self.ran.update(kept)
            note = ("the script's DataLoader sets " + ", ".join(f"{k}={v}" for k, v in kept.items())
                    + " itself, not the trial's value: recorded as what ran, not searched")
            if kept and note not in self.notes:  # once, however many epochs iterate it
                self.notes.append(note)
        return super().loader(iterable, transfer)

    def summary(self) -> dict[str, Any]:
        out = super().summary()
        out.update(dict.fromkeys(self.unmeasured))
        for name, why in unmeasured([self.window]).items():  # rank 0's own reasons
            self.unmeasured.setdefault(name, why)
        return out


def _step_check(trial: dict[str, Any] | None) -> Any:
    """The second step's sample count, checked against the trial's configuration."""
    if trial is None or "global_batch_size" not in trial:
        return None

    def check(steps_done: int, samples: int) -> None:
        if steps_done == 2:
            trialfile.check_step_samples(samples, trial)

    return check


def _reporter(trial: dict[str, Any] | None) -> Any:
    """At the window's close, the summary (a collective: every rank is there) to the search."""
    if trial is None:
        return None
    def report(probe: Any) -> None:
        if probe.before_report is not None:
            probe.before_report(probe.window)
        trialfile.report(probe.summary(), trial, probe.notes, getattr(probe, "ran", {}), probe.unmeasured)

    return report
