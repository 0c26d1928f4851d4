"""CUDA-only lines run on this CPU against autospecs of the real modules: a misspelled name
or a wrong signature fails here, where the ``torch.cuda.is_available()`` guard hides it
from every other CPU test. Nothing measured under the autospec is a measurement."""

from __future__ import annotations

import json
from unittest import mock

import torch

from tuner.harness.system import nvml


def test_the_allocators_reserve_is_read_through_the_real_torch_cuda_api():
    """``torch.cuda.memoryreserved_bytes`` (no such function) made the NVML sampler thread die
    on its first tick on a GPU, blanking gpu_util and every GPU memory figure."""
    cuda = mock.create_autospec(torch.cuda, instance=False)
    cuda.is_available.return_value = True
    cuda.is_initialized.return_value = True
    cuda.memory_reserved.return_value = 3 * 2**30
    with mock.patch.object(torch, "cuda", cuda):
        assert nvml.reserved_bytes(0) == 3 * 2**30
        assert nvml.reserved_bytes(None) == 0
    cuda.memory_reserved.assert_called_once_with(0)


def _gpu(reserved: int = 2**30, own: int = 3 * 2**30) -> tuple[mock.MagicMock, mock.MagicMock]:
    """Autospecs of the real ``torch.cuda`` and ``pynvml``: a GPU that says this process holds
    ``own`` bytes (NVML) of which its allocator reserved ``reserved``."""
    import os

    import pynvml

    cuda = mock.create_autospec(torch.cuda, instance=False)
    cuda.is_available.return_value = cuda.is_initialized.return_value = True
    cuda.get_device_properties.return_value.uuid = "GPU-0000"
    cuda.memory_reserved.return_value = reserved
    cuda.current_device.return_value = 0
    cuda.device_count.return_value = 1
    cuda.mem_get_info.return_value = (60 * 2**30, 80 * 2**30)
    nvml = mock.create_autospec(pynvml, instance=False)
    nvml.NVMLError = pynvml.NVMLError
    nvml.nvmlDeviceGetHandleByUUID.return_value = "handle"
    nvml.nvmlDeviceIsMigDeviceHandle.return_value = False
    nvml.nvmlDeviceGetUtilizationRates.return_value = mock.Mock(gpu=50)
    nvml.nvmlDeviceGetMemoryInfo.return_value = mock.Mock(used=20 * 2**30)
    nvml.nvmlDeviceGetComputeRunningProcesses.return_value = [mock.Mock(pid=os.getpid(), usedGpuMemory=own)]
    return cuda, nvml


def test_the_nvml_sampler_thread_survives_its_first_tick_and_records():
    """The sampler thread that died on the typo's first tick: now it samples on, and gives
    utilization, the device's used memory and this process's own (NVML's count)."""
    import time

    from tuner.harness.system.monitors import GpuUtil

    cuda, nvml = _gpu()
    with mock.patch.object(torch, "cuda", cuda), mock.patch.dict("sys.modules", {"pynvml": nvml}):
        gpu = GpuUtil(0, interval=0.005).start()
        deadline = time.monotonic() + 5
        while len(gpu.samples) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        alive = gpu._thread is not None and gpu._thread.is_alive()  # the thread under test
        gpu.stop()
    assert alive and len(gpu.samples) >= 3 and gpu.samples[0][1] == 0.5
    assert gpu.peak_used == 20 * 2**30 and gpu.peak_own == 3 * 2**30
    nvml.nvmlDeviceGetHandleByUUID.assert_called_with("GPU-0000")
    cuda.memory_reserved.assert_called_with(0)


