"""``--max-seconds`` budgets as monotonic deadlines."""

import math

import pytest

from entmtp.core import EntmtpError, deadline_after


def test_a_budget_ends_that_many_seconds_after_the_start():
    assert deadline_after(2.5, started=100.0) == 102.5
    assert deadline_after(None, started=100.0) is None


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan])
def test_a_budget_that_is_not_a_positive_finite_number_is_one_line(bad):
    with pytest.raises(EntmtpError, match=r"^--max-seconds .*: give a positive number of seconds$"):
        deadline_after(bad)
