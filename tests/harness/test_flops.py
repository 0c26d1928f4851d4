"""FLOPs counted once per model, achieved FLOP/s, and the peak table behind MFU."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import tuner
from tuner.harness.metrics import Window, summarize
from tuner.harness.system.flops import count_flops, peak_flops, peak_for_name

from conftest import TOY


def test_peak_table_by_device_name_and_dtype():
    assert peak_for_name("NVIDIA H200", "bf16") == pytest.approx(989.4e12)
    assert peak_for_name("NVIDIA H100 PCIe", "fp16") == pytest.approx(756e12)
    assert peak_for_name("NVIDIA A100-SXM4-80GB", "fp32") == pytest.approx(19.5e12)
    assert peak_for_name("NVIDIA A100-SXM4-80GB", "fp32", allow_tf32=True) == pytest.approx(156e12)
    assert peak_for_name("NVIDIA A10G", "bf16") == pytest.approx(70e12)  # not the A10's figure
    assert peak_for_name("Tesla V100-SXM2-32GB", "bf16") is None  # no bf16 tensor cores
    assert peak_for_name("Some Future GPU", "bf16") is None  # unknown: no MFU, not a guess
    assert peak_for_name("NVIDIA A100-SXM4-80GB", "fp8") is None  # no FP8 tensor cores: no MFU


@pytest.mark.parametrize("name, dtype, tflops", [
    ("NVIDIA L40", "bf16", 181.0),  # holds the text "L4": once read the L4's 121 (MFU > 1)
    ("NVIDIA L40S", "bf16", 362.1),
    ("NVIDIA L4", "bf16", 121.0),
    ("NVIDIA H100 NVL", "bf16", 835.5),  # not the SXM's 989.4
    ("NVIDIA H200 NVL", "bf16", 835.5),
    ("NVIDIA H100 80GB HBM3", "bf16", 989.4),  # how CUDA names the SXM part
    ("NVIDIA H200", "bf16", 989.4),
    ("NVIDIA H100 PCIe", "bf16", 756.0),
    ("NVIDIA GH200 480GB", "bf16", 989.4),
    ("NVIDIA A100 80GB PCIe", "fp16", 312.0),
    ("NVIDIA H100 80GB HBM3", "fp8", 1978.9),  # float8's own peak, twice bf16's
    ("NVIDIA H200 NVL", "fp8", 1670.5),
    ("NVIDIA L40S", "fp8", 733.0),
    ("NVIDIA B200", "bf16", 2250.0),
    ("NVIDIA B200", "fp8", 4500.0),
    ("NVIDIA GB200", "bf16", 2500.0),  # holds no "B200" token: the NVL72 part's own figure
    ("NVIDIA GB200", "fp8", 5000.0),
    ("NVIDIA B300 SXM6 AC", "fp8", 4500.0),
    ("NVIDIA GB300", "bf16", 2500.0),
])
def test_the_peak_table_matches_whole_model_names_only(name, dtype, tflops):
    """Data-sheet dense figures (half the sparsity ones), matched by whole tokens."""
    assert peak_for_name(name, dtype) == pytest.approx(tflops * 1e12)


def test_fp32_convolutions_use_the_tf32_peak_where_cudnn_allows_tf32():
    """cuDNN runs fp32 convolutions in TF32 by default: against plain FP32's 19.5 TFLOP/s an
    fp32 ResNet on an A100 would read an MFU above 1 (its TF32 peak is 156)."""
    from tuner.harness.system.flops import tf32_in_use

    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:  # PyTorch's defaults: TF32 off for matmuls, on for cuDNN
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = False, True
        assert tf32_in_use(convolutions=True) and not tf32_in_use(convolutions=False)
        assert peak_for_name("NVIDIA A100-SXM4-80GB", "fp32", tf32_in_use(True)) == pytest.approx(156e12)
        torch.backends.cuda.matmul.allow_tf32 = True  # set_float32_matmul_precision("high")
        assert tf32_in_use(convolutions=False)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn
    assert peak_flops(torch.device("cpu"), "fp32") is None


def test_count_flops_of_a_linear_forward_and_backward():
    layer = nn.Linear(32, 64)
    x = torch.randn(16, 32)
    flops = count_flops(lambda: layer(x).sum().backward())
    assert flops == 2 * 16 * 32 * 64 * 2  # forward matmul + weight gradient (x needs no grad)


def test_measure_reports_achieved_flops_counted_from_the_model(toy):
    """Toy model Linear(32, w) -> ReLU -> Linear(w, 4): forward 72w, backward 8w + 8w + 64w
    FLOPs per sample (no input gradient for the first layer) = 152w."""
    m = tuner.measure(toy(task_args={"width": 64}))
    x = m.metrics
    assert x["achieved_tflops"] == pytest.approx(152 * 64 * x["samples_per_s"] / 1e12, rel=1e-6)
    assert x["mfu"] is None  # a CPU has no peak in the table


def test_task_flops_per_sample_wins_over_counting(tmp_path, toy):
    task = tmp_path / "toy_with_flops.py"
    task.write_text(TOY.read_text() + "\n\ndef flops_per_sample(args):\n    return 1e9\n")
    m = tuner.measure(toy(task=str(task)))
    assert m.metrics["achieved_tflops"] == pytest.approx(1e9 * m.metrics["samples_per_s"] / 1e12, rel=1e-6)


def test_mfu_is_achieved_over_peak_per_device():
    w = Window(step_times=[0.5, 0.5], data_waits=[0, 0], samples=[8, 8], wall_s=1.0)
    # 2 ranks x 8 samples per 0.5 s = 32 samples/s; 1e12 FLOPs each; 16e12 per device
    out = summarize([w, w], flops_per_sample=1e12, peak_flops=100e12)
    assert out["samples_per_s"] == pytest.approx(32)
    assert out["achieved_tflops"] == pytest.approx(16)
    assert out["mfu"] == pytest.approx(0.16)


def test_a_checkpointed_first_trial_counts_the_models_flops_not_its_recompute(tmp_path):
    """The FLOPs per sample are the model's whatever trial comes first: before, a trial with
    full checkpointing counted its recompute too, and every later trial's MFU read about a
    third high. Here the first trial of the process checkpoints every block, and the
    count is the plain model's, as a plain eager forward and backward counts it."""
    import torch.utils.data

    from tuner.inputs.task import load_task

    from conftest import ROOT, write_recipe

    recipe = write_recipe(tmp_path, {"name": "ck", "task": str(ROOT / "recipes" / "tasks" / "llama.py"),
                                     "global_batch_size": 4, "steps": {"warmup": 1, "measure": 2}})
    m = tuner.measure(recipe, activation_checkpointing="full", micro_batch_size=4)
    assert m.state == "ok", m.reason
    task = load_task(str(ROOT / "recipes" / "tasks" / "llama.py"), ROOT)
    batch = next(iter(torch.utils.data.DataLoader(task.build_dataset({}), batch_size=4, collate_fn=task.collate)))
    model = task.build_model({})
    plain = count_flops(lambda: task.compute_loss(model, batch).backward()) / 4
    x = m.metrics
    assert x["achieved_tflops"] == pytest.approx(plain * x["samples_per_s"] / 1e12, rel=1e-6)


