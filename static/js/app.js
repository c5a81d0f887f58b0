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

  // A tail quantile drawn over several buckets (data.tails, monitor/pages/tails.py) replaces
  // that quantile's one-bucket figures; its points are [ttft, e2e, tps, ttfat].
  var TAIL_METRICS = ["ttft_ms", "e2e_ms", "tps", "ttfat_ms"];

  function unfoldSeries(data) {
    var points = [].concat.apply([], data.chunks || []).slice(data.skip, data.skip + data.count);
    var step = data.step === "day" ? 86400000 : 3600000;
    var start = data.start ? Date.parse(data.start) : 0;
    var tails = data.tails || {};
    var out = { labels: [], counts: data.counts || [], tails: tails };
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
          var tail = tails[q], ti = TAIL_METRICS.indexOf(m);
          if (tail && ti >= 0) v = tail.points[i] ? tail.points[i][ti] : null;
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
                // Each line's figure with the samples it rests on: its own bucket's probes,
                // or a tail's over its trailing window.
                label: function (ctx) {
                  var q = ctx.dataset.label, tail = data.tails[q], i = ctx.dataIndex;
                  var n = tail ? tail.samples[i] : data.counts[i];
                  var over = tail ? " over " + tail.width + (packed.step === "day" ? " days" : " h") : "";
                  var figure = ctx.parsed.y === null ? "too few samples" : unit(ctx.parsed.y);
                  return q + ": " + figure + (n === undefined ? "" : " (" + n + " samples" + over + ")");
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
      // Routes more than 10x apart: a log axis (and its title says so), else the fast ones
      // crowd into the first tenth of a linear one.
      var log = xmin > 0 && xmax / xmin > 10;
      var barFrom = log ? xmin / 1.5 : Math.max(0, xmin - pad);
      var barTo = log ? xmax * 1.5 : xmax + pad;
      var datasets = [
        { label: "fastest qualifying", data: winner, pointStyle: "star", pointRadius: 12, pointHoverRadius: 14, borderColor: c.ok, backgroundColor: c.ok, borderWidth: 2 },
        { label: "qualifies", data: passing, pointRadius: 7, pointHoverRadius: 9, backgroundColor: c.accent, borderColor: c.accent },
        { label: "below the bar / not qualifying", data: failing, pointRadius: 7, pointHoverRadius: 9, backgroundColor: dim(c.muted.length === 7 ? c.muted : "#6b7280"), borderColor: dim(c.muted.length === 7 ? c.muted : "#6b7280") },
      ];
      if (data.bar !== null && data.bar !== undefined) {
        datasets.push({
          label: "quality bar",
          type: "line",
          data: [{ x: barFrom, y: data.bar }, { x: barTo, y: data.bar }],
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
            x: log
              ? { type: "logarithmic", min: barFrom, max: barTo, title: { display: true, text: data.x_label + ", log scale" } }
              : { type: "linear", title: { display: true, text: data.x_label }, beginAtZero: true },
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

  // Phones show each table row as a card (app.css): each cell gets its column's heading as
  // data-label (group headings, e.g. "TTFT" over "p95", joined), read once per table.
  function labelCells(root) {
    (root || document).querySelectorAll("table.grid").forEach(function (table) {
      if (!table.tHead || table.dataset.labelled) return;
      var columns = [], taken = [];
      Array.prototype.forEach.call(table.tHead.rows, function (row, r) {
        var col = 0;
        Array.prototype.forEach.call(row.cells, function (cell) {
          while (taken[r] && taken[r][col]) col++;
          var text = cell.textContent.replace(/\s+/g, " ").trim();
          for (var dr = 0; dr < cell.rowSpan; dr++) {
            for (var dc = 0; dc < cell.colSpan; dc++) {
              taken[r + dr] = taken[r + dr] || [];
              taken[r + dr][col + dc] = true;
              columns[col + dc] = columns[col + dc] || [];
              if (dr === 0 && text && columns[col + dc].indexOf(text) < 0) columns[col + dc].push(text);
            }
          }
          col += cell.colSpan;
        });
      });
      Array.prototype.forEach.call(table.tBodies, function (body) {
        Array.prototype.forEach.call(body.rows, function (row) {
          var col = 0;
          Array.prototype.forEach.call(row.cells, function (cell) {
            var label = (columns[col] || []).join(" ");
            if (cell.tagName === "TD" && label && cell.colSpan === 1) cell.dataset.label = label;
            col += cell.colSpan;
          });
        });
      });
      table.dataset.labelled = "1";
    });
  }

  // A table that still scrolls sideways is reachable from the keyboard (a focusable region
  // named after its card); one that fits is not a tab stop.
  function reachScrollers() {
    document.querySelectorAll(".table-wrap").forEach(function (wrap) {
      var scrolls = wrap.scrollWidth > wrap.clientWidth + 1;
      if (scrolls && !wrap.hasAttribute("tabindex")) {
        var heading = wrap.closest(".card, section");
        heading = heading && heading.querySelector("h2");
        wrap.setAttribute("tabindex", "0");
        wrap.setAttribute("role", "region");
        wrap.setAttribute("aria-label", (heading ? heading.textContent.trim() : "Table") + " (scrolls sideways)");
        wrap.dataset.madeReachable = "1";
      } else if (!scrolls && wrap.dataset.madeReachable) {
        ["tabindex", "role", "aria-label", "data-made-reachable"].forEach(function (a) { wrap.removeAttribute(a); });
      }
    });
  }

  // Focus and scroll position survive a swap (the overview's refresh, a filter click): the
  // focused element is found again in the new content by its id, its link, or its place.
  var kept = null;
  function focusKey(el, target) {
    if (!el || el === document.body || !target.contains(el)) return null;
    if (el.id) return { id: el.id };
    var href = el.getAttribute("href"), name = el.getAttribute("name");
    var all = Array.prototype.slice.call(target.querySelectorAll("a[href], button, input, select, textarea, [tabindex]"));
    return { tag: el.tagName, href: href, name: name, index: all.indexOf(el) };
  }
  function findAgain(key, target) {
    if (key.id) return document.getElementById(key.id);
    var found = null;
    if (key.href !== null) found = target.querySelector(key.tag.toLowerCase() + '[href="' + CSS.escape(key.href) + '"]');
    if (!found && key.name) found = target.querySelector(key.tag.toLowerCase() + '[name="' + CSS.escape(key.name) + '"]');
    if (!found && key.index >= 0) found = target.querySelectorAll("a[href], button, input, select, textarea, [tabindex]")[key.index] || null;
    return found;
  }
  function keepPlace(event) {
    var target = event.detail.target;
    kept = { x: window.scrollX, y: window.scrollY, key: focusKey(document.activeElement, target), id: target.id };
  }
  // Focus comes back as soon as the new content is in (afterSwap: no moment where a screen
  // reader hears the page's top), the scroll once it has settled (charts drawn, heights final).
  function restoreFocus(event) {
    var place = kept;
    if (!place || !place.key) return;
    var target = event.detail.target;
    if (!document.body.contains(target)) target = place.id ? document.getElementById(place.id) : null;
    if (target && (document.activeElement === document.body || !document.activeElement)) {
      var el = findAgain(place.key, target);
      if (el) el.focus({ preventScroll: true });
    }
  }
  function restorePlace() {
    if (!kept) return;
    var place = kept;
    kept = null;
    window.scrollTo(place.x, place.y);
  }

  function settle(root) {
    drawCharts(root);
    labelCells(root);
    reachScrollers();
  }
  window.addEventListener("resize", reachScrollers);

  // Deferred scripts run in order, so htmx and Chart.js are already here.
  if (window.htmx) {
    // Belt and braces: the same settings are in <meta name="htmx-config">.
    htmx.config.allowEval = false;
    htmx.config.allowScriptTags = false;
    htmx.config.selfRequestsOnly = true;
    // Runs for the page once htmx is ready, and for every piece of content it swaps in.
    htmx.onLoad(function (elt) { settle(elt); });
    document.addEventListener("htmx:beforeSwap", keepPlace);
    document.addEventListener("htmx:afterSwap", restoreFocus);
    document.addEventListener("htmx:afterSettle", restorePlace);
  } else {
    document.addEventListener("DOMContentLoaded", function () { settle(document); });
  }
})();
