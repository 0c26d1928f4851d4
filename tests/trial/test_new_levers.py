"""The levers added through the registry alone, running for real where this machine runs
them: ``channels_last`` and ``in_order`` on the CPU; ``matmul_precision`` and
``cudnn_benchmark`` held for a trial and put back, and refused for a CPU-only search in
one line each."""

from __future__ import annotations

import json
import sys
import time

import pytest
import torch
from torch.utils.data import Dataset

import tuner
from tuner.analysis.diagnose import diagnose
from tuner.analysis.guard import divergence
from tuner.inputs.levers import dataloader_kwargs
from tuner.inputs.space import Machine, make_config
from tuner.outputs import diagnosis, exports, trial_words
from tuner.scriptmode.adapters.common import rebuild_loader
from tuner.scriptmode.config import TrialConfig
from tuner.trial.engines import process

from conftest import ROOT, run, write_recipe

CPU = Machine(cuda=False, bf16=True, fp16=False)
CONVNET = str(ROOT / "recipes" / "tasks" / "convnet.py")
PROBE_TASK = '''
import json, torch
from torch import nn
import importlib.util
spec = importlib.util.spec_from_file_location("convnet", {convnet!r})
convnet = importlib.util.module_from_spec(spec); spec.loader.exec_module(convnet)
build_dataset, build_model = convnet.build_dataset, convnet.build_model
def compute_loss(model, batch):
    x, y = batch
    conv = next(m for m in model.modules() if isinstance(m, nn.Conv2d))
    if x.device.type == "meta":  # the FLOP count's shapes-only pass of the plain model, not the loop
        return nn.functional.cross_entropy(model(x), y)
    with open({facts!r}, "a") as f:
        f.write(json.dumps([x.is_contiguous(memory_format=torch.channels_last),
                            conv.weight.is_contiguous(memory_format=torch.channels_last),
                            torch.get_float32_matmul_precision()]) + "\\n")
    return nn.functional.cross_entropy(model(x), y)
'''


def _probe_recipe(tmp_path, **fields):
    facts = tmp_path / "facts.jsonl"
    (tmp_path / "probe_task.py").write_text(PROBE_TASK.format(convnet=CONVNET, facts=str(facts)))
    body = {"name": "conv", "task": "probe_task.py", "task_args": {"size": 256, "channels": 16},
            "global_batch_size": 8, "steps": {"warmup": 1, "measure": 3}, **fields}
    return write_recipe(tmp_path, body), facts


def test_channels_last_converts_the_model_and_every_image_batch(tmp_path):
    recipe, facts = _probe_recipe(tmp_path)
    nhwc = tuner.measure(recipe, channels_last=True)
    assert nhwc.failures == 0 and nhwc.params["channels_last"] is True
    rows = [json.loads(line) for line in facts.read_text().splitlines()]
    assert rows and all(x and w for x, w, _ in rows)  # the loop's batches and the weights, NHWC
    facts.unlink()
    plain = tuner.measure(recipe)
    rows = [json.loads(line) for line in facts.read_text().splitlines()]
    assert plain.failures == 0 and not any(x or w for x, w, _ in rows)


def test_channels_last_on_a_model_without_convolutions_says_it_changes_nothing():
    from tuner.trial.engines.model_levers import channels_last

    assert channels_last(torch.nn.Linear(4, 4), True) == [
        "channels_last: the model has no 2-D convolution, so the memory format changes nothing it computes"]
    assert channels_last(torch.nn.Conv2d(3, 4, 3), True) == [] and channels_last(torch.nn.Linear(4, 4), False) == []


