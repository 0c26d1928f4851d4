"""The study a search writes, in optuna-dashboard (issue 26, item 2): its real server on the
finished study (SQLite, and PostgreSQL as workers share one), read through its API, its
page rendered in headless Chromium."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

import tuner

from conftest import ROOT, _free_port, write_recipe

pytestmark = pytest.mark.slow


def _recipe(folder, name, **fields):
    return write_recipe(folder, {
        "name": name, "task": str(ROOT / "recipes" / "tasks" / "slow_reads.py"),
        "task_args": {"read_latency_ms": 2.0, "size": 4096}, "global_batch_size": 32,
        "steps": {"warmup": 2, "measure": 8}, "out": str(folder / "run"), "space": {"num_workers": [0, 2]},
        **fields})


class Dashboard:
    """``optuna-dashboard STORAGE`` on a free local port, until the test ends."""

    def __init__(self, storage: str, log: Path) -> None:
        command = shutil.which("optuna-dashboard", path=str(Path(sys.executable).parent)) or "optuna-dashboard"
        for attempt in range(5):
            # a free port can be taken before the server binds it: the suite's other processes
            # (torchrun's stores, gloo's connections) draw from the same ephemeral range (CI, 2026-12-05)
            self.port = _free_port()
            self.log = log.open("wb")
            self.proc = subprocess.Popen([command, storage, "--host", "127.0.0.1", "--port", str(self.port)],
                                         stdout=self.log, stderr=subprocess.STDOUT)
            if self._served() or "Address already in use" not in log.read_text() or attempt == 4:
                break
            self.close()
        if self.proc.poll() is not None:
            self.close()
            raise AssertionError(f"optuna-dashboard did not serve: {log.read_text()[-2000:]}")

    def _served(self) -> bool:
        """Whether the server answers within a minute (``False``: it exited, or never did)."""
        deadline = time.monotonic() + 60
        while True:
            try:
                self.get("/api/studies")
                return True
            except OSError:
                if self.proc.poll() is not None:
                    return False
                if time.monotonic() > deadline:
                    self.close()
                    raise AssertionError("optuna-dashboard did not serve within 60 s") from None
                time.sleep(0.3)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def get(self, path: str) -> object:
        with urllib.request.urlopen(self.url(path), timeout=30) as response:
            return json.loads(response.read())

    def study(self, name: str) -> tuple[int, dict]:
        summaries = self.get("/api/studies")["study_summaries"]
        (found,) = [s for s in summaries if s["study_name"] == name]
        return found["study_id"], self.get(f"/api/studies/{found['study_id']}?after=0")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()


def _check_api(study: dict, rows: list[dict]) -> None:
    """The objective is named, and every trial's headline metrics are flat user attributes."""
    assert study["objective_names"] == ["samples_per_s"], study["objective_names"]
    by_number = {t["number"]: {a["key"]: a["value"] for a in t["user_attrs"]} for t in study["trials"]}
    for row in rows:
        attrs = by_number[int(row["number"])]
        assert float(attrs["metric.samples_per_s"]) == pytest.approx(float(row["samples_per_s"]))
        assert float(attrs["metric.data_wait_share"]) == pytest.approx(float(row["data_wait_share"]))
        assert attrs["state"] == "ok"


def _rows(run: Path) -> list[dict]:
    with (run / "trials.csv").open() as f:
        return list(csv.DictReader(f))


def test_a_finished_search_opens_in_optuna_dashboard_and_renders_in_chromium(tmp_path):
    pytest.importorskip("optuna_dashboard")
    tuner.search(_recipe(tmp_path, "dash"), trials=2, confirm=0, attribute=0, quiet=True)
    rows = _rows(tmp_path / "run")
    dashboard = Dashboard(f"sqlite:///{tmp_path / 'run' / 'study.db'}", tmp_path / "dashboard.log")
    try:
        number, study = dashboard.study("dash")
        _check_api(study, rows)
        chromium = shutil.which("chromium") or shutil.which("chromium-browser")
        if chromium is None:
            if os.environ.get("TUNER_REQUIRE_CHROMIUM"):
                pytest.fail("chromium is required here (TUNER_REQUIRE_CHROMIUM) but not installed")
            pytest.skip("no chromium here (.ci/run installs Debian's)")
        flags = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=20000", "--dump-dom"]
        page = subprocess.run([*flags, dashboard.url(f"/dashboard/studies/{number}")], capture_output=True,
                              text=True, timeout=120)
        assert page.returncode == 0, page.stderr[-2000:]
        assert 'data-unformatted="samples_per_s"' in page.stdout  # the history plot's axis, named
        table = subprocess.run([*flags, dashboard.url(f"/dashboard/studies/{number}/trials")],
                               capture_output=True, text=True, timeout=120)
        shown = {a["key"]: a["value"] for a in study["trials"][0]["user_attrs"]}["metric.samples_per_s"]
        assert "metric.samples_per_s" in table.stdout and shown[:6] in table.stdout, shown
    finally:
        dashboard.close()


def test_a_study_on_postgresql_opens_in_optuna_dashboard(tmp_path, postgres):
    pytest.importorskip("optuna_dashboard")
    name = f"dash-pg-{os.getpid()}-{time.time_ns()}"
    tuner.search(_recipe(tmp_path, name, storage=postgres), trials=2, confirm=0, attribute=0, quiet=True)
    dashboard = Dashboard(postgres, tmp_path / "dashboard.log")
    try:
        _, study = dashboard.study(name)
        _check_api(study, _rows(tmp_path / "run"))
    finally:
        dashboard.close()