def test_a_mig_slice_has_its_share_of_the_peak():
    """A100 3g.20gb: 42 of the A100's 108 SMs. A full GPU reports all of them: its peak is
    the table's."""
    mig = "NVIDIA A100-SXM4-40GB MIG 3g.20gb"
    assert peak_for_name(mig, "bf16", sms=42) == pytest.approx(312e12 * 42 / 108)
    assert peak_for_name(mig, "bf16") is None  # a slice of unknown size: no guess
    assert peak_for_name("NVIDIA H100 80GB HBM3", "bf16", sms=132) == pytest.approx(989.4e12)
    assert peak_for_name("NVIDIA H200", "bf16", sms=132) == pytest.approx(989.4e12)


def test_a_float8_trials_mfu_is_against_the_fp8_peak():
    """A float8 trial's matmuls run on FP8 tensor cores: against bf16's peak its MFU read up
    to 2x too high. The CUDA branch runs against an autospec of the real torch.cuda (a
    misspelled name fails here); the figure is the table's, not a measurement."""
    from unittest import mock

    from tuner.inputs.levers.precision import matmul_dtype
    from tuner.inputs.space import Machine, make_config

    gpu = Machine(cuda=True, bf16=True, fp16=True, capability=(9, 0), packages=frozenset({"torchao"}))
    made = {v: make_config({"amp_dtype": "bf16", "float8": v}, 8, 1, gpu, "auto", strict=False)[0]
            for v in ("off", "tensorwise", "rowwise")}
    assert matmul_dtype(made["tensorwise"]) == matmul_dtype(made["rowwise"]) == "fp8"
    assert matmul_dtype(made["off"]) == "bf16"
    cuda = mock.create_autospec(torch.cuda, instance=False)
    cuda.get_device_name.return_value = "NVIDIA H100 80GB HBM3"
    cuda.get_device_properties.return_value.multi_processor_count = 132
    device = torch.device("cuda", 0)
    with mock.patch.object(torch, "cuda", cuda):
        assert peak_flops(device, matmul_dtype(made["tensorwise"])) == pytest.approx(1978.9e12)
        assert peak_flops(device, "bf16") == pytest.approx(989.4e12)
    cuda.get_device_name.assert_called_with(device)


