"""The new levers as knobs: values, where they apply, what cannot go together, how a
recipe refuses them, and the configs to paste, each read back by the library it is for."""

from __future__ import annotations

import dataclasses
import json
import sys

import pytest
import tomllib

from tuner.inputs.errors import RecipeError
from tuner.inputs.levers.precision import LIGHTNING_PRECISION
from tuner.inputs.plan import Plan
from tuner.inputs.rules import conflict
from tuner.inputs.space import Machine, make_config, numerics, parse_space, reference_knobs, restrict
from tuner.outputs import exports

from conftest import parsed_by_lightning_cli, run

CPU = Machine(cuda=False, bf16=True, fp16=False)


def test_yaml_off_reads_as_the_fsdp_mode_off():
    # YAML 1.1 reads a bare `off` as false: `fsdp: [off, full_shard]` must still mean "off".
    assert parse_space({"fsdp": [False, "full_shard"]}) == {"fsdp": ("off", "full_shard")}
    assert parse_space({"activation_checkpointing": [False, "full"]})["activation_checkpointing"] == ("none", "full")
    with pytest.raises(RecipeError, match=r"space.fsdp\[0\]: expected one of off, full_shard, shard_grad_op"):
        parse_space({"fsdp": ["zero3"]})


def test_fsdp_picks_its_engine_and_never_goes_with_zero():
    assert make_config({"fsdp": "shard_grad_op"}, 8, 2, CPU)[0].engine == "fsdp"
    with pytest.raises(RecipeError, match="two ways to shard the same model"):
        make_config({"fsdp": "full_shard", "zero_stage": 2}, 8, 2, CPU)
    with pytest.raises(RecipeError, match="engine: deepspeed"):
        make_config({"fsdp": "full_shard"}, 8, 2, CPU, engine="deepspeed")


def test_offload_needs_a_sharded_optimizer():
    assert conflict({"offload_optimizer": "cpu"}) is not None
    assert conflict({"offload_optimizer": "cpu", "zero_stage": 1}) is None
    assert conflict({"offload_optimizer": "cpu", "fsdp": "full_shard"}) is None


def test_a_knob_that_means_nothing_takes_its_default():
    # DDP's buckets without DDP, DeepSpeed's without ZeRO: one configuration, one key.
    one_rank, _ = make_config({"ddp_bucket_cap_mb": 100}, 8, 1, CPU)
    ddp, _ = make_config({"ddp_bucket_cap_mb": 100}, 8, 2, CPU)
    fsdp, _ = make_config({"ddp_bucket_cap_mb": 100, "fsdp": "full_shard", "overlap_comm": True}, 8, 2, CPU)
    zero3, _ = make_config({"zero_stage": 3, "allgather_bucket_size": 1000, "overlap_comm": True}, 8, 2, CPU)
    assert one_rank.ddp_bucket_cap_mb == 25 and ddp.ddp_bucket_cap_mb == 100
    assert fsdp.ddp_bucket_cap_mb == 25 and fsdp.overlap_comm is False
    assert zero3.allgather_bucket_size == 500_000_000 and zero3.overlap_comm is True  # ZeRO-3 gathers by prefetch


def test_what_this_machine_cannot_run_is_dropped_with_a_note():
    bare = Machine(cuda=False, bf16=True, fp16=False, compiler=False, fsdp2=False)
    space, notes = restrict({"compile": (False, True), "fsdp": ("off", "full_shard", "shard_grad_op")}, bare)
    assert space == {"compile": (False,), "fsdp": ("off",)}
    assert any("C++ compiler" in n for n in notes) and any("FSDP2 needs torch >= 2.6" in n for n in notes)


def test_the_precision_guard_covers_compile_checkpointing_and_sharding():
    assert numerics({"amp_dtype": "fp32"}) is None
    assert numerics({"amp_dtype": "fp32", "compile": True}) == "fp32 + compile"
    assert numerics({"amp_dtype": "bf16", "fsdp": "full_shard"}) == "bf16 + fsdp=full_shard"
    ref = reference_knobs({"amp_dtype": "bf16", "compile": True, "fsdp": "full_shard", "offload_optimizer": "cpu",
                           "activation_checkpointing": "full", "micro_batch_size": 4})
    assert numerics(ref) is None and conflict(ref) is None and ref["micro_batch_size"] == 4
    plan = Plan.batched(2, 8, amp_dtype="bf16", fsdp="full_shard", compile=True)
    assert numerics(plan) == numerics(plan.params()) == "bf16 + fsdp=full_shard + compile"  # a plan or its record
    assert numerics(Plan.batched(2, 8)) is None


