"""The pictures of `features monitor --report` and of a notebook's `monitor_report(...)`: plain data in, inline SVG
and HTML out (docs/monitoring.md, "The report").

Per feature: its distribution over the days (the 5-95% and 25-75% quantile bands and the median, read from the
stored sketches; for strings and booleans the shares of its most frequent values), its null share and its drift
score (PSI and Jensen-Shannon distance against their thresholds); per group its health and its volume per day.
The reference's days are shaded. Nothing is fetched: the page holds its own style and one small script (a filter
by name and a "drifted only" switch), and every picture draws without that script (a notebook that runs no
script shows the same). Pure: no file, clock or store is read here (features.pipelines.monitor_report gathers the
data).
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import date, timedelta

WIDTH, HEIGHT = 380, 140  # three pictures of a feature side by side
LEFT, RIGHT, TOP, BOTTOM = 50, 8, 8, 22  # the margins around the plotting area: axis labels
PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f")
OTHER_COLOUR = "#bab0ac"
OTHER = "(others)"  # the series of a feature's values beyond the most frequent
QUANTILE_NAMES = ("p05", "p25", "median", "p75", "p95")
DRIFT_COLOUR = "#d62728"
Quantiles = tuple[float, float, float, float, float]  # p05, p25, p50, p75, p95
Tick = Callable[[float], str]  # a value axis's labels


@dataclass(frozen=True)
class DriftPoint:
    """A day's drift; psi and js are None when the day was not judged (too few rows, no reference)."""

    day: date
    psi: float | None
    js: float | None
    drifted: bool


@dataclass(frozen=True)
class FeatureSeries:
    """One feature's statistics per day, the days in order. `quantiles` are of its numbers: a numeric feature's
    values, a list's or map's sizes (None on a day without any). `shares`: for strings and booleans, each of the
    most frequent values' share of the day's non-null rows, the others last under OTHER."""

    name: str
    kind: str
    days: tuple[date, ...]
    null_share: tuple[float, ...]
    quantiles: tuple[Quantiles | None, ...] = ()
    shares: tuple[tuple[str, tuple[float, ...]], ...] = ()
    drift: tuple[DriftPoint, ...] = ()
    psi_threshold: float = 0.2
    js_threshold: float = 0.1

    @property
    def drifted_from(self) -> date | None:
        return next((d.day for d in self.drift if d.drifted), None)


@dataclass(frozen=True)
class HealthItem:
    label: str
    value: str
    alarm: bool = False  # shown as a problem: a stuck or stopped stream


@dataclass(frozen=True)
class GroupSeries:
    """A group's health, its counts per day (`volume`: name, one count per day or None where not recorded) and
    its features."""

    name: str
    days: tuple[date, ...]
    volume: tuple[tuple[str, tuple[int | None, ...]], ...]
    health: tuple[HealthItem, ...]
    features: tuple[FeatureSeries, ...]


@dataclass(frozen=True)
class ReportPage:
    """The whole report: `document()` is the self-contained HTML file, `_repr_html_` the same for a notebook."""

    title: str
    lines: tuple[str, ...]  # said under the title: the reference, the days judged, when it was made
    reference: tuple[date, date]  # [first, end) of the reference days, shaded in the pictures
    groups: tuple[GroupSeries, ...] = field(default_factory=tuple)

    def fragment(self) -> str:
        """The report as one <div>, its style and script inside (what a notebook displays)."""
        parts = [f'<div class="fx-report"><style>{STYLE}</style>', f"<h1>{_text(self.title)}</h1>"]
        parts += [f'<p class="fx-note">{_text(line)}</p>' for line in self.lines]
        parts.append(_summary(self.groups))
        parts.append(
            '<p class="fx-controls" hidden><label>feature <input class="fx-filter" type="search"></label> '
            '<label><input class="fx-only-drifted" type="checkbox"> drifted only</label></p>'
        )
        parts += [_group_html(g, self.reference) for g in self.groups]
        parts.append(f"<script>{SCRIPT}</script></div>")
        return "\n".join(parts)

    def document(self) -> str:
        return (
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{_text(self.title)}</title></head>\n<body>\n{self.fragment()}\n</body></html>\n"
        )

    def _repr_html_(self) -> str:
        return self.fragment()