def test_a_trial_records_what_its_model_holds_for_the_advice(tmp_path):
    """What a lever acts on (convolutions; calls of scaled_dot_product_attention) is what the
    trial records of its model: the llama task with transformers' SDPA attention calls it,
    with its eager attention it does not (an attention kernel would change nothing there),
    and the convnet holds convolutions where the transformers hold none."""
    from conftest import ROOT, write_recipe

    def measured(name: str, task: str, args: dict) -> dict:
        folder = tmp_path / name
        folder.mkdir()
        recipe = write_recipe(folder, {"name": name, "task": str(ROOT / "recipes" / "tasks" / task),
                                       "task_args": args, "global_batch_size": 4,
                                       "steps": {"warmup": 1, "measure": 2}})
        m = tuner.measure(recipe, micro_batch_size=4)
        assert m.state == "ok", m.reason
        return m.repeats[0].ran["model"]

    assert measured("sdpa", "llama.py", {"attn_implementation": "sdpa"}) == {"convolutions": False, "attention": True}
    assert measured("eager", "llama.py", {"attn_implementation": "eager"}) == {"convolutions": False,
                                                                              "attention": False}
    assert measured("conv", "convnet.py", {}) == {"convolutions": True, "attention": False}


def test_an_optimizer_tells_whether_its_model_trains_convolutions():
    """What a script adapter that sees only optimizers (``adapt: torch``, ``adapt: lightning``)
    records of the model: a convolution among the parameters it trains, not one merely
    alive elsewhere in the process."""
    from tuner.harness.system.flops import trains_convolutions

    cnn = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.LazyLinear(2))
    mlp = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    bias_only = torch.optim.SGD([cnn[0].bias], lr=0.1)
    assert trains_convolutions(torch.optim.SGD(cnn[0].parameters(), lr=0.1))
    assert trains_convolutions(bias_only)  # a convolution's bias alone is still its parameter
    assert not trains_convolutions(torch.optim.AdamW(mlp.parameters()))  # cnn is alive, but not trained here
    conv1d = nn.Conv1d(2, 2, 3)
    assert trains_convolutions(torch.optim.SGD(conv1d.parameters(), lr=0.1))


def test_a_script_adapter_sees_whether_the_model_calls_attention():
    """What ``adapt: torch`` and ``adapt: lightning`` record for the attention-kernel advice:
    a training forward of ``nn.MultiheadAttention`` calls scaled_dot_product_attention (by
    its module-level name), an MLP does not, and after torch.compile has compiled a graph
    (which calls the original it captured) the answer is unknown, not "no"."""
    import torch.nn.functional as F

    from tuner.harness.system.flops import AttentionCalls

    original = F.scaled_dot_product_attention
    x = torch.randn(2, 5, 8)
    mha = nn.MultiheadAttention(8, 2, batch_first=True)
    watch = AttentionCalls()
    watch.start()
    mha(x, x, x, need_weights=False)[0].sum().backward()
    assert watch.stop() is True and F.scaled_dot_product_attention is original

    watch = AttentionCalls()
    watch.start()
    nn.Sequential(nn.Linear(8, 8), nn.ReLU())(x).sum().backward()
    assert watch.stop() is False and F.scaled_dot_product_attention is original

    watch = AttentionCalls()
    watch.start()
    torch.compile(nn.Linear(8, 8), backend="eager")(x).sum().backward()
    assert watch.stop() is None and F.scaled_dot_product_attention is original
    # a graph compiled before the watch does not make every later watch unknown
    watch = AttentionCalls()
    watch.start()
    nn.Linear(8, 8)(x).sum().backward()
    assert watch.stop() is False
