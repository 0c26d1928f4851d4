"""The process's place in the job: rank, world size, device and the default process group.

The default process group belongs to the session (one per process, kept across trials);
a trial only creates and destroys what its engine needs. Under torchrun the group is set
up from the environment; a single process that needs one (DeepSpeed) gets a world of one
on a loopback port.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

from tuner.inputs.errors import RecipeError


@dataclass(frozen=True)
class DistContext:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def context() -> DistContext:
    """Where this process runs; initialises the process group under torchrun."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", device_index(local_rank, torch.cuda.device_count()))
        if world > 1:  # each rank on its GPU; one process keeps the default device, and this
            torch.cuda.set_device(device)  # call would open a CUDA context (CUDA 12) in a search
            # that may never train here (script mode: ~0.5 GiB of GPU 0 for nothing)
    else:
        device = torch.device("cpu")
    if world > 1:
        ensure_process_group(device)
    return DistContext(rank=rank, local_rank=local_rank, world_size=world, device=device)


def device_index(local_rank: int, count: int) -> int:
    """The GPU of local rank ``local_rank`` among ``count``: its own where the node has one
    per rank. More ranks than GPUs is refused under NCCL, which cannot put two ranks on one
    GPU (every rank of the node sees the same counts, so every rank refuses, rank 0 aloud);
    over gloo (``$TUNER_DIST_BACKEND``, a test mode) the ranks fold onto the GPUs in turn,
    said once on the node."""
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", local_rank + 1))
    if max(ranks, local_rank + 1) <= count:
        return local_rank
    backend = os.environ.get(BACKEND_ENV) or "nccl"
    if backend == "nccl":
        raise RecipeError(f"nproc_per_node: {ranks} ranks on this node, and it has {count} GPU(s) this job may use "
                          f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); NCCL takes "
                          f"one rank per GPU: run --nproc_per_node={count} or fewer")
    if local_rank == 0:
        print(f"tuner: {ranks} ranks share {count} GPU(s) on this node over {backend}: each GPU's figures "
              "(memory, utilisation, energy) are its ranks' together", file=sys.stderr, flush=True)
    return local_rank % count


BACKEND_ENV = "TUNER_DIST_BACKEND"
"""Overrides the default group's backend (``gloo`` for two ranks sharing one GPU, which NCCL
refuses: ``scripts/gpu_acceptance.py``)."""


_alone = False
"""The default group is a world of one on a rendezvous this process made up itself."""


def formed_alone() -> bool:
    """Whether the default group is a lone process's world of one on the tuner's own
    rendezvous: a library call that formed it takes it down again (:mod:`tuner.harness.caller_state`).
    A group on a launcher's rendezvous (torchrun's) is the job's: re-forming one on
    torchrun's agent store after destroying it hangs, so it stays for the process."""
    return _alone and dist.is_initialized()


def ensure_process_group(device: torch.device) -> None:
    """Create the default group once: NCCL on CUDA, gloo on CPU (or ``$TUNER_DIST_BACKEND``)."""
    global _alone
    if dist.is_initialized():
        return
    backend = os.environ.get(BACKEND_ENV) or ("nccl" if device.type == "cuda" else "gloo")
    _alone = "MASTER_ADDR" not in os.environ
    kwargs: dict[str, Any] = {"backend": backend, "timeout": timedelta(minutes=10)}
    if _alone:  # one process without torchrun (e.g. DeepSpeed alone)
        kwargs.update(_lone_rendezvous())
    if backend == "nccl":
        kwargs["device_id"] = device
    dist.init_process_group(**kwargs)
    # A gloo group still alive when the interpreter exits aborts the process
    # ("terminate called without an active exception"): destroy the one we made. Once for the
    # process: registered per group, a library call left the caller one callback more each time.
    global _at_exit
    if not _at_exit:
        atexit.register(_destroy_process_group)
        _at_exit = True


_at_exit = False
"""Whether :func:`_destroy_process_group` is registered with ``atexit`` (once a process)."""
_on_destroy: list[Callable[[], None]] = []


def when_destroyed(forget: Callable[[], None]) -> None:
    """Call ``forget`` whenever the default group is taken down: what a layer above keeps of
    the group (the trial layer's device meshes and their sub-groups) goes with it, so a
    caller's process does not hold a destroyed group's sockets (seen: 13 descriptors a mesh)."""
    if forget not in _on_destroy:
        _on_destroy.append(forget)


def destroy() -> None:
    """Take the default group down; through DeepSpeed where it holds the group, so it lets go
    of the groups it caches too (seen: ZeRO-1 after FSDP2 in one process failed with "Group
    ... is not registered": DeepSpeed's world group was the destroyed one's)."""
    comm = sys.modules.get("deepspeed.comm.comm")
    if comm is not None and getattr(comm, "cdb", None) is not None:
        comm.destroy_process_group()
    else:
        dist.destroy_process_group()


