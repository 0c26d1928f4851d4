"""Two ranks: a small Llama-style model from transformers' config, whole and cut into two
pipeline stages run by PyTorch's schedules; the loss of each over two SGD steps
(``tests/trial/test_pipeline_parallel.py``)."""

import copy
import json
import sys

import torch
import torch.distributed as dist
from tiny_llama import batch as tiny_batch
from tiny_llama import tiny_llama
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from tuner.trial import pipeline_stages as pp


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    whole = tiny_llama(3)
    batch = tiny_batch()
    out = {"split": [list(r) for r in pp.split(3, world)]}
    reference = copy.deepcopy(whole)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    out["reference"] = []
    for _ in range(2):
        loss = pp.next_token_loss(reference(input_ids=batch).logits, batch)
        out["reference"].append(loss.item())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    for name, schedule_cls in (("gpipe", ScheduleGPipe), ("1f1b", Schedule1F1B)):
        model = copy.deepcopy(whole)
        part = pp.stage(model, rank, world)
        stage = PipelineStage(part, rank, world, torch.device("cpu"))
        schedule = schedule_cls(stage, n_microbatches=2, loss_fn=pp.next_token_loss)
        optimizer = torch.optim.SGD(part.parameters(), lr=0.1)
        got = []
        for _ in range(2):
            losses = []
            if rank == 0:
                schedule.step(batch)
            else:
                schedule.step(target=batch, losses=losses)
            optimizer.step()
            optimizer.zero_grad()
            mean = torch.stack(losses).mean() if losses else torch.zeros(())
            dist.broadcast(mean, src=world - 1)
            got.append(mean.item())
        out[name] = got
    if rank == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(out, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
