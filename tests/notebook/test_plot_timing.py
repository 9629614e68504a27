"""The timing figure's fits: the recompute loop's quadratic goes through the origin and no line dips below zero."""
from __future__ import annotations

import numpy as np
import pytest

from kvlib.notebook import plots


def test_the_quadratic_fit_starts_at_zero_and_no_fit_is_negative():
    ns = [16, 32, 64, 120]
    # Noisy times for which a free quadratic (and the cached loop's straight line) would start below zero.
    series = {"recompute": [60.0, 40.0, 320.0, 800.0], "cached": [5.0, 40.0, 90.0, 200.0]}
    free = np.polyval(np.polyfit(ns, series["recompute"], 2), 0.0)
    assert free < 0 or np.polyval(np.polyfit(ns, series["cached"], 1), 0.0) < 0  # the case being guarded
    fig = plots.plot_timing(ns, series)
    fits = [line for line in fig.axes[0].lines if line.get_linestyle() == "-"]
    assert len(fits) == 2
    for line in fits:
        assert np.asarray(line.get_ydata()).min() >= 0
    quadratic = np.asarray(fits[0].get_ydata())
    assert quadratic[0] == 0.0 and np.asarray(fits[0].get_xdata())[0] == 0.0


def test_measured_speed_ups_are_drawn_as_given_with_a_bar_from_low_to_high():
    ns = [16, 32, 64]
    series = {"recompute": [30.0, 70.0, 200.0], "cached": [10.0, 20.0, 40.0]}  # ratios of medians: 3, 3.5, 5
    speedups = {"cached": [(2.9, 2.5, 3.2), (3.2, 3.0, 4.0), (4.0, 4.0, 6.0)]}  # the rounds' ratios: median, low, high
    fig = plots.plot_timing(ns, series, speedups=speedups)
    points = [line for line in fig.axes[1].lines if line.get_marker() == "o"]
    assert len(points) == 1 and list(points[0].get_ydata()) == [2.9, 3.2, 4.0]  # what the notebook prints, not 3, 3.5, 5
    bars = [c for c in fig.axes[1].containers if c.has_yerr]
    assert len(bars) == 1
    segments = bars[0].lines[2][0].get_segments()                 # one vertical segment per n
    assert [(round(a[1], 6), round(b[1], 6)) for a, b in segments] == [(2.5, 3.2), (3.0, 4.0), (4.0, 6.0)]
    plain = plots.plot_timing(ns, series).axes[1]
    assert not any(c.has_yerr for c in plain.containers)
    assert list(plain.lines[0].get_ydata()) == [3.0, 3.5, 5.0]


@pytest.mark.parametrize("speedups, words", [
    ({"cached": [(3, 2.5, 3.2), (3, 3.0, 4.0)]}, "per\\s+entry of ns"),                  # one triple short
    ({"cached": [(3, 2.5), (3, 4), (4, 6)]}, "per\\s+entry of ns"),                       # pairs, not triples
    ({"cached": [(3, 3.2, 2.5), (3, 3.0, 4.0), (5, 4.0, 6.0)]}, "low <= median <= high"),  # low above high
    ({"cached": [(2, 2.5, 3.2), (3, 3.0, 4.0), (5, 4.0, 6.0)]}, "low <= median <= high"),  # median outside
    ({"recompute": [(1, 1, 1)] * 3}, "other than the baseline"),  # the baseline has no speed-up
    ({"other": [(1, 1, 2)] * 3}, "other than the baseline"),      # not a series
])
def test_speed_ups_that_do_not_fit_the_series_are_refused_with_what_is_allowed(speedups, words):
    series = {"recompute": [30.0, 70.0, 200.0], "cached": [10.0, 20.0, 40.0]}
    with pytest.raises(ValueError, match=words):
        plots.plot_timing([16, 32, 64], series, speedups=speedups)
