"""Every GPU path of the tuner, checked on one GPU against a truth the tuner does not compute.

    python scripts/gpu_acceptance.py [--out gpu_acceptance.json] [--only NAME,NAME]

One command, at most about 7 minutes on one GPU. Each check measures with the tuner (its
public API, or its command line in a fresh process) and with something independent of it: a
plain training loop timed with ``torch.cuda.synchronize()``, the profiler's CUDA trace,
NVML, ``cudaMemGetInfo``, the allocator's own counters, dynamo's compile counters, an
analytic FLOP count. It prints a table (check, measured, truth, threshold, pass) and writes
it as JSON. Exit 0 when every check passed, 1 otherwise; without CUDA it says so in one
line and exits 2.

This file is also the task the checks measure (``task:`` in the recipes it writes): an MLP
on synthetic data whose loader can be made slow (a host sleep per batch), whose batch can
carry a large tensor to copy, and whose forward or backward can be made to run out of memory
or to trip a device-side assert.

What one GPU cannot show: NCCL refuses two ranks on one device, so the multi-rank leg runs
two ranks on the GPU over gloo (CUDA tensors, collectives staged through the host). It
checks that the sharded engines train, that a failed sharded trial ends the search for a
restart, and that the exposed-communication figure is a share; how fast NCCL itself is, and
its kernels' overlap with compute, need a node with two GPUs.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
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

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent

# --- the task ------------------------------------------------------------------------------

WIDTH, DEPTH, IN, MICRO = 8192, 4, 1024, 512
"""The MLP: IN -> WIDTH x DEPTH -> 16 classes (210 M parameters), 512 samples a step: about
13 ms of fp32 matmuls on an H200 against a few ms of host time to collate the batch, so the
step is the device's unless a check makes the loader slow. Analytic FLOPs are exact for it."""


class Synthetic(torch.utils.data.Dataset):
    """Random samples; ``sleep_ms`` of host time per batch (in ``collate``), and an extra
    ``payload`` tensor of that many floats per sample to copy to the device."""

    def __init__(self, size: int, payload: int) -> None:
        self.size, self.payload = size, payload
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(64, IN, generator=g)
        self.y = torch.randint(0, 16, (64,), generator=g)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> Any:
        j = i % 64
        if self.payload:
            return self.x[j], self.y[j], torch.zeros(self.payload)
        return self.x[j], self.y[j]


_ARGS: dict[str, Any] = {}


def build_dataset(args: dict[str, Any]) -> Synthetic:
    _ARGS.clear()
    _ARGS.update(args)
    return Synthetic(args.get("size", 1 << 16), args.get("payload", 0))


def collate(samples: list[Any]) -> Any:
    if _ARGS.get("sleep_ms"):
        time.sleep(_ARGS["sleep_ms"] / 1000.0)
    return torch.utils.data.default_collate(samples)


