"""What the console prints is the text it was given: rich reads ``[...]`` as markup, and the
advice "add space: {compile: [false, true]}" reached a user as "add space: {compile: , }"."""

from __future__ import annotations

import io
from types import SimpleNamespace

from rich.console import Console

from tuner.analysis.diagnose import Verdict
from tuner.analysis.remedies import Step
from tuner.outputs.console import print_diagnosis
from tuner.outputs.live import Live

ADVICE = "to search the ones outside this recipe's space, add space: {compile: [false, true], num_workers: [0, 2]}"


def test_notes_and_advice_keep_their_brackets(tmp_path, capsys):
    live = Live(SimpleNamespace(name="brackets", out=tmp_path), quiet=False)
    live.note(f"the trial asked for [bold]{ADVICE}")
    live.log.removeHandler(live._handler)
    live._handler.close()
    assert f"note: the trial asked for [bold]{ADVICE}" in capsys.readouterr().err
    out = io.StringIO()
    recorded = Verdict("compute-bound", 0.5, "recorded", {"evidence": "a [red]step[/]", "next_step": ADVICE})
    space = Step("add_space", figures={"space": {"compile": [False, True], "num_workers": [0, 2]}})
    found = Verdict("compute-bound", 0.5, "compute-bound", {"rate": 49.0, "wait": 0.0, "ceiling": None, "mfu": None,
                                                            "tflops": None}, (space,))
    print_diagnosis(Console(file=out, width=400), [recorded, found])
    assert "a [red]step[/]" in out.getvalue() and f"next: {ADVICE}" in out.getvalue()
    assert f"what makes the step itself faster: {ADVICE}" in out.getvalue()


def test_a_console_that_is_no_terminal_gets_no_progress_bar_and_no_empty_line(tmp_path, capsys):
    """The progress bar is a terminal's: redirected to a file, its stop printed an empty line
    in the middle of the search's lines (the quickstart's, under the finish's notes)."""
    live = Live(SimpleNamespace(name="log", out=tmp_path, budget=SimpleNamespace(trials=4, minutes=None),
                                storage="sqlite:///x.db"), quiet=False)
    live.start(0, 0)
    live.note("finishing")
    live.stop()
    live.log.removeHandler(live._handler)
    live._handler.close()
    err = capsys.readouterr().err
    assert "note: finishing" in err and "" not in err.splitlines() and "trials" not in err.splitlines()[-1]


def test_a_run_noisier_than_the_table_says_so_on_the_console(tmp_path):
    """A timm run beside a busy machine measured 69.4% noise a run: report.md said so, the
    console did not. Above the table's noisiest row the console's summary warns, below it
    (or with no noise measured) it says nothing."""
    from tuner.inputs.recipe import load_recipe
    from tuner.tuning.search_result import SearchResult

    from conftest import toy_recipe

    recipe = load_recipe(toy_recipe(tmp_path))
    recipe.out.mkdir(parents=True, exist_ok=True)
    params = {"num_workers": 0, "micro_batch_size": 16}
    for sigma, warned in ((0.694, True), (0.10, False), (None, False)):
        data = {"params": params, "metrics": {"samples_per_s": 100.0}, "speedup": 1.0, "trials": 2,
                "baseline": {"params": params, "metrics": {"samples_per_s": 100.0}}, "stopped": "minutes",
                "noise": {"ss": sigma ** 2 * 7, "dof": 7} if sigma else None}
        live = Live(recipe, quiet=True)
        live.summary(SearchResult.from_json(data, recipe.out))
        log = (recipe.out / "search.log").read_text()
        assert ("warning: this run's noise (69% a run) is above the table's 22%: keeps and drops are near coin "
                "flips" in log) == warned, log
        (recipe.out / "search.log").unlink()


def test_an_answer_that_is_the_baseline_is_not_diagnosed_twice(tmp_path):
    """A BERT Trainer search kept its baseline and printed the same verdict and advice twice,
    once as ``baseline:`` and again as ``best:``. The closing line names the bottleneck once,
    with an arrow to the answer's only where the answer differs; ``--explain`` diagnoses each
    end once."""
    from tuner.inputs.recipe import load_recipe
    from tuner.tuning.search_result import SearchResult

    from conftest import toy_recipe

    recipe = load_recipe(toy_recipe(tmp_path))
    recipe.out.mkdir(parents=True, exist_ok=True)
    verdict = {"kind": "compute-bound", "weight": 0.9, "evidence": "49 samples/s with 0% data wait",
               "next_step": "compile: true"}
    base = {"num_workers": 0, "micro_batch_size": 16}
    for best, twice in ((base, False), ({**base, "num_workers": 2}, True)):
        data = {"params": best, "metrics": {"samples_per_s": 100.0}, "speedup": 1.0, "trials": 2,
                "baseline": {"params": base, "metrics": {"samples_per_s": 100.0}}, "stopped": "trials",
                "diagnosis": {"baseline": [verdict], "best": [verdict]}}
        Live(recipe, quiet=True).summary(SearchResult.from_json(data, recipe.out))
        log = (recipe.out / "search.log").read_text()
        assert log.count("compute-bound: 49 samples/s") == (2 if twice else 1), log  # --explain's lines
        bottleneck = next(line for line in log.splitlines() if "bottleneck:" in line)  # the closing line
        assert bottleneck.endswith("bottleneck: compute-bound (90% of the step)" + (
            " -> compute-bound (90% of the step)" if twice else "")), log
        (recipe.out / "search.log").unlink()
