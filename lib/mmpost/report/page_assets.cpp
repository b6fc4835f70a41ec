// The stylesheet and script inlined into every `mmpost report` page. The plots are plain SVG and
// read without the script; it adds the hover readout (nearest logged step, every run's value),
// the "only differences" recipe filter, and the status marker tests read
// (<body data-report-status="ok">, or "error" with the message in #report-errors).
#include "mmpost/report/html.h"

namespace mmpost::report {

const char* page_css() {
  return R"CSS(
:root{--fg:#1f2937;--muted:#6b7280;--line:#e5e7eb;--bg:#f5f6f8;--card:#fff;--bad:#c0392b;--good:#2e7d32}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;color:var(--fg);background:var(--bg)}
header{background:var(--card);border-bottom:1px solid var(--line);padding:16px 24px}
h1{margin:0 0 10px;font-size:20px;font-weight:600}
h2{font-size:16px;font-weight:600;margin:28px 0 12px}
nav{position:sticky;top:0;z-index:2;background:#fffffff2;border-bottom:1px solid var(--line);padding:8px 24px;display:flex;gap:16px;flex-wrap:wrap}
nav a{color:#2563eb;text-decoration:none;font-size:13px}
main{padding:0 24px 24px}
table{border-collapse:collapse;background:var(--card)}
th,td{padding:6px 10px;border-bottom:1px solid var(--line);text-align:left;vertical-align:top}
thead th{font-size:12px;color:var(--muted);font-weight:600;background:#fafafa}
code{font-size:12px;color:var(--muted)}
.swatch{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:6px;vertical-align:baseline}
.banner{padding:8px 12px;border-radius:6px;background:#eef2f7;display:inline-block;margin:0 0 10px}
.banner.bad{background:#fdecea;color:var(--bad)}
.banner.good{background:#e8f5e9;color:var(--good)}
table.health{width:100%}
.health .rule,.health .detail{font-size:12px;color:var(--muted)}
.badge{display:inline-block;font-size:11px;font-weight:600;padding:1px 7px;border-radius:10px;text-transform:uppercase}
.status-ok .badge{background:#e8f5e9;color:var(--good)}
.status-fired .badge{background:var(--bad);color:#fff}
.status-na .badge{background:#eceff1;color:var(--muted)}
.status-fired{background:#fff7f6}
.steps{font-size:12px}
.health a{font-size:12px;color:#2563eb}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(380px,1fr));gap:14px}
figure{margin:0;background:var(--card);border:1px solid var(--line);border-radius:8px;padding:10px 12px 6px}
figure.timeline{grid-column:1/-1}
figure.overlay{border-style:dashed}
figcaption{font-weight:600;font-size:13px;font-family:ui-monospace,SFMono-Regular,Menlo,monospace}
.flag{font:600 10px system-ui,sans-serif;background:var(--bad);color:#fff;border-radius:8px;padding:1px 6px;margin-left:8px}
.legend{font-size:11px;color:var(--muted);display:flex;gap:10px;flex-wrap:wrap;margin-top:2px}
svg.chart{width:100%;height:auto;display:block;overflow:visible}
.chart .gridline{stroke:#eef0f3;stroke-width:1}
.chart .frame{stroke:#c5cad3;stroke-width:1}
.chart .tick{font-size:10px;fill:#6b7280;font-family:system-ui,sans-serif}
.chart .axis-label{font-size:10px;fill:#9ca3af}
.chart .series{stroke-width:1.6;stroke-linejoin:round;stroke-linecap:round}
.chart .mark line{stroke:var(--bad);stroke-width:1.2;stroke-opacity:.22}
.chart .mark path{fill:var(--bad)}
.chart .cursor{stroke:#111;stroke-width:.8;stroke-dasharray:2 2}
.chart .empty{font-size:12px;fill:#9ca3af}
.chart .stage-label{font-size:11px;fill:#0b2545}
#tooltip{position:absolute;display:none;pointer-events:none;background:#111827eb;color:#fff;font-size:12px;padding:6px 8px;border-radius:6px;z-index:5;white-space:nowrap}
#tooltip .swatch{width:8px;height:8px}
.scroll{overflow-x:auto;max-height:640px;overflow-y:auto;border:1px solid var(--line);border-radius:8px}
table.recipe{width:100%;font-size:12px}
table.recipe th{font-family:ui-monospace,Menlo,monospace;font-weight:500;white-space:nowrap}
table.recipe td{font-family:ui-monospace,Menlo,monospace;word-break:break-all;max-width:420px}
table.recipe tr.diff{background:#fff4d6}
table.recipe tr.diff th{font-weight:700}
table.recipe td.none{color:#9ca3af}
table.recipe.only-diff tbody tr:not(.diff){display:none}
footer{padding:12px 24px;color:var(--muted);font-size:12px}
#report-errors{color:var(--bad);white-space:pre-wrap;margin:4px 0 0}
#report-errors:empty{display:none}
)CSS";
}

const char* page_js() {
  return R"JS(
(function () {
  var errors = document.getElementById('report-errors');
  function fail(msg) {
    errors.textContent += 'script error: ' + msg + '\n';
    document.body.setAttribute('data-report-status', 'error');
  }
  window.addEventListener('error', function (e) { fail(e.message); });
  function esc(s) {
    return String(s).replace(/[&<>"']/g, function (c) {
      return {'&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;'}[c];
    });
  }
  function fmt(v) {
    if (v === null || v === undefined) return 'NaN';
    var a = Math.abs(v);
    if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(3);
    return String(+v.toPrecision(5));
  }
  // Index of the x nearest `t` in the ascending array `xs` (-1 when empty).
  function nearest(xs, t) {
    if (!xs.length) return -1;
    var lo = 0, hi = xs.length - 1;
    while (hi - lo > 1) { var mid = (lo + hi) >> 1; if (xs[mid] < t) lo = mid; else hi = mid; }
    return Math.abs(xs[lo] - t) <= Math.abs(xs[hi] - t) ? lo : hi;
  }
  try {
    var data = JSON.parse(document.getElementById('report-data').textContent);
    var tip = document.getElementById('tooltip');
    var wired = 0;
    document.querySelectorAll('figure svg.chart[id]').forEach(function (svg) {
      var lines = data.plots[svg.id] || [];
      var x0 = +svg.dataset.x0, x1 = +svg.dataset.x1, p0 = +svg.dataset.px0, p1 = +svg.dataset.px1;
      var cursor = svg.querySelector('line.cursor');
      svg.addEventListener('mousemove', function (ev) {
        var pt = svg.createSVGPoint();
        pt.x = ev.clientX; pt.y = ev.clientY;
        var loc = pt.matrixTransform(svg.getScreenCTM().inverse());
        var t = x0 + (loc.x - p0) / (p1 - p0) * (x1 - x0), best = null;
        lines.forEach(function (l) {
          var i = nearest(l.x, t);
          if (i >= 0 && (best === null || Math.abs(l.x[i] - t) < Math.abs(best - t))) best = l.x[i];
        });
        if (best === null) return;
        var rows = ['<b>step ' + best + '</b>'];
        lines.forEach(function (l) {
          var i = nearest(l.x, best);
          if (i < 0 || l.x[i] !== best) return;
          var run = data.runs[l.run];
          rows.push('<span class="swatch" style="background:' + (l.color || run.color) + '"></span>' +
                    esc(l.label || run.name) + ': ' + fmt(l.y[i]));
        });
        var cx = p0 + (best - x0) / ((x1 - x0) || 1) * (p1 - p0);
        cursor.setAttribute('x1', cx); cursor.setAttribute('x2', cx);
        cursor.setAttribute('visibility', 'visible');
        tip.innerHTML = rows.join('<br>');
        tip.style.left = (ev.pageX + 14) + 'px';
        tip.style.top = (ev.pageY + 14) + 'px';
        tip.style.display = 'block';
      });
      svg.addEventListener('mouseleave', function () {
        tip.style.display = 'none';
        cursor.setAttribute('visibility', 'hidden');
      });
      wired++;
    });
    var only = document.getElementById('only-diff');
    if (only) only.addEventListener('change', function () {
      document.getElementById('recipe-table').classList.toggle('only-diff', only.checked);
    });
    if (document.body.getAttribute('data-report-status') !== 'error') {
      document.body.setAttribute('data-report-status', 'ok');
      document.getElementById('report-status').textContent = 'interactive: ' + wired + ' plots';
    }
  } catch (e) {
    fail(e && e.message ? e.message : e);
  }
})();
)JS";
}

}  // namespace mmpost::report
