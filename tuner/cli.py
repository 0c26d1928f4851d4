"""Command lines: ``tuner <command>`` and ``python -m tuner.<command>``.

Input errors (:class:`~tuner.inputs.errors.RecipeError`) print one line and exit 2; nothing here
lets a traceback reach the user for bad input.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, NoReturn, Sequence

from tuner.inputs.errors import RecipeError

CAP_ROUNDS = 100
"""``--confirm``'s default (:data:`tuner.tuning.finish.CAP_ROUNDS`, not imported here:
the search's modules load only when a search runs)."""


def measure_main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tuner.measure",
        description="Measure one configuration of a recipe: step time p50/p90/p99, samples/s, "
        "data-wait share, peak memory. Runs under torchrun too (only rank 0 prints).",
    )
    parser.add_argument("recipe", help="the recipe YAML")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="fix a knob (num_workers=4) or override a recipe key (steps.measure=10); repeatable")
    parser.add_argument("--repeats", type=int, default=None,
                        help="trials to run; reported as the median (default: steps.repeats)")
    parser.add_argument("--json", action="store_true", help="print JSON (metrics under \"metrics\") instead of a table")
    parser.add_argument("--trace", metavar="DIR", default=None,
                        help="write a torch.profiler trace of the first repeat's measured window to "
                             "DIR/trace_rank<N>.json (open in Perfetto, chrome://tracing or TensorBoard)")
    parser.add_argument("--nvtx", action="store_true",
                        help="NVTX ranges around data wait, forward, backward and optimizer step (Nsight Systems)")
    parser.add_argument("--all", dest="every", action="store_true",
                        help="list every metric, those not measured here too (default: the measured ones)")
    args = parser.parse_args(argv)
    if args.repeats is not None and args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")

    from tuner.api import measure
    from tuner.outputs import console
    from tuner.trial.trial_result import State

    def run() -> Any:
        return measure(args.recipe, repeats=args.repeats, overrides=args.sets, trace=args.trace, nvtx=args.nvtx)

    return _report(run, args.json, lambda m: console.print_measurement(m, args.every),
                   lambda result: result.state == State.OK)


def _report(run: Callable[[], Any], as_json: bool, show: Callable[[Any], None], ok: Callable[[Any], bool],
            status: Callable[[Any], int] | None = None, data: Callable[[Any], Any] = lambda r: r.to_json()) -> int:
    """Run a command on every rank; rank 0 prints its result (a table, or JSON alone on
    stdout: ``data``); bad input is one line on stderr and exit 2; exit 1 when ``ok`` says no
    (or what ``status`` says)."""
    from tuner.harness import distributed
    from tuner.outputs import console

    try:
        with console.stdout_to_stderr() if as_json else contextlib.nullcontext():
            result = run()
    except RecipeError as exc:
        if distributed.is_main_process():
            print(f"error: {exc}", file=sys.stderr)
        distributed.leave_after_rank_0("tuner/error/said")  # rank 0's line is said before any rank exits
        return exc.exit_code
    if distributed.is_main_process():
        if as_json:
            print(json.dumps(data(result), indent=2))
        else:
            show(result)
    code = status(result) if status is not None else (0 if ok(result) else 1)
    restart = getattr(result, "restart", None)
    if restart:  # its device or group is broken: no barrier, no teardown that could wait on it
        if distributed.is_main_process():
            print(f"tuner: {restart}; this process stopped there", file=sys.stderr)
        distributed.leave_after_rank_0("tuner/restart/said")
        _exit_now(code)
    distributed.shutdown()
    return code


