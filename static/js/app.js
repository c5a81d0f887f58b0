// Routewatch front-end glue. No inline scripts anywhere (the CSP forbids them): chart data
// arrives in <script type="application/json"> elements (Django's json_script) next to a
// <canvas data-chart="kind" data-source="id">, and is drawn here, on first load and after
// every htmx swap.
"use strict";

(function () {
  function cssVar(name, fallback) {
    var v = getComputedStyle(document.documentElement).getPropertyValue(name).trim();
    return v || fallback;
  }

  function palette() {
    return {
      ok: cssVar("--ok", "#1b7f3b"),
      near: cssVar("--near", "#b26a00"),
      over: cssVar("--over", "#b3261e"),
      muted: cssVar("--muted", "#6b7280"),
      accent: cssVar("--accent", "#2f5bea"),
      p50: cssVar("--p50", "#2f5bea"),
      p95: cssVar("--p95", "#b26a00"),
      p99: cssVar("--p99", "#b3261e"),
    };
  }

  // The JSON sits in a json_script element inside a <template>: htmx (allowScriptTags off)
  // removes every <script> from swapped content, but does not look inside templates.
  function readData(canvas) {
    var holder = document.getElementById(canvas.dataset.source);
    var source = holder && holder.content ? holder.content.querySelector("script") : holder;
    if (!source) return null;
    try {
      return JSON.parse(source.textContent);
    } catch (e) {
      return null;
    }
  }

  function fmtMs(v) {
    if (v === null || v === undefined) return "—";
    if (v < 1000) return Math.round(v) + " ms";
    var s = v / 1000;
    if (s < 60) return (s < 10 ? s.toFixed(2) : s.toFixed(1)) + " s";
    var total = Math.round(s), m = Math.floor(total / 60);
    return m + " min " + (total % 60) + " s";
  }

  function fmtTps(v) {
    return v === null || v === undefined ? "—" : Math.round(v).toLocaleString("en-US") + " tok/s";
  }

  // Route chart data (monitor/pages_route.py, series): the chunks joined, less the first
  // `skip` points, are `count` points one step apart from `start` (UTC); each point is
  // [ttft p50, p95, p99, e2e p50, p95, p99, tps p50, p95, p99, ttfat p50, p95, p99] or null
  // (no data that hour); points stored before time to first answer token end after tps.
  var SERIES_METRICS = ["ttft_ms", "e2e_ms", "tps", "ttfat_ms", "app_e2e_ms"];
  var QUANTILES = ["p50", "p95", "p99"];

  function pad2(n) { return (n < 10 ? "0" : "") + n; }

  function unfoldSeries(data) {
    var points = [].concat.apply([], data.chunks || []).slice(data.skip, data.skip + data.count);
    var step = data.step === "day" ? 86400000 : 3600000;
    var start = data.start ? Date.parse(data.start) : 0;
    var out = { labels: [] };
    SERIES_METRICS.forEach(function (m) {
      out[m] = {};
      QUANTILES.forEach(function (q) { out[m][q] = []; });
    });
    points.forEach(function (point, i) {
      var t = new Date(start + i * step);
      var day = pad2(t.getUTCMonth() + 1) + "-" + pad2(t.getUTCDate());
      out.labels.push(data.step === "day" ? t.getUTCFullYear() + "-" + day : day + " " + pad2(t.getUTCHours()) + ":00");
      SERIES_METRICS.forEach(function (m, mi) {
        QUANTILES.forEach(function (q, qi) {
          var v = point ? point[mi * 3 + qi] : null;
          out[m][q].push(v === undefined ? null : v);
        });
      });
    });
    return out;
  }

  var builders = {
    series: function (canvas, packed, c) {
      var data = unfoldSeries(packed);
      var metric = canvas.dataset.metric;
      var block = data[metric] || {};
      var colours = { p50: c.p50, p95: c.p95, p99: c.p99 };
      var datasets = Object.keys(block).map(function (q) {
        return {
          label: q,
          data: block[q],
          borderColor: colours[q] || c.accent,
          backgroundColor: colours[q] || c.accent,
          spanGaps: false,
          pointRadius: data.labels.length > 60 ? 0 : 2,
          borderWidth: 2,
          tension: 0.2,
        };
      });
      var unit = metric === "tps" ? fmtTps : fmtMs;
      return {
        type: "line",
        data: { labels: data.labels, datasets: datasets },
        options: {
          animation: false,
          maintainAspectRatio: false,
          interaction: { mode: "index", intersect: false },
          scales: {
            // Labels are UTC (see unfold above): the axis says so.
            x: { title: { display: true, text: packed.step === "day" ? "day (UTC)" : "hour (UTC)" } },
            y: { beginAtZero: true, ticks: { callback: function (v) { return unit(v); } } },
          },
          plugins: {
            tooltip: {
              callbacks: {
                title: function (items) { return items.length ? items[0].label + " UTC" : ""; },
                label: function (ctx) {
                  return ctx.dataset.label + ": " + (ctx.parsed.y === null ? "too few samples" : unit(ctx.parsed.y));
                },
              },
            },
          },
        },
      };
    },

    scatter: function (canvas, data, c) {
      function dim(colour) { return colour + "55"; }
      var passing = [], failing = [], winner = [];
      data.points.forEach(function (p) {
        (p.winner ? winner : p.qualifies ? passing : failing).push(p);
      });
      var xs = data.points.map(function (p) { return p.x; });
      var xmin = Math.min.apply(null, xs), xmax = Math.max.apply(null, xs);
      var pad = (xmax - xmin) * 0.1 || xmax * 0.1 || 1;
      var datasets = [
        { label: "fastest qualifying", data: winner, pointStyle: "star", pointRadius: 12, pointHoverRadius: 14, borderColor: c.ok, backgroundColor: c.ok, borderWidth: 2 },
        { label: "qualifies", data: passing, pointRadius: 7, pointHoverRadius: 9, backgroundColor: c.accent, borderColor: c.accent },
        { label: "below the bar / not qualifying", data: failing, pointRadius: 7, pointHoverRadius: 9, backgroundColor: dim(c.muted.length === 7 ? c.muted : "#6b7280"), borderColor: dim(c.muted.length === 7 ? c.muted : "#6b7280") },
      ];
      if (data.bar !== null && data.bar !== undefined) {
        datasets.push({
          label: "quality bar",
          type: "line",
          data: [{ x: Math.max(0, xmin - pad), y: data.bar }, { x: xmax + pad, y: data.bar }],
          borderColor: c.over,
          borderDash: [6, 4],
          borderWidth: 1.5,
          pointRadius: 0,
          pointHoverRadius: 0,
          fill: false,
        });
      }
      return {
        type: "scatter",
        data: { datasets: datasets },
        options: {
          animation: false,
          maintainAspectRatio: false,
          scales: {
            x: { title: { display: true, text: data.x_label }, beginAtZero: true },
            y: { title: { display: true, text: data.y_label } },
          },
          plugins: {
            tooltip: {
              filter: function (item) { return item.raw && item.raw.label !== undefined; },
              callbacks: {
                label: function (ctx) {
                  var p = ctx.raw;
                  return [
                    p.label,
                    data.x_label + ": " + fmtMs(p.x * 1000),
                    data.y_label + ": " + p.y,
                    "TTFT p50: " + fmtMs(p.ttft_p50_ms) + " · speed p50: " + fmtTps(p.tps_p50),
                    "e2e p95: " + fmtMs(p.e2e_p95_ms),
                  ];
                },
              },
            },
          },
        },
      };
    },

    waterfall: function (canvas, data, c) {
      var colours = {
        dns: "#8b5cf6", connect: "#0ea5e9", tls: "#14b8a6", upload: "#64748b",
        "queue + prefill": c.near, decode: c.accent,
      };
      return {
        type: "bar",
        data: {
          labels: data.map(function (s) { return s.name; }),
          datasets: [{
            label: "ms from t0",
            data: data.map(function (s) { return [s.start_ms, s.end_ms]; }),
            backgroundColor: data.map(function (s) { return colours[s.name] || c.muted; }),
          }],
        },
        options: {
          indexAxis: "y",
          animation: false,
          maintainAspectRatio: false,
          scales: { x: { beginAtZero: true, ticks: { callback: function (v) { return fmtMs(v); } } } },
          plugins: {
            legend: { display: false },
            tooltip: {
              callbacks: {
                label: function (ctx) {
                  var r = ctx.raw;
                  return fmtMs(r[0]) + " → " + fmtMs(r[1]) + " (" + fmtMs(r[1] - r[0]) + ")";
                },
              },
            },
          },
        },
      };
    },

    // A scenario's calls on one time axis (monitor/pages/scenario.py, waterfall): one row per
    // call, its phases overlaid in that row.
    scenario: function (canvas, data, c) {
      var colours = { "to headers": "#64748b", "queue + prefill": c.near, decode: c.accent, validation: c.ok };
      return {
        type: "bar",
        data: {
          labels: data.rows,
          datasets: data.phases.map(function (p) {
            return { label: p.name, data: p.data, grouped: false, backgroundColor: colours[p.name] || c.muted };
          }),
        },
        options: {
          indexAxis: "y",
          animation: false,
          maintainAspectRatio: false,
          scales: { x: { beginAtZero: true, ticks: { callback: function (v) { return fmtMs(v); } } } },
          plugins: {
            tooltip: {
              callbacks: {
                label: function (ctx) {
                  var r = ctx.raw;
                  return r ? ctx.dataset.label + ": " + fmtMs(r[0]) + " → " + fmtMs(r[1]) + " (" + fmtMs(r[1] - r[0]) + ")" : "";
                },
              },
            },
          },
        },
      };
    },

    bars: function (canvas, data, c) {
      return {
        type: "bar",
        data: {
          labels: data.labels,
          datasets: [{ label: "win rate (%)", data: data.win_rate, backgroundColor: c.accent }],
        },
        options: {
          animation: false,
          maintainAspectRatio: false,
          scales: { y: { beginAtZero: true, max: 100 } },
          plugins: { legend: { display: false } },
        },
      };
    },
  };

  function drawCharts(root) {
    if (!window.Chart) return;
    var c = palette();
    // Text and grid lines from the page's colours (light or dark, prefers-color-scheme).
    Chart.defaults.color = cssVar("--muted", "#4b5563");
    Chart.defaults.borderColor = cssVar("--line", "#e5e7eb");
    var canvases = (root || document).querySelectorAll("canvas[data-chart]");
    canvases.forEach(function (canvas) {
      var build = builders[canvas.dataset.chart];
      var data = readData(canvas);
      if (!build || !data) return;
      var existing = Chart.getChart(canvas);
      if (existing) existing.destroy();
      new Chart(canvas, build(canvas, data, c));
    });
  }

  // Deferred scripts run in order, so htmx and Chart.js are already here.
  if (window.htmx) {
    // Belt and braces: the same settings are in <meta name="htmx-config">.
    htmx.config.allowEval = false;
    htmx.config.allowScriptTags = false;
    htmx.config.selfRequestsOnly = true;
    // Runs for the page once htmx is ready, and for every piece of content it swaps in.
    htmx.onLoad(function (elt) { drawCharts(elt); });
  } else {
    document.addEventListener("DOMContentLoaded", function () { drawCharts(document); });
  }
})();
