"""The timing figure's fits: the recompute loop's quadratic goes through the origin and no line dips below zero."""
from __future__ import annotations

import numpy as np

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
