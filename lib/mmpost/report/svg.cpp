// SVG line charts for `mmpost report` (see svg.h): domain and ticks, decimation, and the markup.
#include "mmpost/report/svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>

namespace mmpost::report {
namespace {

constexpr double kLeft = 54, kRight = 12, kTop = 10, kBottom = 34;  // plot area margins (px)
constexpr size_t kMaxMarkers = 30;    // circles on every point of a short line

std::string fmt(const char* f, double a) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), f, a);
  return buf;
}

/// Spacing of nice_ticks for [lo, hi] (> 0 range).
double nice_step(double lo, double hi, int target) {
  const double raw = (hi - lo) / std::max(1, target);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  return (norm <= 1 ? 1 : norm <= 2 ? 2 : norm <= 5 ? 5 : 10) * mag;
}

struct Range {
  double lo = std::numeric_limits<double>::infinity();
  double hi = -std::numeric_limits<double>::infinity();
  bool valid() const { return lo <= hi; }
  void add(double v) {
    if (!std::isfinite(v)) return;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  /// Widens an empty or zero-width range so it can be drawn.
  void widen() {
    if (!valid()) lo = 0, hi = 1;
    if (hi - lo < 1e-12 * std::max(1.0, std::abs(hi))) {
      const double pad = lo == 0 ? 1 : 0.1 * std::abs(lo);
      lo -= pad, hi += pad;
    }
  }
};

/// Maps a data value in [d0, d1] onto pixels [p0, p1].
struct Scale {
  double d0, d1, p0, p1;
  double operator()(double v) const { return p0 + (v - d0) / (d1 - d0) * (p1 - p0); }
};

void axes(std::string& o, const Chart& c, const Scale& sx, const Scale& sy,
          const std::vector<double>& xt, const std::vector<double>& yt) {
  const double xstep = xt.size() > 1 ? xt[1] - xt[0] : 1;
  const double ystep = yt.size() > 1 ? yt[1] - yt[0] : 1;
  for (double v : yt) {
    const std::string y = fmt("%.1f", sy(v));
    o += "<line class=\"gridline\" x1=\"" + fmt("%.1f", sx.p0) + "\" x2=\"" + fmt("%.1f", sx.p1) +
         "\" y1=\"" + y + "\" y2=\"" + y + "\"/>";
    o += "<text class=\"tick\" x=\"" + fmt("%.1f", sx.p0 - 5) + "\" y=\"" + y +
         "\" text-anchor=\"end\" dominant-baseline=\"middle\">" + format_tick(v, ystep) + "</text>";
  }
  for (double v : xt) {
    const std::string x = fmt("%.1f", sx(v));
    o += "<line class=\"gridline\" x1=\"" + x + "\" x2=\"" + x + "\" y1=\"" + fmt("%.1f", sy.p1) +
         "\" y2=\"" + fmt("%.1f", sy.p0) + "\"/>";
    o += "<text class=\"tick\" x=\"" + x + "\" y=\"" + fmt("%.1f", sy.p0 + 14) +
         "\" text-anchor=\"middle\">" + format_tick(v, xstep) + "</text>";
  }
  o += "<rect class=\"frame\" x=\"" + fmt("%.1f", sx.p0) + "\" y=\"" + fmt("%.1f", sy.p1) +
       "\" width=\"" + fmt("%.1f", sx.p1 - sx.p0) + "\" height=\"" + fmt("%.1f", sy.p0 - sy.p1) +
       "\" fill=\"none\"/>";
  o += "<text class=\"axis-label\" x=\"" + fmt("%.1f", (sx.p0 + sx.p1) / 2) + "\" y=\"" +
       fmt("%.1f", c.height - 4.0) + "\" text-anchor=\"middle\">" + html_escape(c.x_label) +
       "</text>";
}

void series(std::string& o, const ChartLine& l, const Scale& sx, const Scale& sy) {
  const auto keep = decimate(l.y, kMaxPoints);
  const std::string attrs = " data-run=\"" + html_escape(l.label) + "\" stroke=\"" +
                            html_escape(l.color) + "\"";
  std::string points;
  size_t n_points = 0;
  auto flush = [&] {
    if (n_points >= 2) {
      o += "<polyline class=\"series\"" + attrs + " fill=\"none\" points=\"" + points + "\"/>";
    }
    points.clear();
    n_points = 0;
  };
  for (size_t i : keep) {
    if (!std::isfinite(l.y[i]) || !std::isfinite(l.x[i])) {
      flush();
      continue;
    }
    points += (n_points ? " " : "") + fmt("%.1f", sx(l.x[i])) + "," + fmt("%.1f", sy(l.y[i]));
    ++n_points;
  }
  flush();
  size_t finite = 0;
  for (double v : l.y) finite += std::isfinite(v) ? 1 : 0;
  if (finite > kMaxMarkers) return;
  for (size_t i = 0; i < l.y.size(); ++i) {
    if (!std::isfinite(l.y[i])) continue;
    o += "<circle class=\"point\" data-run=\"" + html_escape(l.label) + "\" cx=\"" +
         fmt("%.1f", sx(l.x[i])) + "\" cy=\"" + fmt("%.1f", sy(l.y[i])) + "\" r=\"2.5\" fill=\"" +
         html_escape(l.color) + "\"/>";
  }
}

}  // namespace

