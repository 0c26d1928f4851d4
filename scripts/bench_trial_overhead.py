"""What a trial costs outside its warm-up and measured steps: in-process vs a fresh process.

In-process, one long-lived process runs trial after trial (what ``tuner`` does): a trial
pays for building the dataset, loader, model and engine, and for tearing them down.
A fresh process per trial (what DeepSpeed's autotuner does) also pays the interpreter,
``import torch``/``deepspeed`` and the process group, every time.

A script-mode trial (the user's own script, ``recipes/script_plain.yaml`` by default)
is a fresh ``torchrun`` of the script each time, ended by the tuner once its probe has
reported: its overhead = launch to the end of its process tree - warm-up - measured steps
(both at the measured step rate: slow first steps count as overhead here, where the
in-process rows leave the whole warm-up out).

``--ds-autotuner`` adds DeepSpeed's autotuner's launch of one experiment, made by its
own ``run_experiment`` (the ``deepspeed`` launcher with a hostfile, the config passed
base64-encoded, the engine exiting itself after ``end_profile_step``) on
``recipes/scripts/train_deepspeed.py`` with reads that cost nothing and 4 steps, so its
wall time is launch, start-up and exit. Its clean-up step (``pkill`` over ``pdsh``) is
skipped: pdsh is not installed here, and leaving it out only flatters the autotuner.

All are measured side by side, in alternating rounds; the overhead of a trial =
its wall time - warm-up - measured steps - the stall-free ceiling's steps (all reported
by the trial itself). Prints medians and the ratios to in-process.

    python scripts/bench_trial_overhead.py                       # quick start, 1 rank
    python scripts/bench_trial_overhead.py --nproc 2 --set zero_stage=1
    python scripts/bench_trial_overhead.py --script-set nproc_per_node=1   # launcher: python, fresh vs pre-warmed
    python scripts/bench_trial_overhead.py --phases --script-set nproc_per_node=1   # the tuner's own share
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def launcher(nproc: int) -> list[str]:
    if nproc == 1:
        return [sys.executable]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]


def in_process_round(args: argparse.Namespace) -> list[float]:
    """One long-lived process runs ``--trials`` trials; returns each trial's overhead."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    cmd = [*launcher(args.nproc), __file__, "--worker", out, "--recipe", args.recipe, "--trials", str(args.trials)]
    for s in args.set:
        cmd += ["--set", s]
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return json.loads(Path(out).read_text())


def fresh_process_round(args: argparse.Namespace) -> list[float]:
    """``--trials`` separate ``tuner.measure`` processes; returns each one's overhead."""
    overheads = []
    for _ in range(args.trials):
        cmd = [*launcher(args.nproc), "-m", "tuner.measure", args.recipe, "--json"]
        for s in args.set:
            cmd += ["--set", s]
        start = time.perf_counter()
        proc = subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - start
        timings = json.loads(proc.stdout)["repeats"][0]["timings"]
        overheads.append(wall - timings["warmup"] - timings["measure"] - timings.get("stall_free", 0.0))
    return overheads


def script_round(args: argparse.Namespace, prewarm: bool | None = None) -> list[float]:
    """``--trials`` script-mode trials of ``--script-recipe``, launched as the search does
    (``prewarm``: under ``launcher: python``, forked from the pre-warmed process or not; its
    start is paid by the round's first trial, as by a search's)."""
    import dataclasses

    from tuner.inputs.recipe import load_recipe
    from tuner.inputs.space import Machine
    from tuner.measurement import measured_config
    from tuner.scriptmode.launcher import ScriptTrials
    from tuner.trial.data import warmup_steps

    recipe = load_recipe(args.script_recipe, args.script_set)
    if prewarm is not None:
        assert recipe.script is not None
        recipe = dataclasses.replace(recipe, script=dataclasses.replace(recipe.script, prewarm=prewarm))
    config, _ = measured_config(recipe, Machine.detect())
    overheads = []
    with tempfile.TemporaryDirectory() as out:
        trials = ScriptTrials(recipe, Path(out))
        for _ in range(args.trials):
            start = time.perf_counter()
            result = trials.run(config)  # launch, wait for the report, end the process tree
            wall = time.perf_counter() - start
            assert result.ok, result.reason
            per_step = recipe.global_batch_size / result.metrics["samples_per_s"]
            steps = warmup_steps(recipe.steps.warmup, config) + recipe.steps.measure
            overheads.append(wall - steps * per_step)
        trials.close()
    return overheads


