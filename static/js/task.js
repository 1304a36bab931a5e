// Live task status: a WebSocket on /ws/tasks/<id>/ pushes "task.status", "task.progress"
// and "task.log" events; after every (re)connect the page re-reads /api/v1/tasks/<id>/
// and the assignments' live.json so nothing missed while disconnected stays stale.
(function () {
  "use strict";

  var root = document.querySelector("[data-task-live]");
  if (!root || !("WebSocket" in window)) return;

  var taskId = root.getAttribute("data-task-id");
  var apiUrl = root.getAttribute("data-api-url");
  var liveUrl = root.getAttribute("data-live-url");
  var wsUrl = (location.protocol === "https:" ? "wss://" : "ws://") + location.host + root.getAttribute("data-ws-path");
  var labels = readJson("status-labels", {});
  var cancellable = readJson("cancellable-statuses", []);
  var terminal = ["completed", "failed", "cancelled"];
  var attempts = 0;
  var socket = null;

  function readJson(id, fallback) {
    var node = document.getElementById(id);
    try {
      return node ? JSON.parse(node.textContent) : fallback;
    } catch (e) {
      return fallback;
    }
  }

  // Elements are looked up on every update: htmx may have swapped #task-main since.
  function byId(id) {
    return document.getElementById(id);
  }

  function setLiveState(text) {
    var node = byId("live-state");
    if (node) node.textContent = text;
  }

  function apply(state) {
    var badge = byId("task-status");
    if (badge && state.status) {
      badge.textContent = labels[state.status] || state.status;
      badge.className = "badge badge-large badge-" + state.status;
      badge.setAttribute("data-status", state.status);
    }
    var reason = byId("task-reason");
    if (reason && typeof state.status_reason === "string") {
      reason.textContent = state.status_reason;
      reason.hidden = !state.status_reason;
    }
    if (typeof state.progress === "number") setProgress(state.progress);
    if (state.metrics && typeof state.metrics === "object") renderMetrics(state.metrics);
    if (state.status && cancellable.indexOf(state.status) === -1) {
      var cancel = byId("cancel-form");
      if (cancel) cancel.remove();
    }
  }

  function renderMetrics(metrics) {
    var list = byId("task-metrics");
    var keys = Object.keys(metrics);
    if (!list || keys.length === 0) return;
    list.textContent = "";
    keys.forEach(function (key) {
      var row = document.createElement("div");
      var dt = document.createElement("dt");
      var dd = document.createElement("dd");
      dt.textContent = key;
      dd.textContent = typeof metrics[key] === "number" ? formatValue(metrics[key]) : String(metrics[key]);
      row.appendChild(dt);
      row.appendChild(dd);
      list.appendChild(row);
    });
  }

  // --- Live progress: bar, ETA, one SVG line chart per metric, log tail ---------------
  var MAX_POINTS = 300; // per assignment and chart: halved when exceeded, like the server
  var MAX_LOG_LINES = 200;
  var COLORS = ["#2b50c8", "#b42318", "#146c2e", "#7a4a00", "#6b21a8", "#0b5cad"];
  var SVG_NS = "http://www.w3.org/2000/svg";
  var CHART_W = 320;
  var CHART_H = 120;
  var PAD = 6;

  function createLive(initial) {
    var assignments = {}; // id -> {worker, attempt, state_label, progress, history: [{step, metrics}], index}
    var order = [];

    function sample(entry) {
      var metrics = {};
      Object.keys(entry).forEach(function (key) {
        if (key !== "t" && key !== "step" && typeof entry[key] === "number" && isFinite(entry[key])) {
          metrics[key] = entry[key];
        }
      });
      return { step: entry.step, metrics: metrics };
    }

    function bounded(history) {
      while (history.length > MAX_POINTS) {
        history = history.filter(function (_, i) {
          return i % 2 === 0 || i === history.length - 1;
        });
      }
      return history;
    }

    function load(data) {
      assignments = {};
      order = [];
      (data.assignments || []).forEach(function (a) {
        assignments[a.id] = {
          worker: a.worker,
          attempt: a.attempt,
          state_label: a.state_label,
          progress: a.progress,
          history: bounded((a.history || []).filter(function (e) {
            return e && typeof e.step === "number";
          }).map(sample)),
          index: order.length,
        };
        order.push(a.id);
      });
      var log = byId("task-log");
      if (log) {
        log.textContent = "";
        var lines = [];
        (data.assignments || []).forEach(function (a) {
          lines = lines.concat(a.log_tail || []);
        });
        appendLog(lines);
      }
      renderRows();
      renderCharts();
    }

    function progress(event) {
      var a = assignments[event.assignment_id];
      if (!a) {
        setProgress(event.percent);
        return false;
      }
      a.progress = event.percent;
      var last = a.history[a.history.length - 1];
      var point = { step: event.step, metrics: event.metrics || {} };
      if (last && last.step === event.step) a.history[a.history.length - 1] = point;
      else if (!last || event.step > last.step) a.history.push(point);
      else a.history = [point]; // the run started over (as the stored history does)
      a.history = bounded(a.history);
      setProgress(event.percent);
      var stepNode = byId("task-step");
      if (stepNode) stepNode.textContent = "Step " + event.step + " of " + event.total + ".";
      var eta = byId("task-eta");
      if (eta) eta.textContent = typeof event.eta === "number" ? "About " + formatSeconds(event.eta) + " left." : "";
      if (event.metrics && Object.keys(event.metrics).length) renderMetrics(event.metrics);
      renderRows();
      renderCharts();
      return true;
    }

    function appendLog(lines) {
      var log = byId("task-log");
      if (!log || !lines || !lines.length) return;
      lines.forEach(function (line) {
        var item = document.createElement("li");
        item.textContent = String(line);
        log.appendChild(item);
      });
      while (log.children.length > MAX_LOG_LINES) log.removeChild(log.firstChild);
      log.scrollTop = log.scrollHeight;
    }

    function renderRows() {
      var body = byId("assignment-rows");
      if (!body || !order.length) return;
      body.textContent = "";
      order.forEach(function (id) {
        var a = assignments[id];
        var row = document.createElement("tr");
        row.setAttribute("data-assignment-id", id);
        [a.worker, a.attempt, a.state_label, Math.round(a.progress || 0) + "%"].forEach(function (value, i) {
          var cell = document.createElement("td");
          if (i === 0) {
            var swatch = document.createElement("span");
            swatch.className = "swatch";
            swatch.style.background = COLORS[a.index % COLORS.length];
            swatch.setAttribute("aria-hidden", "true");
            cell.appendChild(swatch);
          }
          if (i === 1 || i === 3) cell.className = "num";
          cell.appendChild(document.createTextNode(String(value)));
          row.appendChild(cell);
        });
        body.appendChild(row);
      });
    }

    function renderCharts() {
      var box = byId("task-charts");
      if (!box) return;
      var names = [];
      order.forEach(function (id) {
        assignments[id].history.forEach(function (p) {
          Object.keys(p.metrics).forEach(function (name) {
            if (names.indexOf(name) === -1) names.push(name);
          });
        });
      });
      box.textContent = "";
      names.forEach(function (name) {
        box.appendChild(chart(name));
      });
    }

    function chart(name) {
      var series = order.map(function (id) {
        var a = assignments[id];
        return {
          color: COLORS[a.index % COLORS.length],
          points: a.history.filter(function (p) {
            return typeof p.metrics[name] === "number";
          }),
        };
      });
      var all = [];
      series.forEach(function (s) {
        all = all.concat(s.points);
      });
      var steps = all.map(function (p) { return p.step; });
      var values = all.map(function (p) { return p.metrics[name]; });
      var x0 = Math.min.apply(null, steps);
      var x1 = Math.max.apply(null, steps);
      var y0 = Math.min.apply(null, values);
      var y1 = Math.max.apply(null, values);
      if (x1 === x0) x1 = x0 + 1;
      if (y1 === y0) { y0 -= 0.5; y1 += 0.5; }
      function sx(step) { return PAD + ((step - x0) / (x1 - x0)) * (CHART_W - 2 * PAD); }
      function sy(value) { return CHART_H - PAD - ((value - y0) / (y1 - y0)) * (CHART_H - 2 * PAD); }

      var figure = document.createElement("figure");
      figure.className = "metric-chart";
      figure.setAttribute("data-metric", name);
      var caption = document.createElement("figcaption");
      var latest = values[values.length - 1];
      caption.textContent = name + ": " + formatValue(latest) + " (range " + formatValue(Math.min.apply(null, values)) +
        " to " + formatValue(Math.max.apply(null, values)) + ")";
      var svg = document.createElementNS(SVG_NS, "svg");
      svg.setAttribute("viewBox", "0 0 " + CHART_W + " " + CHART_H);
      svg.setAttribute("role", "img");
      svg.setAttribute("aria-label", name + " over steps " + Math.min.apply(null, steps) + " to " + Math.max.apply(null, steps));
      var frame = document.createElementNS(SVG_NS, "rect");
      frame.setAttribute("x", "0.5");
      frame.setAttribute("y", "0.5");
      frame.setAttribute("width", String(CHART_W - 1));
      frame.setAttribute("height", String(CHART_H - 1));
      frame.setAttribute("class", "chart-frame");
      svg.appendChild(frame);
      series.forEach(function (s) {
        if (!s.points.length) return;
        var line = document.createElementNS(SVG_NS, "polyline");
        line.setAttribute("points", s.points.map(function (p) {
          return sx(p.step).toFixed(1) + "," + sy(p.metrics[name]).toFixed(1);
        }).join(" "));
        line.setAttribute("stroke", s.color);
        line.setAttribute("class", "chart-line");
        svg.appendChild(line);
        var end = s.points[s.points.length - 1];
        var dot = document.createElementNS(SVG_NS, "circle");
        dot.setAttribute("cx", sx(end.step).toFixed(1));
        dot.setAttribute("cy", sy(end.metrics[name]).toFixed(1));
        dot.setAttribute("r", "3");
        dot.setAttribute("fill", s.color);
        svg.appendChild(dot);
      });
      figure.appendChild(caption);
      figure.appendChild(svg);
      return figure;
    }

    if (initial) load(initial);
    return { load: load, progress: progress, log: appendLog };
  }

  function setProgress(percent) {
    var bar = byId("task-progress");
    var text = byId("task-progress-text");
    var pct = Math.max(0, Math.min(100, percent));
    if (bar) bar.value = pct;
    if (text) text.textContent = Math.round(pct) + "%";
  }

  function formatValue(value) {
    if (typeof value !== "number") return "";
    var abs = Math.abs(value);
    return abs !== 0 && (abs < 0.001 || abs >= 1e6) ? value.toExponential(3) : String(Number(value.toPrecision(4)));
  }

  function formatSeconds(seconds) {
    var s = Math.max(0, Math.round(seconds));
    if (s < 60) return s + " s";
    if (s < 3600) return Math.floor(s / 60) + " min " + (s % 60) + " s";
    return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
  }

  var live = createLive(readJson("task-live-data", null));

  function refresh() {
    if (liveUrl) {
      fetch(liveUrl, { credentials: "same-origin", headers: { Accept: "application/json" } })
        .then(function (response) {
          return response.ok ? response.json() : null;
        })
        .then(function (data) {
          if (data) live.load(data);
        })
        .catch(function () {
          /* offline: the next reconnect tries again */
        });
    }
    fetch(apiUrl, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (response) {
        return response.ok ? response.json() : null;
      })
      .then(function (data) {
        if (data) apply(data);
      })
      .catch(function () {
        /* offline: the next reconnect tries again */
      });
  }

  // The server-rendered parts a status change alters (result, summary, timeline, ledger):
  // fetched again as this page's HTML and swapped in, so they never disagree with the server.
  function redrawSections() {
    fetch(window.location.pathname, { credentials: "same-origin", headers: { Accept: "text/html" } })
      .then(function (response) {
        return response.ok ? response.text() : null;
      })
      .then(function (html) {
        if (!html) return;
        var fresh = new DOMParser().parseFromString(html, "text/html");
        document.querySelectorAll("[data-live-section]").forEach(function (section) {
          var replacement = section.id ? fresh.getElementById(section.id) : null;
          if (replacement) section.innerHTML = replacement.innerHTML;
        });
      })
      .catch(function () {
        /* offline: the next status change or a reload redraws */
      });
  }

  function connect() {
    socket = new WebSocket(wsUrl);
    socket.addEventListener("open", function () {
      var reconnected = attempts > 0;
      attempts = 0;
      setLiveState("Live updates on");
      refresh();
      if (reconnected) redrawSections(); // whatever changed while the socket was down
    });
    socket.addEventListener("message", function (event) {
      var data;
      try {
        data = JSON.parse(event.data);
      } catch (e) {
        return;
      }
      if (data.task_id !== taskId) return;
      if (data.type === "task.status") {
        var badge = byId("task-status");
        var changed = !badge || badge.getAttribute("data-status") !== data.status;
        apply(data);
        if (changed) {
          refresh();
          redrawSections();
        }
      }
      else if (data.type === "task.progress") {
        if (!live.progress(data)) refresh(); // an assignment this page has not seen yet
      } else if (data.type === "task.log") live.log(data.lines);
    });
    socket.addEventListener("close", function (event) {
      // 4403: not ours or signed out; 4401: this browser logged out. Retrying cannot help.
      if (event.code === 4403 || event.code === 4401) {
        setLiveState("");
        return;
      }
      // 4000: the password changed; this browser may still be signed in (the one that
      // changed it, once its new cookie is set): reconnect after a moment, and let the
      // server's session check say.
      if (event.code === 4000) {
        setLiveState("Reconnecting…");
        window.setTimeout(connect, 1500 + Math.random() * 1000);
        return;
      }
      var badge = byId("task-status");
      var status = badge ? badge.getAttribute("data-status") : "";
      if (terminal.indexOf(status) !== -1) {
        setLiveState("");
        return;
      }
      attempts += 1;
      var delay = Math.min(30000, 1000 * Math.pow(2, attempts - 1)) * (0.75 + Math.random() * 0.5);
      setLiveState("Reconnecting…");
      window.setTimeout(connect, delay);
    });
  }

  window.addEventListener("beforeunload", function () {
    if (socket) socket.close();
  });
  connect();
})();