std::vector<double> nice_ticks(double lo, double hi, int target) {
  if (!(hi > lo)) return {lo};
  const double step = nice_step(lo, hi, target);
  std::vector<double> out;
  const double first = std::ceil(lo / step - 1e-9) * step;
  for (double v = first; v <= hi + step * 1e-9; v += step) {
    out.push_back(std::abs(v) < step * 1e-9 ? 0.0 : v);
  }
  return out;
}

std::string format_tick(double v, double step) {
  step = std::abs(step);
  if (std::abs(v) < step * 1e-6 || v == 0) return "0";
  auto decimals = [](double s) { return std::max(0, static_cast<int>(std::ceil(-std::log10(s) - 1e-9))); };
  char buf[64];
  if (step >= 1e6) {
    std::snprintf(buf, sizeof(buf), "%.*fM", decimals(step / 1e6), v / 1e6);
  } else if (step >= 1e3) {
    std::snprintf(buf, sizeof(buf), "%.*fk", decimals(step / 1e3), v / 1e3);
  } else if (step < 1e-4) {
    const int digits = std::clamp(static_cast<int>(std::ceil(std::log10(std::abs(v) / step))) + 1, 1, 6);
    std::snprintf(buf, sizeof(buf), "%.*g", digits, v);
  } else {
    std::snprintf(buf, sizeof(buf), "%.*f", decimals(step), v);
  }
  return buf;
}

std::vector<size_t> decimate(const std::vector<double>& y, size_t max_points) {
  const size_t n = y.size();
  std::vector<size_t> out;
  if (n <= std::max<size_t>(max_points, 4)) {
    out.resize(n);
    std::iota(out.begin(), out.end(), 0);
    return out;
  }
  const size_t buckets = std::max<size_t>(1, (max_points - 2) / 2);
  out.push_back(0);
  for (size_t b = 0; b < buckets; ++b) {
    const size_t lo = 1 + b * (n - 2) / buckets, hi = 1 + (b + 1) * (n - 2) / buckets;
    size_t imin = lo, imax = lo;
    bool any = false;
    for (size_t i = lo; i < hi; ++i) {
      if (!std::isfinite(y[i])) {
        out.push_back(i);  // keeps the break in the line
        continue;
      }
      if (!any || y[i] < y[imin]) imin = i;
      if (!any || y[i] > y[imax]) imax = i;
      any = true;
    }
    if (any) {
      out.push_back(std::min(imin, imax));
      out.push_back(std::max(imin, imax));
    }
  }
  out.push_back(n - 1);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::string render_svg(const Chart& c) {
  Range xr, yr;
  for (const auto& l : c.lines) {
    for (size_t i = 0; i < l.x.size() && i < l.y.size(); ++i) {
      if (std::isfinite(l.y[i])) xr.add(l.x[i]), yr.add(l.y[i]);
    }
  }
  const bool has_data = yr.valid();
  xr.widen();
  yr.widen();
  // The y domain snaps outward to whole ticks; the x domain is the steps logged.
  const double ystep = nice_step(yr.lo, yr.hi, 5);
  const double y0 = std::floor(yr.lo / ystep + 1e-9) * ystep, y1 = std::ceil(yr.hi / ystep - 1e-9) * ystep;
  const Scale sx{xr.lo, xr.hi, kLeft, c.width - kRight};
  const Scale sy{y0, y1, c.height - kBottom, kTop};
  std::string o = "<svg";
  if (!c.id.empty()) o += " id=\"" + html_escape(c.id) + "\"";
  o += " class=\"chart\" viewBox=\"0 0 " + std::to_string(c.width) + " " +
       std::to_string(c.height) + "\" preserveAspectRatio=\"xMidYMid meet\" role=\"img\"" +
       " data-x0=\"" + fmt("%.17g", xr.lo) + "\" data-x1=\"" + fmt("%.17g", xr.hi) +
       "\" data-px0=\"" + fmt("%.1f", sx.p0) + "\" data-px1=\"" + fmt("%.1f", sx.p1) + "\">";
  axes(o, c, sx, sy, nice_ticks(xr.lo, xr.hi, 6), nice_ticks(y0, y1, 5));
  for (double m : c.marks) {
    if (m < xr.lo || m > xr.hi) continue;
    const std::string x = fmt("%.1f", sx(m));
    const double bottom = sy.p0;
    o += "<g class=\"mark\"><title>health check fired at step " + fmt("%.0f", m) +
         "</title><line x1=\"" + x + "\" x2=\"" + x + "\" y1=\"" + fmt("%.1f", sy.p1) + "\" y2=\"" +
         fmt("%.1f", bottom) + "\"/><path d=\"M" + x + " " + fmt("%.1f", bottom - 6) + " l4 6 h-8 z\"/></g>";
  }
  for (const auto& l : c.lines) series(o, l, sx, sy);
  if (!has_data) {
    o += "<text class=\"empty\" x=\"" + fmt("%.1f", (sx.p0 + sx.p1) / 2) + "\" y=\"" +
         fmt("%.1f", (sy.p0 + sy.p1) / 2) + "\" text-anchor=\"middle\">no finite values</text>";
  }
  o += "<line class=\"cursor\" x1=\"0\" x2=\"0\" y1=\"" + fmt("%.1f", sy.p1) + "\" y2=\"" +
       fmt("%.1f", sy.p0) + "\" visibility=\"hidden\"/></svg>";
  return o;
}

std::string html_escape(const std::string& s) {
  std::string o;
  o.reserve(s.size());
  for (char ch : s) {
    switch (ch) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      case '\'': o += "&#39;"; break;
      default: o += ch;
    }
  }
  return o;
}

}  // namespace mmpost::report