def _exit_now(code: int) -> NoReturn:
    """Exit once the output is flushed, without the interpreter's finalization.

    After a CUDA error or a broken collective a barrier or a communicator's destruction can
    wait forever, and torch's C++ threads (gloo's workers, the autograd engine's) touching
    Python objects during teardown can abort the process (pytorch/pytorch#179291). Nothing is
    left to do in finalization here: the study and the run folder are written, the group is
    destroyed, loader and compile workers end with their parent.
    """
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def search_main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="torchrun --nproc_per_node=N -m tuner.search",
        description="Search the recipe's space for the fastest configuration inside the memory budget. "
        "Re-running the same command resumes the study.",
    )
    parser.add_argument("recipe", help="the recipe YAML")
    parser.add_argument("--trials", type=int, help="trial budget (overrides budget.trials)")
    parser.add_argument("--minutes", type=float, help="time budget of the whole command, the search and its "
                        "finish together (overrides budget.minutes)")
    parser.add_argument("--out", help="run folder (default: the recipe's out, runs/<name>)")
    parser.add_argument("--storage", help="Optuna storage URL (default: sqlite:///<out>/study.db)")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="fix a knob (amp_dtype=bf16) or override a recipe key (steps.measure=10); repeatable")
    parser.add_argument("--confirm", type=int, default=CAP_ROUNDS,
                        help="the most interleaved rounds one question of the finish may take (a finalist, a change "
                             f"of the answer, the baseline; default {CAP_ROUNDS}; 0 skips the finish)")
    parser.add_argument("--finish-minutes", type=float, default=None,
                        help="the finish's budget: the finalists re-measured interleaved until the one rule decides "
                             "each change (default: twice as long as the search's trials took); --minutes bounds the "
                             "search and the finish together")
    parser.add_argument("--attribute", type=int, default=None,
                        help="runs of each knob-by-knob attribution configuration not already measured, inside "
                             "what is left of the finish's budget (default: 1; 0 skips)")
    parser.add_argument("--quiet", action="store_true", help="no live table (search.log is still written)")
    parser.add_argument("--explain", action="store_true",
                        help="print every decision and finding, not only the answer (search.log has them anyway)")
    parser.add_argument("--full-budget", action="store_true",
                        help="keep searching once converged, until the trial or time budget is spent")
    parser.add_argument("--no-skip", action="store_true",
                        help="run configurations the memory model predicts over budget.memory_gib too")
    parser.add_argument("--tolerance", type=float, default=None,
                        help="the largest slowdown a simpler answer may cost against the fastest, e.g. 0.02 (2%%): "
                             "a change is dropped only when the interval shows its cost below it, kept when it "
                             "shows more (default: the recipe's tolerance, 0.02)")
    parser.add_argument("--track", action="append", default=[], metavar="NAME[,NAME]",
                        help="log the search to an experiment tracker: mlflow, tensorboard, wandb (several: "
                             "repeat it or separate with commas; the recipe's track: adds to it)")
    args = parser.parse_args(argv)
    for flag, value, minimum in (("--trials", args.trials, 1), ("--minutes", args.minutes, 0),
                                 ("--confirm", args.confirm, 0), ("--attribute", args.attribute, 0),
                                 ("--finish-minutes", args.finish_minutes, 0)):
        if value is not None and value < minimum:
            parser.error(f"{flag} must be >= {minimum}, got {value}")
    if args.minutes is not None and args.minutes <= 0:
        parser.error(f"--minutes must be a positive number, got {args.minutes}")

    from tuner.api import search
    from tuner.harness import distributed
    from tuner.outputs import trial_words
    from tuner.trial.failures import ProcessPoisoned

    try:
        result = search(args.recipe, trials=args.trials, minutes=args.minutes, confirm=args.confirm,
                        attribute=args.attribute, finish_minutes=args.finish_minutes, out=args.out,
                        storage=args.storage, overrides=args.sets,
                        quiet=args.quiet, explain=args.explain, full_budget=args.full_budget, no_skip=args.no_skip,
                        tolerance=args.tolerance, track=args.track, began=process_began())
    except RecipeError as exc:
        if distributed.is_main_process():
            print(f"error: {exc}", file=sys.stderr)
        distributed.leave_after_rank_0("tuner/error/said")  # rank 0's line is said before any rank exits
        return exc.exit_code
    except ProcessPoisoned as exc:  # the trial is recorded on rank 0 before any rank goes
        if distributed.is_main_process():
            print(f"tuner: {exc}", file=sys.stderr)
        distributed.leave_after_rank_0("tuner/restart/said")
        _exit_now(exc.exit_code)
    if result is not None and result.stopped == "interrupted":
        distributed.shutdown_quietly()  # the other ranks may be gone: no barrier
        return 130
    distributed.shutdown()
    if result is not None and result.stopped == "broken":
        print(f"error: {trial_words.broken(result.broken)}", file=sys.stderr)
        return 1
    return 0


