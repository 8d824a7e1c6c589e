"""Load forecasts for the controller: one rate series per workflow, forecast `horizon_s` ahead.

Predictors (`ControlSettings.predictor`):

    constant  the last observation (what a reactive autoscaler assumes)
    ewma      an exponentially weighted moving average, weight `alpha` on the newest sample
              (statsmodels' SimpleExpSmoothing recursion with a fixed smoothing level)
    kalman    a local linear trend (level, slope per second) tracked by filterpy's KalmanFilter;
              the forecast is level + slope * horizon, the trend term bounded to `trend_cap` (25%)
              of the level (a step in the rate is not a trend to extrapolate), never below 0.
              Measurement noise: a Poisson count's rate / period plus (burst_cv * rate)^2 for
              burstiness (requests/s squared), or the caller's `noise_var` where larger (a
              caller that knows its series to be noisier damps each sample's pull on the level);
              process noise white on the slope.

A forecaster's state is a frozen value (ForecastState), so that the decision function stays pure:
`update(state, value, dt_s)` returns the next state and `predict(state, horizon_s)` reads it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from filterpy.common import Q_discrete_white_noise  # the `control` extra, imported with the module so
from filterpy.kalman import KalmanFilter  # that a missing extra is named before any work starts

PREDICTORS = ("constant", "ewma", "kalman")


@dataclass(frozen=True)
class ForecastState:
    """What a predictor keeps between periods: its estimate (level, slope) and, for the Kalman
    filter, the covariance (row-major 2x2); `samples` counts the updates."""

    level: float
    slope: float = 0.0
    covariance: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
    samples: int = 0


@dataclass(frozen=True)
class Forecaster:
    """One predictor with its parameters (module docstring)."""

    name: str = "ewma"
    alpha: float = 0.7  # ewma: weight of the newest sample
    slope_noise: float = 1e-6  # kalman: process noise of the slope, (requests/s per s)^2 per s
    burst_cv: float = 0.1  # kalman: measurement noise beyond Poisson, as a fraction of the rate
    trend_cap: float = 0.25  # kalman: the trend moves a forecast at most this fraction of the level

    def __post_init__(self) -> None:
        if self.name not in PREDICTORS:
            raise ValueError(f"unknown predictor {self.name!r}; use one of {', '.join(PREDICTORS)}")

    def update(self, state: ForecastState | None, value: float, dt_s: float, noise_var: float = 0.0) -> ForecastState:
        """The state after observing `value` (requests/s over the last `dt_s` seconds); `noise_var`:
        the measurement noise where the series is known to vary more than Poisson (kalman)."""
        value = max(float(value), 0.0)
        if state is None:
            noise = max(value, 1e-3) / max(dt_s, 1e-9)
            return ForecastState(value, 0.0, (noise + (self.burst_cv * value) ** 2, 0.0, 0.0, 1e-6), 1)
        if self.name == "constant":
            return ForecastState(value, 0.0, state.covariance, state.samples + 1)
        if self.name == "ewma":
            level = self.alpha * value + (1 - self.alpha) * state.level
            return ForecastState(level, 0.0, state.covariance, state.samples + 1)
        return self._kalman(state, value, dt_s, noise_var)

    def _kalman(self, state: ForecastState, value: float, dt_s: float, noise_var: float) -> ForecastState:
        kf = KalmanFilter(dim_x=2, dim_z=1)
        kf.x = np.array([[state.level], [state.slope]])
        kf.P = np.array(state.covariance, dtype=float).reshape(2, 2)
        kf.F = np.array([[1.0, dt_s], [0.0, 1.0]])
        kf.H = np.array([[1.0, 0.0]])
        kf.Q = np.asarray(Q_discrete_white_noise(dim=2, dt=dt_s, var=self.slope_noise), dtype=np.float64).reshape(2, 2)
        rate = max(value, state.level, 1e-3)
        kf.R = np.array([[max(rate / max(dt_s, 1e-9) + (self.burst_cv * rate) ** 2, noise_var)]])
        kf.predict()
        kf.update(np.array([[value]]))
        level, slope = float(kf.x[0, 0]), float(kf.x[1, 0])
        p = tuple(float(v) for v in np.asarray(kf.P).reshape(4))
        return ForecastState(level, slope, (p[0], p[1], p[2], p[3]), state.samples + 1)

    def predict(self, state: ForecastState | None, horizon_s: float) -> float:
        """The rate expected `horizon_s` ahead (requests/s, >= 0); nan without any sample."""
        if state is None:
            return math.nan
        if self.name == "kalman":
            trend = state.slope * horizon_s
            bound = self.trend_cap * max(state.level, 0.0)
            return max(state.level + min(max(trend, -bound), bound), 0.0)
        return max(state.level, 0.0)