class _BackwardOOM(torch.autograd.Function):
    """Identity forward; a backward that asks for more memory than the device has."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        total = torch.cuda.get_device_properties(grad.device).total_memory
        torch.empty(2 * total, dtype=torch.uint8, device=grad.device)
        return grad


def build_model(args: dict[str, Any]) -> nn.Module:
    width = args.get("width", WIDTH)
    layers: list[nn.Module] = [nn.Linear(IN, width), nn.ReLU()]
    for _ in range(DEPTH - 1):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, 16))
    return nn.Sequential(*layers)


def blocks(model: nn.Module) -> list[nn.Module]:
    return [m for m in model if isinstance(m, nn.Linear)]


def compute_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    x, y = batch[0], batch[1]
    fail = _ARGS.get("fail")
    if fail == "forward_oom":
        total = torch.cuda.get_device_properties(x.device).total_memory
        torch.empty(2 * total, dtype=torch.uint8, device=x.device)
    if fail == "device_assert":
        y = y + 1000  # out of range for 16 classes: the loss kernel's device-side assert
    if fail == "rank1" and torch.distributed.is_initialized() and torch.distributed.get_rank() == 1:
        raise RuntimeError("rank 1's forward failed (raised by the acceptance task)")
    out = model(x)
    if fail == "backward_oom":
        out = _BackwardOOM.apply(out)
    return nn.functional.cross_entropy(out, y)


def build_optimizer(params: Any, args: dict[str, Any]) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-4)


def analytic_flops_per_sample(width: int = WIDTH) -> float:
    """Forward 2 x in x out per linear layer and sample, backward twice that (input and
    weight gradients): 6 x the weights of every linear layer, less the first layer's input
    gradient (2 x in x width), which autograd does not compute for data."""
    weights = IN * width + (DEPTH - 1) * width * width + width * 16
    return 6.0 * weights - 2.0 * IN * width


# --- the checks ----------------------------------------------------------------------------

Row = dict[str, Any]


def row(check: str, measured: float | str | None, truth: float | str | None, threshold: str, ok: bool,
        note: str = "") -> Row:
    return {"check": check, "measured": measured, "truth": truth, "threshold": threshold, "pass": bool(ok),
            "note": note}


def relative(a: float | None, b: float | None) -> float:
    if a is None or b is None or b == 0:
        return math.inf
    return abs(a - b) / abs(b)


class Lab:
    """Recipes, the device, and the plain-loop truths shared by the checks."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.micro = MICRO

    def recipe(self, name: str, task_args: dict[str, Any] | None = None, measure: int = 30, warmup: int = 5,
               **extra: Any) -> Path:
        import yaml

        body = {"name": name, "task": str(HERE), "task_args": task_args or {}, "global_batch_size": self.micro,
                "steps": {"warmup": warmup, "measure": measure, "repeats": 1}, "out": str(self.folder / name),
                **extra}
        path = self.folder / f"{name}.yaml"
        path.write_text(yaml.safe_dump(body))
        return path

    def measure(self, name: str, task_args: dict[str, Any] | None = None, measure: int = 30, **knobs: Any) -> Any:
        import tuner

        return tuner.measure(self.recipe(name, task_args, measure), **knobs)

    def plain(self, steps: int, **kwargs: Any) -> dict[str, float]:
        """:meth:`_plain`, then its model, optimizer and cached blocks released."""
        out = self._plain(steps, **kwargs)
        gc.collect()
        torch.cuda.empty_cache()
        return out

    def _plain(self, steps: int, sleep_ms: float = 0.0, payload: int = 0, pin: bool = False,
               dtype: torch.dtype | None = None, compiled: bool = False) -> dict[str, float]:
        """The same training step without the tuner: the batch built on the host, copied,
        forward, backward, AdamW; ``sleep_ms`` of host time per step before the copy (the
        slow loader). Timed with a synchronize around the steps after 3 warm-up steps;
        ``first_s`` is the first (compiling) step's own time."""
        torch.manual_seed(0)
        model = build_model({}).to(self.device)
        step_model = torch.compile(model) if compiled else model
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        data = Synthetic(64, payload)
        host = [torch.utils.data.default_collate([data[i] for i in range(self.micro % 64 or 64)])] * (
            self.micro // 64 or 1)
        x = torch.cat([h[0] for h in host])
        y = torch.cat([h[1] for h in host])
        extra = torch.cat([h[2] for h in host]) if payload else None
        if pin:
            x, y = x.pin_memory(), y.pin_memory()
            extra = extra.pin_memory() if extra is not None else None

        def one() -> None:
            if sleep_ms:
                time.sleep(sleep_ms / 1000.0)
            xd, yd = x.to(self.device, non_blocking=pin), y.to(self.device, non_blocking=pin)
            if extra is not None:
                extra.to(self.device, non_blocking=pin)
            with torch.autocast("cuda", dtype=dtype) if dtype else contextlib.nullcontext():
                loss = nn.functional.cross_entropy(step_model(xd), yd)
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
        start = time.perf_counter()
        for _ in range(steps):
            one()
        torch.cuda.synchronize()
        step = (time.perf_counter() - start) / steps
        return {"step_s": step, "first_s": first, "reserved": float(torch.cuda.max_memory_reserved(self.device))}

    def traced(self, name: str, task_args: dict[str, Any] | None = None, measure: int = 20,
               **knobs: Any) -> tuple[Any, dict[str, float]]:
        """A tuner measurement whose measured window is also traced by the profiler (the
        tuner's ``trace``), and the truth read from that trace of the same run: over the
        device's span from the window's first GPU activity to its last, the share it sat
        idle or copying to the device (the exposed data wait), and the share of
        host-to-device copies."""
        import tuner

        folder = self.folder / f"{name}_trace"
        m = tuner.measure(self.recipe(name, task_args, measure), trace=folder, **knobs)
        events = json.loads((folder / "trace_rank0.json").read_text())["traceEvents"]
        device = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
        if not device:
            raise RuntimeError("the profiler's trace holds no GPU activity (CUPTI missing?)")
        start = min(float(e["ts"]) for e in device)
        end = max(float(e["ts"]) + float(e["dur"]) for e in device)
        busy = _union_length([(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in device
                              if not (e["cat"] == "gpu_memcpy" and "HtoD" in e["name"])])
        copies = _union_length([(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in device
                                if e["cat"] == "gpu_memcpy" and "HtoD" in e["name"]])
        span = end - start
        return m, {"wait": 1.0 - busy / span, "copy": copies / span}


def _union_length(intervals: list[tuple[float, float]]) -> float:
    """Total length of ``intervals`` merged (the tuner's own interval union)."""
    from tuner.harness.comm import union

    return sum(b - a for a, b in union(intervals))


def nvml_used_bytes(index: int) -> int | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        uuid = str(torch.cuda.get_device_properties(index).uuid)
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
    except Exception:  # noqa: BLE001 - no NVML: the check says so
        return None


def with_nvml_peak(work: Callable[[], Any], peaks: list[int]) -> Any:
    """``work()``, with NVML's used memory of the current GPU sampled every 50 ms into ``peaks``."""
    stop = threading.Event()
    index = torch.cuda.current_device()

    def sample() -> None:
        while not stop.is_set():
            used = nvml_used_bytes(index)
            if used is None:
                return
            peaks.append(used)
            stop.wait(0.05)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        return work()
    finally:
        stop.set()
        thread.join()


def smi_utilization(seconds: float, work: Callable[[], Any]) -> float | None:
    """Mean ``nvidia-smi`` utilization.gpu over ``work()``, sampled every 0.1 s."""
    samples: list[float] = []
    stop = threading.Event()
    index = torch.cuda.current_device()

    def sample() -> None:
        while not stop.is_set():
            try:
                out = subprocess.run(["nvidia-smi", f"--id={index}", "--query-gpu=utilization.gpu",
                                      "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=5)
                samples.append(float(out.stdout.strip().splitlines()[0]) / 100.0)
            except (OSError, ValueError, IndexError, subprocess.SubprocessError):
                return
            stop.wait(0.1)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    work()
    stop.set()
    thread.join()
    return statistics.fmean(samples) if samples else None


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
"""A one-process script for the pre-warmed launcher's check: CUDA in a child forked from a
process that imported torch (never CUDA) must work as in a fresh one."""


def prewarmed_rates(folder: Path) -> dict[bool, list[Any]]:
    """Two script trials forked from the pre-warmed launcher, and two fresh ones, alternating."""
    import dataclasses

    from tuner.config.recipe import load_recipe
    from tuner.config.space import Machine
    from tuner.measurement import measured_config
    from tuner.scriptmode.launcher import ScriptTrials

    (folder / "train.py").write_text(PREWARM_SCRIPT)
    (folder / "recipe.yaml").write_text("name: prewarm\nscript: train.py\nglobal_batch_size: 512\n"
                                        "steps: {warmup: 5, measure: 40}\ntimeout_s: 180\n")
    recipe = load_recipe(folder / "recipe.yaml")
    assert recipe.script is not None and recipe.script.launcher == "python"
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
    return runs


def checks(lab: Lab) -> list[tuple[str, Callable[[], list[Row]]]]:
    """Each check's name and function (run in this order; later ones reuse earlier figures)."""
    seen: dict[str, Any] = {}

    def step_time() -> list[Row]:
        m = lab.measure("base", pin_memory=True, num_workers=0)
        seen["base"] = m
        peak_used: list[int] = []
        truth = with_nvml_peak(lambda: lab.plain(30), peak_used)
        seen["plain"], seen["plain_used"] = truth, max(peak_used, default=None)
        tuner_step = lab.micro / m.metrics["samples_per_s"]
        return [row("step time: tuner (CUDA events) vs a synchronized plain loop, s", tuner_step, truth["step_s"],
                    "within 10%", relative(tuner_step, truth["step_s"]) <= 0.10)]

    def data_wait() -> list[Row]:
        base = seen["plain"]["step_s"]
        out = []
        for label, factor in (("host ahead (loader sleeps 0.3 x step)", 0.3),
                              ("loader-bound (loader sleeps 2 x step)", 2.0)):
            sleep_ms = factor * base * 1000
            m, truth = lab.traced(f"wait{factor}", {"sleep_ms": sleep_ms}, pin_memory=True, num_workers=0)
            share = m.metrics["data_wait_share"]
            out.append(row(f"data wait share, {label}: vs the device's idle share in the trace", share,
                           truth["wait"], "within 0.05", abs(share - truth["wait"]) <= 0.05))
            if factor == 2.0:
                seen["bound"] = (m, sleep_ms)
        return out

    def transfer() -> list[Row]:
        out = []
        payload = 1 << 15  # 128 KiB per sample: 64 MiB a batch
        for pin in (False, True):
            m, truth = lab.traced(f"copy{int(pin)}", {"payload": payload}, pin_memory=pin, num_workers=0)
            share, wait = m.metrics["transfer_share"], m.metrics["data_wait_share"]
            out.append(row(f"transfer share, pin_memory={pin}: vs the trace's host-to-device copies", share,
                           truth["copy"], "within 0.05", share is not None and abs(share - truth["copy"]) <= 0.05))
            if not pin:  # the pageable copy waits for the previous step's kernels: not a data wait
                out.append(row("data wait share with a pageable copy: vs the trace's idle + copy share", wait,
                               truth["wait"], "within 0.05", abs(wait - truth["wait"]) <= 0.05))
        return out

    def memory() -> list[Row]:
        m, truth = seen["base"], seen["plain"]
        peak = m.metrics["peak_mem_gib"] * 2**30
        out = [row("peak_mem_gib vs a plain loop's max_memory_reserved, GiB", peak / 2**30,
                   truth["reserved"] / 2**30, "within 5%", relative(peak, truth["reserved"]) <= 0.05)]
        used, nvml = m.metrics["gpu_mem_used_gib"], seen["plain_used"]
        out.append(row("gpu_mem_used_gib vs NVML's used memory over the plain loop, GiB", used,
                       None if nvml is None else nvml / 2**30, "within 10%",
                       used is not None and nvml is not None and relative(used * 2**30, nvml) <= 0.10,
                       "" if nvml is not None else "NVML not readable"))
        own = m.metrics.get("gpu_mem_process_gib")
        out.append(row("gpu_mem_process_gib: above the allocator's peak, within the device's used, GiB", own,
                       f"{m.metrics['peak_mem_gib']:.2f}..{used}", "between", own is not None and used is not None
                       and m.metrics["peak_mem_gib"] < own <= used + 0.01))
        index = lab.device.index or 0
        from tuner.harness.system.devices import room

        free, total = torch.cuda.mem_get_info(lab.device)
        smi = nvml_used_bytes(index)
        truth_room = None if smi is None else total - smi + torch.cuda.memory_reserved(lab.device)
        out.append(row("plan's default budget: free at start + own (cudaMemGetInfo vs NVML), GiB",
                       room() / 2**30, None if truth_room is None else truth_room / 2**30, "within 2%",
                       truth_room is not None and relative(room(), truth_room) <= 0.02))
        return out

    def ooms() -> list[Row]:
        out = []
        for where in ("forward_oom", "backward_oom"):
            m = lab.measure(where, {"fail": where}, measure=5)
            out.append(row(f"an OOM in the {where.split('_')[0]} is recorded as oom", m.state, "oom",
                           "equal", m.state == "oom", (m.reason or "")[:80]))
        again = lab.measure("base_again", pin_memory=True, num_workers=0)
        before, after = seen["base"].metrics["peak_mem_gib"], again.metrics["peak_mem_gib"]
        out.append(row("the next trial's peak after two OOMs, GiB", after, before, "within 3%",
                       relative(after, before) <= 0.03))
        return out

    def flops() -> list[Row]:
        m = seen["base"]
        counted = m.metrics["achieved_tflops"] * 1e12 / m.metrics["samples_per_s"]
        truth = analytic_flops_per_sample()
        mfus = [m.metrics["mfu"]]
        bf16 = lab.measure("bf16", amp_dtype="bf16", pin_memory=True)
        seen["bf16"] = bf16
        mfus.append(bf16.metrics["mfu"] if bf16.metrics else None)
        known = [x for x in mfus if x is not None]
        return [row("FLOPs per sample: FlopCounterMode vs analytic 6 x weights", counted, truth, "within 3%",
                    relative(counted, truth) <= 0.03),
                row("MFU (fp32 with TF32 noted, bf16) never exceeds 1", max(known, default=None), 1.0, "<= 1",
                    bool(known) and max(known) <= 1.0, "; ".join(n for n in m.repeats[0].notes if "TF32" in n))]

    def utilization() -> list[Row]:
        m, sleep_ms = seen["bound"]
        smi = smi_utilization(5.0, lambda: lab.plain(max(5, int(5.0 / (sleep_ms / 1000.0))), sleep_ms=sleep_ms))
        util = m.metrics["gpu_util"]
        return [row("gpu_util (NVML) vs nvidia-smi on the loader-bound loop", util, smi, "within 0.15",
                    util is not None and smi is not None and abs(util - smi) <= 0.15)]

    def compile_time() -> list[Row]:
        import torch._dynamo

        torch._dynamo.reset()
        plain = lab.plain(10, compiled=True)
        excess = plain["first_s"] - plain["step_s"]
        torch._dynamo.reset()
        m = lab.measure("compiled", measure=10, compile=True)
        got = m.metrics["compile_s"] if m.metrics else None
        return [row("compile_s (dynamo counters) vs a plain loop's first-step excess, s", got, excess,
                    "0.5-1.1 x", got is not None and 0.5 * excess <= got <= 1.1 * excess,
                    "inductor caches off (TORCHINDUCTOR_FORCE_DISABLE_CACHES=1)")]

    def precisions() -> list[Row]:
        out = []
        reference = seen["base"].repeats[0].losses
        for engine, knobs in (("DeepSpeed ZeRO-2", {"zero_stage": 2}), ("FSDP2", {"fsdp": "full_shard"})):
            for dtype in ("bf16", "fp16"):
                m = lab.measure(f"{engine.split()[0]}_{dtype}", measure=10, amp_dtype=dtype, **knobs)
                losses = m.repeats[0].losses if m.repeats else []
                gap = relative(losses[0], reference[0]) if losses and reference else math.inf
                out.append(row(f"{engine} {dtype}: trains, finite loss, first loss vs fp32", m.state,
                               "ok", "ok and within 5%",
                               m.state == "ok" and all(map(math.isfinite, losses)) and gap <= 0.05,
                               f"first-loss gap {gap:.3f}; {(m.reason or '')[:60]}"))
        return out

    def offload() -> list[Row]:
        from tuner.trial.engines import deepspeed_engine

        read: list[Any] = []
        init = deepspeed_engine.DeepSpeedEngine.__init__

        def recording(self: Any, *args: Any, **kwargs: Any) -> None:
            init(self, *args, **kwargs)
            read.append(self.model._config.zero_config.offload_optimizer)

        deepspeed_engine.DeepSpeedEngine.__init__ = recording  # type: ignore[method-assign]
        try:
            m = lab.measure("offload", measure=3, zero_stage=2, offload_optimizer="cpu")
        finally:
            deepspeed_engine.DeepSpeedEngine.__init__ = init  # type: ignore[method-assign]
        pinned = bool(read) and read[0] is not None and read[0].pin_memory
        return [row("ZeRO-2 offload trial: DeepSpeed ran with pinned host buffers", f"{m.state}, pinned={pinned}",
                    "ok, pinned=True", "equal", m.state == "ok" and pinned, (m.reason or "")[:80])]

    def probe() -> list[Row]:
        import tuner

        p, q = tuner.Probe(), tuner.Probe(device="cuda")
        want = torch.device("cuda", torch.cuda.current_device())
        return [row("tuner.Probe() and Probe(device='cuda') time the current CUDA device", f"{p.device}, {q.device}",
                    str(want), "equal", p.device == want and q.device == want)]

    def poisoned() -> list[Row]:
        recipe = lab.recipe("assert", {"fail": "device_assert"}, measure=5)
        proc = subprocess.run([sys.executable, "-m", "tuner.measure", str(recipe), "--repeats", "3", "--json"],
                              capture_output=True, text=True, timeout=240, cwd=ROOT)
        try:
            out = json.loads(proc.stdout)
        except json.JSONDecodeError:
            out = {}
        said = "this process stopped there" in proc.stderr
        ran = len(out.get("repeats") or [])
        return [row("a device-side assert: recorded, no further repeat, one line", f"{out.get('state')}, {ran} run",
                    "error, 1 run", "equal", out.get("state") == "error" and ran == 1 and said,
                    (out.get("reason") or proc.stderr[-120:])[:100])]

    def two_ranks() -> list[Row]:
        out = []
        env = {**os.environ, "TUNER_DIST_BACKEND": "gloo"}
        for label, knobs in (("DDP", []), ("ZeRO-2", ["--set", "zero_stage=2"])):
            recipe = lab.recipe(f"ranks_{label}", measure=10)
            proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                   "--nproc_per_node=2", "-m", "tuner.measure", str(recipe), *knobs, "--json"],
                                  capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
            try:
                m = json.loads(proc.stdout)
            except json.JSONDecodeError:
                m = {}
            share = (m.get("metrics") or {}).get("comm_share")
            out.append(row(f"two ranks on one GPU over gloo, {label}: trains, comm_share a share",
                           f"{m.get('state')}, {share}", "ok, 0..1", "ok",
                           m.get("state") == "ok" and share is not None and 0.0 <= share <= 1.0,
                           proc.stderr[-100:] if proc.returncode else ""))
        recipe = lab.recipe("ranks_fail", {"fail": "rank1"}, measure=5, space={"zero_stage": [2]})
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                               "-m", "tuner.search", str(recipe), "--trials", "2", "--confirm", "0", "--quiet"],
                              capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
        said = [line for line in proc.stderr.splitlines() if "re-run the same command to resume" in line]
        ranks_75 = proc.stderr.count("exitcode  : 75")  # torchrun's own summary (it exits 1 itself)
        out.append(row("a failed sharded trial on two ranks: recorded, the ranks exit 75 for a re-run", ranks_75,
                       "ranks exit 75", ">= 1 rank", ranks_75 >= 1 and len(said) >= 1,
                       (said or [proc.stderr[-100:]])[0][:100]))
        return out

    def prewarmed() -> list[Row]:
        folder = Path(tempfile.mkdtemp(prefix="tuner-prewarm-"))
        runs = prewarmed_rates(folder)
        ok = all(r.ok for rs in runs.values() for r in rs)
        log = (folder / "run-True" / "trials" / "002" / "output.log").read_text()
        forked, on_cuda = "forked from the pre-warmed launcher" in log, "device cuda True" in log
        rate = {w: statistics.median([r.metrics["samples_per_s"] for r in rs]) if ok else None
                for w, rs in runs.items()}
        reasons = "; ".join((r.reason or "")[:60] for rs in runs.values() for r in rs if not r.ok)
        return [row("a script trial forked from the pre-warmed launcher trains on CUDA: samples/s vs fresh",
                    rate[True], rate[False], "within 10%", ok and forked and on_cuda
                    and relative(rate[True], rate[False]) <= 0.10, reasons or f"forked={forked}, cuda={on_cuda}")]

    return [("step_time", step_time), ("data_wait", data_wait), ("transfer", transfer), ("memory", memory),
            ("ooms", ooms), ("flops", flops), ("utilization", utilization), ("compile", compile_time),
            ("precisions", precisions), ("offload", offload), ("probe", probe), ("poisoned", poisoned),
            ("two_ranks", two_ranks), ("prewarmed", prewarmed)]


def show(rows: list[Row]) -> str:
    def fmt(v: Any) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    lines = ["| check | measured | truth | threshold | pass |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['check']} | {fmt(r['measured'])} | {fmt(r['truth'])} | {r['threshold']} | "
                     f"{'pass' if r['pass'] else 'FAIL'}{' - ' + r['note'] if r['note'] else ''} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="gpu_acceptance.json", help="the table as JSON (default: %(default)s)")
    parser.add_argument("--only", default="", help="comma-separated check names (default: all)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_acceptance: no CUDA device here (torch.cuda.is_available() is False); run it on a GPU node",
              file=sys.stderr)
        return 2
    os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")  # compile time measured, not a cache hit
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpu_acceptance_") as tmp:
        lab = Lab(Path(tmp))
        wanted = {n for n in args.only.split(",") if n}
        rows: list[Row] = []
        for name, check in checks(lab):
            if wanted and name not in wanted:
                continue
            t0 = time.monotonic()
            try:
                got = check()
            except Exception as exc:  # noqa: BLE001 - a check that broke is a failed row, the others still run
                got = [row(name, None, None, "runs", False, f"{type(exc).__name__}: {str(exc)[:150]}")]
            for r in got:
                r["seconds"] = round(time.monotonic() - t0, 1)
            rows.extend(got)
            print(f"gpu_acceptance: {name} done in {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "seconds": round(time.monotonic() - started, 1), "rows": rows}
    Path(args.out).write_text(json.dumps(report, indent=2, default=str))
    print(show(rows))
    print(f"\n{sum(r['pass'] for r in rows)}/{len(rows)} passed on {report['device']} in {report['seconds']:.0f} s; "
          f"wrote {args.out}")
    return 0 if all(r["pass"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
