"""The levers of a 2026 GPU (issue 36) on the CPU: the paths a CPU runs, for real, on the
shipped GPT-2 and Llama tasks (SDPA's math and flash kernels, operator-level
checkpointing, compile's modes), and the rules that refuse the rest in one line, before a
trial, with the machine facts that decide them."""

from __future__ import annotations

import csv
import json
import sys

import pytest
import tomllib
import torch
import yaml
from torch.utils._python_dispatch import TorchDispatchMode

import tuner
from tuner.inputs import rules
from tuner.inputs.levers.process import _expandable_env
from tuner.inputs.space import Machine, make_config, unsupported
from tuner.outputs import diagnosis, exports
from tuner.trial.engines import model_levers as levers
from tuner.trial.engines import stages
from tuner.trial.engines.gpu_levers import GraphShapes, attention_kernel, float8_model

from conftest import ROOT, run, write_recipe

CPU = Machine(cuda=False, bf16=True, fp16=False)
CPU_DEVICE = torch.device("cpu")
H100 = Machine(cuda=True, bf16=True, fp16=True, cudnn=True, capability=(9, 0),
               packages=frozenset({"torchao", "liger_kernel"}))
A100 = Machine(cuda=True, bf16=True, fp16=True, cudnn=True, capability=(8, 0), packages=frozenset({"torchao"}))
T4 = Machine(cuda=True, bf16=False, fp16=True, cudnn=True, capability=(7, 5), packages=frozenset())
LLAMA = str(ROOT / "recipes" / "tasks" / "llama.py")
LLAMA_ARGS = {"seq_len": 32, "hidden_size": 64, "layers": 2, "heads": 4, "vocab_size": 256,
              "attn_implementation": "sdpa"}


def _refused(machine: Machine) -> dict[tuple[str, object], str]:
    return {(name, value): why for name, value, why, _ in unsupported(machine)}


def test_a_cpu_refuses_each_gpu_only_value_and_runs_the_others():
    refused = _refused(CPU)
    for knob, value in [("compile_mode", "reduce-overhead"), ("attention_backend", "efficient"),
                        ("attention_backend", "cudnn"), ("float8", "tensorwise"), ("float8", "rowwise"),
                        ("expandable_segments", True), ("fused_loss", True)]:
        assert (knob, value) in refused, (knob, value)
        assert "\n" not in refused[knob, value]
    for knob, value in [("compile_mode", "max-autotune-no-cudagraphs"), ("attention_backend", "math"),
                        ("attention_backend", "flash"), ("activation_checkpointing", "op")]:
        assert (knob, value) not in refused
    assert "compute capability 8.9" in refused["float8", "tensorwise"]


def test_the_gpu_decides_what_its_kernels_refuse():
    assert not {k for k in _refused(H100) if k[0] in ("float8", "attention_backend", "fused_loss", "compile_mode")}
    a100 = _refused(A100)
    assert "this GPU is 8.0" in a100["float8", "rowwise"] and ("attention_backend", "flash") not in a100
    assert "Liger-Kernel is not installed" in a100["fused_loss", True]
    t4 = _refused(T4)
    assert "compute capability 8.0 or higher; this GPU is 7.5" in t4["attention_backend", "flash"]
    assert ("attention_backend", "efficient") not in t4
    no_ao = Machine(cuda=True, bf16=True, fp16=True, capability=(9, 0), packages=frozenset())
    assert "pip install torchao" in _refused(no_ao)["float8", "tensorwise"]


def _rule(machine: Machine, **knobs: object) -> str | None:
    config, _ = make_config(knobs, 8, 2, machine)
    return rules.refusal(config, rules.Where(machine))


