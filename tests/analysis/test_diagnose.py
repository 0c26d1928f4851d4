"""Diagnosis: each verdict from a task built to have that bottleneck, and at its boundaries."""

from __future__ import annotations

import json

import pytest

import tuner
from tuner.analysis.diagnose import THRESHOLDS, diagnose
from tuner.outputs import diagnosis
from tuner.outputs.diagnosis import headline

from conftest import torchrun


def kinds(verdicts):
    return [v.kind for v in verdicts]


@pytest.mark.slow  # 10 s on a quiet machine
def test_a_slow_loader_is_data_bound(toy):
    """64 ms of reads a step (4 ms a sample, sleeping) against a step of microseconds: at 1 ms
    a sample, beside two CPU-bound processes, the step's arithmetic outgrew its reads and the
    verdict was compute-bound (a true reading of that machine)."""
    m = tuner.measure(toy(task_args={"read_ms": 4.0}), num_workers=0)
    assert kinds(m.diagnosis)[0] == "data-bound"
    assert "more loader workers than 0" in diagnosis.next_step(m.diagnosis[0])
    # the Python API hands each verdict over with its words: print(v) says them
    said = str(m.diagnosis[0])
    assert said.startswith("data-bound: the loop waits for data ") and "\n  next: try more loader workers" in said
    assert m.diagnosis[0].next_step == diagnosis.next_step(m.diagnosis[0])


def test_a_tiny_step_saturates_the_host(toy):
    """Width 16, two samples a step: microseconds of arithmetic and of reading per step,
    about a millisecond of Python and dispatch. The rule reads the main process's own CPU use
    (it must keep most of a core busy); beside two busy processes it got 0.6 of one, so the
    claim "the cores are busy" would be false there, and the verdict is not made: what the
    test holds is the rule against the figure the same run recorded."""
    recipe = toy(task_args={"width": 16, "cached": True}, global_batch_size=2, steps={"warmup": 5, "measure": 200})
    m = tuner.measure(recipe, num_workers=0)
    busy = m.metrics["cpu_util"] >= THRESHOLDS["host_saturated_cpu"]
    if busy:
        assert kinds(m.diagnosis)[0] == "host-bound", (m.metrics["cpu_util"], m.diagnosis)
        assert "large matmul" in diagnosis.evidence(m.diagnosis[0])
    else:
        assert "host-bound" not in kinds(m.diagnosis), (m.metrics["cpu_util"], m.diagnosis)


def test_a_wide_model_on_cached_data_is_compute_bound(toy):
    """Samples already in memory, a 2.4M-parameter model: the step is arithmetic, and the
    loop barely waits, so only a faster step would raise it. Its ceiling is the window's own
    steps less their waits (no replay below a 5% wait), which the evidence must not cite:
    it would be the wait restated. Which ceiling it is follows the wait this window recorded:
    in a two-at-a-time CI run the cached loop's wait passed 5% and the ceiling was replayed."""
    from tuner.trial.ceiling_comm_flops import CEILING_FROM_WINDOW_BELOW

    recipe = toy(task_args={"width": 32768, "cached": True}, global_batch_size=64, steps={"warmup": 2, "measure": 12})
    m = tuner.measure(recipe, num_workers=0)
    assert kinds(m.diagnosis)[0] == "compute-bound", (m.diagnosis, m.metrics)
    assert "data wait" in diagnosis.evidence(m.diagnosis[0])
    method, waited = m.metrics["stall_free_method"], m.metrics["data_wait_share"]
    assert method in ("window minus waits", "replayed"), method
    if waited < 0.8 * CEILING_FROM_WINDOW_BELOW:
        assert method == "window minus waits", (method, waited)
    if method == "window minus waits":
        assert "stall-free ceiling" not in diagnosis.evidence(m.diagnosis[0]), diagnosis.evidence(m.diagnosis[0])


