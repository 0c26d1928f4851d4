"""The search in the experiment tracker the user already has: MLflow, TensorBoard, W&B.

``--track mlflow,tensorboard`` (or ``track:`` in the recipe) logs each trial as it is
recorded and the result when the run folder is written: MLflow a parent run with a nested
run a trial, TensorBoard event files under ``RUN_DIR/tensorboard``, W&B one run with a step
a trial (offline in ``RUN_DIR/wandb`` without credentials or ``WANDB_MODE``). Where each
goes is the tracker's own configuration; docs/outputs.md lists what each gets. A tracker
that fails mid-search is dropped with one line; the search goes on.
"""

from __future__ import annotations

import importlib.util
import json
import math
import netrc
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from tuner.inputs.errors import RecipeError
from tuner.inputs.trackers import TRACKERS
from tuner.outputs import closing, trial_words
from tuner.trial.trial_result import State
from tuner.tuning.events import Said, SearchEvents

if TYPE_CHECKING:
    from tuner.inputs.plan import Plan
    from tuner.inputs.recipe import Recipe
    from tuner.study.trial_record import Record
    from tuner.tuning.search_result import SearchResult

PACKAGES = {"mlflow": "mlflow", "tensorboard": "tensorboard", "wandb": "wandb"}
"""The package each tracker needs (``pip install 'tuner[NAME]'``)."""
FILES = ("report.html", "best.json", "trials.csv", "search.log", "dataloader.json", "ds_config.json",
         "accelerate_config.yaml", "hf_training_args.json", "torchtitan.toml", "torch_settings.py",
         "lightning_trainer.yaml")
"""What a tracker keeps of the run folder, where present."""


def check(names: tuple[str, ...]) -> None:
    """Refuse, in one line, a tracker whose package is not installed (before any trial)."""
    for name in names:
        if importlib.util.find_spec(PACKAGES[name]) is None:
            raise RecipeError(f"track: {name} needs the {PACKAGES[name]} package, which is not installed: "
                              f"pip install 'tuner[{name}]' (or drop {name} from track / --track)")


