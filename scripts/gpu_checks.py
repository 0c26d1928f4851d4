"""The checks ``scripts/gpu_acceptance.py`` runs on one GPU, in four groups of under four
minutes each (``--group N``; the fourth: the levers of a 2026 GPU), each a tuner measurement
against a truth the tuner does not compute. Rules: :data:`gpu_acceptance.RULES`; the task
measured: ``scripts/gpu_task.py``.

What one GPU cannot show: NCCL refuses two ranks on one device, so the two-rank checks run
over gloo (CUDA tensors, collectives staged through the host): they check that the engines
train and that a failed sharded trial ends the search for a re-run; how fast NCCL is, and
``comm_share`` (the profiled NCCL kernels), need a node with two GPUs.
"""

from __future__ import annotations

import contextlib
import csv
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

import gpu_task
from gpu_acceptance import ROOT, Check, Row, failed, judge, not_here

TASK = Path(gpu_task.__file__).resolve()
GIB = 2**30


class Lab:
    """Recipes, the device, and the plain-loop truths shared by the checks."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.micro = gpu_task.MICRO

    def recipe(self, name: str, task_args: dict[str, Any] | None = None, measure: int = 30, warmup: int = 5,
               batch: int | None = None, **extra: Any) -> Path:
        import yaml

        body = {"name": name, "task": str(TASK), "task_args": task_args or {},
                "global_batch_size": batch or self.micro,
                "steps": {"warmup": warmup, "measure": measure, "repeats": 1}, "out": str(self.folder / name), **extra}
        path = self.folder / f"{name}.yaml"
        path.write_text(yaml.safe_dump(body))
        return path

    def measure(self, name: str, task_args: dict[str, Any] | None = None, measure: int = 30,
                batch: int | None = None, **knobs: Any) -> Any:
        import tuner

        return tuner.measure(self.recipe(name, task_args, measure, batch=batch), **knobs)

    def plain(self, steps: int, **kwargs: Any) -> dict[str, float]:
        """:meth:`_plain`, then its model, optimizer and cached blocks released."""
        out = self._plain(steps, **kwargs)
        gc.collect()
        torch.cuda.empty_cache()
        return out

    def _plain(self, steps: int, sleep_ms: float = 0.0, payload: int = 0, pin: bool = False,
               dtype: torch.dtype | None = None, compiled: bool = False, model: str = "mlp",
               batch: int | None = None) -> dict[str, float]:
        """The same training step without the tuner: the batch built on the host, ``sleep_ms``
        of host time (the slow loader), the copy, forward, backward, AdamW. Timed with a
        synchronize around the steps after 3 warm-up steps; ``first_s`` is the first
        (compiling) step's own time; ``host_share`` the share of the loop's time the host
        spent blocked in the loader's sleep and the copy (what a tuner reading the host clock
        would call data wait). ``compiled``: each block compiled, as the tuner does."""
        torch.manual_seed(0)
        args = {"model": model}
        net = gpu_task.build_model(args).to(self.device)
        if compiled:  # the blocks are nn.Linear: Module.compile() would compile nothing (torch's frames)
            for block in gpu_task.blocks(net) or [net]:
                block.forward = torch.compile(block.forward)
        opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
        data = gpu_task.Synthetic(64, payload, model)
        n = batch or self.micro
        rows = [data[i % 64] for i in range(n)]
        host = torch.utils.data.default_collate(rows)
        if pin:
            host = [t.pin_memory() for t in host]
        blocked = 0.0

        def one() -> None:
            nonlocal blocked
            t0 = time.perf_counter()
            if sleep_ms:
                time.sleep(sleep_ms / 1000.0)
            on = [t.to(self.device, non_blocking=pin) for t in host]
            blocked += time.perf_counter() - t0
            with torch.autocast("cuda", dtype=dtype) if dtype else contextlib.nullcontext():
                loss = nn.functional.cross_entropy(net(on[0]), on[1])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        torch.cuda.synchronize()
        start = time.perf_counter()
        one()
        torch.cuda.synchronize()
        first = time.perf_counter() - start
        for _ in range(2):
            one()
        torch.cuda.reset_peak_memory_stats(self.device)
        torch.cuda.synchronize()
        blocked, start = 0.0, time.perf_counter()
        for _ in range(steps):
            one()
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
        return {"step_s": wall / steps, "first_s": first, "host_share": blocked / wall,
                "reserved": float(torch.cuda.max_memory_reserved(self.device)),
                "allocated": float(torch.cuda.max_memory_allocated(self.device))}

    def traced(self, name: str, task_args: dict[str, Any] | None = None, measure: int = 20,
               **knobs: Any) -> tuple[Any, dict[str, float]]:
        """A tuner measurement whose measured window is also traced by the profiler, and the
        truth read from that trace of the same run: over the device's span from the
        window's first GPU activity to its last, the share it sat idle or copying to the
        device (the exposed data wait), and the share of host-to-device copies."""
        import tuner

        folder = self.folder / f"{name}_trace"
        m = tuner.measure(self.recipe(name, task_args, measure), trace=folder, **knobs)
        events = json.loads((folder / "trace_rank0.json").read_text())["traceEvents"]
        device = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
        if not device:
            raise RuntimeError("the profiler's trace holds no GPU activity (CUPTI missing?)")
        start = min(float(e["ts"]) for e in device)
        end = max(float(e["ts"]) + float(e["dur"]) for e in device)

        def h2d(e: dict[str, Any]) -> bool:
            return e["cat"] == "gpu_memcpy" and "HtoD" in e["name"]

        busy = _union([(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in device if not h2d(e)])
        copies = _union([(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in device if h2d(e)])
        span = end - start
        return m, {"wait": 1.0 - busy / span, "copy": copies / span}


def _union(intervals: list[tuple[float, float]]) -> float:
    """Total length of ``intervals`` merged (the tuner's own interval union)."""
    from tuner.harness.comm import union

    return sum(b - a for a, b in union(intervals))


def nvml_used_bytes(index: int) -> int | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByUUID(device_uuid(index))
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
    except Exception:  # noqa: BLE001 - no NVML: the row says so
        return None


def device_uuid(index: int) -> str:
    """CUDA device ``index``'s UUID as NVML and nvidia-smi name it."""
    uuid = str(torch.cuda.get_device_properties(index).uuid)
    return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"


def smi_samples(query: str, work: Callable[[], Any], gpus: list[str] | None = None) -> list[tuple[float, float]]:
    """``(perf_counter, value)`` of ``nvidia-smi --query-gpu=QUERY`` on ``gpus`` (UUIDs; the
    current GPU's by default), summed over them, sampled every 0.1 s while ``work()`` runs
    (none where nvidia-smi does not answer). By UUID: nvidia-smi's index is NVML's, not CUDA's."""
    samples: list[tuple[float, float]] = []
    stop = threading.Event()
    ids = ",".join(gpus or [device_uuid(torch.cuda.current_device())])

    def sample() -> None:
        while not stop.is_set():
            try:
                out = subprocess.run(["nvidia-smi", f"--id={ids}", f"--query-gpu={query}",
                                      "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=5)
                samples.append((time.perf_counter(), sum(float(v) for v in out.stdout.split())))
            except (OSError, ValueError, IndexError, subprocess.SubprocessError):
                return
            stop.wait(0.1)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        work()
    finally:
        stop.set()
        thread.join()
    return samples


def smi_utilization(work: Callable[[], Any]) -> float | None:
    """Mean ``nvidia-smi`` utilization.gpu over ``work()``."""
    samples = smi_samples("utilization.gpu", work)
    return statistics.fmean(v / 100.0 for _, v in samples) if samples else None


def command(*args: str, timeout: float = 300, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})


def torchrun(*args: str, timeout: float = 300, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return command("-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *args, timeout=timeout,
                   env={"TUNER_DIST_BACKEND": "gloo", **(env or {})})


# --- group 1: timing and memory ------------------------------------------------------------

def step_time(lab: Lab, seen: dict[str, Any]) -> list[Row]:
    m = lab.measure("base", pin_memory=True, num_workers=0)
    seen["base"] = m
    truth: dict[str, float] = {}
    used = smi_samples("memory.used", lambda: truth.update(lab.plain(30)))  # MiB, nvidia-smi's own process
    seen["plain"], seen["plain_used"] = truth, max((v for _, v in used), default=None)
    tuner_step = lab.micro / m.metrics["samples_per_s"]
    return [judge("step time: tuner (CUDA events) vs a synchronized plain loop, s", "within_10pct", tuner_step,
                  truth["step_s"])]


def data_wait(lab: Lab, seen: dict[str, Any]) -> list[Row]:
    """The loop ahead of the device (the host's loader time hides under the device's step:
    the device never waits, while the host's own clock says it waited half the time), and
    the device waiting (the loader longer than the step)."""
    base = seen["plain"]["step_s"]
    ahead = 0.5 * base * 1000
    m, truth = lab.traced("ahead", {"sleep_ms": ahead}, pin_memory=True, num_workers=0)
    naive = lab.plain(20, sleep_ms=ahead, pin=True)["host_share"]
    rows = [judge("data wait, the loop ahead of the device (loader 0.5 x step): tuner vs trace", "wait_ahead",
                  m.metrics["data_wait_share"], truth["wait"], f"host clock {naive:.2f}", naive=naive)]
    for factor in (1.5, 3.0):
        m, truth = lab.traced(f"behind{factor}", {"sleep_ms": factor * base * 1000}, pin_memory=True,
                              num_workers=0)
        rows.append(judge(f"data wait, the device waiting (loader {factor} x step): tuner vs trace", "wait_idle",
                          m.metrics["data_wait_share"], truth["wait"]))
    return rows


PAYLOAD = 1 << 15
"""128 KiB of floats a sample, 64 MiB a batch: about 1.3 ms pinned, 4-6 ms pageable, on a
13 ms step, collated by 8 workers (the step stays the device's)."""


def transfer(lab: Lab, seen: dict[str, Any]) -> list[Row]:
    """Copies on a GPU-bound step: the copy's share as the trace shows it, pinned and
    pageable; and the pageable copy's data wait, which is the copy (the device idle for
    it), not the host's wait for the earlier kernels the copy queues behind (what a tuner
    reading the host clock around ``.to()`` would call input-transfer-bound)."""
    rows = []
    for pin in (True, False):
        m, truth = lab.traced(f"copy{int(pin)}", {"payload": PAYLOAD}, pin_memory=pin, num_workers=8)
        rows.append(judge(f"transfer share, pin_memory={pin}: tuner vs the trace's host-to-device copies", "transfer",
                          m.metrics["transfer_share"], truth["copy"]))
        if not pin:
            plain = lab.plain(20, payload=PAYLOAD, pin=False)
            naive = plain["host_share"]
            rows.append(judge("data wait with a pageable copy on a GPU-bound step: tuner vs trace", "pageable_wait",
                              m.metrics["data_wait_share"], truth["wait"],
                              f"host clock {naive:.2f}; the trace's copies {truth['copy']:.2f} of the step",
                              naive=naive, copy=truth["copy"]))
    return rows


HELD_GIB = 20
HOLDER = f"""
import sys, time, torch
x = torch.empty({HELD_GIB} * 2**30, dtype=torch.uint8, device="cuda")
print("held", flush=True)
time.sleep(600)
"""


def memory(lab: Lab, seen: dict[str, Any]) -> list[Row]:
    from tuner.harness.system.devices import room

    m, truth = seen["base"], seen["plain"]
    x = m.metrics
    rows = [judge("peak_mem_gib (the allocator's reserve) vs a plain loop's max_memory_allocated, GiB",
                  "reserve_over_allocated", x["peak_mem_gib"], truth["allocated"] / GIB,
                  f"the plain loop's own reserve {truth['reserved'] / GIB:.3f}")]
    smi = seen["plain_used"]
    rows.append(judge("gpu_mem_used_gib vs nvidia-smi's memory.used (its own process) over the plain loop, GiB",
                      "within_10pct", x["gpu_mem_used_gib"], None if smi is None else smi / 1024))
    rows.append(judge("gpu_mem_process_gib: above the allocator's peak, within the device's used, GiB",
                      "process_memory", x.get("gpu_mem_process_gib"), None, low=x["peak_mem_gib"],
                      high=x["gpu_mem_used_gib"]))
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held", "the holder did not start"
        total = torch.cuda.get_device_properties(lab.device).total_memory
        used = nvml_used_bytes(lab.device.index or 0)
        mine = torch.cuda.memory_reserved(lab.device)
        got = room(lab.device)
    finally:
        holder.kill()
        holder.wait()
    truth_room = None if used is None else total - used + mine
    rows.append(judge(f"the search's default budget with another process holding {HELD_GIB} GiB: room vs "
                      "free + own (NVML), GiB", "budget", got / GIB, None if truth_room is None else truth_room / GIB,
                      total=total / GIB, held=HELD_GIB))
    return rows


def flops(lab: Lab, seen: dict[str, Any]) -> list[Row]:
    """A transformer block with attention (SDPA on CUDA): FLOPs a sample counted by the
    tuner (its meta-device pass) vs nanoGPT's 6N + 12 L H Q T by hand."""
    m = lab.measure("transformer", {"model": "transformer"}, measure=10, batch=64)
    counted = m.metrics["achieved_tflops"] * 1e12 / m.metrics["samples_per_s"]
    return [judge("FLOPs a sample of a transformer with attention: tuner vs by hand", "within_1pct", counted,
                  gpu_task.analytic_flops_per_sample(model="transformer"))]


def mfu(lab: Lab, seen: dict[str, Any]) -> list[Row]:
    """A compute-bound stack of bf16 matmuls (8192 wide, 1024 samples a step): the tuner's
    achieved TFLOP/s against the analytic FLOPs over a synchronized plain loop's step, a truth
    that reads no peak (before, both sides divided by the tuner's own peak, so a wrong peak
    cancelled, and a 512-wide stack measured the loop's overhead); then the peak table's bf16
    figure as an upper bound of what one dense 8192^3 bf16 matmul reaches here, and no more
    than twice it (a peak far above what the part does would make every MFU small)."""
    from tuner.harness.system.flops import peak_flops

    m = lab.measure("matmul", {"model": "matmul"}, measure=30, batch=1024, amp_dtype="bf16")
    plain = lab.plain(30, dtype=torch.bfloat16, model="matmul", batch=1024)
    truth = gpu_task.analytic_flops_per_sample(gpu_task.MATMUL_WIDTH, "matmul") * 1024 / plain["step_s"] / 1e12
    peak = peak_flops(lab.device, "bf16")
    dense = dense_matmul_tflops(lab.device)
    return [judge("achieved TFLOP/s of a bf16 matmul stack: tuner vs analytic FLOPs / synchronized plain step",
                  "within_10pct", m.metrics["achieved_tflops"], truth, f"MFU {m.metrics['mfu']}"),
            judge("the table's bf16 peak, TFLOP/s, against a dense 8192^3 bf16 matmul here", "peak_bound",
                  None if peak is None else peak / 1e12, dense)]


def dense_matmul_tflops(device: Any, n: int = 8192, repeats: int = 20) -> float:
    """TFLOP/s of one bf16 ``n`` x ``n`` x ``n`` matmul, synchronized, the best of ``repeats``."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize(device)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    del a, b
    torch.cuda.empty_cache()
    return 2 * n**3 / best / 1e12


# --- group 2: failures, engines, compile ----------------------------------------------------

def ooms(lab: Lab, seen: dict[str, Any]) -> list[Row]:
    before = lab.measure("before_oom", pin_memory=True, num_workers=0, measure=10)
    rows = []
    for where in ("forward_oom", "backward_oom"):
        m = lab.measure(where, {"fail": where}, measure=5)
        rows.append(judge(f"an OOM in the {where.split('_')[0]} is recorded as oom", "equal", m.state, "oom",
                          (m.reason or "")[:80]))
    again = lab.measure("after_oom", pin_memory=True, num_workers=0, measure=10)
    rows.append(judge("the next trial's peak after two OOMs vs before them, GiB", "within_3pct",
                      again.metrics["peak_mem_gib"], before.metrics["peak_mem_gib"]))
    return rows


def poisoned(lab: Lab, seen: dict[str, Any]) -> list[Row]:
    recipe = lab.recipe("assert", {"fail": "device_assert"}, measure=5)
    proc = command("-m", "tuner.measure", str(recipe), "--repeats", "3", "--json", timeout=240)
    try:
        out = json.loads(proc.stdout)
    except json.JSONDecodeError:
        out = {}
    said = "this process stopped there" in proc.stderr
    got = f"{out.get('state')}, {len(out.get('repeats') or [])} run, said={said}"
    return [judge("a device-side assert: recorded, no further repeat, one line", "equal", got,
                  "error, 1 run, said=True", (out.get("reason") or proc.stderr[-120:])[:100])]


def resume(lab: Lab, seen: dict[str, Any]) -> list[Row]:
    """A sticky CUDA error in the second trial: the search records it and exits 75; the same
    command resumes and its later trials succeed (the error's trial not run again)."""
    recipe = lab.recipe("sticky", {"fail": "device_assert", "fail_micro": 256}, measure=5,
                        baseline={"micro_batch_size": 512}, space={"micro_batch_size": [512, 256, 128]},
                        budget={"trials": 3})
    cmd = ("-m", "tuner.search", str(recipe), "--confirm", "0", "--attribute", "0", "--quiet")
    first, second = command(*cmd, timeout=240), command(*cmd, timeout=240)
    table = lab.folder / "sticky" / "trials.csv"
    if not table.exists():
        last = (second.stderr or first.stderr or "").strip().splitlines()[-1:] or ["no output"]
        return [failed("after a sticky CUDA error: exit 75, then the same command finishes the search",
                       f"exits {first.returncode}, {second.returncode}, no trials.csv: {last[0][:160]}")]
    with open(table, newline="") as f:
        rows = list(csv.DictReader(f))
    states = {r["micro_batch_size"]: r["state"] for r in rows}
    ok = first.returncode == 75 and second.returncode == 0 and states.get("256") == "error" \
        and states.get("512") == "ok" and states.get("128") == "ok" and len(rows) == 3
    return [judge("after a sticky CUDA error: exit 75, then the same command finishes the search", "true", ok,
                  True, f"exits {first.returncode}, {second.returncode}; {states}")]


def precisions(lab: Lab, seen: dict[str, Any]) -> list[Row]:
    """ZeRO-2 and FSDP2 in bf16 and fp16: each of 20 steps' losses against fp32's of the same
    seed and data (after the optimizer steps too, where a wrong cast or an unscaled fp16
    gradient shows; the first loss alone is before any step)."""
    rows = []
    reference = lab.measure("fp32_ref", measure=20).repeats[0].losses
    for engine, knobs in (("DeepSpeed ZeRO-2", {"zero_stage": 2}), ("FSDP2", {"fsdp": "full_shard"})):
        for dtype in ("bf16", "fp16"):
            m = lab.measure(f"{engine.split()[0]}_{dtype}", measure=20, amp_dtype=dtype, **knobs)
            losses = m.repeats[0].losses if m.state == "ok" and m.repeats else None
            rows.append(judge(f"{engine} {dtype}: every step's loss of 20 vs fp32's", "losses_5pct", losses,
                              reference, f"{m.state} {(m.reason or '')[:60]}"))
    return rows


def offload(lab: Lab, seen: dict[str, Any]) -> list[Row]:
    """ZeRO-2 with the optimizer on the host: DeepSpeed's own fp32 partitions are pinned
    (read with ``is_pinned()``), as ``ds_config.json`` exports."""
    from tuner.inputs.library_configs import ds_config
    from tuner.inputs.plan import Plan
    from tuner.trial.engines import deepspeed_engine

    pinned: list[bool] = []
    init = deepspeed_engine.DeepSpeedEngine.__init__

    def recording(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        parts = getattr(self.model.optimizer, "single_partition_of_fp32_groups", None) or []
        pinned.extend(bool(t.is_pinned()) for t in parts)

    deepspeed_engine.DeepSpeedEngine.__init__ = recording  # type: ignore[method-assign]
    try:
        m = lab.measure("offload", measure=3, zero_stage=2, offload_optimizer="cpu")
    finally:
        deepspeed_engine.DeepSpeedEngine.__init__ = init  # type: ignore[method-assign]
    config = Plan.of(1, "deepspeed", micro_batch_size=lab.micro, grad_accum_steps=1, zero_stage=2,
                       offload_optimizer="cpu")
    exported = ds_config(config, cuda=True)["zero_optimization"]["offload_optimizer"].get("pin_memory")
    ok = m.state == "ok" and bool(pinned) and all(pinned) and exported is True
    return [judge("ZeRO-2 offload: the host partitions are pinned, and ds_config.json says so", "true", ok, True,
                  f"{m.state}; {sum(pinned)}/{len(pinned)} pinned; exported pin_memory={exported}")]


def compile_time(lab: Lab, seen: dict[str, Any]) -> list[Row]:
    """compile_s (dynamo's counters) against a plain loop's first-step excess, each compiling
    the same blocks with inductor's cache already warm (a run of each before): like with
    like, where a cold whole-model compile against a warm per-block one failed for that."""
    import torch._dynamo

    lab.measure("compile_warm", measure=5, compile=True)
    torch._dynamo.reset()
    lab.plain(3, compiled=True)
    torch._dynamo.reset()
    plain = lab.plain(10, compiled=True)
    torch._dynamo.reset()
    m = lab.measure("compiled", measure=10, compile=True)
    excess = plain["first_s"] - plain["step_s"]
    return [judge("compile_s vs a plain loop's first-step excess, both warm, s", "compile",
                  m.metrics["compile_s"] if m.metrics else None, excess)]


# --- group 3: the search, processes, script mode ---------------------------------------------

def smi_power_w(work: Callable[[], Any], skip_s: float = 1.0) -> float | None:
    """Mean ``nvidia-smi`` power.draw (W) over ``work()``, the first ``skip_s`` left out (the
    reading averages over the last second on recent drivers, so its first samples still hold
    the idle device)."""
    start = time.perf_counter()
    kept = [w for t, w in smi_samples("power.draw", work) if t - start >= skip_s]
    return statistics.fmean(kept) if kept else None


def energy(lab: Lab, seen: dict[str, Any]) -> list[Row]:
    """Energy a sample: the tuner's ``energy_j_per_sample`` (NVML's total-energy counter
    read at the window's ends, over the window's samples) against the device's own power
    draw as ``nvidia-smi`` reports it over a plain loop of the same step, times that loop's
    step time, over the micro-batch. A tuner counting the node once per rank, or reading
    the counter's millijoules as joules, is off by the ranks or by 1000."""
    m = lab.measure("energy", measure=400, pin_memory=True, num_workers=0)
    x = m.metrics
    plain: dict[str, float] = {}
    watts = smi_power_w(lambda: plain.update(lab.plain(500, pin=True)))
    truth = None if watts is None or not plain else watts * plain["step_s"] / lab.micro
    tuner_w = None
    if x.get("energy_j_per_sample") is not None and x.get("samples_per_s"):
        tuner_w = x["energy_j_per_sample"] * x["samples_per_s"]
    return [judge("energy_j_per_sample (NVML's counter over the window) vs nvidia-smi's power.draw x the "
                  "plain step / micro-batch, J", "within_15pct", x.get("energy_j_per_sample"), truth,
                  f"tuner {tuner_w and round(tuner_w, 1)} W at {x.get('samples_per_s', 0):.0f} samples/s; "
                  f"nvidia-smi {watts and round(watts, 1)} W at a {plain.get('step_s', 0) * 1000:.2f} ms step"
                  + "".join(f"; {n}" for n in m.notes if n.startswith("energy")))]


def utilization(lab: Lab, seen: dict[str, Any]) -> list[Row]:
    step = lab.plain(10)["step_s"]
    sleep_ms = 2.0 * step * 1000
    m = lab.measure("util", {"sleep_ms": sleep_ms}, pin_memory=True, num_workers=0)
    smi = smi_utilization(lambda: lab.plain(max(5, int(5.0 / (sleep_ms / 1000.0))), sleep_ms=sleep_ms))
    return [judge("gpu_util (NVML) vs nvidia-smi on a loader-bound loop", "utilization", m.metrics["gpu_util"], smi)]


def search(lab: Lab, seen: dict[str, Any]) -> list[Row]:
    """A search on one GPU end to end: the budget kept (a micro-batch over it skipped by the
    memory model or measured over it, never the answer), one made slow (the task sleeps
    below 2048) pruned on its CUDA-event steps, the answer written out with its configs.

    The MLP is 1024 wide and the global batch 16,384, so activations rule the peak (at the
    default width AdamW's step over 210 M parameters set it: an H200 read 4.18 GiB at a
    micro-batch of 1024 and 4.14 at 8192). The budget bounds what the process holds on the
    device, its CUDA context included (``gpu_mem_process_gib``, as the search judges it):
    halfway between the two probes' process memory. Halfway between their allocator peaks
    (0.21 and 0.78 GiB on an H200) was 0.49 GiB, under the 0.7 GiB context alone, and
    every micro-batch was rightly over it."""
    import tuner

    args = {"width": 1024}
    probes = {n: lab.measure(f"search_probe{n}", args, measure=3, batch=16384, micro_batch_size=n).metrics
              for n in (2048, 16384)}
    held = {n: max(m["peak_mem_gib"], m.get("gpu_mem_process_gib") or 0.0) for n, m in probes.items()}
    check = "a search on one GPU: the budget kept, pruning, answer and exports"
    if held[16384] < held[2048] + 0.3:
        return [failed(check, f"the check cannot place a budget: 16384 holds {held[16384]:.2f} GiB, 2048 "
                              f"{held[2048]:.2f}")]
    budget = round((held[2048] + held[16384]) / 2, 2)
    recipe = lab.recipe("search", {**args, "slow_below": 2048, "slow_ms": 40.0}, measure=10, batch=16384,
                        baseline={"micro_batch_size": 2048}, space={"micro_batch_size": [16384, 2048, 1024]},
                        budget={"trials": 4, "memory_gib": budget})
    result = tuner.search(recipe, confirm=2, quiet=True)
    with open(lab.folder / "search" / "trials.csv", newline="") as f:
        states = {r["micro_batch_size"]: r["state"] for r in csv.DictReader(f)}
    files = [n for n in ("best.json", "ds_config.json", "dataloader.json", "report.md")
             if (lab.folder / "search" / n).exists()]
    ok = states.get("16384") in ("skipped", "over_budget") and states.get("1024") == "pruned" \
        and len(files) == 4 and result is not None and result.best["params"]["micro_batch_size"] == 2048
    return [judge(check, "true", ok, True, f"budget {budget} GiB (held: 2048 {held[2048]:.2f}, 16384 "
                                           f"{held[16384]:.2f}); {states}; {files}")]


def two_ranks(lab: Lab, seen: dict[str, Any]) -> list[Row]:
    """Two ranks: DDP over gloo on one GPU (gloo all-reduces CUDA tensors); ZeRO-2 and a failed
    sharded trial need a reduce-scatter and all-gathers on CUDA tensors, which gloo lacks, so
    they run over NCCL on two GPUs and say so on one."""
    rows = []
    two = torch.cuda.device_count() >= 2
    for label, knobs in (("DDP", []), ("ZeRO-2", ["--set", "zero_stage=2"])):
        if label != "DDP" and not two:
            rows.append(not_here(f"two ranks, {label}: trains", "needs two GPUs (gloo has no reduce-scatter for "
                                                                "CUDA tensors; NCCL refuses two ranks on one GPU)"))
            continue
        recipe = lab.recipe(f"ranks_{label}", measure=10)
        nccl = {"TUNER_DIST_BACKEND": ""} if label != "DDP" else None  # one GPU a rank, NCCL's backend
        proc = torchrun("-m", "tuner.measure", str(recipe), *knobs, "--json", env=nccl)
        try:
            m = json.loads(proc.stdout)
        except json.JSONDecodeError:
            m = {}
        where = "on one GPU over gloo" if label == "DDP" else "on two GPUs over NCCL"
        rows.append(judge(f"two ranks {where}, {label}: trains", "equal", m.get("state"), "ok",
                          proc.stderr[-100:] if proc.returncode else ""))
    if not two:
        rows.append(not_here("a failed sharded trial on two ranks: recorded, the ranks exit 75 for a re-run",
                             "needs two GPUs (ZeRO-2's collectives on CUDA tensors)"))
        return rows
    recipe = lab.recipe("ranks_fail", {"fail": "rank1"}, measure=5, space={"zero_stage": [2]})
    proc = torchrun("-m", "tuner.search", str(recipe), "--trials", "2", "--confirm", "0", "--quiet",
                    env={"TUNER_DIST_BACKEND": ""})
    said = [line for line in proc.stderr.splitlines() if "re-run the same command to resume" in line]
    ranks_75 = proc.stderr.count("exitcode  : 75")  # torchrun's own summary (it exits 1 itself)
    rows.append(judge("a failed sharded trial on two ranks: recorded, the ranks exit 75 for a re-run", "true",
                      ranks_75 >= 1 and len(said) >= 1, True, (said or [proc.stderr[-100:]])[0][:100]))
    return rows


PROBE_SCRIPT = """
import json, torch, torch.distributed as dist
import tuner
probe = tuner.Probe(warmup=3, measure=10)   # made before set_device, as a script's first lines do
dist.init_process_group("gloo")
torch.cuda.set_device(0)
model = torch.nn.Linear(4096, 4096).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
data = [(torch.randn(256, 4096),) for _ in range(20)]
for (x,) in probe.loader(data):
    model(x.cuda(non_blocking=True)).sum().backward()
    opt.step()
    opt.zero_grad()
    probe.step()
    if probe.done:
        break
s = probe.summary()
if dist.get_rank() == 0:
    print(json.dumps({"device": str(probe.device), "rate": s["samples_per_s"], "steps": s["measured_steps"],
                      "set_aside": s.get("warmup_set_aside") or 0}))
dist.destroy_process_group()
"""


def probe_torchrun(lab: Lab, seen: dict[str, Any]) -> list[Row]:
    script = lab.folder / "probe_ranks.py"
    script.write_text(PROBE_SCRIPT)
    proc = torchrun(str(script))
    try:
        got = json.loads(proc.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        got = {}
    # 10 measured steps, of which the first-use steps the window sets aside (warmup_set_aside)
    ok = proc.returncode == 0 and got.get("device") == "cuda:0" and got.get("steps", 0) >= 5 and \
        got.get("steps", 0) + got.get("set_aside", 0) == 10 and (got.get("rate") or 0) > 0
    return [judge("tuner.Probe under torchrun, two processes on one GPU: each rank's window, reduced", "true", ok,
                  True, json.dumps(got) if got else proc.stderr[-120:])]


VISIBLE_SCRIPT = """
import os, torch
import tuner
print("visible", os.environ.get("CUDA_VISIBLE_DEVICES"), torch.cuda.device_count(), flush=True)
probe = tuner.Probe()
model = torch.nn.Linear(1024, 1024).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
while not probe.done:
    for x in probe.loader([torch.randn(64, 1024) for _ in range(20)]):
        model(x.cuda()).sum().backward()
        opt.step()
        opt.zero_grad()
        probe.step()
        if probe.done:
            break
"""


def script_gpus(lab: Lab, seen: dict[str, Any]) -> list[Row]:
    """A script trial sees the GPU the search claimed for it, and that one only."""
    import tuner

    folder = lab.folder / "visible"
    folder.mkdir()
    (folder / "train.py").write_text(VISIBLE_SCRIPT)
    (folder / "recipe.yaml").write_text("name: visible\nscript: train.py\nglobal_batch_size: 64\n"
                                        "steps: {warmup: 2, measure: 5}\ntimeout_s: 120\n"
                                        f"out: {folder / 'runs' / 'visible'}\n")  # else runs/ of the cwd
    result = tuner.search(folder / "recipe.yaml", trials=1, confirm=0, attribute=0, quiet=True)
    logs = sorted((folder / "runs" / "visible" / "trials").glob("*/output.log"))
    said = next((line for log in logs for line in log.read_text().splitlines() if line.startswith("visible")), "")
    ok = result is not None and said.split()[1:] == ["0", "1"]
    return [judge("a script trial's CUDA_VISIBLE_DEVICES: the claimed GPU, one device", "true", ok, True, said)]


def layout_path(lab: Lab, seen: dict[str, Any]) -> list[Row]:
    """The layout engine on one GPU (tensor = pipeline = 1, a mesh of one): the same losses
    as the plain engine, step for step, from the same weights and batches."""
    from tuner.inputs.plan import Plan
    from tuner.inputs.task import load_task
    from tuner.trial.engines import build_engine

    task = load_task(str(TASK), ROOT)
    args = {"model": "mlp", "width": 1024}
    data = gpu_task.Synthetic(64, 0)
    batches = [[t.to(lab.device) for t in torch.utils.data.default_collate([data[i] for i in range(j, j + 64)])]
               for j in range(0, 256, 64)]
    losses: dict[str, list[float]] = {}
    for name in ("torch", "layout"):
        torch.manual_seed(0)
        config = Plan.of(1, name, micro_batch_size=64, grad_accum_steps=1)
        engine = build_engine(task, args, config, lab.device)  # the layout's mesh of one, or none
        losses[name] = []
        for batch in batches:
            losses[name].append(float(engine.forward_backward(batch, True)))
            engine.optimizer_step()
        engine.close()
    return [judge("the layout engine on one GPU (tp = pp = 1) trains as the plain engine", "losses",
                  losses["layout"], losses["torch"])]


PREWARM_SCRIPT = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import tuner

device = "cuda" if torch.cuda.is_available() else "cpu"
cfg = tuner.config(global_batch_size=512, micro_batch_size=512)
model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 16))
model = model.to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
data = TensorDataset(torch.randn(4096, 1024), torch.randint(0, 16, (4096,)))
probe = tuner.Probe(device=device)
print("device", device, torch.cuda.is_available(), flush=True)
while not probe.done:
    for x, y in probe.loader(DataLoader(data, **cfg.dataloader_kwargs())):
        loss = nn.functional.cross_entropy(model(x.to(device, non_blocking=True)), y.to(device))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        probe.step()
        if probe.done:
            break
"""


def prewarmed(lab: Lab, seen: dict[str, Any]) -> list[Row]:
    """Two script trials forked from the pre-warmed launcher and two fresh ones, alternating:
    CUDA in a child of a process that imported torch (never CUDA) works as in a fresh one."""
    import dataclasses

    from tuner.inputs.recipe import load_recipe
    from tuner.inputs.space import Machine
    from tuner.measurement import measured_config
    from tuner.scriptmode.launcher import ScriptTrials

    # This process's cache from the checks before (the layout engine's, in-process) is given
    # back first: a lent H200 held 0.9 GiB of it above the GPUs' memory at the claim, and the
    # launcher waited its 60 s once for memory no trial held (91 s for the row).
    gc.collect()
    torch.cuda.empty_cache()
    folder = Path(tempfile.mkdtemp(prefix="tuner-prewarm-"))
    (folder / "train.py").write_text(PREWARM_SCRIPT)
    (folder / "recipe.yaml").write_text("name: prewarm\nscript: train.py\nglobal_batch_size: 512\n"
                                        "steps: {warmup: 5, measure: 40}\ntimeout_s: 180\n")
    recipe = load_recipe(folder / "recipe.yaml")
    assert recipe.script is not None
    config, _ = measured_config(recipe, Machine.detect())
    runs: dict[bool, list[Any]] = {True: [], False: []}
    trials = {warm: ScriptTrials(dataclasses.replace(recipe, script=dataclasses.replace(recipe.script, prewarm=warm)),
                                 folder / f"run-{warm}") for warm in (True, False)}
    try:
        for _ in range(2):
            for warm in (True, False):
                runs[warm].append(trials[warm].run(config))
    finally:
        for t in trials.values():
            t.close()
    ok = all(r.ok for rs in runs.values() for r in rs)
    if not ok:
        return [failed("prewarmed", "; ".join((r.reason or "")[:60] for rs in runs.values() for r in rs if not r.ok))]
    log = (folder / "run-True" / "trials" / "002" / "output.log").read_text()
    rate = {w: statistics.median([r.metrics["samples_per_s"] for r in rs]) for w, rs in runs.items()}
    forked, on_cuda = "forked from the pre-warmed launcher" in log, "device cuda True" in log
    return [judge("a script trial forked from the pre-warmed launcher trains on CUDA: samples/s vs fresh",
                  "within_10pct", rate[True] if forked and on_cuda else None, rate[False],
                  f"forked={forked}, cuda={on_cuda}")]


# --- group 4: the levers of a 2026 GPU --------------------------------------------------------

def float8(lab: Lab, seen: dict[str, Any]) -> list[Row]:
    """float8 (tensorwise) on the transformer trains within the precision guard's tolerance
    of bf16 (the mean loss over the same steps), and it is torchao's: its converter
    recorded turning every block's four projections into ``Float8Linear`` (the head, 16
    wide, left as torchtitan leaves it)."""
    import torchao.float8 as ao

    converted: list[int] = []
    original = ao.convert_to_float8_training

    def recording(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
        out = original(module, *args, **kwargs)
        converted.append(sum(type(m).__name__ == "Float8Linear" for m in module.modules()))
        return out

    ao.convert_to_float8_training = recording
    try:
        args = {"model": "transformer"}
        bf16 = lab.measure("bf16_ref", args, measure=20, batch=64, amp_dtype="bf16")
        f8 = lab.measure("float8", args, measure=20, batch=64, amp_dtype="bf16", float8="tensorwise")
    finally:
        ao.convert_to_float8_training = original

    def mean_loss(m: Any) -> float | None:
        losses = m.repeats[0].losses if m.state == "ok" and m.repeats else []
        return statistics.fmean(losses) if losses else None

    rate = ""
    if bf16.metrics and f8.metrics:
        rate = f"samples/s float8 {f8.metrics['samples_per_s']:.0f}, bf16 {bf16.metrics['samples_per_s']:.0f}"
    return [judge("float8 tensorwise: mean loss vs bf16's over the same steps", "within_5pct", mean_loss(f8),
                  mean_loss(bf16), f"{f8.state} {(f8.reason or '')[:60]}; {rate}"),
            judge("float8: Linear layers torchao converted (4 a block, not the head)", "equal",
                  converted[0] if converted else None, 4 * gpu_task.LAYERS)]


def _plain_sdpa(lab: Lab, backend: str) -> str:
    """Whether one block's forward and backward run in bf16 under ``sdpa_kernel`` with that
    backend alone, in a plain loop: ``runs`` or ``fails``."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from tuner.inputs.levers.kernels import BACKENDS

    block = gpu_task.Block(gpu_task.D_MODEL, gpu_task.HEADS).to(lab.device)
    x = torch.randn(8, gpu_task.SEQ, gpu_task.D_MODEL, device=lab.device, requires_grad=True)
    try:
        with sdpa_kernel([getattr(SDPBackend, BACKENDS[backend])]), torch.autocast("cuda", dtype=torch.bfloat16):
            block(x).float().sum().backward()
        torch.cuda.synchronize()
        return "runs"
    except RuntimeError:
        return "fails"


def attention(lab: Lab, seen: dict[str, Any]) -> list[Row]:
    """Each SDPA backend: the tuner refuses before a trial what a plain forward under
    ``sdpa_kernel`` cannot run, and a trial of the others runs with that backend alone
    enabled where the transformer's attention runs (recorded by the task)."""
    from tuner.inputs import rules
    from tuner.inputs.levers.kernels import BACKENDS
    from tuner.inputs.space import Machine, make_config, unsupported

    machine = Machine.detect()
    refused = {value for name, value, _, _ in unsupported(machine) if name == "attention_backend"}
    rows = []
    for backend in BACKENDS:
        config, _ = make_config({"attention_backend": backend, "amp_dtype": "bf16"}, 64, 1, machine)
        truth = _plain_sdpa(lab, backend)
        if backend in refused or rules.refusal(config, rules.Where(machine)) is not None:
            rows.append(judge(f"attention_backend {backend}: refused or runs, as a plain forward", "backend",
                              "refused", truth))
            continue
        log = lab.folder / f"sdpa_{backend}.jsonl"
        m = lab.measure(f"sdpa_{backend}", {"model": "transformer", "sdpa_log": str(log)}, measure=5, batch=64,
                        amp_dtype="bf16", attention_backend=backend)
        enabled = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        measured = "runs" if m.state == "ok" and enabled == [[backend]] else f"{m.state}: enabled {enabled}"
        rows.append(judge(f"attention_backend {backend}: refused or runs, as a plain forward", "backend", measured,
                          truth, (m.reason or "")[:60]))
    return rows


def _graph_launches(folder: Path) -> int:
    events = json.loads((folder / "trace_rank0.json").read_text())["traceEvents"]
    return sum(1 for e in events if e.get("ph") == "X" and e.get("name") == "cudaGraphLaunch")


def graphs(lab: Lab, seen: dict[str, Any]) -> list[Row]:
    """``compile_mode: reduce-overhead`` captures CUDA graphs and replays them in the
    measured window (``cudaGraphLaunch`` in the profiler's trace of that window, at least
    one a step); the default mode, the same blocks compiled, launches none."""
    import tuner

    counts, states = {}, {}
    for mode in ("default", "reduce-overhead"):
        folder = lab.folder / f"graphs_{mode}"
        recipe = lab.recipe(f"graphs_{mode}", {"model": "transformer"}, measure=10, batch=64)
        m = tuner.measure(recipe, trace=folder, compile=True, compile_mode=mode, amp_dtype="bf16")
        states[mode] = f"{m.state} {(m.reason or '')[:50]}"
        counts[mode] = _graph_launches(folder) if m.state == "ok" and (folder / "trace_rank0.json").exists() else None
    ok = counts["reduce-overhead"] is not None and counts["reduce-overhead"] >= 10 and counts["default"] == 0
    return [judge("reduce-overhead replays CUDA graphs in the window, default mode none", "true", ok, True,
                  f"cudaGraphLaunch: {counts}; {states}")]


EXPANDABLE_SCRIPT = """
import json, os, sys
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import tuner

cfg = tuner.config(global_batch_size=256, micro_batch_size=256)
model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 16)).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
data = TensorDataset(torch.randn(2048, 1024), torch.randint(0, 16, (2048,)))
probe = tuner.Probe(device="cuda")
while not probe.done:
    for x, y in probe.loader(DataLoader(data, **cfg.dataloader_kwargs())):
        nn.functional.cross_entropy(model(x.cuda()), y.cuda()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if not os.path.exists(sys.argv[1]):  # before the window ends the process
            segments = torch.cuda.memory_snapshot()
            with open(sys.argv[1], "w") as f:
                json.dump({"env": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"), "segments": len(segments),
                           "expandable": sum(bool(s.get("is_expandable")) for s in segments)}, f)
        probe.step()
        if probe.done:
            break
"""


def expandable(lab: Lab, seen: dict[str, Any]) -> list[Row]:
    """``expandable_segments`` reaches the process it is for: a script trial's environment
    and allocator (its segments expandable, by the allocator's own snapshot), and an
    in-process trial's allocator, off again after it; ``peak_mem_gib - peak_allocated_gib``,
    the memory it is meant to save, measured with it and without."""

    from tuner.inputs.recipe import load_recipe
    from tuner.inputs.space import Machine
    from tuner.measurement import measured_config
    from tuner.scriptmode.launcher import ScriptTrials

    folder = Path(tempfile.mkdtemp(prefix="tuner-expandable-"))
    facts = folder / "allocator.json"
    (folder / "train.py").write_text(EXPANDABLE_SCRIPT)
    (folder / "recipe.yaml").write_text(f"name: expandable\nscript: train.py\nargs: [{str(facts)!r}]\n"
                                        "global_batch_size: 256\nsteps: {warmup: 3, measure: 10}\ntimeout_s: 120\n")
    recipe = load_recipe(folder / "recipe.yaml")
    config, _ = measured_config(recipe, Machine.detect())
    trials = ScriptTrials(recipe, folder / "run")
    try:
        result = trials.run(config.replace(expandable_segments=True))
    finally:
        trials.close()
    said = json.loads(facts.read_text()) if facts.exists() else {}
    script_ok = result.ok and "expandable_segments:True" in (said.get("env") or "") and said.get("expandable", 0) > 0
    rows = [judge("expandable_segments in a script trial: its environment and its allocator's segments", "true",
                  script_ok, True, f"{result.state}; {said}")]
    slack, inside = {}, {}
    for on in (False, True):
        log = lab.folder / f"alloc_{on}.json"
        m = lab.measure(f"expandable_{on}", {"model": "transformer", "alloc_log": str(log)}, measure=10, batch=64,
                        amp_dtype="bf16", expandable_segments=on)
        inside[on] = json.loads(log.read_text()) if log.exists() else {}
        if m.metrics and m.metrics.get("peak_allocated_gib") is not None:
            slack[on] = round(m.metrics["peak_mem_gib"] - m.metrics["peak_allocated_gib"], 3)
    after = torch.empty(64 << 20, dtype=torch.uint8, device=lab.device)
    restored = not any(s.get("is_expandable") for s in torch.cuda.memory_snapshot())
    del after
    ok = inside[True].get("expandable", 0) > 0 and inside[False].get("expandable", 1) == 0 and restored \
        and len(slack) == 2
    rows.append(judge("expandable_segments in an in-process trial: its segments expandable, none without, off after",
                      "true", ok, True, f"reserved - allocated GiB: without {slack.get(False)}, with "
                                        f"{slack.get(True)}; restored={restored}"))
    return rows


# --- group 5: a node of two GPUs or more, over NCCL -------------------------------------------

NCCL = {"TUNER_DIST_BACKEND": ""}
"""One rank a GPU, NCCL's backend (the torchrun helper's default is gloo, for one GPU)."""


def _json(text: str) -> dict[str, Any]:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return {}


def nccl_engines(lab: Lab, seen: dict[str, Any]) -> list[Row]:
    """DDP, ZeRO-2 and FSDP2 on two GPUs over NCCL: each trains, with a ``comm_share`` read."""
    rows = []
    for label, knobs in (("DDP", []), ("ZeRO-2", ["--set", "zero_stage=2"]), ("FSDP2", ["--set", "fsdp=full_shard"])):
        recipe = lab.recipe(f"nccl_{label}", measure=20, batch=2 * lab.micro)
        proc = torchrun("-m", "tuner.measure", str(recipe), *knobs, "--json", env=NCCL)
        m = _json(proc.stdout)
        share = (m.get("metrics") or {}).get("comm_share")
        rows.append(judge(f"two GPUs over NCCL, {label}: trains, comm_share read", "true",
                          m.get("state") == "ok" and isinstance(share, float), True,
                          proc.stderr[-100:] if proc.returncode else f"comm_share {share}"))
    return rows


TRACED = """
import json, sys
import torch.distributed as dist
import tuner
m = tuner.measure(sys.argv[1], trace=sys.argv[2])
if dist.get_rank() == 0:
    print(json.dumps({"state": m.state, "comm_share": (m.metrics or {}).get("comm_share")}))
"""


def _merged(intervals: list[tuple[float, float]]) -> list[list[float]]:
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def trace_nccl_share(events: list[dict[str, Any]]) -> float | None:
    """From a profiler trace, written out here rather than by the tuner's arithmetic: NCCL
    kernel time that no compute kernel overlaps, over the span from the first kernel to the
    last."""
    kernels = [(float(e["ts"]), float(e["ts"]) + float(e["dur"]), "nccl" in e["name"].lower())
               for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"]
    if not kernels:
        return None
    compute = _merged([(a, b) for a, b, comm in kernels if not comm])
    exposed = 0.0
    for a, b in _merged([(a, b) for a, b, comm in kernels if comm]):
        covered = sum(max(0.0, min(b, d) - max(a, c)) for c, d in compute)
        exposed += (b - a) - covered
    span = max(b for _, b, _ in kernels) - min(a for a, _, _ in kernels)
    return exposed / span if span > 0 else None


def nccl_comm(lab: Lab, seen: dict[str, Any]) -> list[Row]:
    """DDP on two GPUs: the tuner's ``comm_share`` (its profiled steps after the window)
    against the trace of the window itself."""
    script, folder = lab.folder / "traced.py", lab.folder / "nccl_trace"
    script.write_text(TRACED)
    recipe = lab.recipe("nccl_comm", measure=20, batch=2 * lab.micro)
    proc = torchrun(str(script), str(recipe), str(folder), env=NCCL)
    m = _json(proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "")
    trace = folder / "trace_rank0.json"
    truth = trace_nccl_share(json.loads(trace.read_text())["traceEvents"]) if trace.exists() else None
    return [judge("comm_share on two GPUs over NCCL vs the window's trace", "comm_nccl", m.get("comm_share"), truth,
                  proc.stderr[-100:] if proc.returncode else "")]


def nccl_energy(lab: Lab, seen: dict[str, Any]) -> list[Row]:
    """Two ranks on a node of two GPUs or more: the tuner's joules a second against
    nvidia-smi's power draw of those two GPUs alone (by UUID), sampled while the job runs
    (its upper half: the window, not the start-up). Counting every GPU of the node, or each
    once per rank, is outside it."""
    recipe = lab.recipe("nccl_energy", measure=400, batch=2 * lab.micro)
    gpus = [device_uuid(i) for i in range(2)]
    ran: dict[str, Any] = {}
    samples = smi_samples("power.draw", lambda: ran.update(
        proc=torchrun("-m", "tuner.measure", str(recipe), "--json", env=NCCL)), gpus)
    x = _json(ran["proc"].stdout).get("metrics") or {}
    watts = None
    if x.get("energy_j_per_sample") is not None and x.get("samples_per_s"):
        watts = x["energy_j_per_sample"] * x["samples_per_s"]
    drawn = sorted(v for _, v in samples)
    busy = drawn[len(drawn) // 2:]
    return [judge(f"energy of the job's own GPUs: 2 ranks on a node of {torch.cuda.device_count()}, W vs "
                  "nvidia-smi's of those two", "job_watts", watts, statistics.median(busy) if busy else None,
                  "", peak=max(drawn) if drawn else None)]


CHECKS: list[Check] = [
    Check("step_time", 1, 25, step_time),
    Check("data_wait", 1, 60, data_wait, needs=("step_time",)),
    Check("transfer", 1, 40, transfer),
    Check("memory", 1, 25, memory, needs=("step_time",), requires=("nvml",)),
    Check("energy", 1, 30, energy, requires=("nvml",)),
    Check("flops", 1, 20, flops),
    Check("mfu", 1, 20, mfu),
    Check("ooms", 2, 30, ooms),
    Check("poisoned", 2, 30, poisoned),
    Check("resume", 2, 45, resume),
    Check("precisions", 2, 60, precisions, requires=("deepspeed",)),
    Check("offload", 2, 30, offload, requires=("deepspeed",)),
    Check("compile", 2, 40, compile_time, requires=("compiler",)),
    Check("utilization", 3, 25, utilization, requires=("nvml",)),
    Check("search", 3, 60, search),
    Check("two_ranks", 3, 60, two_ranks, requires=("deepspeed",)),
    Check("probe_torchrun", 3, 20, probe_torchrun),
    Check("script_gpus", 3, 15, script_gpus),
    Check("layout", 3, 15, layout_path),
    Check("prewarmed", 3, 40, prewarmed),  # 91 s on an H200 with a 60 s wait, now avoided (see it)
    Check("float8", 4, 40, float8, requires=("float8",)),
    Check("attention", 4, 45, attention),
    Check("graphs", 4, 80, graphs, requires=("compiler",)),
    Check("expandable", 4, 45, expandable),
    Check("nccl_engines", 5, 110, nccl_engines, requires=("two_gpus", "deepspeed")),
    Check("nccl_comm", 5, 40, nccl_comm, requires=("two_gpus",)),
    Check("nccl_energy", 5, 50, nccl_energy, requires=("two_gpus", "nvml")),
]
"""Every check, in the order a full run takes them, with its group and expected seconds
on an H200 (estimates until a GPU run measures them: each row records its own)."""
