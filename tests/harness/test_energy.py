"""Energy per sample: the powercap counters read from a real sysfs-shaped tree (packages
only, a wrap inside the window), NVML's energy counter of each rank's own GPU rehearsed
against autospecs of the real ``pynvml`` and ``torch.cuda`` (:mod:`gpu_node`), each GPU
counted once, and never a zero or a part where a counter was not read. Nothing measured
under the autospec is a measurement."""

from __future__ import annotations

import pynvml
import pytest
import torch
from gpu_node import node, patched, uuid

from tuner.harness.metrics import Window, summarize, unmeasured
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


def test_each_rank_reads_its_own_gpu_matched_by_uuid_not_every_gpu_of_the_node():
    """A job of 2 ranks on an 8-GPU node with CUDA_VISIBLE_DEVICES=2,5: CUDA's devices 0 and
    1 are NVML's 2 and 5, and only their counters are read (GPU i moves 10 J x (i + 1) a read)."""
    nvml, cuda = node(8, visible=(2, 5))
    with patched(nvml, cuda):
        readers = [energy.reader_for(torch.device("cuda", i)) for i in (0, 1)]
        for reader in readers:
            reader.start()
        joules = [reader.stop() for reader in readers]
    assert [r.key for r in readers] == [uuid(2), uuid(5)] and all(r.why is None for r in readers)
    assert joules == [pytest.approx(30.0), pytest.approx(60.0)]
    nvml.nvmlDeviceGetHandleByIndex.assert_not_called()  # never an index: CUDA's is not NVML's
    windows = [_window([8] * 10, energy_j=j, key=r.key) for j, r in zip(joules, readers)]
    assert summarize(windows)["energy_j_per_sample"] == pytest.approx(90.0 / 160)


def test_two_ranks_sharing_one_gpu_count_its_joules_once():
    windows = [_window([8] * 10, energy_j=40.0, key=uuid(0)), _window([8] * 10, energy_j=41.0, key=uuid(0))]
    assert summarize(windows)["energy_j_per_sample"] == pytest.approx(40.0 / 160)


def test_a_gpu_whose_counter_fails_gives_no_figure_rather_than_a_part_of_the_jobs():
    windows = [_window([8] * 10, energy_j=40.0, key=uuid(0)),
               _window([8] * 10, why="NVML gives no energy counter (Not Supported)")]
    assert summarize(windows)["energy_j_per_sample"] is None
    assert unmeasured(windows) == {"energy_j_per_sample": "NVML gives no energy counter (Not Supported)"}


def test_an_nvml_without_the_counter_gives_no_figure_and_says_so():
    nvml, cuda = node(1)
    nvml.nvmlDeviceGetTotalEnergyConsumption.side_effect = pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
    with patched(nvml, cuda):
        reader = energy.reader_for(torch.device("cuda", 0))
    assert reader.counters == [] and "NVML gives no energy counter" in reader.why


def test_a_mig_instance_is_found_by_its_own_uuid_and_says_it_has_no_energy_counter():
    """CUDA prints a MIG instance's UUID bare, as it does a GPU's: tried as ``GPU-`` first,
    then ``MIG-``, never prefixed wrongly into a silent null; its energy is refused in one line."""
    mig = "MIG-0000abcd-1111-2222-3333-444455556666"
    nvml, cuda = node(1, mig={0: mig})
    with patched(nvml, cuda):
        reader = energy.reader_for(torch.device("cuda", 0))
    nvml.nvmlDeviceGetHandleByUUID.assert_called_with(mig)
    assert reader.counters == [] and reader.why == energy.MIG_WHY


def test_only_the_hosts_first_process_reads_its_packages_and_the_others_say_nothing():
    reader = energy.reader_for(torch.device("cpu"), local_rank=3)
    assert reader.counters == [] and reader.why is None


def _window(samples, energy_j=None, why=None, key=None):
    return Window(step_times=[0.1] * len(samples), samples=samples, data_waits=[0.0] * len(samples),
                  wall_s=0.1 * len(samples), cpu_s=0.1, energy_j=energy_j, energy_why=why, energy_key=key)


def test_energy_per_sample_is_the_hosts_joules_over_every_ranks_samples():
    reader_rank = _window([8] * 10, energy_j=40.0, key="host:a")
    other_rank = _window([8] * 10)
    metrics = summarize([reader_rank, other_rank])
    assert metrics["energy_j_per_sample"] == pytest.approx(40.0 / 160)
    assert unmeasured([reader_rank, other_rank]) == {}


def test_unread_energy_is_none_never_zero_and_the_note_says_why():
    windows = [_window([8] * 10, why="/sys/class/powercap does not exist")]
    assert summarize(windows)["energy_j_per_sample"] is None
    assert unmeasured(windows) == {"energy_j_per_sample": "/sys/class/powercap does not exist"}


def test_a_search_for_samples_per_joule_on_a_mig_instance_is_told_why_before_it_starts(monkeypatch):
    """The search's check reads NVML alone (no CUDA context in a script recipe's search)."""
    mig = "MIG-0000abcd-1111-2222-3333-444455556666"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", mig)
    nvml, cuda = node(1, mig={0: mig})
    with patched(nvml, cuda):
        assert energy.node_why(cuda=True) == energy.MIG_WHY
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with patched(nvml, cuda):
        assert energy.node_why(cuda=True) is None  # a whole GPU's counter answers
