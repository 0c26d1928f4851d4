"""``scripts/gpu_acceptance.py`` on a machine without CUDA, and the parts of it a CPU can
check: every row's rule fails what a broken tuner would report, the groups fit the device's
time, a run writes each row as it finishes, and what it needs is said in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tuner

from conftest import write_recipe

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
SCRIPT = SCRIPTS / "gpu_acceptance.py"
sys.path.insert(0, str(SCRIPTS))

import gpu_acceptance  # noqa: E402 - the script's folder on the path first
import gpu_task  # noqa: E402


def test_without_cuda_it_says_so_in_one_line_and_exits_2(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "t.json")], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "no CUDA device" in lines[0] and "Traceback" not in proc.stderr
    assert not (tmp_path / "t.json").exists()


@pytest.mark.parametrize("name", sorted(gpu_acceptance.RULES))
def test_every_rule_fails_what_a_broken_tuner_would_report_and_passes_a_right_one(name):
    rule = gpu_acceptance.RULES[name]
    measured, truth, context = rule.passing
    assert rule.test(measured, truth, **context), (name, rule.passing)
    measured, truth, context = rule.failing
    assert not rule.test(measured, truth, **context), (name, rule.failing)
    row = gpu_acceptance.judge("c", name, *rule.failing[:2], **rule.failing[2])
    assert row["pass"] is False and row["threshold"] == rule.text


def test_a_measurement_the_rule_cannot_read_fails_the_row():
    row = gpu_acceptance.judge("c", "within_10pct", None, 0.013)
    assert row["pass"] is False
    row = gpu_acceptance.judge("c", "budget", 100.0, 100.0)  # the context the rule needs is missing
    assert row["pass"] is False and "rule: TypeError" in row["note"]


def checks():
    import gpu_checks

    return gpu_checks.CHECKS


def test_each_group_fits_under_four_minutes_and_every_check_has_one():
    groups: dict[int, float] = {}
    for check in checks():
        groups[check.group] = groups.get(check.group, 0.0) + check.seconds
    assert sorted(groups) == list(range(1, len(groups) + 1))
    assert all(s <= gpu_acceptance.GROUP_BUDGET_S for s in groups.values()), groups
    names = [c.name for c in checks()]
    assert len(names) == len(set(names))
    for c in checks():  # a check needs only checks that come before it
        assert all(names.index(n) < names.index(c.name) for n in c.needs), c.name


def test_only_pulls_in_what_a_check_needs_and_a_group_its_own():
    picked = [c.name for c in gpu_acceptance.select(checks(), only=["memory"])]
    assert picked == ["step_time", "memory"]  # memory reads step_time's measurement
    group = [c.name for c in gpu_acceptance.select(checks(), group=1)]
    assert group[:2] == ["step_time", "data_wait"] and "search" not in group
    with pytest.raises(SystemExit, match="no check named nope"):
        gpu_acceptance.select(checks(), only=["nope"])


def test_every_row_is_written_as_its_check_finishes_and_a_broken_check_is_a_failed_row(tmp_path):
    out = tmp_path / "rows.json"
    seen_on_disk = []

    def first(lab, seen):
        seen["x"] = 1
        return [gpu_acceptance.judge("first", "within_10pct", 1.0, 1.0)]

    def second(lab, seen):
        seen_on_disk.append(json.loads(out.read_text()))  # what a run cut here would have left
        raise RuntimeError("the GPU went away")

    def third(lab, seen):
        return [gpu_acceptance.judge("third", "equal", seen["x"], 1)]

    plan = [gpu_acceptance.Check("first", 1, 1, first), gpu_acceptance.Check("second", 1, 1, second),
            gpu_acceptance.Check("needs_nvml", 1, 1, third, requires=("nvml",)),
            gpu_acceptance.Check("third", 1, 1, third)]
    lines: list[str] = []
    rows = gpu_acceptance.run_checks(plan, None, out, {"nvml": "nvidia-ml-py: NVMLError"}, {"device": "test"},
                                     lines.append)
    assert seen_on_disk[0]["complete"] is False and [r["check"] for r in seen_on_disk[0]["rows"]] == ["first"]
    assert [r["pass"] for r in rows] == [True, False, False, True]
    assert "RuntimeError: the GPU went away" in rows[1]["note"]
    assert rows[2]["note"] == "missing: nvidia-ml-py: nvidia-ml-py: NVMLError"
    final = json.loads(out.read_text())
    assert final["complete"] is True and len(final["rows"]) == 4 and final["device"] == "test"
    assert lines[0] == gpu_acceptance.HEADER and len(lines) == 5 and "FAIL" in lines[2]


def test_what_it_needs_is_said_in_one_line():
    deps = gpu_acceptance.dependencies()
    assert set(deps) == {"cuda", "nvml", "compiler", "deepspeed", "float8", "two_gpus"}
    assert deps["float8"] in ("torchao is not installed", "no CUDA device")
    assert deps["two_gpus"] == "no CUDA device"
    assert deps["cuda"] is not None and "sees no CUDA device" in deps["cuda"]  # this machine
    line = gpu_acceptance.dependency_line(deps)
    assert line.startswith("gpu_acceptance: needs: CUDA PyTorch MISSING") and "\n" not in line
    assert "DeepSpeed ok" in gpu_acceptance.dependency_line({"deepspeed": None})


def test_its_task_trains_under_the_tuner_and_its_analytic_flops_are_the_counted_ones(tmp_path):
    """The checks measure scripts/gpu_task.py: it loads and trains as a task, and each FLOP
    truth it holds the tuner to is what the tuner counts of the same model here: the MLP
    and the matmul stack through a measurement, the transformer with attention as the
    tuner counts it (a meta-device pass; the fused CPU attention kernel counted too)."""
    for model, width in (("mlp", 64), ("matmul", 64)):
        args = {"model": model, **({"width": width} if width else {})}
        recipe = write_recipe(tmp_path, {"name": f"acceptance-{model}", "task": str(SCRIPTS / "gpu_task.py"),
                                         "task_args": args, "global_batch_size": 32,
                                         "steps": {"warmup": 1, "measure": 4}})
        m = tuner.measure(recipe)
        assert m.state == "ok", m.reason
        counted = m.metrics["achieved_tflops"] * 1e12 / m.metrics["samples_per_s"]
        truth = gpu_task.analytic_flops_per_sample(width or gpu_task.WIDTH, model)
        assert counted == pytest.approx(truth, rel=1e-6), model
    from tuner.harness.system.flops import count_flops
    from tuner.trial.ceiling_comm_flops import _meta_count

    args = {"model": "transformer"}
    data = gpu_task.build_dataset(args)
    batch = torch.utils.data.default_collate([data[i] for i in range(2)])
    truth = gpu_task.analytic_flops_per_sample(model="transformer")
    assert _meta_count(gpu_task, args, batch) / 2 == pytest.approx(truth, rel=1e-9)
    model = gpu_task.build_model(args)
    assert count_flops(lambda: gpu_task.compute_loss(model, batch).backward()) / 2 == pytest.approx(truth, rel=1e-9)


ACCEPTANCE = SCRIPTS / "device" / "acceptance.sh"


def _parts() -> dict[str, list[tuple[str, int, list[str]]]]:
    """acceptance.sh's parts: (group, timeout s, checks), read from the script itself."""
    import re

    text = ACCEPTANCE.read_text()
    parts = {}
    for part, body in re.findall(r"^\s+(\d)\) groups=\((.*?)\) ;;", text, flags=re.M | re.S):
        groups = re.findall(r'"(\w+) (\d+) ([\w,]+)"', body)
        parts[part] = [(name, int(limit), checks.split(",")) for name, limit, checks in groups]
    return parts