@pytest.mark.parametrize("knobs", [
    {"fsdp": "full_shard", "activation_checkpointing": "selective", "compile": True, "amp_dtype": "bf16",
     "offload_optimizer": "cpu", "optimizer_impl": "fused"},
    {"fsdp": "shard_grad_op", "activation_checkpointing": "full"},
    {"zero_stage": 2, "overlap_comm": True, "reduce_bucket_size": 10**7, "allgather_bucket_size": 10**7,
     "offload_optimizer": "cpu"},
    {"zero_stage": 3, "overlap_comm": True},
    {"ddp_bucket_cap_mb": 100, "activation_checkpointing": "full", "optimizer_impl": "foreach"},
])
def test_every_export_is_accepted_by_the_library_that_reads_it(knobs, tmp_path):
    from accelerate.commands.config.config_args import load_config_from_file
    from deepspeed.runtime.config import DeepSpeedConfig
    from transformers import TrainingArguments

    config, _ = make_config(knobs, 32, 2, CPU)
    ds = exports.ds_config(config)
    one = dataclasses.replace(config, world_size=1)  # DeepSpeed checks the batch against its world: 1 here
    DeepSpeedConfig(json.loads(json.dumps(exports.ds_config(one))))
    zero = ds["zero_optimization"]
    assert zero["stage"] == config.zero_stage
    assert ("offload_optimizer" in zero) == (config.zero_stage >= 1 and config.offload_optimizer == "cpu")
    if config.zero_stage >= 1:
        assert zero["overlap_comm"] == config.overlap_comm and zero["reduce_bucket_size"] == config.reduce_bucket_size

    path = tmp_path / "accelerate_config.yaml"
    path.write_text(exports.accelerate_config(config, cuda=False))
    loaded = load_config_from_file(str(path))
    if config.engine == "fsdp":
        assert loaded.distributed_type == "FSDP" and loaded.fsdp_config["fsdp_version"] == 2
        assert loaded.fsdp_config["fsdp_reshard_after_forward"] == (config.fsdp == "full_shard")
        assert loaded.fsdp_config["fsdp_activation_checkpointing"] == (config.activation_checkpointing != "none")
    assert (loaded.dynamo_config or {}).get("dynamo_backend") == ("INDUCTOR" if config.compile else None)

    hf = exports.hf_training_args(config)
    hf.pop("deepspeed", None)
    args = TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True, **hf)
    assert args.torch_compile == config.compile
    if config.optimizer_impl == "default":  # the job's own optimizer: no optim key, the Trainer's default stands
        assert "optim" not in hf and args.optim.value == TrainingArguments(output_dir=str(tmp_path)).optim.value
    else:
        assert args.optim.value == ("adamw_torch_fused" if config.optimizer_impl == "fused" else "adamw_torch")
    if config.engine != "fsdp":
        assert bool(args.activation_checkpointing) == (config.activation_checkpointing != "none")

    _read_back_by_lightning_cli(config, tmp_path)

    titan = tomllib.loads(exports.torchtitan_toml(config))
    assert titan["training"]["local_batch_size"] == config.micro_batch_size
    assert titan["training"]["compile"] == config.compile
    assert titan["activation_checkpoint"]["mode"] == config.activation_checkpointing
    assert titan["parallelism"]["data_parallel_shard_degree"] == (2 if config.engine == "fsdp" else 1)
    assert titan["optimizer"]["implementation"] == {"default": "for-loop", "foreach": "foreach",
                                                    "fused": "fused"}[config.optimizer_impl]


def _read_back_by_lightning_cli(config, tmp_path):
    """lightning_trainer.yaml through LightningCLI's own parser."""
    parsed = parsed_by_lightning_cli(exports.lightning_trainer(config, cuda=False), tmp_path)
    assert parsed.trainer.precision == LIGHTNING_PRECISION[config.amp_dtype]
    assert parsed.trainer.accumulate_grad_batches == config.grad_accum_steps and parsed.trainer.devices == 2
    assert parsed.data.batch_size == config.micro_batch_size and parsed.data.num_workers == config.num_workers
    strategy = parsed.trainer.strategy
    if config.engine == "deepspeed":
        assert strategy == f"deepspeed_stage_{config.zero_stage}" + ("_offload" if config.offload_optimizer == "cpu"
                                                                      else "")
    elif config.engine == "fsdp":
        assert strategy.class_path.endswith("FSDPStrategy")
        assert strategy.init_args.sharding_strategy.name == ("FULL_SHARD" if config.fsdp == "full_shard"
                                                             else "SHARD_GRAD_OP")
        assert bool(strategy.init_args.cpu_offload) == (config.offload_optimizer == "cpu")
    else:
        assert strategy == "ddp"


@pytest.mark.parametrize("args, message", [
    (["--set", "fsdp=full_shard", "--set", "zero_stage=2"],
     "--set: fsdp: full_shard and zero_stage: 2 are two ways to shard the same model"),
    (["--set", "offload_optimizer=cpu"], "--set: offload_optimizer: cpu needs a sharded optimizer"),
    (["--set", "compile=maybe"], "--set compile: expected true or false"),
    (["--set", "activation_checkpointing=half"], "expected one of none, op, selective, full"),
])
def test_impossible_levers_are_refused_before_anything_runs(toy, args, message):
    proc = run([sys.executable, "-m", "tuner.measure", str(toy()), *args])
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_a_recipe_fixing_fsdp_and_zero_together_is_refused(toy):
    proc = run([sys.executable, "-m", "tuner.search", str(toy(space={"fsdp": "full_shard", "zero_stage": 2}))])
    assert proc.returncode == 2 and "space: fsdp: full_shard and zero_stage: 2" in proc.stderr, proc.stderr
    recipe = toy(engine="deepspeed", space={"fsdp": ["off", "full_shard"]})
    proc = run([sys.executable, "-m", "tuner.search", str(recipe)])
    assert proc.returncode == 2 and "engine: deepspeed cannot run fsdp" in proc.stderr, proc.stderr
