"""Energy per sample: the powercap counters read from a real sysfs-shaped tree (packages
only, a wrap inside the window), NVML's energy counter of every GPU of the node rehearsed
against an autospec of the real ``pynvml``, one reader a node, and never a zero where no
counter was read. Nothing measured under the autospec is a measurement."""

from __future__ import annotations

from unittest import mock

import pynvml
import pytest

from tuner.harness.metrics import Window, energy_note, summarize
from tuner.harness.system import energy


def _zone(root, name, uj, wrap=None):
    zone = root / name
    zone.mkdir()
    (zone / "energy_uj").write_text(f"{uj}\n")
    if wrap is not None:
        (zone / "max_energy_range_uj").write_text(f"{wrap}\n")
    return zone


def test_powercap_adds_the_packages_not_their_subzones_and_survives_a_wrap(tmp_path):
    p0 = _zone(tmp_path, "intel-rapl:0", 5_000_000, wrap=10_000_000)
    _zone(tmp_path, "intel-rapl:0:0", 1_000_000)  # the package's cores: inside package 0's figure
    p1 = _zone(tmp_path, "intel-rapl:1", 2_000_000)
    counters, why = energy.powercap_counters(tmp_path)
    assert why is None and [c.name for c in counters] == ["intel-rapl:0", "intel-rapl:1"]
    reader = energy.Energy(counters, None, "powercap")
    reader.start()
    (p0 / "energy_uj").write_text("1_000_000".replace("_", ""))  # wrapped: 5 J -> 10 J -> 1 J
    (p1 / "energy_uj").write_text("2500000")
    assert reader.stop() == pytest.approx(6.0 + 0.5)


def test_no_powercap_is_no_figure_with_its_reason(tmp_path):
    counters, why = energy.powercap_counters(tmp_path / "absent")
    assert counters == [] and "does not exist" in why
    reader = energy.Energy(counters, why, "powercap")
    reader.start()
    assert reader.stop() is None


def test_nvml_reads_every_gpu_of_the_node_in_joules():
    nvml = mock.create_autospec(pynvml, instance=False)
    nvml.NVMLError = pynvml.NVMLError
    nvml.nvmlDeviceGetCount.return_value = 2
    nvml.nvmlDeviceGetHandleByIndex.side_effect = lambda i: f"handle{i}"
    readings = {"handle0": iter([10_000, 10_000, 70_000]), "handle1": iter([5_000, 5_000, 35_000])}
    nvml.nvmlDeviceGetTotalEnergyConsumption.side_effect = lambda h: next(readings[h])  # millijoules
    with mock.patch.dict("sys.modules", {"pynvml": nvml}):
        reader = energy.reader_for(cuda=True, local_rank=0)
        assert reader.why is None and reader.source == "nvml" and len(reader.counters) == 2
        reader.start()
        assert reader.stop() == pytest.approx(60.0 + 30.0)
    nvml.nvmlDeviceGetHandleByIndex.assert_has_calls([mock.call(0), mock.call(1)])


def test_an_nvml_without_the_counter_gives_no_figure_and_says_so():
    nvml = mock.create_autospec(pynvml, instance=False)
    nvml.NVMLError = pynvml.NVMLError
    nvml.nvmlDeviceGetCount.return_value = 1
    nvml.nvmlDeviceGetTotalEnergyConsumption.side_effect = pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
    with mock.patch.dict("sys.modules", {"pynvml": nvml}):
        reader = energy.reader_for(cuda=True, local_rank=0)
    assert reader.counters == [] and "NVML gives no energy counter" in reader.why


def test_one_process_a_node_reads_it():
    reader = energy.reader_for(cuda=False, local_rank=3)
    assert reader.counters == [] and "another process" in reader.why


def _window(samples, energy_j=None, why=None):
    return Window(step_times=[0.1] * len(samples), samples=samples, data_waits=[0.0] * len(samples),
                  wall_s=0.1 * len(samples), cpu_s=0.1, energy_j=energy_j, energy_why=why)


def test_energy_per_sample_is_the_nodes_joules_over_every_ranks_samples():
    reader_rank = _window([8] * 10, energy_j=40.0)
    other_rank = _window([8] * 10, why="another process of this node reads its counters")
    metrics = summarize([reader_rank, other_rank])
    assert metrics["energy_j_per_sample"] == pytest.approx(40.0 / 160)
    assert energy_note([reader_rank, other_rank]) is None


def test_unread_energy_is_none_never_zero_and_the_note_says_why():
    windows = [_window([8] * 10, why="/sys/class/powercap does not exist")]
    assert summarize(windows)["energy_j_per_sample"] is None
    assert energy_note(windows) == "energy_j_per_sample not measured: /sys/class/powercap does not exist"