def check_main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tuner.check",
        description="Performance regression gate. --rev REV: the recipe's task or script at git revision REV "
        "(a worktree) against the working tree, each measured in fresh processes, interleaved, as pairs. "
        "--against RUN_DIR/best.json: the recorded answer's speedup over its baseline, both re-measured "
        "interleaved here, against the recorded speedup. Exit 0 when shown within the tolerance, 1 when shown "
        "slower beyond it (or when it no longer runs), 4 when undecided at the rounds' limit (--undecided pass or "
        "fail makes it 0 or 1), 2 on bad input or when the comparison would be meaningless (another device or "
        "world size).",
    )
    parser.add_argument("recipe", help="the recipe YAML")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--rev", metavar="REV", help="a git revision (branch, tag, commit) to gate the working tree "
                       "against")
    which.add_argument("--against", metavar="RUN_DIR/best.json", help="the recorded result")
    parser.add_argument("--tolerance", type=float, default=0.05,
                        help="how much slower (--rev) or how much smaller a speedup (--against) may be shown to be, "
                             "as a fraction (default 0.05)")
    parser.add_argument("--rounds", "--repeats", dest="rounds", type=int, default=None,
                        help="the most interleaved rounds (each side once); it stops as soon as the interval "
                             "decides the gate (default 20)")
    parser.add_argument("--nproc-per-node", type=int, default=1,
                        help="with --rev: ranks each measurement of a task recipe runs on (torchrun)")
    parser.add_argument("--absolute", action="store_true",
                        help="with --against: gate the answer's samples/s against the recorded one too; needs "
                             "--process-noise")
    parser.add_argument("--process-noise", type=float, default=None,
                        help="with --absolute: one run's relative noise between two processes of this machine")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="override a recipe key (steps.measure=40); repeatable")
    parser.add_argument("--undecided", choices=("exit", "pass", "fail"), default="exit",
                        help="what an undecided gate exits with: its own status 4 (default: an undecided gate is "
                             "not a pass), or 0 (pass) or 1 (fail), for a CI that takes two outcomes; the verdict "
                             "printed stays UNDECIDED")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    if args.rev is not None and (args.absolute or args.process_noise is not None):
        parser.error("--absolute and --process-noise go with --against, not --rev")

    from tuner.analysis.gate import DEFAULT_REV_ROUNDS, DEFAULT_ROUNDS, exit_status
    from tuner.api import check, check_rev
    from tuner.outputs import console, wording

    def status(result: Any) -> int:
        return exit_status(result.verdict, args.undecided)

    def data(result: Any) -> dict[str, Any]:  # the verdict's words, for a CI log
        return {**result.to_json(), "exit_code": status(result), "reason": wording.gate(result)}

    if args.rev is not None:
        def progress(done: int, rev: float, work: float) -> None:
            print(f"round {done}: {args.rev} {rev:,.1f} samples/s, working tree {work:,.1f}", file=sys.stderr)

        return _report(lambda: check_rev(args.recipe, args.rev, args.tolerance, args.rounds or DEFAULT_REV_ROUNDS,
                                         tuple(args.sets),
                                         args.nproc_per_node, progress),
                       args.json, console.print_rev_check, lambda result: result.passed, status, data)
    return _report(lambda: check(args.recipe, args.against, args.tolerance, args.rounds or DEFAULT_ROUNDS,
                                 tuple(args.sets), args.absolute, args.process_noise),
                   args.json, console.print_check, lambda result: result.passed, status, data)


def plan_main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="[torchrun --nproc_per_node=N] -m tuner.plan",
        description="Without a search: the largest micro-batch predicted to fit the memory budget for each "
        "sharding x AMP x checkpointing combination of the recipe's space, with the model's error bound, "
        "from a few short profiled trials. Writes plan.json into the run folder; a search there starts from it.",
    )
    parser.add_argument("recipe", help="the recipe YAML")
    parser.add_argument("--out", help="run folder (default: the recipe's out, runs/<name>)")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="fix a knob or override a recipe key (budget.memory_gib=40); repeatable")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    args = parser.parse_args(argv)

    from tuner.api import plan
    from tuner.outputs import console

    return _report(lambda: plan(args.recipe, out=args.out, overrides=args.sets), args.json, console.print_plan,
                   lambda result: True)


def report_main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tuner.report",
                                     description="Rebuild report.md and report.html of a search from its study.")
    parser.add_argument("run_dir", help="the search's run folder (runs/<name>)")
    parser.add_argument("--storage", help="the study's storage URL, when it is not RUN_DIR/study.db")
    args = parser.parse_args(argv)
    out = Path(args.run_dir)
    if not out.is_dir():
        print(f"error: {out} is not a folder (give the search's run folder)", file=sys.stderr)
        return 2
    from tuner.outputs.report.build import build_report

    try:
        md, page = build_report(out, storage=args.storage)
    except RecipeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(f"wrote {md} and {page}")
    return 0


