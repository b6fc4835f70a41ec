// A small SVG line-chart writer for `mmpost report`: nice axis ticks, one polyline per series
// (broken at NaNs, min-max decimated past a point budget), markers for short series, and marks
// at flagged steps. Plain strings in, one <svg> element out: no JavaScript needed to see a plot.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace mmpost::report {

/// One line of a chart. `x` ascends; NaN values break the line.
struct ChartLine {
  std::string label;  ///< the run's name (for data-run and the hover readout)
  std::string color;  ///< CSS color
  std::vector<double> x, y;
};

/// A chart: lines over a shared step axis, plus vertical marks at flagged steps.
struct Chart {
  std::string id;                  ///< element id of the <svg> ("" for none)
  std::string x_label = "step";
  std::vector<ChartLine> lines;
  std::vector<double> marks;       ///< steps a health check fired at (red ticks on the x axis)
  int width = 420, height = 240;   ///< viewBox size (the page scales it to the grid cell)
};

/// "Nice" tick values (1, 2 or 5 x 10^k apart) covering [lo, hi], at most about `target` of
/// them. lo == hi gives one tick.
std::vector<double> nice_ticks(double lo, double hi, int target);

/// A tick label: enough decimals for the tick spacing `step`, "k"/"M" for large values, and
/// exponents for tiny ones ("2e-05").
std::string format_tick(double v, double step);

/// Indices of the points to draw when a series has more than `max_points`: the first and last
/// point and, per bucket of consecutive points, its minimum and maximum (spikes survive).
/// All indices when there are few enough.
std::vector<size_t> decimate(const std::vector<double>& y, size_t max_points);
/// The point budget per line render_svg draws with (and the page's hover data keeps).
inline constexpr size_t kMaxPoints = 2000;

/// The <svg> element of `chart`: axes with ticks and labels, a light grid, one
/// <polyline class="series" data-run="LABEL"> per unbroken run of each line (a <circle
/// class="point"> per point when a line has at most 30), and a <g class="mark"> (a faint
/// vertical line and a red triangle on the axis) per mark.
/// The root carries data-x0/x1 (step domain) and data-px0/px1 (its pixel span) for the
/// page's hover readout.
std::string render_svg(const Chart& chart);

/// Escapes &, <, >, " and ' for HTML text and attributes.
std::string html_escape(const std::string& s);

}  // namespace mmpost::report
