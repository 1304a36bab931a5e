// The task page's metric charts, drawn with uPlot (static/vendor/uPlot.iife.min.js).
//
// MetricCharts.render(box, runs, smoothing) draws one chart per metric group into ``box``:
// ``runs`` is a list of {label, index, history: [{step, metrics}]}, one per job, and a
// group is a metric and its validation twin (pairing rule: ``group`` below, and
// docs/pages.md). Each chart has axes with tick labels, a legend naming every line with its
// value under the cursor, and lines smoothed by an exponential moving average of weight
// ``smoothing`` (0: the raw values), as TensorBoard's slider does. Charts that already
// exist get new data in place (live updates), and follow their container's width.
(function () {
  "use strict";

  // Per job: its training line's colour, then its validation line's (dashed as well).
  // Dark enough for 3:1 against white, and told apart by hue and by the dash.
  var PAIRS = [
    ["#2b50c8", "#c2410c"],
    ["#146c2e", "#a21caf"],
    ["#7a4a00", "#0e7490"],
    ["#6b21a8", "#b42318"],
  ];
  var HEIGHT = 190;
  // Prefixes that mark a validation metric, and those that mark a training one.
  var VALIDATION = ["val_", "val/", "valid_", "valid/", "validation_", "validation/", "eval_", "eval/"];
  var TRAINING = ["train_", "train/", "training_", "training/"];

  // The chart a metric goes on and the line it draws there: ``val_loss`` and ``loss``
  // (or ``train_loss``, ``train/loss`` and ``val/loss``) share the chart "loss".
  function group(name) {
    var i;
    for (i = 0; i < VALIDATION.length; i++) {
      if (name.indexOf(VALIDATION[i]) === 0 && name.length > VALIDATION[i].length) {
        return { base: name.slice(VALIDATION[i].length), validation: true };
      }
    }
    for (i = 0; i < TRAINING.length; i++) {
      if (name.indexOf(TRAINING[i]) === 0 && name.length > TRAINING[i].length) {
        return { base: name.slice(TRAINING[i].length), validation: false };
      }
    }
    return { base: name, validation: false };
  }

  function colour(index, validation) {
    return PAIRS[index % PAIRS.length][validation ? 1 : 0];
  }

  // TensorBoard's smoothing: an exponential moving average, debiased so the first points
  // are not pulled towards zero. Gaps (null) stay gaps and do not reset the average.
  function smooth(values, weight) {
    if (!weight) return values.slice();
    var last = 0;
    var count = 0;
    return values.map(function (v) {
      if (v === null || v === undefined) return null;
      last = last * weight + (1 - weight) * v;
      count += 1;
      return last / (1 - Math.pow(weight, count));
    });
  }

  function format(value) {
    if (typeof value !== "number" || !isFinite(value)) return "—";
    var abs = Math.abs(value);
    return abs !== 0 && (abs < 0.001 || abs >= 1e6) ? value.toExponential(3) : String(Number(value.toPrecision(4)));
  }

  // The groups (charts) of these runs, in the order their first metric appeared: each with
  // its lines (one per job and metric name).
  function plan(runs) {
    var charts = [];
    var byBase = {};
    runs.forEach(function (run) {
      run.history.forEach(function (point) {
        Object.keys(point.metrics).forEach(function (name) {
          var g = group(name);
          var chart = byBase[g.base];
          if (!chart) {
            chart = byBase[g.base] = { base: g.base, names: [], lines: [] };
            charts.push(chart);
          }
          if (chart.names.indexOf(name) === -1) chart.names.push(name);
          var key = run.index + "\u0000" + name;
          var known = chart.lines.some(function (line) {
            return line.key === key;
          });
          if (!known) chart.lines.push({ key: key, run: run, name: name, validation: g.validation });
        });
      });
    });
    charts.forEach(function (chart) {
      // A lone metric keeps its own name (``val_top5``, ``lr``); a pair is named for both.
      chart.title = chart.names.length === 1 ? chart.names[0] : chart.base;
      chart.lines.sort(function (a, b) {
        return a.run.index - b.run.index || Number(a.validation) - Number(b.validation) || (a.name < b.name ? -1 : 1);
      });
    });
    return charts;
  }

  // uPlot's columns: the steps any line has, ascending, then each line's values at them.
  function columns(chart, weight) {
    var steps = [];
    var seen = {};
    chart.lines.forEach(function (line) {
      line.run.history.forEach(function (p) {
        if (typeof p.metrics[line.name] === "number" && !seen[p.step]) {
          seen[p.step] = true;
          steps.push(p.step);
        }
      });
    });
    steps.sort(function (a, b) {
      return a - b;
    });
    var at = {};
    steps.forEach(function (s, i) {
      at[s] = i;
    });
    var data = [steps];
    chart.lines.forEach(function (line) {
      var values = steps.map(function () {
        return null;
      });
      line.run.history.forEach(function (p) {
        if (typeof p.metrics[line.name] === "number") values[at[p.step]] = p.metrics[line.name];
      });
      data.push(smooth(values, weight));
    });
    return data;
  }

  function lineLabel(line, runs) {
    return runs > 1 ? line.run.label + ": " + line.name : line.name;
  }

  // Tick labels as drawn, kept on the figure (data-ticks-x, data-ticks-y) for whoever
  // reads the page without the canvas.
  function ticks(figure, attribute) {
    return function (u, splits) {
      var labels = splits.map(function (v) {
        return v === null ? "" : format(v);
      });
      figure.setAttribute(attribute, labels.join(" "));
      return labels;
    };
  }

  function showLatest(u) {
    var last = u.data[0].length - 1;
    if (u.cursor.idx === null || u.cursor.idx === undefined) {
      if (last >= 0 && u.legend.idx !== last) u.setLegend({ idx: last });
    }
  }

  function describe(chart, data) {
    var steps = data[0];
    var values = [];
    data.slice(1).forEach(function (column) {
      column.forEach(function (v) {
        if (v !== null) values.push(v);
      });
    });
    if (!steps.length || !values.length) return chart.title;
    return chart.title + " over steps " + steps[0] + " to " + steps[steps.length - 1] + ", from " +
      format(Math.min.apply(null, values)) + " to " + format(Math.max.apply(null, values));
  }

  function signature(chart, runs) {
    return chart.lines.map(function (line) {
      return lineLabel(line, runs) + "|" + colour(line.run.index, line.validation);
    }).join("\n");
  }

  function create(box, chart, runs, data, position) {
    var figure = document.createElement("figure");
    figure.className = "metric-chart";
    figure.setAttribute("data-metric", chart.title);
    var caption = document.createElement("figcaption");
    caption.textContent = chart.title;
    var plot = document.createElement("div");
    plot.className = "metric-plot";
    plot.setAttribute("role", "img");
    figure.appendChild(caption);
    figure.appendChild(plot);
    box.insertBefore(figure, box.children[position] || null);
    var width = Math.max(200, plot.clientWidth || box.clientWidth || 320);
    var series = [{ label: "step", value: function (u, v) { return v === null || v === undefined ? "—" : String(v); } }];
    chart.lines.forEach(function (line) {
      series.push({
        label: lineLabel(line, runs),
        stroke: colour(line.run.index, line.validation),
        width: 2,
        dash: line.validation ? [6, 4] : undefined,
        spanGaps: true,
        points: { size: 5 },
        value: function (u, v) {
          return format(v);
        },
      });
    });
    var options = {
      width: width,
      height: HEIGHT,
      series: series,
      scales: { x: { time: false } },
      axes: [
        { label: "step", values: ticks(figure, "data-ticks-x"), stroke: "#59636e", grid: { stroke: "#e5e8ec" } },
        { values: ticks(figure, "data-ticks-y"), stroke: "#59636e", grid: { stroke: "#e5e8ec" }, size: 56 },
      ],
      cursor: { points: { size: 7 }, drag: { x: true, y: false } },
      legend: { live: true },
      // Off the chart, the legend shows each line's latest value.
      hooks: { setCursor: [showLatest], setData: [showLatest] },
    };
    var u = new window.uPlot(options, data, plot);
    plot.setAttribute("aria-label", describe(chart, data));
    var entry = { figure: figure, plot: plot, uplot: u, signature: signature(chart, runs), width: width };
    if ("ResizeObserver" in window) {
      entry.observer = new ResizeObserver(function () {
        var w = Math.max(200, Math.floor(plot.clientWidth));
        if (w && w !== entry.width) {
          entry.width = w;
          u.setSize({ width: w, height: HEIGHT });
        }
      });
      entry.observer.observe(plot);
    }
    return entry;
  }

  function destroy(entry) {
    if (entry.observer) entry.observer.disconnect();
    entry.uplot.destroy();
    entry.figure.remove();
  }

  // Charts drawn in each box, by title.
  var drawn = new WeakMap();

  function render(box, runs, weight) {
    if (!window.uPlot) return;
    var shown = drawn.get(box) || {};
    if (!box.isConnected || (Object.keys(shown).length && !box.contains(shown[Object.keys(shown)[0]].figure))) {
      shown = {}; // the box was redrawn (htmx swapped the page): start again
    }
    var charts = plan(runs);
    var next = {};
    charts.forEach(function (chart, position) {
      var data = columns(chart, weight);
      var entry = shown[chart.title];
      if (entry && entry.signature === signature(chart, runs.length)) {
        entry.uplot.setData(data);
        entry.plot.setAttribute("aria-label", describe(chart, data));
        if (box.children[position] !== entry.figure) box.insertBefore(entry.figure, box.children[position] || null);
      } else {
        if (entry) destroy(entry);
        entry = create(box, chart, runs.length, data, position);
      }
      next[chart.title] = entry;
    });
    Object.keys(shown).forEach(function (title) {
      if (!next[title]) destroy(shown[title]);
    });
    drawn.set(box, next);
    return charts.length;
  }

  window.MetricCharts = { render: render, group: group, smooth: smooth, colour: colour };
})();