def test_what_cannot_run_together_is_refused_by_its_rule():
    assert "fp16 and bf16 inputs only" in _rule(H100, attention_backend="flash", amp_dtype="fp32")
    assert _rule(H100, attention_backend="flash", amp_dtype="bf16") is None
    assert _rule(H100, attention_backend="efficient", amp_dtype="fp32") is None
    assert _rule(CPU, attention_backend="flash", amp_dtype="fp32") is None  # the CPU's flash takes fp32
    graphs = "reduce-overhead without sharding"
    assert graphs in _rule(H100, compile=True, compile_mode="reduce-overhead", fsdp="full_shard")
    assert graphs in _rule(H100, compile=True, compile_mode="reduce-overhead", zero_stage=2)
    assert _rule(H100, compile=True, compile_mode="reduce-overhead") is None
    assert "DeepSpeed's ZeRO" in _rule(H100, float8="tensorwise", zero_stage=1, amp_dtype="bf16")
    assert "without tensor parallelism" in _rule(H100, float8="rowwise", tensor_parallel=2, amp_dtype="bf16")
    assert _rule(H100, float8="tensorwise", fsdp="full_shard", amp_dtype="bf16") is None
    assert "fused_loss without tensor or pipeline" in _rule(H100, fused_loss=True, tensor_parallel=2)
    staged = _rule(H100, fused_loss=True, pipeline_parallel=2, micro_batch_size=1)  # 8 micro-batches: 1f1b's rule holds
    assert "fused_loss without tensor or pipeline" in staged
    assert _rule(H100, fused_loss=True, fsdp="full_shard") is None


def test_compile_mode_is_inert_without_compile():
    config, _ = make_config({"compile_mode": "reduce-overhead"}, 8, 1, H100)
    assert GraphShapes.of(config) is None and rules.refusal(config, rules.Where(H100)) is None