class _Uneven(Dataset):
    """Sample 0 (all of batch 0) is slow to prepare; the others are instant."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int):
        if index < 4:
            time.sleep(0.4)
        return torch.tensor([float(index)])


def _first_batches(in_order: bool) -> list[int]:
    config, _ = make_config({"num_workers": 2, "in_order": in_order, "micro_batch_size": 4}, 4, 1, CPU)
    batches = iter(torch.utils.data.DataLoader(_Uneven(), **dataloader_kwargs(config)))
    first = [int(next(batches)[0, 0]) for _ in range(3)]
    batches._shutdown_workers()
    return first


def test_out_of_order_hands_over_the_ready_batches_before_a_slow_one():
    # Real workers: batch 0 takes 1.6 s on worker 0, batch 1 is instant on worker 1.
    assert _first_batches(in_order=True)[0] == 0
    assert _first_batches(in_order=False)[0] != 0


def test_in_order_is_a_loader_keyword_only_with_workers_and_only_when_off():
    config, _ = make_config({"num_workers": 0, "in_order": False}, 8, 1, CPU)
    assert config.in_order is True and "in_order" not in dataloader_kwargs(config)
    on, _ = make_config({"num_workers": 2}, 8, 1, CPU)
    off, _ = make_config({"num_workers": 2, "in_order": False}, 8, 1, CPU)
    assert "in_order" not in dataloader_kwargs(on) and dataloader_kwargs(off)["in_order"] is False
    assert dataloader_kwargs(off)["in_order"] is False


def test_the_script_loader_is_rebuilt_with_in_order():
    loader = torch.utils.data.DataLoader(_Uneven(), batch_size=4, num_workers=1)
    cfg = TrialConfig.of(4, 1, True, micro_batch_size=4, num_workers=2, in_order=False)
    rebuilt = rebuild_loader(loader, cfg, "torch")
    assert rebuilt.in_order is False and rebuilt.num_workers == 2
    kept = rebuild_loader(loader, cfg, "torch", only=["micro_batch_size"])
    assert kept.in_order is True and kept.num_workers == 1


def test_process_levers_hold_for_a_trial_and_come_back():
    before = torch.get_float32_matmul_precision(), torch.backends.cudnn.benchmark
    config, _ = make_config({"matmul_precision": "medium", "cudnn_benchmark": True}, 8, 1,
                            Machine(cuda=True, bf16=True, fp16=True, cudnn=True))
    with process.held(config):
        assert torch.get_float32_matmul_precision() == "medium" and torch.backends.cudnn.benchmark is True
    assert (torch.get_float32_matmul_precision(), torch.backends.cudnn.benchmark) == before


def test_a_trial_runs_with_its_matmul_precision_and_restores_it(tmp_path):
    # The CPU search refuses "high"; a trial given it (as a GPU search would) holds it.
    from tuner.harness.distributed import context
    from tuner.inputs.recipe import load_recipe
    from tuner.trial.run import run_trial

    recipe_path, facts = _probe_recipe(tmp_path)
    recipe = load_recipe(recipe_path)
    config, _ = make_config({"matmul_precision": "high"}, 8, 1, Machine(cuda=True, bf16=True, fp16=True))
    result = run_trial(recipe, config, context())
    assert result.ok, result.reason
    assert {json.loads(line)[2] for line in facts.read_text().splitlines()} == {"high"}
    assert torch.get_float32_matmul_precision() == "highest"


@pytest.mark.slow
def test_a_cpu_search_refuses_the_gpu_levers_in_one_line_each(tmp_path):
    recipe, _ = _probe_recipe(tmp_path, space={"matmul_precision": ["highest", "high"],
                                               "cudnn_benchmark": [False, True], "channels_last": [False, True]},
                              budget={"trials": 2})
    proc = run([sys.executable, "-m", "tuner.search", str(recipe), "--out", str(tmp_path / "run")], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines() + proc.stderr.splitlines()
    assert sum("matmul_precision=high dropped: TF32 matmuls need a CUDA GPU" in line for line in lines) == 1
    assert sum("cudnn_benchmark=true dropped" in line for line in lines) == 1
    best = json.loads((tmp_path / "run" / "best.json").read_text())
    assert best["params"]["matmul_precision"] == "highest" and best["params"]["cudnn_benchmark"] is False
    settings = (tmp_path / "run" / "torch_settings.py").read_text()
    assert ("channels_last" in settings) == best["params"]["channels_last"]
    compile(settings.replace("model = ", "model = torch.nn.Conv2d(3, 3, 1); model = "), "torch_settings", "exec")


def test_the_exports_say_what_was_measured():
    config, _ = make_config({"matmul_precision": "high", "cudnn_benchmark": True, "channels_last": True}, 8, 1,
                            Machine(cuda=True, bf16=True, fp16=True, cudnn=True))
    settings = exports.torch_settings(config)
    assert 'torch.set_float32_matmul_precision(\'high\')' in settings
    assert "torch.backends.cudnn.benchmark = True" in settings and "channels_last" in settings
    assert exports.hf_training_args(config)["tf32"] is True
    medium, _ = make_config({"matmul_precision": "medium"}, 8, 1, Machine(cuda=True, bf16=True, fp16=True))
    assert "tf32" not in exports.hf_training_args(medium)  # TrainingArguments has no bf16-matmul field
    plain, _ = make_config({}, 8, 1, CPU)
    assert "nothing to set" in exports.torch_settings(plain)


def test_compute_bound_advice_leaves_out_what_the_configuration_already_does():
    metrics = {"samples_per_s": 100.0, "data_wait_share": 0.0, "step_time_p50_s": 0.1, "step_time_p99_s": 0.1}
    fused = diagnose(metrics, {"optimizer_impl": "fused", "compile": True, "amp_dtype": "bf16"}, device="cpu")
    step = diagnosis.next_step(next(v for v in fused if v.kind == "compute-bound"))
    assert "optimizer_impl" not in step and "compile: true" not in step and "amp_dtype" not in step
    assert "matmul_precision" not in step and "cudnn_benchmark" not in step  # a CPU runs neither
    # the values a CPU runs of a lever it half runs; a mode only once compile is on
    assert "compile_mode: max-autotune-no-cudagraphs," in step and "attention_backend: flash" in step
    assert "cudnn" not in step and "reduce-overhead" not in step and "float8" not in step
    gpu = diagnosis.next_step(next(v for v in diagnose(metrics, {}, device="cuda") if v.kind == "compute-bound"))
    assert gpu.index("matmul_precision: high") < gpu.index("compile: true") and "cudnn_benchmark" in gpu
    assert "compile_mode" not in gpu and "float8: tensorwise" in gpu and "attention_backend: flash or cudnn" in gpu


def test_the_guard_compares_out_of_order_curves_by_their_mean():
    reference = [2.0, 1.0, 3.0, 2.0]
    permuted = [3.0, 2.0, 2.0, 1.0]
    assert divergence(permuted, reference, 0.05, "bf16") is not None  # step by step: batches differ
    assert divergence(permuted, reference, 0.05, "bf16", ordered=False) is None
    apart = divergence([4.0, 4.0, 4.0, 4.0], reference, 0.05, "bf16", ordered=False)
    assert apart is not None and apart["code"] == "mean_apart"
    assert "mean loss" in trial_words.trial_reason({"ruled": apart})


def test_what_the_library_ran_is_what_the_advice_reads(tmp_path, monkeypatch):
    """An HF Trainer left at optimizer_impl: default runs fused AdamW (transformers 5): its
    probe reports it, the trial file carries it, and the compute-bound advice does not
    suggest what already ran."""
    import transformers

    from tuner.harness.metrics import METRIC_NAMES
    from tuner.measurement import combine
    from tuner.scriptmode import trialfile
    from tuner.scriptmode.callbacks.hf import ProbeCallback
    from tuner.trial.trial_result import TrialResult

    loader = torch.utils.data.DataLoader(list(range(8)), batch_size=2)
    ran = {}
    for optim in ("adamw_torch_fused", "adamw_torch"):
        args = transformers.TrainingArguments(output_dir=str(tmp_path / optim), optim=optim, report_to=[],
                                              use_cpu=True)
        callback = ProbeCallback(report=False)
        callback.on_train_begin(args, None, None, train_dataloader=loader)
        ran[optim] = dict(callback.probe.ran)
        callback._unwrap()
        callback.probe.close()
    assert ran == {"adamw_torch_fused": {"optimizer_impl": "fused"}, "adamw_torch": {}}

    result = tmp_path / "result.json"
    monkeypatch.setenv("RANK", "0")
    trialfile.report({"samples_per_s": 1.0}, {"result": str(result)}, ["a note"], ran["adamw_torch_fused"])
    assert trialfile.read_result(result).ran == {"optimizer_impl": "fused"}

    metrics = {**dict.fromkeys(METRIC_NAMES), "samples_per_s": 100.0, "data_wait_share": 0.0,
               "step_time_p50_s": 0.1, "step_time_p99_s": 0.1}
    config, _ = make_config({}, 8, 1, CPU)
    runs = [TrialResult(config.params(), "ok", metrics=metrics, ran={"optimizer_impl": "fused"})]
    advice = next(v for v in combine("hf", None, config, runs, [], 1).diagnosis if v.kind == "compute-bound")
    assert "optimizer_impl" not in diagnosis.next_step(advice) and "compile: true" in diagnosis.next_step(advice)