def test_the_device_budget_is_the_free_memory_plus_what_this_process_holds():
    """The room a trial has on its GPU: cudaMemGetInfo's free bytes (context, NCCL and other
    processes already out) plus this process's own, NVML's count where larger than the
    allocator's reserve."""
    from tuner.harness.system.devices import room

    cuda, nvml = _gpu(reserved=2**30, own=3 * 2**30)
    with mock.patch.object(torch, "cuda", cuda), mock.patch.dict("sys.modules", {"pynvml": nvml}):
        assert room(torch.device("cuda", 0)) == 60 * 2**30 + 3 * 2**30
    cuda.mem_get_info.assert_called_once_with(torch.device("cuda", 0))


def test_a_one_process_search_claims_no_gpu_before_a_trial_needs_it(monkeypatch):
    """``torch.cuda.set_device`` opens a CUDA context (CUDA 12): a script-mode search, which
    trains nothing in its own process, held ~0.5 GiB of GPU 0 for its whole run. One process
    keeps the default device without the call; under torchrun each rank still claims its own."""
    from tuner.harness import distributed

    cuda, _ = _gpu()
    cuda.device_count.return_value = 8
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    with mock.patch.object(torch, "cuda", cuda):
        ctx = distributed.context()
    assert ctx.device == torch.device("cuda", 0) and ctx.world_size == 1
    cuda.set_device.assert_not_called()
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setattr(distributed, "ensure_process_group", lambda device: None)
    with mock.patch.object(torch, "cuda", cuda):
        ctx = distributed.context()
    cuda.set_device.assert_called_once_with(torch.device("cuda", 3))


def _events(cuda: mock.MagicMock, ms: float) -> None:
    """``torch.cuda.Event`` autospecced: every pair of events ``ms`` milliseconds apart."""
    cuda.Event = mock.create_autospec(torch.cuda.Event)
    cuda.Event.return_value.elapsed_time.return_value = ms
    cuda.Event.return_value.query.return_value = True


def test_the_cuda_event_timer_records_on_the_devices_stream_and_reads_milliseconds():
    """The window's clock on a GPU (:class:`tuner.harness.timing.CudaEvents`): an event
    recorded on the device's current stream a mark, read in milliseconds after the window."""
    from tuner.harness import timing

    cuda = mock.create_autospec(torch.cuda, instance=False)
    _events(cuda, 12.5)
    device = torch.device("cuda", 0)
    with mock.patch.object(torch, "cuda", cuda):
        clock = timing.source_for(device)
        a, b = clock.mark(), clock.mark()
        assert isinstance(clock, timing.CudaEvents) and clock.seconds(a, b) == 0.0125 and clock.reached(b)
        clock.wait(b)
    cuda.Event.assert_called_with(enable_timing=True)
    cuda.current_stream.assert_called_with(device)
    cuda.Event.return_value.record.assert_called_with(cuda.current_stream.return_value)
    cuda.Event.return_value.synchronize.assert_called_once_with()


def test_the_pipeline_clock_times_stage_work_with_events_and_synchronises_once():
    from tuner.trial.engines.pipeline_clock import PipelineClock

    cuda = mock.create_autospec(torch.cuda, instance=False)
    _events(cuda, 4.0)
    with mock.patch.object(torch, "cuda", cuda):
        clock = PipelineClock(torch.device("cuda", 0))
        clock.step(lambda: None)
        assert clock.idle_s(0.0, float("inf")) == 0.004  # one step of 4 ms, no stage work seen
    cuda.synchronize.assert_called_once_with()


def test_a_windows_device_peaks_come_from_the_allocators_counters():
    """The allocator's reserved and allocated peaks after a window on a GPU, its counters reset
    before it (:class:`tuner.harness.system.monitors.WindowMonitors`)."""
    from types import SimpleNamespace

    from tuner.harness.system.monitors import WindowMonitors

    cuda, nvml = _gpu()
    cuda.max_memory_reserved.return_value, cuda.max_memory_allocated.return_value = 5 * 2**30, 4 * 2**30
    device = torch.device("cuda", 0)
    with mock.patch.object(torch, "cuda", cuda), mock.patch.dict("sys.modules", {"pynvml": nvml}):
        monitors = WindowMonitors(device, 0.05, reset_peaks=True)
        window = SimpleNamespace(wall_s=0.1)
        monitors.stop(window, 0.0)
    cuda.reset_peak_memory_stats.assert_called_once_with(device)
    assert window.peak_device_bytes == 5 * 2**30 and window.peak_allocated_bytes == 4 * 2**30
    cuda.max_memory_reserved.assert_called_with(device)


