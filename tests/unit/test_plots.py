"""The inline-SVG plots: well-formed XML, the expected number of points and bars, labels
escaped, and never a NaN whatever the input."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

import pytest

from softprobe.gym.evals.plots import histogram, line_chart, sparkline

SVG = "{http://www.w3.org/2000/svg}"


def parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg.replace("<svg ", '<svg xmlns="http://www.w3.org/2000/svg" ', 1))
    assert root.tag == f"{SVG}svg" and "plot" in root.get("class", "").split()
    assert float(root.get("width")) > 0 and float(root.get("height")) > 0
    for element in root.iter():
        for value in element.attrib.values():
            assert "nan" not in value.lower() and "inf" not in value.lower(), (element.tag, value)
    return root


def points(polyline: ET.Element) -> list[tuple[float, float]]:
    pairs = [tuple(map(float, p.split(","))) for p in polyline.get("points").split()]
    assert all(math.isfinite(x) and math.isfinite(y) for x, y in pairs)
    return pairs


def test_sparkline_one_point_per_step_per_series():
    root = parse(sparkline([[0, 1, 2, 1], [0, 0.5]], names=["A", "B"]))
    lines = root.findall(f"{SVG}polyline")
    assert [len(points(line)) for line in lines] == [4, 2]
    assert len(root.findall(f"{SVG}circle")) == 6
    xs = [x for x, _ in points(lines[0])]
    assert xs == sorted(xs) and len(set(xs)) == 4  # steps left to right
    ys = [y for _, y in points(lines[0])]
    assert ys[2] < ys[1] < ys[0]  # a higher reward is drawn higher
    assert root.get("data-plot") == "sparkline"


def test_sparkline_edge_cases_stay_finite():
    assert len(parse(sparkline([[]])).findall(f"{SVG}polyline")) == 0
    assert len(points(parse(sparkline([[3.0]])).find(f"{SVG}polyline"))) == 1
    root = parse(sparkline([[float("nan"), None, float("inf"), -2.0]]))
    assert len(points(root.find(f"{SVG}polyline"))) == 4


@pytest.mark.parametrize("series, bins", [([("A", [0.0, 0.5, 1.0, 1.0])], 10),
                                          ([("A", [0.0, 1.0]), ("B", [0.2, None, 0.9])], 5),
                                          ([("A", [])], 4)])
def test_histogram_has_one_bar_per_bin_per_series(series, bins):
    root = parse(histogram(series, bins=bins))
    bars = [r for r in root.findall(f"{SVG}rect") if r.get("class") == "bar"]
    assert len(bars) == bins * len(series)
    counts = [int(bar.find(f"{SVG}title").text.split(": ")[1].split(" ")[0]) for bar in bars]
    assert sum(counts) == sum(v is not None for _, values in series for v in values)
    assert root.get("data-plot") == "histogram"


def test_histogram_counts_land_in_their_bins_and_heights_follow():
    root = parse(histogram([("A", [0.0, 0.05, 0.5, 1.0, 1.0, 1.0])], bins=10))
    bars = [r for r in root.findall(f"{SVG}rect") if r.get("class") == "bar"]
    heights = [float(b.get("height")) for b in bars]
    assert [h > 0 for h in heights] == [True, False, False, False, False, True, False, False, False, True]
    assert heights[9] == max(heights) and heights[0] == pytest.approx(heights[9] * 2 / 3, abs=0.1)


def test_values_outside_the_range_widen_it_and_labels_are_escaped():
    root = parse(histogram([("<b>A</b>", [-1.0, 2.0, float("nan")])], bins=3))
    bars = [r for r in root.findall(f"{SVG}rect") if r.get("class") == "bar"]
    assert [float(b.get("height")) > 0 for b in bars] == [True, False, True]  # NaN left out
    assert any(t.text == "<b>A</b> (2)" for t in root.iter(f"{SVG}text"))  # escaped in the SVG, text when parsed
    with pytest.raises(ValueError):
        histogram([("A", [0.5])], bins=0)


def test_line_chart_draws_each_component():
    svg = line_chart([1, 2, 3], [("no_error", [1, 1, 1]), ("note", [0, 1, None])])
    root = parse(svg[: svg.index("</svg>") + 6])
    assert [len(points(p)) for p in root.findall(f"{SVG}polyline")] == [3, 3]
    assert 'class="legend"' in svg and "no_error" in svg
