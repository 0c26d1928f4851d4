"""A search logged to MLflow, TensorBoard and W&B (offline), each read back through the
tracker's own reader (issue 26, item 1)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

import tuner
from tuner.outputs import closing

from conftest import ROOT, write_recipe

pytestmark = pytest.mark.slow


def _recipe(folder, **fields):
    return write_recipe(folder, {
        "name": "tracked", "task": str(ROOT / "recipes" / "tasks" / "slow_reads.py"),
        "task_args": {"read_latency_ms": 2.0, "size": 4096}, "global_batch_size": 32,
        "steps": {"warmup": 2, "measure": 8}, "out": str(folder / "run"),
        "space": {"num_workers": [0, 2]}, **fields})


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """One search logged to all three trackers (the recipe names two, the call a third),
    shared by the tests below: each reads back one tracker."""
    for package in ("mlflow", "tensorboard", "wandb"):
        pytest.importorskip(package)
    tmp = tmp_path_factory.mktemp("tracked")
    with pytest.MonkeyPatch.context() as env:
        env.chdir(tmp)  # MLflow keeps a database store's artifacts in ./mlruns
        env.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp / 'mlflow.db'}")
        env.setenv("MLFLOW_EXPERIMENT_NAME", "tuner-test")
        env.setenv("WANDB_MODE", "offline")
        env.setenv("WANDB_SILENT", "true")
        env.delenv("WANDB_API_KEY", raising=False)
        result = tuner.search(_recipe(tmp, track=["mlflow", "tensorboard"]), trials=2, confirm=0, attribute=0,
                              quiet=True, track="wandb")
    with (tmp / "run" / "trials.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["state"] for r in rows] == ["ok", "ok"], rows
    return tmp, result, rows


def test_mlflow_holds_the_search_as_a_parent_run_and_each_trial_as_a_child(searched):
    from mlflow.tracking import MlflowClient

    tmp, result, rows = searched
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("tuner-test")
    runs = client.search_runs([experiment.experiment_id])
    (parent,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = sorted((r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id),
                      key=lambda r: int(r.data.tags["tuner.trial"]))
    assert [c.data.params["num_workers"] for c in children] == [r["num_workers"] for r in rows]
    for child, row in zip(children, rows):
        assert child.data.metrics["samples_per_s"] == pytest.approx(float(row["samples_per_s"]))
        assert child.data.tags["tuner.state"] == "ok" and child.info.status == "FINISHED"
    best = [c for c in children if c.data.tags.get("tuner.best") == "true"]
    assert len(best) == 1 and best[0].data.tags["tuner.trial"] == str(result.best["trial"])
    assert parent.data.metrics["best.samples_per_s"] == pytest.approx(result.best["metrics"]["samples_per_s"])
    assert parent.data.metrics["speedup"] == pytest.approx(result.speedup)
    kept = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"report.html", "best.json", "trials.csv", "dataloader.json", "ds_config.json", "summary.txt"} <= kept, kept
    decided = {k.removeprefix("tuner.decision."): v for k, v in parent.data.tags.items()
               if k.startswith("tuner.decision.")}
    assert decided and decided == {d.knob: d.verdict for d in result.summary.decisions}  # the summary's, as tags
    text = Path(client.download_artifacts(parent.info.run_id, "summary.txt", str(tmp))).read_text()
    assert text.splitlines() == closing.lines(result.summary)  # the console's closing lines
    assert parent.info.status == "FINISHED"


def test_tensorboard_event_files_hold_every_trial_and_the_best(searched):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tmp, result, rows = searched
    events = EventAccumulator(str(tmp / "run" / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    rates = events.Scalars("trials/samples_per_s")
    assert [e.step for e in rates] == [int(r["number"]) for r in rows]
    assert [e.value for e in rates] == pytest.approx([float(r["samples_per_s"]) for r in rows], rel=1e-5)
    assert events.Scalars("best/samples_per_s")[0].value == pytest.approx(result.best["metrics"]["samples_per_s"],
                                                                          rel=1e-5)
    summary = events.Tensors("summary/text_summary")[0].tensor_proto.string_val[0].decode()
    assert [line.strip() for line in summary.splitlines()] == [line.strip() for line in closing.lines(result.summary)]
    hparams = sorted(p.name for p in (tmp / "run" / "tensorboard").iterdir() if p.is_dir())
    assert hparams == [f"trial-{int(r['number']):04d}" for r in rows], hparams


def _wandb_records(path):
    """The records of an offline run's ``.wandb`` file: LevelDB's log format (32 KiB blocks of
    CRC32, length, type chunks; W&B's own header first), each a W&B ``Record`` protobuf.
    wandb 0.31 has no Python reader of its own (its core is Go), so the format is read here
    and the records by W&B's protobuf definition."""
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, bodies, pending = path.read_bytes(), 7, [], b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        body, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 1:
            bodies.append(body)
        elif kind in (2, 3):
            pending += body
        elif kind == 4:
            bodies.append(pending + body)
            pending = b""
    records = []
    for body in bodies:
        record = pb.Record()
        record.ParseFromString(body)
        records.append(record)
    return records


def test_wandb_offline_run_keeps_trials_summary_and_files(searched):
    tmp, result, rows = searched
    (run_file,) = list((tmp / "run" / "wandb").glob("offline-run-*/run-*.wandb"))
    records = _wandb_records(run_file)

    def items(record, part):
        return {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in getattr(record, part)}

    history = [items(r.history, "item") for r in records if r.WhichOneof("record_type") == "history"]
    trials = [h for h in history if "trial/number" in h]
    assert [h["trial/number"] for h in trials] == [int(r["number"]) for r in rows]
    assert [h["trial/samples_per_s"] for h in trials] == pytest.approx([float(r["samples_per_s"]) for r in rows])
    summary = {}
    for r in records:
        if r.WhichOneof("record_type") == "summary":
            summary.update(items(r.summary, "update"))
    assert summary["best/samples_per_s"] == pytest.approx(result.best["metrics"]["samples_per_s"])
    assert summary["best/params"]["num_workers"] == result.best["params"]["num_workers"]
    assert summary["decisions"] == {d.knob: d.verdict for d in result.summary.decisions}
    assert summary["said"].splitlines() == closing.lines(result.summary)
    (kept,) = [r.artifact for r in records
               if r.WhichOneof("record_type") == "artifact" and r.artifact.type == "tuner-run"]
    assert {"report.html", "best.json", "trials.csv", "ds_config.json"} <= {c.path for c in kept.manifest.contents}


def test_a_missing_tracker_package_or_name_is_one_line(tmp_path):
    code = ("import importlib.util, sys; real = importlib.util.find_spec\n"
            "importlib.util.find_spec = lambda n, *a: None if n == 'wandb' else real(n, *a)\n"
            "from tuner.cli import search_main; sys.exit(search_main(sys.argv[1:]))")
    proc = subprocess.run([sys.executable, "-c", code, str(_recipe(tmp_path)), "--track", "wandb", "--quiet"],
                          capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: track: wandb needs the wandb package, which is not installed: pip install 'tuner[wandb]' "
        "(or drop wandb from track / --track)"), proc.stderr
    with pytest.raises(tuner.RecipeError, match="track: unknown tracker 'neptune'; expected mlflow, tensorboard"):
        tuner.load_recipe(_recipe(tmp_path, track="mlflow,neptune"))