def test_a_trials_allocator_figures_are_its_peaks_and_the_retries_inside_it():
    """The in-process trial's allocator bookends on a GPU (tuner/trial/run.py): peaks reset
    before, read after; retries and OOMs as the difference of the allocator's counters."""
    from types import SimpleNamespace

    from tuner.trial import run

    cuda = mock.create_autospec(torch.cuda, instance=False)
    cuda.memory_stats.side_effect = [{"num_alloc_retries": 2, "num_ooms": 0}, {"num_alloc_retries": 5, "num_ooms": 1}]
    cuda.max_memory_reserved.return_value, cuda.max_memory_allocated.return_value = 7 * 2**30, 6 * 2**30
    device, window = torch.device("cuda", 1), SimpleNamespace()
    with mock.patch.object(torch, "cuda", cuda):
        before = run._allocator_start(device)
        run._allocator_end(window, device, before)
    cuda.reset_peak_memory_stats.assert_called_once_with(device)
    assert (window.peak_device_bytes, window.peak_allocated_bytes) == (7 * 2**30, 6 * 2**30)
    assert (window.alloc_retries, window.cuda_ooms) == (3, 1)


def test_expandable_segments_set_and_put_back_through_the_allocators_setter():
    from tuner.inputs.levers import process

    cuda = mock.create_autospec(torch.cuda, instance=False)
    cuda.is_available.return_value = True
    with mock.patch.object(torch, "cuda", cuda):
        restore = process.expandable_segments(True)
        restore()
    assert [c.args for c in cuda.memory._set_allocator_settings.call_args_list] == [
        ("expandable_segments:True",), ("expandable_segments:False",)]
    assert cuda.empty_cache.call_count == 2


def test_each_rank_takes_its_local_gpu_and_a_lone_process_keeps_the_default(monkeypatch):
    """Under torchrun every rank claims GPU LOCAL_RANK (rank 3 of 4 on two nodes of two GPUs:
    its node's second); one process alone does not call set_device (under CUDA 12 it opens a
    context: ~0.5 GiB of GPU 0 for a script-mode search that never trains there)."""
    from tuner.harness import distributed

    cuda = mock.create_autospec(torch.cuda, instance=False)
    cuda.is_available.return_value, cuda.device_count.return_value = True, 2
    monkeypatch.setattr(distributed, "ensure_process_group", lambda device: None)
    with mock.patch.object(torch, "cuda", cuda):
        for var, value in (("WORLD_SIZE", "4"), ("RANK", "3"), ("LOCAL_RANK", "1"), ("LOCAL_WORLD_SIZE", "2")):
            monkeypatch.setenv(var, value)
        ctx = distributed.context()
        assert ctx.device == torch.device("cuda", 1) and ctx.world_size == 4
        cuda.set_device.assert_called_once_with(torch.device("cuda", 1))
        for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
            monkeypatch.delenv(var)
        cuda.set_device.reset_mock()
        assert distributed.context().device == torch.device("cuda", 0)
        cuda.set_device.assert_not_called()


def test_exposed_communication_on_a_gpu_is_nccl_kernels_no_compute_kernel_covers():
    """The CUDA definition of :func:`tuner.harness.comm.exposed_share` on a kernel trace: an
    all-reduce of 10 us of which compute kernels cover 4, over a 20 us span: 0.3."""
    from tuner.harness.comm import exposed_share

    events = [{"ph": "X", "cat": "kernel", "name": "ampere_sgemm_128x64", "ts": 0.0, "dur": 8.0},
              {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "ts": 4.0, "dur": 10.0},
              {"ph": "X", "cat": "kernel", "name": "elementwise_kernel", "ts": 14.0, "dur": 6.0},
              {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "ts": 3.0, "dur": 1.0}]
    assert exposed_share(events, 20.0, "cuda") == 0.3