def compare_main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tuner.compare",
        description="Two run folders side by side: one configuration of each (best, baseline or a trial "
        "number), every metric with its ratio and whether its interval shows the difference beyond the tolerance. "
        "Refused (exit 2) when the runs were measured on different devices, world sizes or torch versions.")
    parser.add_argument("run_a", help="a search's run folder (runs/NAME)")
    parser.add_argument("run_b", help="the other run folder (the same one to compare two of its trials)")
    parser.add_argument("--a", default="best", metavar="WHICH", help="best (default), baseline or a trial number")
    parser.add_argument("--b", default="best", metavar="WHICH", help="best (default), baseline or a trial number")
    parser.add_argument("--html", metavar="PATH", help="also write the comparison as an HTML page")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--anyway", action="store_true",
                        help="show runs from different machines side by side, their differences on top")
    parser.add_argument("--process-noise", type=float, default=None,
                        help="one run's relative noise between two processes of this machine (e.g. 0.05): what two "
                             "run folders' rates are judged with; without it their rates are shown, not judged")
    parser.add_argument("--tolerance", type=float, default=None,
                        help="the difference that matters, as a fraction (default: the search's tolerance, 0.02)")
    args = parser.parse_args(argv)
    from tuner.outputs import comparison

    try:
        result = comparison.compare(args.run_a, args.run_b, args.a, args.b, args.anyway, args.tolerance,
                                    args.process_noise)
    except RecipeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(json.dumps(result.to_json(), indent=1) if args.json else comparison.table(result))
    if args.html:
        Path(args.html).write_text(comparison.page(result), encoding="utf-8")
    return 0


def agent_main(argv: Sequence[str] | None = None) -> int:
    from tuner.scriptmode import node_agent as agent

    parser = argparse.ArgumentParser(prog="python -m tuner.agent", description=(agent.__doc__ or "").split("\n\n")[0])
    parser.add_argument("recipe", help="the script recipe the search runs (nnodes > 1)")
    parser.add_argument("--out", help="the search's run folder, if it overrides the recipe's out")
    parser.add_argument("--idle-exit", type=float, default=None, metavar="S",
                        help="exit after S seconds without a trial (default: run until Ctrl-C)")
    args = parser.parse_args(argv)
    from tuner.inputs.recipe import load_recipe

    try:
        recipe = load_recipe(args.recipe)
    except RecipeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return agent.serve(recipe, Path(args.out) if args.out else recipe.out, args.idle_exit)


COMMANDS: dict[str, Callable[[Sequence[str] | None], int]] = {
    "measure": measure_main, "search": search_main, "check": check_main, "report": report_main, "plan": plan_main,
    "agent": agent_main, "compare": compare_main,
}


def process_began() -> float:
    """When the command a user timed began, on the monotonic clock: this process's start, or
    under torchrun its launcher's. ``budget.minutes`` bounds the whole command, imports
    included.
    """
    import time

    import psutil

    process = psutil.Process()
    if os.environ.get("TORCHELASTIC_RUN_ID") and process.parent() is not None:
        process = process.parent()
    age = min(max(0.0, time.time() - process.create_time()), 600.0)  # a clock step never makes it absurd
    return time.monotonic() - age


def main(argv: Sequence[str] | None = None) -> int:
    """The ``tuner`` console script: ``tuner measure RECIPE ...``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print(f"usage: tuner {{{','.join(COMMANDS)}}} ...", file=sys.stderr)
        if argv and argv[0] not in ("-h", "--help"):
            print(f"error: unknown command {argv[0]!r}", file=sys.stderr)
            return 2
        return 0 if argv else 2
    return COMMANDS[argv[0]](argv[1:])


def run_command(command: Callable[[], int]) -> NoReturn:
    """Exit with the command's code; Ctrl-C outside what the command handles itself (while
    importing torch, before the study is open) is exit 130 with one line, not a traceback.
    The process is the tuner's own: its heap may be frozen (:func:`tuner.trial.run.own_process`)."""
    try:
        from tuner.trial.run import own_process

        own_process()
        code = command()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        code = 130
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        _exit_now(code)
    sys.exit(code)


def console_main() -> NoReturn:
    """The ``tuner`` console script's entry point."""
    run_command(main)


if __name__ == "__main__":
    console_main()