STYLE = """
.fx-report{font:13px/1.4 system-ui,sans-serif;color:#222;max-width:1200px}
.fx-report h1{font-size:20px}.fx-report h2{font-size:17px;border-bottom:1px solid #ccc}
.fx-report h3{font-size:14px;margin:14px 0 2px}.fx-report .fx-note{margin:2px 0;color:#555}
.fx-report .fx-drifted h3{color:#d62728}.fx-report .fx-plots{display:flex;flex-wrap:wrap;gap:8px}
.fx-report figure{margin:0}.fx-report figcaption{color:#555;font-size:12px}
.fx-report table{border-collapse:collapse}.fx-report td,.fx-report th{padding:1px 10px 1px 0;text-align:left}
.fx-report .fx-alarm{color:#d62728;font-weight:600}
.fx-report svg text{font-size:10px;fill:#555}.fx-report svg .fx-axis{stroke:#999}
.fx-report svg .fx-grid{stroke:#eee}.fx-report svg .fx-reference{fill:#f1f1f1}
""".strip()

# Shows the filter once it can work; hides the features whose name does not hold its text, or that did not drift.
SCRIPT = """
for (const report of document.querySelectorAll('.fx-report')) {
  const controls = report.querySelector('.fx-controls');
  const filter = report.querySelector('.fx-filter'), only = report.querySelector('.fx-only-drifted');
  const apply = () => {
    const wanted = filter.value.trim().toLowerCase();
    for (const section of report.querySelectorAll('section.fx-feature')) {
      const named = section.dataset.feature.toLowerCase().includes(wanted);
      section.hidden = !named || (only.checked && section.dataset.drifted !== 'true');
    }
  };
  filter.addEventListener('input', apply);
  only.addEventListener('change', apply);
  controls.hidden = false;
}
""".strip()


def _summary(groups: Sequence[GroupSeries]) -> str:
    drifted = [(g.name, f) for g in groups for f in g.features if f.drifted_from is not None]
    if not drifted:
        return '<p class="fx-note">No feature drifted.</p>'
    rows = "".join(
        f'<tr><td>{_text(g)}</td><td><a href="#{_anchor(g, f.name)}">{_text(f.name)}</a></td>'
        f"<td>from {f.drifted_from}</td></tr>"
        for g, f in drifted
    )
    return f'<table class="fx-drift-summary"><tr><th>group</th><th>drifted</th><th></th></tr>{rows}</table>'


def _group_html(group: GroupSeries, reference: tuple[date, date]) -> str:
    health = "".join(
        f"<tr><th>{_text(h.label)}</th><td{' class=fx-alarm' if h.alarm else ''}>{_text(h.value)}</td></tr>"
        for h in group.health
    )
    names = [name for name, _ in group.volume]
    volume = _figure("per day", _lines_svg("volume", group.days, group.volume, reference, _count), _colours(names))
    features = "\n".join(_feature_html(group.name, f, reference) for f in group.features)
    return (
        f'<section class="fx-group" data-group="{_text(group.name)}"><h2>{_text(group.name)}</h2>'
        f'<table class="fx-health">{health}</table><div class="fx-plots">{volume}</div>\n{features}</section>'
    )


def _feature_html(group: str, f: FeatureSeries, reference: tuple[date, date]) -> str:
    if f.shares:
        names = [value for value, _ in f.shares]
        distribution = _figure("share of the non-null rows", _shares_svg(f, reference), _colours(names))
    else:
        what = "values" if f.kind == "numeric" else "sizes"
        distribution = _figure(f"{what}: 5-95% and 25-75% of the rows, median", _bands_svg(f, reference), [])
    empty = " or empty" if f.kind in ("list", "map") else ""
    nulls = _figure(
        f"null{empty} share", _lines_svg("nulls", f.days, (("nulls", f.null_share),), reference, _percent), []
    )
    legend = [("PSI", PALETTE[0]), ("JS distance", PALETTE[1]), ("drift", DRIFT_COLOUR)]
    thresholds = f"drift (dashed: the thresholds, PSI {f.psi_threshold:g} and JS {f.js_threshold:g})"
    drift = _figure(thresholds, _drift_svg(f), legend)
    since = f.drifted_from
    heading = _text(f.name) + (f" &mdash; drifted from {since}" if since else "")
    return (
        f'<section class="fx-feature{" fx-drifted" if since else ""}" id="{_anchor(group, f.name)}" '
        f'data-feature="{_text(f.name)}" data-kind="{_text(f.kind)}" data-drifted="{"true" if since else "false"}">'
        f'<h3>{heading}</h3><div class="fx-plots">{distribution}{nulls}{drift}</div></section>'
    )


def _figure(caption: str, svg: str, legend: Sequence[tuple[str, str]]) -> str:
    keys = "".join(f' <span style="color:{colour}">&#9632;</span> {_text(name)}' for name, colour in legend)
    return f"<figure>{svg}<figcaption>{_text(caption)}{keys}</figcaption></figure>"


def _colours(names: Sequence[str]) -> list[tuple[str, str]]:
    """Each series' colour: the palette's in turn, grey for the others of a feature's values."""
    return [(n, OTHER_COLOUR if n == OTHER else PALETTE[i % len(PALETTE)]) for i, n in enumerate(names)]