def phases(args: argparse.Namespace) -> None:
    """What the tuner itself adds to a script trial, by phase: how long after the probe wrote
    its report the launcher saw it, how long ending the process tree took, and what
    ``import tuner`` costs after ``import torch`` in a fresh interpreter."""
    import os

    from tuner.inputs.recipe import load_recipe
    from tuner.inputs.space import Machine
    from tuner.measurement import measured_config
    from tuner.scriptmode import launcher
    from tuner.scriptmode.launcher import ScriptTrials

    recipe = load_recipe(args.script_recipe, args.script_set)
    config, _ = measured_config(recipe, Machine.detect())
    seen: list[float] = []
    ended: list[float] = []
    read, end = launcher.read_result, launcher.end_tree

    def timed_read(path: Path) -> object:
        seen.append(time.time() - os.path.getmtime(path))
        return read(path)

    def timed_end(proc: object) -> None:
        start = time.perf_counter()
        end(proc)
        ended.append(time.perf_counter() - start)

    launcher.read_result, launcher.end_tree = timed_read, timed_end  # type: ignore[assignment]
    try:
        with tempfile.TemporaryDirectory() as out:
            trials = ScriptTrials(recipe, Path(out))
            for _ in range(args.trials * args.rounds):
                assert trials.run(config).ok
            trials.close()
    finally:
        launcher.read_result, launcher.end_tree = read, end  # type: ignore[assignment]
    code = "import time, torch; t = time.perf_counter(); import tuner; print(time.perf_counter() - t)"
    imports = [float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                    check=True).stdout.split()[-1]) for _ in range(5)]
    print(f"script trials: {len(seen)} of {Path(args.script_recipe).name} {' '.join(args.script_set)}")
    for name, xs in (("report seen after written, s", seen), ("process tree ended in, s", ended),
                     ("import tuner after import torch, s", imports)):
        print(f"{name:<38}{statistics.median(xs):>8.3f}  (min {min(xs):.3f}, max {max(xs):.3f})")


def ds_autotuner_round(args: argparse.Namespace) -> list[float]:
    """``--trials`` experiments launched the way DeepSpeed's autotuner launches each one."""
    import os
    import socket

    from deepspeed.autotuning import scheduler

    scheduler.clean_up = lambda exp, reservations: None  # pdsh + pkill: not on this machine
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"  # `deepspeed`
    script = ROOT / "recipes" / "scripts" / "train_deepspeed.py"
    base = json.loads((script.parent / "ds_config.json").read_text())
    overheads = []
    for i in range(args.trials):
        with tempfile.TemporaryDirectory() as folder:
            d = Path(folder)
            (d / "hostfile").write_text("localhost slots=2\n")
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            config = {**base, "autotuning": {"enabled": True, "start_profile_step": 1, "end_profile_step": 3,
                                             "metric_path": str(d / "metrics.json")}}
            exp = {"exp_id": i, "name": f"bench_ds_autotuner_{i}", "master_port": port,
                   "hostfile": str(d / "hostfile"), "result_dir": str(d / "exp"), "ds_config": config}
            node = scheduler.Node("localhost", 2)
            reservation = scheduler.Reservation(node, node.reserve_slots(2))
            start = time.perf_counter()
            scheduler.run_experiment(exp, [reservation], str(script),
                                     ["--deepspeed_config", "ds_config.json", "--latency-ms", "0"])
            wall = time.perf_counter() - start
            if not (d / "metrics.json").exists():
                err = (d / "exp" / "stderr.log").read_text()[-2000:]
                raise SystemExit(f"the DeepSpeed experiment wrote no metrics; its stderr ends:\n{err}")
            overheads.append(wall)  # 4 steps of a 0.5 MB model: milliseconds
    return overheads


