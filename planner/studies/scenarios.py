"""The axes of a capacity study and the scenarios they span (docs/capacity.md).

A scenario is one question: the workflows' arrival rates, the cluster (size in GPUs, made of whole
copies of the instance's node kinds, optionally only some GPU types: a *mix*), the prices per GPU
hour and, in a forecast, the month. Axes:

* `--rates a:b:s` total rate (the workflows keep their mix), or `--rate WORKFLOW=a:b:s` per
  workflow (repeatable; a workflow not named keeps its rate): their product is the rate axis.
* `--clusters 8,16` GPU counts;  `--mix H100 --mix H100+A6000` GPU-type mixes (node kinds of the
  instance whose GPU type is in the mix, taken in turn).
* `--price H100=2,3.5` prices per GPU hour (product over GPU types; default: the instance's).
* `--growth-per-month 0.05 --months 24`: the forecast, rate x (1 + growth)^month for months
  0..24 from the instance's rates (or the single `--rate` values given), in place of a rate axis.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

from scepsy.models.errors import InputError
from scepsy.models.instance.instance import MAX_CLUSTER_GPUS, MAX_RATE, Instance

Rates = tuple[tuple[str, float], ...]  # (workflow, arrival rate in req/s), in instance order
Prices = tuple[tuple[str, float], ...]  # (gpu type, price per GPU hour)

MAX_GRID_POINTS = 10_000  # values on one axis: beyond it a typo (a step of 1e-9) would run for ever
MAX_SCENARIOS = 1_000_000  # scenarios of one study, counted before any is built


def parse_values(text: str, field: str, positive: bool = True, upper: float = MAX_RATE) -> list[float]:
    """`a:b:s` (inclusive) or `a,b,c`; every value finite, > 0 (>= 0 if not `positive`) and <= `upper`;
    at most MAX_GRID_POINTS of them."""
    try:
        if ":" in text:
            start, stop, step = (float(v) for v in text.split(":"))
            if not (step > 0 and math.isfinite(start) and math.isfinite(stop) and math.isfinite(step)):
                raise ValueError
            count = int(math.floor((stop - start) / step + 1e-9)) + 1
            if count > MAX_GRID_POINTS:
                raise InputError(None, field, f"{text!r} is {count:,} values, more than {MAX_GRID_POINTS:,}",
                                 "use a larger step or a shorter range")
            values = [round(start + k * step, 9) for k in range(count)]
        else:
            values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise InputError(None, field, f"cannot read {text!r}", "write start:stop:step (e.g. 1:20:1) or a list 1,2,5") from None
    if len(values) > MAX_GRID_POINTS:
        raise InputError(None, field, f"{len(values):,} values, more than {MAX_GRID_POINTS:,}", "list fewer values")
    if not values or not all(math.isfinite(v) and 0 <= v <= upper for v in values) or (positive and min(values) == 0):
        raise InputError(None, field, f"{text!r} has a value out of range",
                         f"use finite values {'above' if positive else 'from'} 0 up to {upper:g}")
    return values


def parse_named(values: list[str], field: str, names: list[str], positive: bool = True) -> dict[str, list[float]]:
    """NAME=SPEC items with NAME among `names`."""
    out: dict[str, list[float]] = {}
    for item in values:
        name, sep, spec = item.partition("=")
        if not sep or name not in names:
            raise InputError(None, field, f"{item!r} is not NAME=VALUES with NAME one of {', '.join(names)}",
                             f"write e.g. {names[0]}=2:40:2")
        if name in out:
            raise InputError(None, field, f"{name!r} given twice", "name each one once")
        out[name] = parse_values(spec, field, positive)
    return out


def parse_clusters(text: str) -> list[int]:
    try:
        sizes = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise InputError(None, "clusters", f"cannot read {text!r}", "list GPU counts, e.g. 4,8,16") from None
    if not sizes or sizes[0] <= 0 or sizes[-1] > MAX_CLUSTER_GPUS or len(sizes) > MAX_GRID_POINTS:
        raise InputError(None, "clusters", f"cluster sizes must be in 1..{MAX_CLUSTER_GPUS:,} GPUs, at most {MAX_GRID_POINTS:,} of them",
                         "list GPU counts, e.g. 4,8,16")
    return sizes


@dataclass(frozen=True)
class Scenario:
    rates: Rates
    cluster_gpus: int
    mix: str = ""  # "" = every node kind of the instance; else GPU types joined by "+"
    prices: Prices = ()  # overrides of cost_per_hour
    month: int | None = None

    @property
    def total_rate_rps(self) -> float:
        return sum(r for _, r in self.rates)

    def instance(self, base: Instance) -> Instance:
        return with_prices(resized(base, self.cluster_gpus, self.mix), self.prices).with_arrival_rates(dict(self.rates))


def resized(instance: Instance, gpus: int, mix: str = "") -> Instance:
    """The cluster of `gpus` GPUs from the node kinds whose GPU type is in `mix` (all if empty)."""
    if mix:
        types = mix.split("+")
        nodes = tuple(n for n in instance.cluster.nodes if n.gpu_type in types)
        instance = replace(instance, cluster=replace(instance.cluster, nodes=nodes))
    return instance.with_cluster_size(gpus)


def with_prices(instance: Instance, prices: Prices) -> Instance:
    if not prices:
        return instance
    types = dict(instance.cluster.gpu_types)
    for name, price in prices:
        types[name] = types[name].model_copy(update={"cost_per_hour": price})
    return replace(instance, cluster=replace(instance.cluster, gpu_types=types))


@dataclass(frozen=True)
class Axes:
    """Everything the command line chose; `scenarios` spans them."""

    total_rates: list[float] | None = None
    workflow_rates: dict[str, list[float]] | None = None
    clusters: list[int] | None = None  # None: the instance's own size
    mixes: list[str] | None = None
    prices: dict[str, list[float]] | None = None
    growth_per_month: float | None = None
    months: int | None = None


def check_axes(base: Instance, axes: Axes) -> None:
    """Each mistake as one line naming the argument and the fix."""
    if axes.total_rates and axes.workflow_rates:
        raise InputError(None, "rates", "both `rates` and `rate` given", "use `rates` for the total or `rate` per workflow")
    forecast = axes.growth_per_month is not None or axes.months is not None
    if forecast:
        if axes.growth_per_month is None or axes.months is None:
            raise InputError(None, "months", "a forecast needs both `growth_per_month` and `months`",
                             "give both, e.g. `growth_per_month` 0.05 and `months` 24")
        if axes.total_rates or any(len(v) > 1 for v in (axes.workflow_rates or {}).values()):
            raise InputError(None, "months", "a forecast grows the rates itself", "drop `rates`, or give single `rate` values as the base")
    types = {n.gpu_type for n in base.cluster.nodes}
    for mix in axes.mixes or []:
        unknown = [t for t in mix.split("+") if t not in types]
        if unknown or not mix:
            raise InputError(base.source, "mix", f"{mix!r} names GPU types without nodes: {', '.join(unknown) or '(none)'}",
                             f"use GPU types of the instance's nodes: {', '.join(sorted(types))}", argument=True)
    for name in axes.prices or {}:
        if name not in base.cluster.gpu_types:
            raise InputError(base.source, "price", f"unknown GPU type {name!r}", f"use one of {', '.join(sorted(base.cluster.gpu_types))}",
                             argument=True)


def rate_vectors(base: Instance, axes: Axes) -> list[tuple[Rates, int | None]]:
    """Each point of the rate axis with its month (None outside a forecast)."""
    names = [w.name for w in base.workflows]
    own = {w.name: w.arrival_rate for w in base.workflows}
    if axes.growth_per_month is not None and axes.months is not None:
        start = {**own, **{w: v[0] for w, v in (axes.workflow_rates or {}).items()}}
        return [
            (tuple((w, round(start[w] * (1 + axes.growth_per_month) ** m, 9)) for w in names), m)
            for m in range(axes.months + 1)
        ]
    if axes.total_rates:
        total = sum(own.values())
        return [(tuple((w, round(own[w] * t / total, 9)) for w in names), None) for t in axes.total_rates]
    per = [(axes.workflow_rates or {}).get(w, [own[w]]) for w in names]
    return [(tuple(zip(names, combo)), None) for combo in itertools.product(*per)]


def rate_count(base: Instance, axes: Axes) -> int:
    """How many points `rate_vectors` gives, without building them."""
    if axes.growth_per_month is not None and axes.months is not None:
        return axes.months + 1
    if axes.total_rates:
        return len(axes.total_rates)
    return math.prod(len((axes.workflow_rates or {}).get(w.name, [w.arrival_rate])) for w in base.workflows)


def scenarios(base: Instance, axes: Axes) -> list[Scenario]:
    """Every scenario, in a fixed order: mix, cluster, prices, then rates (neighbours adjacent)."""
    check_axes(base, axes)
    sizes = axes.clusters or [sum(n.gpus for n in base.cluster.nodes)]
    mixes = axes.mixes or [""]
    price_axis = axes.prices or {}
    count = len(mixes) * len(sizes) * math.prod(len(v) for v in price_axis.values()) * rate_count(base, axes)
    if count > MAX_SCENARIOS:
        raise InputError(base.source, "axes", f"{count:,} scenarios, more than {MAX_SCENARIOS:,}",
                         "use fewer values on the rate, cluster, mix or price axes")
    price_points = [tuple(zip(price_axis, combo)) for combo in itertools.product(*price_axis.values())] or [()]
    out = []
    for mix in mixes:
        for size in sizes:
            resized(base, size, mix)  # fail fast on sizes that are not whole nodes
            for prices in price_points:
                out += [Scenario(rates, size, mix, prices, month) for rates, month in rate_vectors(base, axes)]
    return out
