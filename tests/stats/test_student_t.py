"""Student's t quantiles, exact at any level (they replace two printed tables)."""

from __future__ import annotations

import pytest

from tuner.stats.student_t import central, one_sided, t_quantile

PRINTED_95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)
PRINTED_99 = (63.657, 9.925, 5.841, 4.604, 4.032, 3.707, 3.499, 3.355, 3.250, 3.169)


def test_the_quantiles_match_the_printed_tables_to_their_three_decimals():
    assert [round(t_quantile(d, 0.95), 3) for d in range(1, 11)] == list(PRINTED_95)
    assert [round(t_quantile(d, 0.99), 3) for d in range(1, 11)] == list(PRINTED_99)
    assert t_quantile(30, 0.99) == pytest.approx(2.750, abs=5e-4)
    assert t_quantile(10_000, 0.99) == pytest.approx(2.5763, abs=1e-4)  # towards the normal's 2.5758


def test_any_level_and_the_one_sided_bound():
    assert one_sided(1, 0.995) == pytest.approx(t_quantile(1, 0.99))
    assert one_sided(5, 0.9) == pytest.approx(1.476, abs=1e-3)  # a textbook one-sided 90%
    for dof in (1, 2, 7, 40, 299, 301):
        assert central(t_quantile(dof, 0.8), dof) == pytest.approx(0.8, abs=1e-6)


@pytest.mark.parametrize("dof,level", [(0, 0.99), (3, 1.0), (3, 0.0)])
def test_outside_its_domain_it_says_so(dof, level):
    with pytest.raises(ValueError):
        t_quantile(dof, level)