def numbers(metrics: Mapping[str, Any] | None) -> dict[str, float]:
    """The numeric, finite metrics (a tracker takes no words and no NaN)."""
    return {k: float(v) for k, v in (metrics or {}).items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


def files(out: Path) -> list[Path]:
    return [out / name for name in FILES if (out / name).is_file()]


def said(result: "SearchResult") -> str:
    """The search's closing lines, as the console prints them (:mod:`tuner.outputs.closing`)."""
    return "\n".join(closing.lines(result.summary))


def verdicts(result: "SearchResult") -> dict[str, str]:
    """Each change's verdict (``kept``, ``dropped``, ``undecided``) by its knob, from the summary."""
    return {d.knob: d.verdict for d in result.summary.decisions}


class Tracker:
    """One tracker's side of a search."""

    name = ""

    def start(self, recipe: "Recipe", out: Path) -> str | None:
        """Open the search's run; returns a line saying where it goes, if worth saying."""
        raise NotImplementedError

    def trial(self, number: int, params: dict[str, Any], metrics: dict[str, Any] | None, state: str,
              reason: str, baseline: bool) -> None:
        raise NotImplementedError

    def finish(self, result: "SearchResult", out: Path) -> None:
        raise NotImplementedError


class MLflowTracker(Tracker):
    name = "mlflow"

    def start(self, recipe: "Recipe", out: Path) -> str | None:
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient()
        experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME") or f"tuner-{recipe.name}"
        found = self.client.get_experiment_by_name(experiment)
        self.experiment = found.experiment_id if found is not None else self.client.create_experiment(experiment)
        parent = self.client.create_run(self.experiment, run_name=f"search {recipe.name}",
                                        tags={"tuner.recipe": str(recipe.path), "tuner.out": str(out)})
        self.parent = parent.info.run_id
        self.client.log_batch(self.parent, params=_params({"global_batch_size": recipe.global_batch_size,
                                                            "world_size": recipe.world_size,
                                                            "recipe": recipe.name}))
        self.runs: dict[int, str] = {}
        import mlflow

        return f"track: mlflow: experiment {experiment!r}, parent run {self.parent} at {mlflow.get_tracking_uri()}"

    def trial(self, number: int, params: dict[str, Any], metrics: dict[str, Any] | None, state: str,
              reason: str, baseline: bool) -> None:
        from mlflow.entities import Metric

        run = self.client.create_run(self.experiment, run_name=f"trial {number}", tags={
            "mlflow.parentRunId": self.parent, "tuner.trial": str(number), "tuner.state": state,
            "tuner.reason": reason[:4000], "tuner.baseline": str(baseline).lower()})
        now = int(time.time() * 1000)
        self.client.log_batch(run.info.run_id, params=_params(params),
                              metrics=[Metric(k, v, now, 0) for k, v in numbers(metrics).items()])
        status = "FINISHED" if state == State.OK else "KILLED" if state == State.PRUNED else "FAILED"
        self.client.set_terminated(run.info.run_id, status=status)
        self.runs[number] = run.info.run_id

    def finish(self, result: "SearchResult", out: Path) -> None:
        from mlflow.entities import Metric

        best = result.best.get("trial")
        if best in self.runs:
            self.client.set_tag(self.runs[best], "tuner.best", "true")
        now = int(time.time() * 1000)
        metrics = [Metric(f"best.{k}", v, now, 0) for k, v in numbers(result.best.get("metrics")).items()]
        if result.speedup is not None:
            metrics.append(Metric("speedup", float(result.speedup), now, 0))
        self.client.log_batch(self.parent, metrics=metrics, params=_params(
            {f"best.{k}": v for k, v in (result.best.get("params") or {}).items()}))
        self.client.set_tag(self.parent, "tuner.stopped", str(result.stopped))
        for knob, verdict in verdicts(result).items():
            self.client.set_tag(self.parent, f"tuner.decision.{knob}", verdict)
        self.client.log_text(self.parent, said(result), "summary.txt")
        for path in files(out):
            self.client.log_artifact(self.parent, str(path))
        self.client.set_terminated(self.parent, status="FINISHED")


def _params(values: Mapping[str, Any]) -> list[Any]:
    from mlflow.entities import Param

    return [Param(k, str(v)) for k, v in values.items()]


class TensorBoardTracker(Tracker):
    name = "tensorboard"

    def start(self, recipe: "Recipe", out: Path) -> str | None:
        from torch.utils.tensorboard import SummaryWriter

        self.logdir = Path(os.environ.get("TUNER_TENSORBOARD_DIR") or out / "tensorboard")
        self.writer = SummaryWriter(log_dir=str(self.logdir))
        self.writer.add_text("recipe", f"{recipe.name}: global batch {recipe.global_batch_size}, "
                                       f"{recipe.world_size} rank(s), {recipe.path}")
        return f"track: tensorboard: tensorboard --logdir {self.logdir}"

    def trial(self, number: int, params: dict[str, Any], metrics: dict[str, Any] | None, state: str,
              reason: str, baseline: bool) -> None:
        values = numbers(metrics)
        for key, value in values.items():
            self.writer.add_scalar(f"trials/{key}", value, number)
        self.writer.add_text("trials/state", f"trial {number}: {state}{' (baseline)' if baseline else ''} {reason}",
                             number)
        hparams = {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in params.items()}
        self.writer.add_hparams(hparams, {f"hparam/{k}": v for k, v in values.items()} or {"hparam/ok": 0.0},
                                run_name=f"trial-{number:04d}", global_step=number)
        self.writer.flush()

    def finish(self, result: "SearchResult", out: Path) -> None:
        for key, value in numbers(result.best.get("metrics")).items():
            self.writer.add_scalar(f"best/{key}", value, 0)
        if result.speedup is not None:
            self.writer.add_scalar("best/speedup", float(result.speedup), 0)
        kept = "\n".join(f"- {p}" for p in files(out))
        self.writer.add_text("best", f"params: `{json.dumps(result.best.get('params'))}`\n\n"
                                     f"stopped: {result.stopped}\n\nfiles:\n{kept}")
        self.writer.add_text("summary", "".join(f"    {line}\n" for line in closing.lines(result.summary)))
        self.writer.close()


class WandbTracker(Tracker):
    name = "wandb"

    def start(self, recipe: "Recipe", out: Path) -> str | None:
        import wandb
        from wandb.sdk import wandb_setup

        self.own_service = wandb_setup._singleton is None  # noqa: SLF001 - whether W&B was set up before us
        """W&B was not set up in this process before the search: its service process (wandb-core)
        is the search's to end, as a library call leaves the caller's process as found."""
        mode = os.environ.get("WANDB_MODE") or ("online" if _wandb_credentials() else "offline")
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT") or "tuner", name=f"search {recipe.name}",
                              dir=str(out), mode=mode, reinit="create_new",
                              config={"recipe": recipe.name, "global_batch_size": recipe.global_batch_size,
                                      "world_size": recipe.world_size, "out": str(out)},
                              settings=wandb.Settings(silent=True, console="off"))
        self.rows: list[list[Any]] = []
        if mode == "offline" and not os.environ.get("WANDB_MODE"):
            where = Path(self.run.dir).parent  # the run's folder (run.dir is its files/)
            return (f"track: wandb: no W&B credentials (WANDB_API_KEY, wandb login), so the run is offline in "
                    f"{where}; `wandb sync {where}` sends it")
        return f"track: wandb: run {self.run.id} ({mode})"

    def trial(self, number: int, params: dict[str, Any], metrics: dict[str, Any] | None, state: str,
              reason: str, baseline: bool) -> None:
        values = numbers(metrics)
        self.run.log({"trial/number": number, **{f"trial/{k}": v for k, v in values.items()},
                      **{f"param/{k}": v if isinstance(v, (int, float, bool)) else str(v) for k, v in params.items()},
                      "trial/ok": float(state == State.OK)}, step=number)
        self.rows.append([number, state, reason[:500], baseline, json.dumps(params), values.get("samples_per_s")])

    def finish(self, result: "SearchResult", out: Path) -> None:
        import wandb

        self.run.summary.update({f"best/{k}": v for k, v in numbers(result.best.get("metrics")).items()})
        self.run.summary.update({"best/params": result.best.get("params"), "speedup": result.speedup,
                                 "stopped": result.stopped, "best/trial": result.best.get("trial"),
                                 "decisions": verdicts(result), "said": said(result)})
        self.run.log({"trials": wandb.Table(columns=["trial", "state", "reason", "baseline", "params",
                                                     "samples_per_s"], data=self.rows)})
        artifact = wandb.Artifact(f"tuner-{self.run.name or 'search'}".replace(" ", "-"), type="tuner-run")
        for path in files(out):
            artifact.add_file(str(path))
        self.run.log_artifact(artifact)
        self.run.finish()
        if self.own_service:
            wandb.teardown()


