"""The parallel layout's arithmetic, rules and exports (issue 27): where each rank sits in
the (pp, dp, tp) mesh, the global batch counted over the data-parallel ranks, every rule
that refuses a layout named in its words, and the degrees in each config to paste, read
back by the libraries that take them."""

from __future__ import annotations

import pytest
import tomllib

from tuner.inputs import layout, rules
from tuner.inputs.plan import Plan
from tuner.inputs.space import Machine, make_config
from tuner.outputs import exports

from conftest import parsed_by_lightning_cli

CPU = Machine(cuda=False, bf16=True, fp16=False)


def test_ranks_sit_in_the_mesh_as_init_device_mesh_places_them():
    lay = layout.Layout(tp=2, pp=2, world=8)
    assert lay.dp == 2 and lay.model_parallel
    # row-major over (pp, dp, tp): a tensor-parallel group is consecutive ranks (one node)
    assert [lay.coordinates(r) for r in range(8)] == [
        (0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1), (1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1)]
    assert [lay.data_rank(r) for r in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]
    assert layout.Layout(tp=2, pp=4, world=4).dp == 1  # refused, yet its batch arithmetic holds


def test_the_global_batch_is_counted_over_the_data_parallel_ranks():
    config, _ = make_config({"tensor_parallel": 2, "micro_batch_size": 4}, 32, 8, CPU)
    assert config.engine == "layout" and config.grad_accum_steps == 2  # 4 x 2 x dp 4 = 32
    config, _ = make_config({"tensor_parallel": 2, "pipeline_parallel": 2}, 32, 8, CPU)
    assert config.micro_batch_size == 16 and config.grad_accum_steps == 1  # no accumulation: 32 / dp 2
    # ZeRO, DDP's buckets and offload take no PyTorch layout: with one they mean nothing
    config, _ = make_config({"tensor_parallel": 2, "zero_stage": 2, "ddp_bucket_cap_mb": 100}, 32, 8, CPU)
    assert config.zero_stage == 0 and config.ddp_bucket_cap_mb == 25 and config.engine == "layout"
    config, _ = make_config({"pipeline_parallel": 1, "pipeline_schedule": "gpipe"}, 32, 8, CPU)
    assert config.pipeline_schedule == "1f1b" and config.engine == "torch"  # no stages, no schedule
    assert rules.smallest_data_parallel({"tensor_parallel": (1, 2), "pipeline_parallel": (1, 4, 3)}, 8) == 1


@pytest.mark.parametrize("knobs, world, rule", [
    ({"tensor_parallel": 2, "pipeline_parallel": 4}, 4, "8 ranks per model copy does not divide the world of 4"),
    ({"tensor_parallel": 8}, 16, "tensor_parallel 8 spans more than one node's 4 ranks"),
    ({"pipeline_parallel": 2, "amp_dtype": "fp16"}, 4, "use bf16, as torchtitan does"),
    ({"pipeline_parallel": 4, "grad_accum_steps": 2}, 4, "1f1b runs 2 micro-batch(es) per step through 4 stages"),
    ({"pipeline_parallel": 2, "pipeline_schedule": "interleaved_1f1b", "grad_accum_steps": 5}, 2,
     "in rounds of 2 (the rule: a whole number of rounds)"),
    ({"pipeline_parallel": 2, "pipeline_schedule": "interleaved_1f1b", "grad_accum_steps": 4}, 2,
     "needs 4 stages of at least one block each; the model has 3"),
    ({"pipeline_parallel": 2, "pipeline_schedule": "interleaved_1f1b", "fsdp": "full_shard"}, 4,
     "interleave without fsdp or shard under 1f1b"),
])
def test_each_impossible_layout_is_refused_with_its_rule(knobs, world, rule):
    why = rules.refusal(_plan(world, **{"grad_accum_steps": 8, **knobs}), rules.Where(CPU, per_node=4, blocks=3))
    assert why is not None and rule in why and "the rule" in why


def _plan(world: int, **knobs) -> Plan:
    return Plan.of(world, **{"micro_batch_size": 1, **knobs})


def test_possible_layouts_and_batches_pass():
    somewhere = rules.Where(CPU, per_node=4, blocks=3)
    assert rules.refusal(_plan(8, tensor_parallel=2, pipeline_parallel=2, grad_accum_steps=2), somewhere) is None
    assert rules.refusal(_plan(2, pipeline_parallel=2, pipeline_schedule="gpipe", grad_accum_steps=1),
                         rules.Where(CPU)) is None
    assert rules.refusal(_plan(4, micro_batch_size=4, grad_accum_steps=1), rules.Where(CPU, global_batch=8)) == (
        "micro_batch_size 4 x 4 data-parallel rank(s) does not divide global_batch_size 8 (the rule: global = "
        "micro x accumulation x data-parallel degree)")
    assert rules.refusal(_plan(4, micro_batch_size=4, grad_accum_steps=1, tensor_parallel=2),
                         rules.Where(CPU, global_batch=8)) is None


def test_the_degrees_reach_torchtitan_accelerate_and_lightning(tmp_path):
    from accelerate.commands.config.config_args import load_config_from_file

    config, _ = make_config({"tensor_parallel": 2, "pipeline_parallel": 2, "pipeline_schedule": "interleaved_1f1b",
                             "fsdp": "full_shard", "micro_batch_size": 2, "amp_dtype": "bf16"}, 32, 8, CPU)
    titan = tomllib.loads(exports.torchtitan_toml(config))
    assert titan["parallelism"] == {
        "data_parallel_shard_degree": 2, "data_parallel_replicate_degree": 1, "tensor_parallel_degree": 2,
        "pipeline_parallel_degree": 2, "fsdp_reshard_after_forward": "always", "enable_async_tensor_parallel": False,
        "pipeline_parallel_schedule": "Interleaved1F1B", "pipeline_parallel_microbatch_size": 2}
    assert titan["training"]["global_batch_size"] == 32 and titan["training"]["local_batch_size"] == 2
    assert exports.ds_config(config)["train_batch_size"] == 32  # counted over the 2 model copies

    replicated, _ = make_config({"tensor_parallel": 2}, 8, 2, CPU)
    path = tmp_path / "accelerate_config.yaml"
    path.write_text(exports.accelerate_config(replicated, cuda=True))
    loaded = load_config_from_file(str(path))
    assert loaded.distributed_type == "FSDP" and loaded.parallelism_config["parallelism_config_tp_size"] == 2
    _lightning_reads(replicated, tmp_path)


def _lightning_reads(config, tmp_path):
    """lightning_trainer.yaml through LightningCLI's own parser: ModelParallelStrategy with the degrees."""
    strategy = parsed_by_lightning_cli(exports.lightning_trainer(config, cuda=True), tmp_path).trainer.strategy
    assert strategy.class_path.endswith("ModelParallelStrategy")
    assert strategy.init_args.tensor_parallel_size == 2 and strategy.init_args.data_parallel_size == 1


def test_ranks_per_node_come_from_torchrun_for_this_job_only(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert layout.ranks_per_node(8) == 4
    assert layout.ranks_per_node(4) is None  # the environment describes another job
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert layout.ranks_per_node(8) is None