@pytest.mark.slow
def test_a_large_all_reduce_under_two_ranks_is_communication_bound(toy):
    recipe = toy(task_args={"width": 16384, "step_ms": 2.0}, steps={"warmup": 3, "measure": 15})
    proc = torchrun(2, "-m", "tuner.measure", str(recipe), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert "communication-bound" in [v["kind"] for v in out["diagnosis"]], out["diagnosis"]


BASE = {"samples_per_s": 1000.0, "stall_free_samples_per_s": 1050.0, "data_wait_share": 0.02,
        "comm_share": 0.0, "cpu_util": 0.5, "step_time_p50_s": 0.010, "step_time_p99_s": 0.012,
        "peak_mem_gib": 2.0}


@pytest.mark.parametrize("change, kind", [
    ({"peak_mem_gib": 7.5}, "memory-bound"),
    ({"alloc_retries": 3}, "memory-bound"),
    ({"transfer_share": 0.2}, "input-transfer-bound"),
    ({"step_time_p99_s": 0.05}, "unstable"),
    ({"comm_share": 0.3}, "communication-bound"),
    ({"data_wait_share": 0.4, "stall_free_samples_per_s": 2500.0}, "data-bound"),
    ({"bubble_share": 0.3}, "pipeline-bound"),
])
def test_each_rule_at_its_threshold(change, kind):
    verdicts = diagnose({**BASE, **change}, {"num_workers": 2, "pin_memory": False}, memory_budget_gib=8)
    assert kind in kinds(verdicts)
    assert kind not in kinds(diagnose(BASE, {}, memory_budget_gib=8))


def test_a_pipeline_bubble_says_its_theory_and_the_levers_that_shrink_it():
    params = {"pipeline_parallel": 4, "grad_accum_steps": 4, "pipeline_schedule": "1f1b"}
    verdict = diagnose({**BASE, "bubble_share": 0.5}, params)[0]
    assert verdict.kind == "pipeline-bound"
    said, step = diagnosis.evidence(verdict), diagnosis.next_step(verdict)
    assert "idle 50% of the step (4 stages x 4 micro-batches: (p - 1) / (m + p - 1) = 43% in theory" in said
    assert "a smaller micro_batch_size" in step and "interleaved_1f1b" in step
    interleaved = diagnose({**BASE, "bubble_share": 0.5}, {**params, "pipeline_schedule": "interleaved_1f1b"})[0]
    assert "interleaved_1f1b" not in diagnosis.next_step(interleaved)  # already followed


def test_a_data_bound_next_step_advises_only_what_the_configuration_does_not_run():
    """quickstart's best, 8 persistent workers prefetching 4, was told "try more loader
    workers than 8, a larger prefetch_factor, persistent_workers"."""
    waiting = {**BASE, "data_wait_share": 0.5, "stall_free_samples_per_s": 3000.0}
    best = diagnose(waiting, {"num_workers": 8, "prefetch_factor": 4, "persistent_workers": True})[0]
    assert best.kind == "data-bound" and diagnosis.next_step(best).startswith(
        "try more loader workers than 8, a larger prefetch_factor than 4; if the workers"), diagnosis.next_step(best)
    # without workers, a prefetch depth and persistence mean nothing (the quick start's baseline
    # was left "try persistent_workers" once the evidence took the workers out)
    baseline = diagnose(waiting, {"num_workers": 0, "prefetch_factor": 2, "persistent_workers": False})[0]
    # and no "if the workers are CPU-bound": the loop loads every sample itself
    assert diagnosis.next_step(baseline) == ("try more loader workers than 0; or make the per-sample work cheaper "
                                             "(decode once, cache)"), baseline
    two = diagnose(waiting, {"num_workers": 2, "prefetch_factor": 2, "persistent_workers": False})[0]
    assert diagnosis.next_step(two).startswith(
        "try more loader workers than 2, a larger prefetch_factor than 2, persistent_workers: true;"), two


def test_gpu_host_bound_needs_an_idle_gpu():
    busy_host = {**BASE, "cpu_util": 1.0}
    assert kinds(diagnose({**busy_host, "gpu_util": 0.3}, device="cuda"))[0] == "host-bound"
    assert "host-bound" not in kinds(diagnose({**busy_host, "gpu_util": 0.95}, device="cuda"))


def test_a_ceiling_taken_from_the_window_itself_is_never_cited():
    """``window minus waits`` is rate / (1 - wait): citing it as the compute-bound verdict's
    evidence would prove the wait from the wait."""
    replayed = diagnose({**BASE, "stall_free_method": "replayed"})
    shortcut = diagnose({**BASE, "stall_free_method": "window minus waits"})
    assert any("stall-free ceiling" in diagnosis.evidence(v) for v in replayed), replayed
    assert all("stall-free ceiling" not in diagnosis.evidence(v) for v in shortcut), shortcut


def test_data_wait_with_no_headroom_is_not_data_bound():
    """Waiting 20% but the stall-free ceiling is barely higher: a faster loader buys little."""
    metrics = {**BASE, "data_wait_share": 0.2, "stall_free_samples_per_s": 1100.0}
    assert "data-bound" not in kinds(diagnose(metrics))


def test_verdicts_are_ordered_and_explained():
    verdicts = diagnose({**BASE, "data_wait_share": 0.5, "stall_free_samples_per_s": 3000.0, "comm_share": 0.2,
                         "step_time_p99_s": 0.05}, {"num_workers": 1})
    assert kinds(verdicts) == ["data-bound", "communication-bound", "unstable"]
    assert all(diagnosis.evidence(v) and diagnosis.next_step(v) for v in verdicts)
    assert headline([]).startswith("no clear bottleneck")
    assert set(THRESHOLDS) >= {"data_wait_share", "comm_share", "unstable_tail"}


def test_an_unmeasured_data_wait_is_never_a_zero_in_a_verdict():
    """nanoGPT under a plain python launch has no DataLoader: its data wait is unknown. The
    report said "compute-bound: 102 samples/s with 0% data wait" beside a table showing "-".
    Without a ceiling no compute-bound claim rests on the unknown wait; with a replayed
    ceiling at the rate it is made, and says the wait was not measured."""
    metrics = {"samples_per_s": 102.0, "data_wait_share": None, "comm_share": 0.0, "step_time_p50_s": 0.3,
               "step_time_p99_s": 0.31, "achieved_tflops": 0.05}
    assert "compute-bound" not in kinds(diagnose(metrics, host_matmul_tflops=0.2))
    replayed = {**metrics, "stall_free_samples_per_s": 103.0, "stall_free_method": "replayed"}
    verdict = next(v for v in diagnose(replayed, host_matmul_tflops=0.2) if v.kind == "compute-bound")
    assert "data wait not measured" in diagnosis.evidence(verdict) and "0% data wait" not in diagnosis.evidence(verdict)


def test_a_larger_micro_batch_is_advised_only_where_accumulation_is_left_to_trade():
    """The DeepSpeed job at micro-batch 128 of a global 256 on 2 ranks (one accumulation
    step) was told to "try a larger micro-batch": at a fixed global batch there is none."""
    metrics = {"samples_per_s": 5000.0, "data_wait_share": 0.0, "comm_share": 0.31, "step_time_p50_s": 0.05,
               "step_time_p99_s": 0.06}
    whole = next(v for v in diagnose(metrics, {"micro_batch_size": 128, "grad_accum_steps": 1, "zero_stage": 0})
                 if v.kind == "communication-bound")
    step = diagnosis.next_step(whole)
    assert "micro-batch" not in step and "micro_batch_size" not in step, step
    assert "larger buckets" in diagnosis.next_step(whole)
    split = next(v for v in diagnose(metrics, {"micro_batch_size": 32, "grad_accum_steps": 4, "zero_stage": 0})
                 if v.kind == "communication-bound")
    assert diagnosis.next_step(split).startswith("try a larger micro_batch_size with fewer accumulation steps")


def test_the_advice_passes_the_searchs_refusal_rules_and_says_how_to_add_what_it_lacks(tmp_path):
    """A compute-bound CPU job whose micro-batch is the whole global batch: the advice holds
    only what the search could run here (what the machine rules out, the space's refusal
    rules), and the levers outside the recipe's space end it with how to add them. Without
    the search's rules (``tuner measure``) a CPU's own refusals still apply."""
    from tuner.analysis.remedies import remedies
    from tuner.inputs.recipe import load_recipe
    from tuner.inputs.space import Machine, make_config
    from tuner.study.searchspace import build_space
    from tuner.tuning import config_view

    from conftest import toy_recipe

    def said_by(*args, **kwargs) -> str:
        return diagnosis.listed(remedies(*args, **kwargs))

    recipe = load_recipe(toy_recipe(tmp_path, global_batch_size=16, space={"amp_dtype": ["fp32", "bf16"]}))
    machine = Machine(cuda=False, bf16=True, fp16=False)
    space = build_space(recipe, machine)

    def make(knobs):
        knobs = {k: v for k, v in knobs.items() if k not in ("grad_accum_steps", "engine")}
        return make_config(knobs, 16, 1, machine, "auto", strict=False)[0]

    params = make({"micro_batch_size": 16}).params()
    here = config_view.here(space, machine, make, params, 16)
    said = said_by("compute-bound", params, "cpu", here=here)
    for refused in ("matmul_precision", "cudnn_benchmark", "float8", "cudnn (fused", "larger micro_batch_size"):
        assert refused not in said, (refused, said)  # CUDA-only, or no accumulation left to trade
    assert "compile: true (fused kernels)" in said and "amp_dtype: bf16" in said
    assert said.endswith("add space: {compile: [false, true], optimizer_impl: [default, fused], channels_last: "
                         "[false, true], attention_backend: [default, flash]}"), said
    assert here.refusal("attention_backend", "cudnn") and here.refusal("micro_batch_size", 32)
    plain = said_by("compute-bound", params, "cpu")
    assert "float8" not in plain and "add space" not in plain
    # what the trial recorded its model holds: nothing for channels_last or an attention kernel
    bare = said_by("compute-bound", {**params, "model": {"convolutions": False, "attention": False}}, "cpu",
                    here=here)
    assert "channels_last" not in bare and "attention_backend" not in bare and "compile: true" in bare, bare
    images = said_by("compute-bound", {**params, "model": {"convolutions": True, "attention": False}}, "cpu",
                      here=here)
    assert "channels_last: true" in images and "attention_backend" not in images, images
    # a script under adapt: torch takes loader and process knobs only: "add space: {compile: ...}"
    # would be refused ("reaches the script by no route"); it is told how they reach it instead
    from tuner.inputs.script import ADAPTER_ROUTES

    script = config_view.here(space, machine, make, params, 16, set(ADAPTER_ROUTES["torch"]))
    routed = said_by("compute-bound", {**params, "model": {"convolutions": False, "attention": True}}, "cpu",
                      here=script)
    assert "add space" not in routed and "compile: true (fused kernels)" in routed, routed
    assert routed.endswith("compile, optimizer_impl and attention_backend reach this script only through a "
                           "flag or variable it reads: set them in the script, or map them (knobs: "
                           "{compile: \"--compile {}\"}) to search them"), routed


def test_no_clear_bottleneck_claims_no_wait_only_where_one_was_measured():
    """nanoGPT's loop iterates no DataLoader: its data wait is null, never read as none."""
    from tuner.outputs.diagnosis import headline

    unmeasured = headline([], {"data_wait_share": None, "samples_per_s": 35.4})
    assert "no wait" not in unmeasured and "data wait is not measured" in unmeasured
    assert "no wait" in headline([], {"data_wait_share": 0.01, "samples_per_s": 35.4})


def test_communication_advice_names_the_buckets_of_the_engine_it_runs():
    """The DeepSpeed job was told "larger buckets (ddp_bucket_cap_mb; ...)", a DDP lever, and,
    on a CPU, "on GPUs, check the interconnect (NCCL_DEBUG=INFO)"; FSDP2 has no bucket knob."""
    metrics = {"samples_per_s": 5000.0, "data_wait_share": 0.0, "comm_share": 0.31, "step_time_p50_s": 0.05,
               "step_time_p99_s": 0.06}

    def advice(**params):
        knobs = {"micro_batch_size": 128, "grad_accum_steps": 1, "zero_stage": 0, **params}
        return diagnosis.next_step(next(v for v in diagnose(metrics, knobs) if v.kind == "communication-bound"))

    ds = advice(engine="deepspeed")
    assert "reduce_bucket_size" in ds and "overlap_comm: true" in ds and "ddp_bucket_cap_mb" not in ds, ds
    ddp = advice(engine="torch")
    assert "ddp_bucket_cap_mb" in ddp and "overlap_comm" not in ddp and "reduce_bucket_size" not in ddp, ddp
    sharded = advice(engine="torch", fsdp="full_shard")
    assert "ddp_bucket_cap_mb" not in sharded and "reduce_bucket_size" not in sharded, sharded  # no bucket knob
    assert "NCCL" not in ds + ddp  # a CPU run: no interconnect to check
