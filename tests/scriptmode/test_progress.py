"""What a script that ended without a window is told (:mod:`tuner.scriptmode.adapters.progress`
and the launcher's reason): each count of what it did, read back from its output as the
launcher reads it, under torchrun's rank prefix too."""

from __future__ import annotations

import torch

from tuner.scriptmode import launcher
from tuner.scriptmode.adapters.progress import MARK, Progress, never_stepped


def test_the_counts_name_what_the_script_did():
    hand = Progress()
    hand.backward = 12
    assert hand.why(10).startswith("it ran 12 backward pass(es) and no torch.optim optimizer step")
    assert "no backward pass and no optimizer step" in Progress().why(10)
    short = Progress()
    short.backward, short.steps = 5, 5
    assert short.why(10).startswith("it ended after 5 optimizer step(s), and the window needs at least 10")
    assert never_stepped(MARK + hand.why(10)) and never_stepped(MARK + Progress().why(10))
    assert not never_stepped(MARK + short.why(10)) and not never_stepped(hand.why(10)) and not never_stepped(None)


def test_the_installed_counter_sees_backward_passes_and_every_optimizers_steps():
    progress = Progress()
    original = torch.autograd.backward
    try:
        progress.install()
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            model(torch.randn(4, 2)).sum().backward()
        opt.step()
        assert (progress.backward, progress.steps) == (3, 1)
    finally:
        progress.uninstall()  # in the product it holds for the script's whole process
    assert torch.autograd.backward is original
    opt.step()
    assert progress.steps == 1


def test_the_launcher_gives_the_scripts_line_and_an_adapters_own_question(tmp_path):
    log = tmp_path / "output.log"
    log.write_text("tuner: python -m tuner.scriptmode.adapters train.py\nepoch 1 done\n"
                   f"[rank0]: {MARK}{Progress().why(10)}\n")
    state, reason, _ = launcher.exited(0, log, "torch")
    assert state == "error", reason
    assert reason.startswith('the script printed "epoch 1 done" and ended without a measured window: it ran no '
                             "backward"), reason
    assert reason.endswith(f"(whole output: {log})"), reason
    log.write_text("tuner: python -m tuner.scriptmode.adapters train.py\ntraining done\n")
    _, reason, _ = launcher.exited(0, log, "hf")
    assert reason.startswith('the script finished without reporting (its last line: "training done"): adapt: hf '
                             "measures its library's training steps") and "tuner.Probe" not in reason, reason
    _, reason, _ = launcher.exited(0, log)  # no adapter: the script's own probe is the question
    assert "does it use tuner.Probe" in reason, reason


def test_a_script_that_stopped_before_training_is_quoted_first(tmp_path):
    """The last line the script printed (not torchrun's banner, not the tuner's) leads where it
    made no backward pass at all: it says why it stopped."""
    log = tmp_path / "output.log"
    log.write_text("tuner: python -m torch.distributed.run -m tuner.scriptmode.adapters example.py\n\n"
                   "*****************************************\nSetting OMP_NUM_THREADS environment variable for each "
                   "process to be 1 in default\n*****************************************\n"
                   "[rank0]: Unable to locate sufficient 2 gpus. Exiting.\n"
                   "[rank0]: /x/site-packages/lib.py:3: UserWarning: a warning's source echoed below it\n"
                   "[rank0]:   warnings.warn(\n"
                   "W1205 23:57:01.123000 4242 torch/distributed/run.py:803] a launcher warning\n"
                   f"[rank0]: {MARK}{Progress().why(10)}\n")
    state, reason, _ = launcher.exited(0, log, "torch")
    assert state == "error" and never_stepped(reason), reason
    assert reason.startswith('the script printed "Unable to locate sufficient 2 gpus. Exiting." and ended without '
                             "a measured window: it ran no backward pass"), reason
    hand = Progress()
    hand.backward = 3  # it trained without an optimizer: its last line is no reason, the count is
    log.write_text(f"epoch 1 done\n{MARK}{hand.why(10)}\n")
    assert launcher.exited(0, log, "torch")[1].startswith("the script ended without a measured window: it ran 3")