# ---------------------------------------------------------------------------------------------------------
# Charts: a slot per day from the first to the last (a missing day leaves its slot empty), a linear value axis


@dataclass(frozen=True)
class _Axes:
    first: date
    last: date
    low: float
    high: float

    def x(self, day: date) -> float:
        """The middle of the day's slot."""
        return LEFT + self.slot() * ((day - self.first).days + 0.5)

    def y(self, value: float) -> float:
        return TOP + (HEIGHT - TOP - BOTTOM) * (self.high - value) / (self.high - self.low)

    def slot(self) -> float:
        """The width of one day."""
        return (WIDTH - LEFT - RIGHT) / ((self.last - self.first).days + 1)


def _axes(days: Sequence[date], values: Sequence[float], floor: float | None = None) -> _Axes:
    """Axes over the days and the values, padded by 5% (below only when there is no `floor`)."""
    finite = [v for v in values if math.isfinite(v)]
    low = min(finite, default=0.0) if floor is None else floor
    high = max(finite, default=1.0)
    if high <= low:
        high = low + (abs(low) * 0.1 or 1.0)
    pad = (high - low) * 0.05
    return _Axes(min(days), max(days), low if floor is not None else low - pad, high + pad)


def _svg(kind: str, axes: _Axes | None, body: Sequence[str], reference: tuple[date, date] | None, tick: Tick) -> str:
    head = (
        f'<svg class="fx-plot" data-plot="{kind}" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
        f'height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}">'
    )
    if axes is None:
        return f'{head}<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle">no data</text></svg>'
    shaded = _reference(axes, reference) if reference is not None else ""
    return head + shaded + "".join(_grid(axes, tick)) + "".join(body) + "</svg>"


def _reference(axes: _Axes, reference: tuple[date, date]) -> str:
    """The reference's days shaded, where the axis shows them."""
    first, last = max(reference[0], axes.first), min(reference[1] - timedelta(days=1), axes.last)
    if last < first:
        return ""
    x0, x1 = axes.x(first) - axes.slot() / 2, axes.x(last) + axes.slot() / 2
    return (
        f'<rect class="fx-reference" x="{x0:.1f}" y="{TOP}" width="{x1 - x0:.1f}" height="{HEIGHT - TOP - BOTTOM}">'
        "<title>the reference's days</title></rect>"
    )


def _grid(axes: _Axes, tick: Tick) -> list[str]:
    out = []
    for value in _ticks(axes.low, axes.high):
        y = axes.y(value)
        out.append(f'<line class="fx-grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>')
        out.append(f'<text x="{LEFT - 4}" y="{y + 3:.1f}" text-anchor="end">{_text(tick(value))}</text>')
    bottom = HEIGHT - BOTTOM
    out.append(f'<line class="fx-axis" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{bottom}" y2="{bottom}"/>')
    for day in _day_ticks(axes.first, axes.last):
        out.append(f'<text x="{axes.x(day):.1f}" y="{HEIGHT - 8}" text-anchor="middle">{day:%m-%d}</text>')
    return out


def _ticks(low: float, high: float, most: int = 4) -> list[float]:
    """Round values from low to high, at most `most` + 1 of them (steps of 1, 2 or 5 times a power of ten)."""
    raw = (high - low) / most
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.ceil(low / step) * step
    return [first + i * step for i in range(most + 1) if first + i * step <= high]


def _day_ticks(first: date, last: date, most: int = 7) -> list[date]:
    span = (last - first).days
    step = max(1, math.ceil(span / (most - 1)))
    return [first + timedelta(days=i) for i in range(0, span + 1, step)]


def _runs(days: Sequence[date], present: Sequence[bool]) -> list[list[int]]:
    """The indexes of consecutive days (none missing between them) that have a value."""
    runs: list[list[int]] = []
    for i, here in enumerate(present):
        if here and runs and runs[-1][-1] == i - 1 and (days[i] - days[i - 1]).days == 1:
            runs[-1].append(i)
        elif here:
            runs.append([i])
    return runs


def _bands_svg(f: FeatureSeries, reference: tuple[date, date]) -> str:
    known = {i: q for i, q in enumerate(f.quantiles) if q is not None}
    if not known:
        return _svg("distribution", None, [], None, _number)
    axes = _axes(f.days, [v for q in known.values() for v in (q[0], q[4])])

    def at(i: int, k: int) -> tuple[float, float]:
        return axes.x(f.days[i]), axes.y(known[i][k])

    body = []
    for run in _runs(f.days, [i in known for i in range(len(f.days))]):
        for lo, hi, colour in ((0, 4, "#c6dbef"), (1, 3, "#6baed6")):
            outline = [at(i, hi) for i in run] + [at(i, lo) for i in reversed(run)]
            body.append(f'<polygon class="fx-mark" fill="{colour}" points="{_points(outline)}"/>')
        body.append(_polyline([at(i, 2) for i in run], "#08519c"))
    for i, q in known.items():
        quantiles = ", ".join(f"{name} {_number(v)}" for name, v in zip(QUANTILE_NAMES, q, strict=True))
        body.append(_dot(*at(i, 2), "#08519c", f"{f.days[i]}: {quantiles}"))
    return _svg("distribution", axes, body, reference, _number)