def test_the_allocator_setting_joins_the_jobs_own():
    assert _expandable_env(True, {}) == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert _expandable_env(True, {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128,expandable_segments:False"}) \
        == {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128,expandable_segments:True"}
    assert _expandable_env(False, {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"}) == {}


def test_the_exports_carry_every_lever_as_measured():
    knobs = {"compile": True, "compile_mode": "max-autotune-no-cudagraphs", "attention_backend": "cudnn",
             "float8": "tensorwise", "fsdp": "full_shard", "amp_dtype": "bf16", "expandable_segments": True,
             "fused_loss": True, "activation_checkpointing": "op"}
    config, _ = make_config(knobs, 8, 8, H100)
    titan = tomllib.loads(exports.torchtitan_toml(config))
    assert titan["model"]["converters"] == ["float8"]
    assert titan["float8"]["enable_fsdp_float8_all_gather"] is True
    assert titan["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}
    assert "expandable_segments" in exports.torchtitan_toml(config)
    hf = exports.hf_training_args(config)
    assert hf["torch_compile_mode"] == "max-autotune-no-cudagraphs" and hf["use_liger_kernel"] is True
    accelerate = yaml.safe_load(exports.accelerate_config(config, True))
    assert accelerate["dynamo_config"]["dynamo_mode"] == "max-autotune-no-cudagraphs"
    settings = exports.torch_settings(config)
    for line in ("sdpa_kernel(SDPBackend.CUDNN_ATTENTION)", "Float8LinearConfig.from_recipe_name('tensorwise')",
                 "expandable_segments:True", "block.compile(mode='max-autotune-no-cudagraphs')",
                 "fused_linear_cross_entropy=True"):
        assert line in settings, line
    compile(settings, "torch_settings.py", "exec")
    op, _ = make_config({"activation_checkpointing": "op"}, 8, 1, CPU)
    pasted: dict = {}
    exec(exports.torch_settings(op), pasted)  # the policy a script pastes, run as it would be
    model = _blocks(0)
    torch.utils.checkpoint.checkpoint(model, torch.randn(2, 16), use_reentrant=False,
                                      context_fn=pasted["op_context"]).sum().backward()
    rowwise, _ = make_config({**knobs, "float8": "rowwise"}, 8, 8, H100)
    section = tomllib.loads(exports.torchtitan_toml(rowwise))["float8"]
    assert section["recipe_name"] == "rowwise" and section["enable_fsdp_float8_all_gather"] is False


def test_a_change_of_batch_shape_stops_a_graphed_trial():
    """``compile_mode``'s check of each micro-batch, as the loop gets it: from the stage's pass
    over the levers that declare one (``Applied.each_batch``), only where CUDA graphs record."""
    config, _ = make_config({"compile": True, "compile_mode": "reduce-overhead"}, 8, 1, H100)
    assert stages.batch_checks(make_config({"compile": True}, 8, 1, H100)[0]) == []
    [check] = stages.batch_checks(config)
    check({"input_ids": torch.zeros(8, 128), "labels": torch.zeros(8, 128)})
    check({"labels": torch.zeros(8, 128), "input_ids": torch.zeros(8, 128)})
    with pytest.raises(tuner.TrialError, match="the batches change shape"):
        check({"input_ids": torch.zeros(8, 97), "labels": torch.zeros(8, 97)})


class _Ops(TorchDispatchMode):
    """The aten operators that run, by name."""

    def __init__(self, names: tuple[str, ...]) -> None:
        super().__init__()
        self.names, self.seen = names, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in self.names:
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


def _blocks(seed: int) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    return torch.nn.Sequential(*(torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(),
                                                     torch.nn.Linear(64, 16)) for _ in range(4)))


@pytest.mark.parametrize("mode, recomputed", [("none", 0), ("op", 0), ("full", 4)])
def test_operator_level_checkpointing_keeps_the_matmuls_and_recomputes_the_rest(mode, recomputed):
    """Backward's matmuls: the gradients' 2 per Linear (input, weight; 8 Linears, the first
    one's input needs none: 15), plus the forward's own again where they are recomputed:
    ``full`` recomputes each block's first Linear (its second one's output is saved by no
    one, and the recompute stops early once what the backward needs is back); ``op``
    keeps the matmuls, and recomputes the GELUs, which ``none`` keeps."""
    plain, checked = _blocks(0), _blocks(0)
    assert levers.checkpoint_blocks(list(checked), mode, levers.Recompute(False)) == (0 if mode == "none" else 4)
    x = torch.randn(8, 16)
    plain(x).square().sum().backward()
    loss = checked(x).square().sum()
    ops = _Ops(("addmm", "mm", "gelu"))
    with ops:
        loss.backward()
    for a, b in zip(plain.parameters(), checked.parameters()):
        assert torch.equal(a.grad, b.grad)
    matmuls = sum(n in ("addmm", "mm") for n in ops.seen)
    assert matmuls == 15 + recomputed
    assert ops.seen.count("gelu") == (0 if mode == "none" else 4)


def _llama() -> torch.nn.Module:
    import importlib.util

    spec = importlib.util.spec_from_file_location("llama_task", LLAMA)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build_model(LLAMA_ARGS)


@pytest.mark.parametrize("backend, kernel", [("math", "_safe_softmax"),
                                             ("flash", "_scaled_dot_product_flash_attention_for_cpu")])
def test_the_attention_backend_picks_the_kernel_llama_runs(backend, kernel):
    """Llama (``attn_implementation: sdpa``) under each backend a CPU has: the fused flash
    kernel, or the math path's operators (a softmax per layer; it decomposes before any
    dispatch mode sees its own name)."""
    model = _llama()
    config, _ = make_config({"attention_backend": backend}, 8, 1, CPU)
    ids = torch.randint(0, 256, (2, 32))
    ops = _Ops(("_safe_softmax", "_scaled_dot_product_flash_attention_for_cpu"))
    with attention_kernel(config, CPU_DEVICE), ops:
        model(input_ids=ids, labels=ids).loss.backward()
    assert set(ops.seen) == {kernel} and len(ops.seen) == 2  # one per layer


@pytest.mark.parametrize("mode", ["op", "full"])
def test_a_checkpointed_block_recomputes_under_its_forwards_attention_kernel(mode):
    """The backward runs outside the forward's contexts; the recompute enters them again
    (without: ``op`` under math recomputed with the flash kernel and failed)."""
    config, _ = make_config({"attention_backend": "math"}, 8, 1, CPU)
    ids = torch.randint(0, 256, (2, 32))
    plain, checked = _llama(), _llama()
    checked.load_state_dict(plain.state_dict())
    levers.without_kv_cache(checked, mode)  # as a trial does: the cache grows between forward and recompute
    levers.checkpoint_blocks(list(checked.model.layers), mode, levers.Recompute(False),
                             lambda: stages.forward(config, CPU_DEVICE))
    for model in (plain, checked):
        with attention_kernel(config, CPU_DEVICE):
            loss = model(input_ids=ids, labels=ids).loss
        ops = _Ops(("_scaled_dot_product_flash_attention_for_cpu",))
        with ops:
            loss.backward()
        assert ops.seen == []
    for a, b in zip(plain.parameters(), checked.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=1e-6)


def test_float8_is_refused_before_it_converts_on_a_cpu():
    """torchao is not what refuses it: the machine rule does, before a trial (above);
    the converter itself leaves a model alone at ``off``."""
    config, _ = make_config({}, 8, 1, CPU)
    model = torch.nn.Linear(16, 16)
    assert float8_model(model, config) == [] and type(model) is torch.nn.Linear


def _search_recipe(tmp_path, facts):
    task = tmp_path / "sdpa_llama.py"
    task.write_text(f'''
import json, importlib.util, torch
spec = importlib.util.spec_from_file_location("llama", {LLAMA!r})
llama = importlib.util.module_from_spec(spec); spec.loader.exec_module(llama)
build_dataset, build_model = llama.build_dataset, llama.build_model
def compute_loss(model, batch):
    if batch.device.type != "meta":
        with open({str(facts)!r}, "a") as f:
            allowed = [torch.backends.cuda.math_sdp_enabled(), torch.backends.cuda.flash_sdp_enabled()]
            f.write(json.dumps(allowed) + "\\n")
    return llama.compute_loss(model, batch)
''')
    space = {"attention_backend": ["default", "math", "flash", "efficient", "cudnn"],
             "activation_checkpointing": ["none", "op"], "float8": ["off", "tensorwise", "rowwise"],
             "expandable_segments": [False, True], "fused_loss": [False, True],
             "compile_mode": ["default", "reduce-overhead"]}
    return write_recipe(tmp_path, {"name": "gpu-levers", "task": str(task), "task_args": LLAMA_ARGS,
                                   "global_batch_size": 8, "steps": {"warmup": 1, "measure": 4},
                                   "space": space, "budget": {"trials": 6}})


@pytest.mark.slow
def test_a_cpu_search_over_the_gpu_levers_refuses_the_gpu_ones_and_measures_the_rest(tmp_path):
    facts = tmp_path / "facts.jsonl"
    recipe = _search_recipe(tmp_path, facts)
    out = tmp_path / "run"
    proc = run([sys.executable, "-m", "tuner.search", str(recipe), "--out", str(out)], timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines() + proc.stderr.splitlines()
    for dropped in ("attention_backend=efficient dropped", "attention_backend=cudnn dropped",
                    "float8=tensorwise dropped", "float8=rowwise dropped", "expandable_segments=true dropped",
                    "fused_loss=true dropped", "compile_mode=reduce-overhead dropped"):
        assert sum(dropped in line for line in lines) == 1, dropped
    trials = list(csv.DictReader((out / "trials.csv").open()))
    assert all(t["state"] == "ok" for t in trials), [t["reason"] for t in trials]
    assert {"math", "flash"} <= {t["attention_backend"] for t in trials}
    assert "op" in {t["activation_checkpointing"] for t in trials}
    assert not {t["float8"] for t in trials} - {"off"} and not {t["fused_loss"] for t in trials} - {"False"}
    seen = {tuple(json.loads(line)) for line in facts.read_text().splitlines()}
    # each trial's forwards under its kernel: every one allowed (default), math alone, flash alone
    assert seen == {(True, True), (True, False), (False, True)}


@pytest.mark.slow
def test_operator_level_checkpointing_trains_gpt2_as_without_it(tmp_path):
    recipe = write_recipe(tmp_path, {
        "name": "op", "task": str(ROOT / "recipes" / "tasks" / "gpt2.py"),
        "task_args": {"seq_len": 32, "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 256},
        "global_batch_size": 4, "steps": {"warmup": 1, "measure": 3}})
    plain = tuner.measure(recipe, repeats=1)
    op = tuner.measure(recipe, repeats=1, activation_checkpointing="op")
    assert plain.failures == 0 and op.failures == 0, (plain.reason, op.reason)
    assert op.repeats[0].losses == plain.repeats[0].losses
    assert op.metrics["recompute_share"] > 0 and plain.metrics["recompute_share"] is None


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["max-autotune-no-cudagraphs"])  # default: tests/trial/test_levers.py
def test_each_compile_mode_a_cpu_runs_trains_with_its_compile_outside_the_window(tmp_path, mode):
    recipe = write_recipe(tmp_path, {
        "name": "modes", "task": str(ROOT / "recipes" / "tasks" / "gpt2.py"),
        "task_args": {"seq_len": 16, "n_embd": 32, "n_layer": 1, "n_head": 2, "vocab_size": 128},
        "global_batch_size": 4, "steps": {"warmup": 1, "measure": 3}})
    # with op checkpointing: under compile its policy is the only context checkpoint may take
    result = tuner.measure(recipe, repeats=1, compile=True, compile_mode=mode, activation_checkpointing="op")
    assert result.failures == 0, result.reason
    assert result.params["compile_mode"] == mode and result.params["activation_checkpointing"] == "op"
    assert result.metrics["compile_s"] > 0 and result.metrics["step_time_p50_s"] < result.metrics["compile_s"]


def test_the_diagnosis_suggests_them_where_its_verdict_points_and_the_machine_runs_them():
    from tuner.analysis.diagnose import diagnose

    metrics = {"samples_per_s": 100.0, "data_wait_share": 0.0, "step_time_p50_s": 0.1, "step_time_p99_s": 0.1,
               "peak_mem_gib": 9.5, "alloc_retries": 3}

    def advice(device: str, **params: object) -> str:
        found = diagnose(metrics, params, device=device, memory_budget_gib=10)
        return diagnosis.next_step(next(v for v in found if v.kind == "memory-bound"))

    assert "expandable_segments: true" in advice("cuda") and "fused_loss: true" in advice("cuda")
    assert "expandable_segments" not in advice("cuda", expandable_segments=True)
    assert "expandable_segments" not in advice("cpu") and "fused_loss" not in advice("cpu")


def test_a_script_trial_gets_the_allocator_setting_in_its_environment(tmp_path, monkeypatch):
    """The process lever reaches a script trial through its environment, read by the CUDA
    allocator when the script first touches the GPU, beside the job's own settings."""
    from tuner.inputs.recipe import load_recipe
    from tuner.scriptmode.launcher import launch

    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "recipe.yaml").write_text("name: s\nscript: train.py\nglobal_batch_size: 8\n")
    recipe = load_recipe(tmp_path / "recipe.yaml")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:256")
    config, _ = make_config({"expandable_segments": True}, 8, 1, H100)
    trial = {"knobs": config.params(), "grad_accum_steps": config.grad_accum_steps}
    _, env = launch(recipe, tmp_path, trial)
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:256,expandable_segments:True"
    off, _ = make_config({}, 8, 1, H100)
    _, env = launch(recipe, tmp_path, {"knobs": off.params(), "grad_accum_steps": 1})
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:256"