def _wandb_credentials() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):
        return False


MAKERS: dict[str, Callable[[], Tracker]] = {"mlflow": MLflowTracker, "tensorboard": TensorBoardTracker,
                                            "wandb": WandbTracker}
assert set(MAKERS) == set(TRACKERS)


class Tracked(SearchEvents):
    """The search's events for the console (``inner``) and for each tracker."""

    def __init__(self, inner: SearchEvents, names: tuple[str, ...], recipe: "Recipe", out: Path) -> None:
        self.inner = inner
        self.trackers: list[Tracker] = []
        for name in names:
            tracker = MAKERS[name]()
            said = self._guard(tracker, lambda t=tracker: t.start(recipe, out))
            if said is False:
                continue
            self.trackers.append(tracker)
            if said:
                inner.note(said)

    def _guard(self, tracker: Tracker, call: Callable[[], Any]) -> Any:
        """Run a tracker's call; a failure drops the tracker with one line (``False``)."""
        try:
            return call()
        except Exception as exc:  # noqa: BLE001 - a tracker never stops the search
            text = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
            self.inner.note(f"track: {tracker.name} failed ({type(exc).__name__}: {text}); the search goes on "
                            "without it")
            if tracker in self.trackers:
                self.trackers.remove(tracker)
            return False

    def note(self, text: "str | Said") -> None:
        self.inner.note(text)

    def detail(self, text: "str | Said") -> None:
        self.inner.detail(text)

    def start(self, done: int, measured: int) -> None:
        self.inner.start(done, measured)

    def begin(self, number: int, config: "Plan") -> None:
        self.inner.begin(number, config)

    def chose(self, number: int, why: "str | Said") -> None:
        self.inner.chose(number, why)

    def finish_trial(self, trial: "Record", outcome: str, best: float | None) -> None:
        self.inner.finish_trial(trial, outcome, best)
        attrs = trial.attrs
        for tracker in list(self.trackers):
            self._guard(tracker, lambda t=tracker: t.trial(
                trial.number, dict(attrs.get("params") or {}), attrs.get("metrics"), outcome,
                trial_words.trial_reason(attrs) or "", bool(attrs.get("baseline"))))

    def stop(self) -> None:
        self.inner.stop()

    def finish(self, result: "SearchResult", out: Path) -> None:
        """The result and the run folder's files, once written."""
        for tracker in list(self.trackers):
            self._guard(tracker, lambda t=tracker: t.finish(result, out))