def test_the_callers_cuda_generators_are_put_back_as_found():
    """A library call leaves the caller's CUDA random state as it found it
    (:mod:`tuner.harness.caller_state`): every device's generator saved, then restored."""
    from tuner.harness import caller_state

    cuda = mock.create_autospec(torch.cuda, instance=False)
    cuda.is_available.return_value = cuda.is_initialized.return_value = True
    cuda.get_rng_state_all.return_value = ["gpu0 state", "gpu1 state"]
    with mock.patch.object(torch, "cuda", cuda):
        state = caller_state._rng_state()
        caller_state._set_rng_state(state)
    assert state["cuda"] == ["gpu0 state", "gpu1 state"]
    cuda.set_rng_state_all.assert_called_once_with(["gpu0 state", "gpu1 state"])


def test_nvtx_ranges_go_through_torch_cuda_nvtx(monkeypatch):
    from tuner.harness import nvtx

    cuda = mock.create_autospec(torch.cuda, instance=False)
    monkeypatch.setattr(nvtx, "available", lambda: True)
    with mock.patch.object(torch, "cuda", cuda):
        ranges = nvtx.Ranges(True)
        ranges.push("forward")
        ranges.pop()
    cuda.nvtx.range_push.assert_called_once_with("forward")
    cuda.nvtx.range_pop.assert_called_once_with()


def test_a_plan_without_a_memory_budget_reads_the_least_room_over_the_ranks(monkeypatch, tmp_path):
    """``tuner plan`` on GPUs without ``budget.memory_gib``: each rank's room
    (:func:`tuner.harness.system.devices.room`), the least of them (here another rank's GPU
    has 12 GiB where this one has 40), in GiB, with where it came from."""
    import tuner
    from tuner.harness import distributed
    from tuner.harness.system import devices
    from tuner.inputs.machine import Machine
    from tuner.memory import capacity

    from conftest import toy_recipe

    monkeypatch.setattr(devices, "room", lambda device=None: 40 * 2**30)
    monkeypatch.setattr(distributed, "all_gather", lambda obj: [obj, 12 * 2**30])
    recipe = tuner.load_recipe(toy_recipe(tmp_path))
    gib, why = capacity.plan_budget(recipe, Machine(cuda=True, bf16=True, fp16=True), torch.device("cuda", 0))
    assert gib == 12.0 and why.startswith("the least over the ranks of each GPU's free memory at start")


def test_a_traced_window_on_a_gpu_asks_the_profiler_for_the_cuda_activity(tmp_path):
    """``tuner.Probe(trace=DIR)`` on a CUDA device: the profiler records the CPU and CUDA
    activities over the window (kineto accepts both on this CPU build; the CUDA side records
    nothing here), and the file is written when the window closes."""
    import torch._dynamo.device_interface  # imported before the autospec, as in any process
    from torch.profiler import ProfilerActivity

    import tuner

    cuda = mock.create_autospec(torch.cuda, instance=False)
    _events(cuda, 3.0)
    real = torch.profiler.profile
    asked: list[list[ProfilerActivity]] = []

    def profile(activities):
        asked.append(list(activities))
        return real(activities=activities)

    with mock.patch.object(torch, "cuda", cuda), mock.patch("torch.profiler.profile", profile):
        probe = tuner.Probe(warmup=1, measure=3, device="cuda:0", monitors=False, comm_profile=False,
                            trace=tmp_path)
        for _ in range(4):
            probe.step(samples=2)
        assert probe.done
    assert asked == [[ProfilerActivity.CPU, ProfilerActivity.CUDA]]
    assert "traceEvents" in json.loads((tmp_path / "trace_rank0.json").read_text())