def _forget_control_group() -> None:
    global _control
    _control = None
    for forget in _on_destroy:
        forget()


def _destroy_process_group() -> None:
    """At exit: meet the other ranks briefly (a rank that died must not hang us), then
    take the group down."""
    if not dist.is_initialized():
        return
    if dist.get_backend() == "gloo":
        with contextlib.suppress(Exception):
            dist.monitored_barrier(timeout=timedelta(seconds=30))
    destroy()
    _forget_control_group()


def shutdown() -> None:
    """End of a command: wait for every rank, then take the group down together, so no
    rank tears down its side while a peer still talks to it (seen here: a gloo rank
    exiting alone aborted with "terminate called without an active exception")."""
    if dist.is_initialized():
        dist.barrier()
        destroy()
        _forget_control_group()


_control: Any = None


def _control_group() -> Any:
    """A gloo group for the tuner's own small messages (flags, params, results): on CPU
    tensors, so agreeing never waits on, or synchronises, the GPU."""
    global _control
    if _control is None:
        _control = dist.group.WORLD if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
    return _control


def several_ranks() -> bool:
    """A process group of more than one rank is formed."""
    return dist.is_initialized() and dist.get_world_size() > 1


def all_gather(obj: Any) -> list[Any]:
    """Every rank's ``obj`` on every rank (just ``[obj]`` without a group)."""
    if not several_ranks():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj, group=_control_group())
    return out


def any_rank(flag: bool) -> bool:
    """True when ``flag`` is true on any rank: one 1-element all-reduce on gloo."""
    if not several_ranks():
        return flag
    t = torch.tensor([1 if flag else 0], dtype=torch.int32)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=_control_group())
    return bool(t.item())


def mean(values: list[float]) -> list[float]:
    """Each value's mean over the ranks (every rank gives as many), on every rank."""
    if not several_ranks() or not values:
        return values
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, group=_control_group())
    return [float(x) / dist.get_world_size() for x in t]


def agree(failure: Any) -> Any:
    """The first rank's failure (any picklable value, ``None`` for none), on every rank.

    Costs one tiny all-reduce when no rank failed, which is the common case."""
    if not several_ranks():
        return failure
    if not any_rank(failure is not None):
        return None
    return next(f for f in all_gather(failure) if f is not None)


def broadcast(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank: how rank 0's decisions reach the others."""
    if not several_ranks():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=_control_group())
    return box[0]


def _lone_rendezvous() -> dict[str, Any]:
    """A world of one's store, listening on a port the kernel picked as it bound it (a port
    asked for, closed and bound later can be handed to two processes). The environment a
    launcher would have set is set to what was bound, for the libraries that read it
    (DeepSpeed reads ``RANK``/``LOCAL_RANK``/``WORLD_SIZE``).
    """
    store = dist.TCPStore("127.0.0.1", 0, world_size=1, is_master=True, timeout=timedelta(minutes=10))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
    return {"store": store, "rank": 0, "world_size": 1}


def is_main_process() -> bool:
    """Rank 0, or the only process: the one that prints and writes."""
    if dist.is_initialized():
        return dist.get_rank() == 0
    return int(os.environ.get("RANK", "0")) == 0


def leave_after_rank_0(key: str, wait_s: float = 60.0) -> None:
    """Before this process exits without the group: rank 0 says through the store that it
    is done (its record written, its output printed); the other ranks wait for that, since
    the first rank to exit has torchrun end the others, rank 0 included, mid-write. The
    store, not a collective: the group may be what is broken, or not yet made (a recipe
    refused before it: torchrun's agent store then), and a refusal's one line must still print."""
    world = dist.get_world_size() if dist.is_initialized() else int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return
    try:
        store = _store()
        if store is None:
            return
        key = f"{key}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        if is_main_process():
            store.set(key, "1")
        else:
            store.wait([key], timedelta(seconds=wait_s))
    except Exception:  # noqa: BLE001 - the store's host is gone, or rank 0 never came: exit anyway
        pass


def _store() -> dist.Store | None:
    """The group's store, or before a group torchrun's agent store (``TORCHELASTIC_USE_AGENT_STORE``:
    the agent hosts it at ``MASTER_ADDR:MASTER_PORT``, every rank a client, as ``env://`` does)."""
    if dist.is_initialized():
        return dist.distributed_c10d._get_default_store()  # noqa: SLF001 - the group's store: no public getter
    env = os.environ
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or "MASTER_ADDR" not in env or "MASTER_PORT" not in env:
        return None
    return dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), int(env["WORLD_SIZE"]), is_master=False,
                         timeout=timedelta(seconds=30))


def shutdown_quietly() -> None:
    """After Ctrl-C the other ranks may be gone: no barrier, just let go of the group."""
    if dist.is_initialized():
        with contextlib.suppress(Exception):
            destroy()
        _forget_control_group()