def _shares_svg(f: FeatureSeries, reference: tuple[date, date]) -> str:
    axes = _axes(f.days, [1.0], floor=0.0)
    width = axes.slot() * 0.8
    colours = dict(_colours([value for value, _ in f.shares]))
    body = []
    for i, day in enumerate(f.days):
        below = 0.0
        for value, shares in f.shares:
            if shares[i] <= 0:
                continue
            top, bottom = axes.y(below + shares[i]), axes.y(below)
            body.append(
                f'<rect class="fx-mark" fill="{colours[value]}" x="{axes.x(day) - width / 2:.1f}" y="{top:.1f}" '
                f'width="{width:.1f}" height="{bottom - top:.1f}"><title>{_text(f"{day}: {value} {shares[i]:.1%}")}'
                "</title></rect>"
            )
            below += shares[i]
    return _svg("distribution", axes, body, reference, _percent)


def _lines_svg(
    kind: str,
    days: Sequence[date],
    series: Sequence[tuple[str, Sequence[float | int | None]]],
    reference: tuple[date, date] | None,
    tick: Tick,
) -> str:
    values = [float(v) for _, vs in series for v in vs if v is not None]
    if not days or not values:
        return _svg(kind, None, [], None, tick)
    axes = _axes(days, values, floor=0.0)
    body = []
    for (name, vs), (_, colour) in zip(series, _colours([name for name, _ in series]), strict=True):
        known = {i: float(v) for i, v in enumerate(vs) if v is not None}
        for run in _runs(days, [i in known for i in range(len(days))]):
            body.append(_polyline([(axes.x(days[i]), axes.y(known[i])) for i in run], colour))
        body += [_dot(axes.x(days[i]), axes.y(v), colour, f"{days[i]}: {name} {tick(v)}") for i, v in known.items()]
    return _svg(kind, axes, body, reference, tick)


def _drift_svg(f: FeatureSeries) -> str:
    judged = [(d, d.psi, d.js) for d in f.drift if d.psi is not None and d.js is not None]
    if not judged:
        return _svg("drift", None, [], None, _number)
    values = [v for _, psi, js in judged for v in (psi, js)] + [f.psi_threshold, f.js_threshold]
    axes = _axes([*f.days, *(d.day for d, _, _ in judged)], values, floor=0.0)
    days = [d.day for d, _, _ in judged]
    body = []
    for k, (name, threshold) in enumerate((("PSI", f.psi_threshold), ("JS", f.js_threshold))):
        colour, y = PALETTE[k], axes.y(threshold)
        body.append(
            f'<line stroke="{colour}" stroke-dasharray="4 3" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" '
            f'y2="{y:.1f}"><title>{name} threshold {threshold:g}</title></line>'
        )
        points = [(axes.x(d.day), axes.y(m[k])) for d, *m in judged]
        body += [_polyline([points[i] for i in run], colour) for run in _runs(days, [True] * len(days))]
        for (d, *m), (x, y) in zip(judged, points, strict=True):
            tip = f"{d.day}: {name} {m[k]:.3f}" + (", drifted" if d.drifted else "")
            body.append(_dot(x, y, DRIFT_COLOUR if d.drifted else colour, tip))
    return _svg("drift", axes, body, None, _number)


def _polyline(xy: Sequence[tuple[float, float]], colour: str) -> str:
    return f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{_points(xy)}"/>'


def _dot(x: float, y: float, colour: str, tip: str) -> str:
    return (
        f'<circle class="fx-mark" cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{colour}"><title>{_text(tip)}</title>'
        "</circle>"
    )


def _points(xy: Sequence[tuple[float, float]]) -> str:
    return " ".join(f"{x:.1f},{y:.1f}" for x, y in xy)


def _number(value: float) -> str:
    return f"{value:.4g}" if value == 0 or 0.01 <= abs(value) < 1e6 else f"{value:.2e}"


def _count(value: float) -> str:
    return f"{value:,.0f}"


def _percent(value: float) -> str:
    return f"{value:.0%}" if value == 0 or value >= 0.1 else f"{value:.1%}"


def _text(value: object) -> str:
    return html.escape(str(value), quote=True)


def _anchor(group: str, feature: str) -> str:
    return _text(f"fx-{group}-{feature}".replace(" ", "_"))