def worker(args: argparse.Namespace) -> None:
    """Inside the long-lived process: trials one after another, timed from outside."""
    from tuner.harness import distributed
    from tuner.inputs.recipe import load_recipe
    from tuner.inputs.space import Machine
    from tuner.measurement import measured_config
    from tuner.trial import engines
    from tuner.trial.run import run_trial

    ctx = distributed.context()
    recipe = load_recipe(args.recipe, args.set, world_size=ctx.world_size)
    config, _ = measured_config(recipe, Machine.detect())
    engines.prepare(config, ctx.device)  # once per process, as tuner.measure does
    overheads = []
    for _ in range(args.trials):
        start = time.perf_counter()
        result = run_trial(recipe, config, ctx)
        wall = time.perf_counter() - start
        assert result.ok, result.reason
        overheads.append(wall - result.timings["warmup"] - result.timings["measure"]
                         - result.timings.get("stall_free", 0.0))
    if ctx.is_main:
        Path(args.worker).write_text(json.dumps(overheads))
    distributed.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", default=str(ROOT / "recipes" / "quickstart.yaml"))
    parser.add_argument("--set", action="append", default=[], help="knob or recipe override, as tuner.measure --set")
    parser.add_argument("--nproc", type=int, default=1, help="ranks per trial (torchrun when > 1)")
    parser.add_argument("--trials", type=int, default=3, help="trials per round and mode")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of all modes")
    parser.add_argument("--script-recipe", default=str(ROOT / "recipes" / "script_plain.yaml"),
                        help="the script-mode recipe for the script row ('' skips it)")
    parser.add_argument("--script-set", action="append", default=[],
                        help="override in the script recipe (nproc_per_node=1: one process, launcher: python, "
                             "measured fresh and pre-warmed)")
    parser.add_argument("--ds-autotuner", action="store_true",
                        help="add DeepSpeed's autotuner's launch of one experiment (2 ranks)")
    parser.add_argument("--phases", action="store_true",
                        help="only the tuner's own share of a script trial, by phase (--script-recipe)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    if args.phases:
        phases(args)
        return

    rows: dict[str, list[float]] = {"in-process": [], "fresh process": []}
    python = False
    if args.script_recipe:
        from tuner.inputs.recipe import load_recipe

        script = load_recipe(args.script_recipe, args.script_set).script
        python = script is not None and script.launcher == "python"
        rows.update({"script, fresh": [], "script, prewarm": []} if python else {"script mode": []})
    if args.ds_autotuner:
        rows["DS autotuner"] = []
    for r in range(args.rounds):
        rows["in-process"] += in_process_round(args)
        rows["fresh process"] += fresh_process_round(args)
        if python:
            rows["script, fresh"] += script_round(args, prewarm=False)
            rows["script, prewarm"] += script_round(args, prewarm=True)
        elif args.script_recipe:
            rows["script mode"] += script_round(args)
        if args.ds_autotuner:
            rows["DS autotuner"] += ds_autotuner_round(args)
        medians = ", ".join(f"{k} {statistics.median(v):.2f} s" for k, v in rows.items())
        print(f"round {r + 1}/{args.rounds}: {medians}", file=sys.stderr)
    base = statistics.median(rows["in-process"])
    print(f"recipe: {Path(args.recipe).name}  set: {' '.join(args.set) or '-'}  ranks: {args.nproc}  "
          f"trials: {len(rows['in-process'])} per mode")
    if args.script_recipe:
        print(f"script mode: {Path(args.script_recipe).name} {' '.join(args.script_set)} (its own ranks and knobs)")
    print(f"{'mode':<16}{'median s':>10}{'min s':>10}{'max s':>10}{'x in-process':>14}")
    for name, xs in rows.items():
        m = statistics.median(xs)
        print(f"{name:<16}{m:>10.3f}{min(xs):>10.3f}{max(xs):>10.3f}{m / base:>14.1f}")


if __name__ == "__main__":
    main()