def test_the_acceptance_command_refuses_a_cpu_in_one_line():
    proc = subprocess.run(["bash", str(ACCEPTANCE), "1"], capture_output=True, text=True, timeout=120)
    said = (proc.stdout + proc.stderr).strip().splitlines()
    assert proc.returncode == 2 and len(said) == 1 and "no CUDA GPU here" in said[0], said


def test_the_acceptance_parts_hold_every_check_once_most_likely_faults_first_and_fit_a_lease():
    """Memory and NVML first, then the data wait and the copy, then the one-GPU search; part 1
    in 540 s of the GPU (its groups' timeouts, and the checks' own estimates well inside
    them), each check in one part only, every check somewhere."""
    parts = _parts()
    assert sorted(parts) == ["1", "2", "3", "4"]
    named = [c for groups in parts.values() for _, _, checks in groups for c in checks]
    import gpu_checks

    known = {c.name for c in gpu_checks.CHECKS}
    assert sorted(named) == sorted(known) and len(named) == len(set(named))
    first = [c for _, _, checks in parts["1"] for c in checks]
    assert first[:2] == ["memory", "utilization"] and "search" in first
    assert sum(limit for _, limit, _ in parts["1"]) <= 540 - 60  # a minute for the install and the versions
    for part, groups in parts.items():
        for name, limit, checks in groups:
            chosen = gpu_acceptance.select(gpu_checks.CHECKS, None, checks)
            assert sum(c.seconds for c in chosen) <= limit, (part, name)


def test_the_traces_nccl_share_is_counted_by_hand_as_the_tuners_arithmetic_counts_it():
    """The node check's truth is written out in the check, not the tuner's: on a trace of an
    all-reduce of 6 us of which compute kernels cover 3, over a 14 us span, both read 3/14."""
    from tuner.harness.comm import exposed_share

    import gpu_checks

    def kernel(name, ts, dur):
        return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur}

    events = [kernel("sm80_gemm", 0, 10), kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 8, 6),
              kernel("elementwise", 12, 1), {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 30}]
    assert gpu_checks.trace_nccl_share(events) == pytest.approx(3 / 14)
    assert exposed_share(events, 14, "cuda") == pytest.approx(3 / 14)
    assert gpu_checks.trace_nccl_share([]) is None


def test_a_row_this_machine_cannot_run_is_neither_a_pass_nor_a_fail(capsys):
    """Two ranks of ZeRO-2 on one GPU: gloo has no reduce-scatter for CUDA tensors and NCCL
    refuses two ranks on one device, so the row says it needs two GPUs; the exit status
    counts the rows that ran."""
    row = gpu_acceptance.not_here("two ranks, ZeRO-2: trains", "needs two GPUs")
    assert row["pass"] is None and "n/a - needs two GPUs" in gpu_acceptance.show_row(row)
