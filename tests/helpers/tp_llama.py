"""Two ranks: a small Llama-style model from transformers' config, unsharded and sharded by
its own tensor-parallel plan; the loss of each, before and after one optimizer step, and
the shards' shapes (``tests/trial/test_tensor_parallel.py``)."""

import copy
import json
import os
import sys

import torch
import torch.distributed as dist
from tiny_llama import batch as tiny_batch
from tiny_llama import tiny_llama
from torch.distributed.device_mesh import init_device_mesh

from tuner.trial import tensor_parallel


def losses(model, batch, steps=2):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    out = []
    for _ in range(steps):
        loss = model(input_ids=batch, labels=batch).loss
        out.append(loss.item())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return out


def main():
    dist.init_process_group("gloo")
    model = tiny_llama(2)
    batch = tiny_batch()
    sharded = copy.deepcopy(model)
    model_before = copy.deepcopy(model)
    reference = losses(model, batch)
    plan, said = tensor_parallel.plan_of(sharded)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    count = tensor_parallel.parallelize(sharded, mesh, plan)
    q = sharded.model.layers[0].self_attn.q_proj.weight
    got = losses(sharded, batch)
    # the same, with sequence parallelism: what each norm sees is its rank's half of the sequence
    sequence = copy.deepcopy(model_before)
    vocab, said_vocab = tensor_parallel.with_vocab(sequence, tensor_parallel.plan_of(sequence)[0], 2)
    plan, said_sp = tensor_parallel.with_sequence(sequence, vocab)
    tensor_parallel.parallelize(sequence, mesh, plan)
    seen = []
    sequence.model.layers[1].post_attention_layernorm.register_forward_hook(
        lambda m, args, out: seen.append(list(out.shape)))
    got_sp = losses(sequence, batch)
    if dist.get_rank() == 0:
        with open(sys.argv[1], "w") as f:
            json.dump({"reference": reference, "sharded": got, "modules": count, "said": said,
                       "q_local": list(q.to_local().shape), "q_global": list(q.shape),
                       "sequence": got_sp, "norm_output": seen[0], "said_sp": said_sp,
                       "said_vocab": said_vocab, "head_local": list(sequence.lm_head.weight.to_local().shape)}, f)
    dist.destroy_process_group()
    # the device meshes' gloo groups outlive destroy_process_group: exit without interpreter
    # finalization, as the tuner's own ranks do, or the exit can abort ("terminate called ...")
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
