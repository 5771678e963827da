// Interactive line charts: every <figure class="chart-box" data-chart="..."> the server
// drew as SVG is drawn again with uPlot (vendored, static/uPlot.iife.min.js): axes with
// ticks, the legend under the plot with each series' value at the cursor, a tooltip at the
// cursor, drag to zoom on x (double-click or "reset zoom" to undo), a log y scale, smoothing,
// and epoch or step on x where the data have both. Without script the SVG stays. Also the
// N-way compare page's parameters against final metrics (figure.scatter-box).
(function () {
  "use strict";
  var PALETTE = ["#1f4e96", "#c2410c", "#15803d", "#7e22ce", "#0e7490",
                 "#a16207", "#be123c", "#4d7c0f", "#475569", "#9333ea"];
  var DASHES = [null, [7, 4], [2, 3], [10, 3, 2, 3], [4, 2], [1, 4]];
  var WHOLE = [];
  for (var e = 0; e < 10; e++) WHOLE.push(Math.pow(10, e), 2 * Math.pow(10, e), 5 * Math.pow(10, e));

  function fmt(v) {
    if (v == null || !isFinite(v)) return "—";
    var a = Math.abs(v);
    return a !== 0 && (a < 1e-3 || a >= 1e6) ? v.toExponential(3) : String(+v.toPrecision(6));
  }

  // Exponential moving average over the values present (nulls stay null).
  function smooth(ys, weight) {
    if (!weight) return ys;
    var out = [], last = null;
    for (var i = 0; i < ys.length; i++) {
      if (ys[i] == null) { out.push(null); continue; }
      last = last == null ? ys[i] : last * weight + ys[i] * (1 - weight);
      out.push(last);
    }
    return out;
  }

  function tooltipPlugin(box, xName) {
    var tip;
    return {
      hooks: {
        init: function (u) {
          tip = document.createElement("div");
          tip.className = "chart-tooltip";
          tip.style.display = "none";
          u.over.appendChild(tip);
        },
        setCursor: function (u) {
          var idx = u.cursor.idx;
          if (idx == null || u.cursor.left < 0) { tip.style.display = "none"; return; }
          var lines = [xName() + " " + fmt(u.data[0][idx])];
          for (var i = 1; i < u.series.length; i++) {
            var v = u.data[i][idx];
            if (v != null && u.series[i].show) lines.push(u.series[i].label + ": " + fmt(v));
          }
          tip.textContent = lines.join("\n");
          tip.style.display = "block";
          var left = u.cursor.left + 12, top = u.cursor.top + 12;
          if (left + tip.offsetWidth > u.over.clientWidth) left = u.cursor.left - tip.offsetWidth - 12;
          if (top + tip.offsetHeight > u.over.clientHeight) top = u.cursor.top - tip.offsetHeight - 12;
          tip.style.left = Math.max(0, left) + "px";
          tip.style.top = Math.max(0, top) + "px";
          box.setAttribute("data-hover", tip.textContent);
        },
      },
    };
  }

  function select(name, options, onChange) {
    var el = document.createElement("select");
    el.className = name;
    options.forEach(function (value) {
      var o = document.createElement("option");
      o.value = o.textContent = value;
      el.appendChild(o);
    });
    el.addEventListener("change", onChange);
    return el;
  }

  // A chart box's row of controls and its plot's place; `labelled` adds a control to the row.
  function frame(box) {
    var controls = document.createElement("div");
    controls.className = "chart-controls";
    var target = document.createElement("div");
    target.className = "chart-plot";
    box.appendChild(controls);
    box.appendChild(target);
    return {
      controls: controls,
      target: target,
      labelled: function (text, element) {
        var wrap = document.createElement("label");
        wrap.appendChild(document.createTextNode(text + " "));
        wrap.appendChild(element);
        controls.appendChild(wrap);
        return element;
      },
    };
  }

  function draw(box) {
    var spec;
    try { spec = JSON.parse(box.getAttribute("data-chart")); } catch (e) { return; }
    if (!spec || !spec.series || !spec.series.length || typeof uPlot === "undefined") return;
    var state = { x: spec.xs[0], log: false, smooth: 0 };
    var positive = spec.series.every(function (s) { return s.y.every(function (v) { return v > 0; }); });

    var svg = box.querySelector("svg.chart");
    if (svg) svg.style.display = "none";
    var parts = frame(box), target = parts.target, control = parts.labelled;
    if (spec.xs.length > 1) {
      var xSelect = control("x", select("chart-x", spec.xs, function () { state.x = xSelect.value; render(); }));
    }
    var logBox = document.createElement("input");
    logBox.type = "checkbox";
    logBox.className = "chart-log";
    if (!positive) { logBox.disabled = true; logBox.title = "a log scale needs values above 0"; }
    control("log y", logBox).addEventListener("change", function () { state.log = logBox.checked; render(); });
    var smoothSelect = document.createElement("select");
    smoothSelect.className = "chart-smooth";
    [["none", 0], ["0.6", 0.6], ["0.9", 0.9]].forEach(function (p) {
      var o = document.createElement("option");
      o.value = String(p[1]);
      o.textContent = p[0];
      smoothSelect.appendChild(o);
    });
    control("smoothing", smoothSelect).addEventListener("change", function () {
      state.smooth = +smoothSelect.value; render();
    });
    var reset = document.createElement("button");
    reset.type = "button";
    reset.className = "chart-reset";
    reset.textContent = "reset zoom";
    parts.controls.appendChild(reset);

    var plot = null;
    function render() {
      if (plot) plot.destroy();
      var tables = spec.series.map(function (s) {
        var xs = s.x[state.x] || [];
        var pairs = xs.map(function (x, i) { return [x, s.y[i]]; })
          .sort(function (a, b) { return a[0] - b[0]; });
        return [pairs.map(function (p) { return p[0]; }), smooth(pairs.map(function (p) { return p[1]; }), state.smooth)];
      });
      var data = uPlot.join(tables);
      var series = [{ label: state.x, value: function (u, v) { return fmt(v); } }];
      spec.series.forEach(function (s, i) {
        var dash = DASHES[i % DASHES.length] || (s.dashed ? [5, 3] : null);
        series.push({
          label: s.label,
          stroke: PALETTE[i % PALETTE.length],
          width: 2,
          dash: dash || undefined,
          spanGaps: true,
          points: { show: data[0].length <= 60, size: 5 },
          value: function (u, v) { return fmt(v); },
        });
      });
      var width = Math.max(280, Math.min(box.clientWidth || 520, 640));
      plot = new uPlot({
        title: spec.title,
        width: width,
        height: 240,
        scales: { x: { time: false }, y: state.log ? { distr: 3, log: 10 } : {} },
        axes: [
          { label: state.x, size: 40, incrs: WHOLE }, // epochs and steps are whole numbers
          { size: 64, values: function (u, ticks) { return ticks.map(fmt); } },
        ],
        series: series,
        cursor: { drag: { x: true, y: false }, focus: { prox: 24 } },
        legend: { live: true },
        focus: { alpha: 0.35 },
        plugins: [tooltipPlugin(box, function () { return state.x; })],
        hooks: {
          setScale: [function (u, key) {
            if (key !== "x") return;
            box.setAttribute("data-x-min", String(u.scales.x.min));
            box.setAttribute("data-x-max", String(u.scales.x.max));
          }],
        },
      }, data, target);
      box.uplot = plot; // for the page's tests: positions of values, the scales
      box.setAttribute("data-drawn", state.x + (state.log ? " log" : ""));
    }
    reset.addEventListener("click", function () {
      if (!plot) return;
      var xs = plot.data[0];
      plot.setScale("x", { min: xs[0], max: xs[xs.length - 1] });
    });
    render();
  }

  // Parameters against final metrics: one point a run, the field on x and the metric on y
  // picked from the differing numeric spec fields and the recorded metrics.
  function drawScatter(box) {
    var spec;
    try { spec = JSON.parse(box.getAttribute("data-scatter")); } catch (e) { return; }
    if (!spec || typeof uPlot === "undefined") return;
    var params = Object.keys(spec.params), metrics = Object.keys(spec.metrics);
    var state = { x: params[0], y: metrics.indexOf("loss") >= 0 ? "loss" : metrics[0], log: false };
    box.textContent = "";
    var parts = frame(box), target = parts.target, labelled = parts.labelled;
    var xs = labelled("x", select("scatter-x", params, function () { state.x = xs.value; render(); }));
    var ys = labelled("y", select("scatter-y", metrics, function () { state.y = ys.value; render(); }));
    ys.value = state.y;
    var logBox = document.createElement("input");
    logBox.type = "checkbox";
    logBox.className = "chart-log";
    labelled("log x", logBox).addEventListener("change", function () { state.log = logBox.checked; render(); });
    var plot = null;
    function render() {
      if (plot) plot.destroy();
      var px = spec.params[state.x], py = spec.metrics[state.y];
      var usable = px.every(function (v) { return v == null || v > 0; });
      logBox.disabled = !usable;
      var tables = [], series = [{ label: state.x, value: function (u, v) { return fmt(v); } }];
      spec.runs.forEach(function (run, i) {
        if (px[i] == null || py[i] == null) return;
        tables.push([[px[i]], [py[i]]]);
        var colour = PALETTE[i % PALETTE.length];
        series.push({
          label: "run " + run, stroke: colour, fill: colour, paths: function () { return null; },
          points: { show: true, size: 10, fill: colour }, value: function (u, v) { return fmt(v); },
        });
      });
      if (!tables.length) { target.textContent = "No run has both values."; return; }
      var width = Math.max(280, Math.min(box.clientWidth || 560, 720));
      plot = new uPlot({
        title: state.y + " against " + state.x,
        width: width,
        height: 280,
        scales: { x: state.log && usable ? { time: false, distr: 3, log: 10 } : { time: false } },
        axes: [
          { label: state.x, size: 40, values: function (u, t) { return t.map(fmt); } },
          { label: state.y, size: 70, values: function (u, t) { return t.map(fmt); } },
        ],
        series: series,
        cursor: { drag: { x: true, y: false }, focus: { prox: 24 } },
        legend: { live: true },
        plugins: [tooltipPlugin(box, function () { return state.x; })],
      }, uPlot.join(tables), target);
      box.uplot = plot;
      box.setAttribute("data-drawn", state.x + " " + state.y);
    }
    render();
  }

  function drawAll(root) {
    var boxes = (root || document).querySelectorAll("figure.chart-box[data-chart]:not([data-drawn])");
    for (var i = 0; i < boxes.length; i++) draw(boxes[i]);
    var scatters = (root || document).querySelectorAll("figure.scatter-box[data-scatter]:not([data-drawn])");
    for (var j = 0; j < scatters.length; j++) drawScatter(scatters[j]);
  }
  document.addEventListener("DOMContentLoaded", function () { drawAll(document); });
  // The run page swaps its content in when the run's state changes: draw what came in.
  document.addEventListener("htmx:afterSwap", function (e) { drawAll(e.target); });
})();
