// Live task status: a WebSocket on /ws/tasks/<id>/ pushes "task.status", "task.progress"
// and "task.log" events; after every (re)connect the page re-reads /api/v1/tasks/<id>/
// and the assignments' live.json so nothing missed while disconnected stays stale. The
// ledger section, whose rows are sealed into blocks without a task event, is re-read
// while a row is pending.
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
  var LIVE_ASSIGNMENTS = ["offered", "running"]; // a worker holds the job and should be heard from
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
    if (state.status) settleStep(state.status);
    if (state.metrics && typeof state.metrics === "object") renderMetrics(state.metrics);
    if (state.status && cancellable.indexOf(state.status) === -1) {
      var cancel = byId("cancel-form");
      if (cancel) cancel.remove();
    }
  }

  function currentStatus() {
    var badge = byId("task-status");
    return badge ? badge.getAttribute("data-status") || "" : "";
  }

  // The step and the time left describe the run in hand: none once the task is finished,
  // and no time left once the work is done (verifying) or went back to waiting (open).
  function settleStep(status) {
    var done = terminal.indexOf(status) !== -1;
    var stepNode = byId("task-step");
    var eta = byId("task-eta");
    if (stepNode && (done || status === "open")) stepNode.textContent = "";
    if (eta && (done || status === "open" || status === "verifying")) eta.textContent = "";
  }

  function showStep(event) {
    var status = currentStatus();
    if (terminal.indexOf(status) !== -1) return; // a late report of a finished run
    var stepNode = byId("task-step");
    if (stepNode) stepNode.textContent = "Step " + event.step + " of " + event.total + ".";
    var eta = byId("task-eta");
    var left = typeof event.eta === "number" && event.step < event.total && status !== "verifying";
    if (eta) eta.textContent = left ? "About " + formatSeconds(event.eta) + " left." : "";
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

  // --- Live progress: bar, ETA, metric charts (metric_charts.js), the worker log ---------
  var MAX_POINTS = 300; // per assignment and chart: halved when exceeded, like the server
  var MAX_LOG_LINES = 10000; // per assignment: as many as the server keeps (workers.live.log)
  var LOG_PAGE = 2000; // lines per read of log.json

  // An assignment's colour: its training line's on the charts, and its row's swatch.
  function colorOf(index) {
    return window.MetricCharts ? window.MetricCharts.colour(index, false) : "#2b50c8";
  }

  function createLive(initial) {
    // id -> {worker, attempt, state, state_label, progress, history: [{step, metrics}], lines, heardAt, index}
    var assignments = {};
    var order = [];
    var strays = {}; // log lines of an assignment live.json has not listed yet: id -> lines
    var skew = 0; // the server's clock minus this browser's, in ms
    var silentAfter = 0; // seconds; 0: never say
    var hinted = false; // whether a row says how long its worker has been silent

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

    function serverNow() {
      return Date.now() + skew;
    }

    // The stored state replaces this page's, except for the log lines: the stored tail may
    // not hold the newest lines the page already shows (the server buffers them before it
    // writes them), so each assignment's lines are merged, never replaced.
    function load(data) {
      var previous = assignments;
      var now = Date.parse(data.now);
      if (!isNaN(now)) skew = now - Date.now();
      if (typeof data.silent_after === "number") silentAfter = data.silent_after;
      assignments = {};
      order = [];
      (data.assignments || []).forEach(function (a) {
        var shown = previous[a.id] ? previous[a.id].lines : [];
        if (strays[a.id]) {
          shown = shown.concat(strays[a.id]);
          delete strays[a.id];
        }
        var heard = Date.parse(a.heard_at);
        var before = previous[a.id] ? previous[a.id].heardAt : 0;
        assignments[a.id] = {
          worker: a.worker,
          attempt: a.attempt,
          state: a.state,
          state_label: a.state_label,
          progress: a.progress,
          history: bounded((a.history || []).filter(function (e) {
            return e && typeof e.step === "number";
          }).map(sample)),
          lines: mergeLines((a.log_tail || []).map(String), shown),
          logCount: typeof a.log_count === "number" ? a.log_count : 0,
          fullLog: previous[a.id] ? previous[a.id].fullLog : false,
          heardAt: Math.max(isNaN(heard) ? 0 : heard, before || 0),
          index: order.length,
        };
        order.push(a.id);
      });
      var unnamed = strays[""]; // lines that came before any assignment was known
      if (unnamed && order.length) {
        var newest = assignments[order[order.length - 1]];
        newest.lines = mergeLines(newest.lines, unnamed);
        delete strays[""];
      }
      renderLog();
      renderRows();
      renderCharts();
      order.forEach(readFullLog);
    }

    // The lines of an assignment's log before the stored tail: read once from log.json,
    // page by page, then merged with what the page shows like a stored tail is.
    function readFullLog(id) {
      var a = assignments[id];
      var url = logUrl();
      if (!a || !url || a.fullLog || a.logCount <= a.lines.length) return;
      a.fullLog = true;
      var lines = [];
      function next(after) {
        var query = "?assignment=" + encodeURIComponent(id) + "&after=" + after + "&limit=" + LOG_PAGE;
        return fetch(url + query, { credentials: "same-origin", headers: { Accept: "application/json" } })
          .then(function (response) {
            return response.ok ? response.json() : null;
          })
          .then(function (page) {
            if (!page) throw new Error("log.json");
            page.lines.forEach(function (pair) {
              lines.push(String(pair[1]));
            });
            if (page.first > 1) noteDropped(a, page.first - 1);
            if (page.next !== null && lines.length < MAX_LOG_LINES) return next(page.next);
            var current = assignments[id];
            if (!current) return;
            current.lines = mergeLines(lines, current.lines);
            renderLog();
          });
      }
      next(0).catch(function () {
        a.fullLog = false; // the next reconnect tries again
      });
    }

    function noteDropped(a, count) {
      var note = byId("log-note");
      if (!note) return;
      note.textContent = "The oldest " + count + " lines of " + a.worker + "'s log (attempt " + a.attempt +
        ") are not kept: a job keeps its newest lines only.";
      note.hidden = false;
    }

    // Two windows onto one worker's append-only stream of lines: the stored tail, which
    // lags while lines wait in the server's buffer, and the lines this page shows, which
    // lack those sent while its socket was down. Their union, in order, without repeats.
    function mergeLines(stored, shown) {
      if (!shown.length) return stored.slice(-MAX_LOG_LINES);
      if (!stored.length) return shown.slice(-MAX_LOG_LINES);
      if (startsWith(shown, stored)) return shown.slice(-MAX_LOG_LINES); // not all written yet
      if (startsWith(stored, shown)) return stored.slice(-MAX_LOG_LINES); // some missed here
      // Both windows slid (each keeps the last lines only): where in the shown lines does
      // the stored tail end? Before the overlap the shown lines are older than the stored
      // ones (read earlier from the full log), after it newer.
      for (var end = shown.length; end > 0; end--) {
        var k = Math.min(end, stored.length);
        if (sameLines(stored, stored.length - k, shown, end - k, k)) {
          return shown.slice(0, end - k).concat(stored, shown.slice(end)).slice(-MAX_LOG_LINES);
        }
      }
      // The shown lines have a gap (the socket dropped, then came back with newer lines):
      // anchor on the stored tail's last line, where the shown lines hold it, and keep what
      // the page showed after it.
      var last = stored[stored.length - 1];
      for (var at = shown.length - 1; at >= 0; at--) {
        if (shown[at] === last) return stored.concat(shown.slice(at + 1)).slice(-MAX_LOG_LINES);
      }
      return stored.slice(-MAX_LOG_LINES); // no overlap: the stored tail is the newer one
    }

    function startsWith(lines, prefix) {
      return prefix.length <= lines.length && sameLines(lines, 0, prefix, 0, prefix.length);
    }

    function sameLines(a, i, b, j, n) {
      for (var x = 0; x < n; x++) {
        if (a[i + x] !== b[j + x]) return false;
      }
      return true;
    }

    function renderLog() {
      var log = byId("task-log");
      if (!log) return;
      var lines = [];
      order.forEach(function (id) {
        lines = lines.concat(assignments[id].lines);
      });
      Object.keys(strays).forEach(function (id) {
        lines = lines.concat(strays[id]);
      });
      log.textContent = "";
      appendLines(lines);
    }

    function logUrl() {
      var panel = byId("log-panel");
      return panel ? panel.getAttribute("data-log-url") : "";
    }

    function progress(event) {
      var a = assignments[event.assignment_id];
      if (!a) {
        setProgress(event.percent);
        return false;
      }
      a.progress = event.percent;
      a.heardAt = serverNow();
      var last = a.history[a.history.length - 1];
      var point = { step: event.step, metrics: event.metrics || {} };
      if (last && last.step === event.step) a.history[a.history.length - 1] = point;
      else if (!last || event.step > last.step) a.history.push(point);
      else a.history = [point]; // the run started over (as the stored history does)
      a.history = bounded(a.history);
      setProgress(event.percent);
      showStep(event);
      if (event.metrics && Object.keys(event.metrics).length) renderMetrics(event.metrics);
      renderRows();
      renderCharts();
      return true;
    }

    // Lines from the socket: kept with their assignment (for the next merge) and shown.
    // Returns false for an assignment this page has not seen yet.
    function appendLog(event) {
      var lines = (Array.isArray(event.lines) ? event.lines : []).map(String);
      if (!lines.length) return true;
      // A server that does not name the assignment: the newest one is the likeliest.
      var id = event.assignment_id || order[order.length - 1] || "";
      var a = assignments[id];
      if (a) {
        a.lines = a.lines.concat(lines).slice(-MAX_LOG_LINES);
        a.heardAt = serverNow();
      } else {
        strays[id] = (strays[id] || []).concat(lines).slice(-MAX_LOG_LINES);
      }
      appendLines(lines);
      return Boolean(a);
    }

    // New lines go at the end; the box follows them unless its reader scrolled up.
    function appendLines(lines) {
      var log = byId("task-log");
      if (!log || !lines || !lines.length) return;
      var following = log.scrollHeight - log.scrollTop - log.clientHeight < 24;
      var query = logQuery();
      var fragment = document.createDocumentFragment();
      lines.forEach(function (line) {
        var item = document.createElement("li");
        item.textContent = String(line);
        if (query) item.hidden = !matches(item.textContent, query);
        fragment.appendChild(item);
      });
      log.appendChild(fragment);
      var limit = MAX_LOG_LINES * Math.max(1, order.length);
      while (log.children.length > limit) log.removeChild(log.firstChild);
      if (following) log.scrollTop = log.scrollHeight;
      countMatches();
    }

    function renderRows() {
      var body = byId("assignment-rows");
      if (!body || !order.length) return;
      body.textContent = "";
      hinted = false;
      order.forEach(function (id) {
        var a = assignments[id];
        if (silence(a)) hinted = true;
        var row = document.createElement("tr");
        row.setAttribute("data-assignment-id", id);
        [a.worker, a.attempt, a.state_label + silenceNote(a), Math.round(a.progress || 0) + "%"].forEach(function (value, i) {
          var cell = document.createElement("td");
          if (i === 0) {
            var swatch = document.createElement("span");
            swatch.className = "swatch";
            swatch.style.background = colorOf(a.index);
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

    // Seconds since a worker holding the job was last heard from, once past silent_after.
    function silence(a) {
      if (!silentAfter || !a.heardAt || LIVE_ASSIGNMENTS.indexOf(a.state) === -1) return 0;
      var seconds = (serverNow() - a.heardAt) / 1000;
      return seconds > silentAfter ? seconds : 0;
    }

    function silenceNote(a) {
      var seconds = silence(a);
      return seconds ? " · last heard from " + formatSeconds(seconds) + " ago" : "";
    }

    // Whether a worker holding the job has gone quiet; the rows are redrawn to say so (or
    // to stop saying so).
    function quiet() {
      var any = order.some(function (id) {
        return silence(assignments[id]) > 0;
      });
      if (any || hinted) renderRows();
      return any;
    }

    // Redrawn at most once a frame, however many progress events come.
    var chartFrame = 0;

    function renderCharts() {
      if (chartFrame) return;
      chartFrame = window.requestAnimationFrame(function () {
        chartFrame = 0;
        drawCharts();
      });
    }

    function drawCharts() {
      var box = byId("task-charts");
      if (!box || !window.MetricCharts) return;
      var runs = order.map(function (id) {
        var a = assignments[id];
        return { label: a.worker + " (attempt " + a.attempt + ")", index: a.index, history: a.history };
      });
      var count = window.MetricCharts.render(box, runs, smoothing());
      var controls = byId("chart-controls");
      if (controls) controls.hidden = !count;
    }

    if (initial) load(initial);
    return { load: load, progress: progress, log: appendLog, quiet: quiet, redraw: drawCharts };
  }

  // The charts' smoothing weight, 0 to 0.99 (the slider of the charts' partial).
  function smoothing() {
    var input = byId("chart-smoothing");
    var value = input ? Number(input.value) : 0;
    return isFinite(value) ? Math.max(0, Math.min(0.99, value)) : 0;
  }

  // --- Log search: filters the lines loaded, and says how many match ------------------
  function logQuery() {
    var input = byId("log-search");
    return input ? input.value.trim().toLowerCase() : "";
  }

  function matches(text, query) {
    return text.toLowerCase().indexOf(query) !== -1;
  }

  function filterLog() {
    var log = byId("task-log");
    if (!log) return;
    var query = logQuery();
    Array.prototype.forEach.call(log.children, function (item) {
      item.hidden = Boolean(query) && !matches(item.textContent, query);
    });
    countMatches();
  }

  function countMatches() {
    var log = byId("task-log");
    var out = byId("log-matches");
    if (!log || !out) return;
    var total = log.children.length;
    if (!logQuery()) {
      out.textContent = total === 1 ? "1 line" : total + " lines";
      return;
    }
    var shown = 0;
    Array.prototype.forEach.call(log.children, function (item) {
      if (!item.hidden) shown += 1;
    });
    out.textContent = shown + " of " + total + (total === 1 ? " line matches" : " lines match");
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

  // The controls are found through the document: htmx may swap #task-main, and with it them.
  document.addEventListener("input", function (event) {
    var target = event.target;
    if (!target || !target.id) return;
    if (target.id === "chart-smoothing") {
      var out = byId("chart-smoothing-value");
      if (out) out.textContent = Number(target.value).toFixed(2);
      live.redraw();
    } else if (target.id === "log-search") {
      filterLog();
    }
  });
  countMatches();

  var liveReadAt = 0;

  function refreshLive() {
    if (!liveUrl) return;
    liveReadAt = Date.now();
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

  function refresh() {
    refreshLive();
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

  // The server-rendered parts a status change alters (metrics, result, summary, timeline,
  // ledger): fetched again as this page's HTML and swapped in, so they never disagree with
  // the server. ``only``: the ids of the sections to swap (all of them if left out).
  function redrawSections(only) {
    return fetch(window.location.pathname, { credentials: "same-origin", headers: { Accept: "text/html" } })
      .then(function (response) {
        return response.ok ? response.text() : null;
      })
      .then(function (html) {
        if (!html) return;
        var fresh = new DOMParser().parseFromString(html, "text/html");
        document.querySelectorAll("[data-live-section]").forEach(function (section) {
          if (only && only.indexOf(section.id) === -1) return;
          var replacement = section.id ? fresh.getElementById(section.id) : null;
          if (!replacement) return;
          section.innerHTML = replacement.innerHTML;
          if (replacement.hasAttribute("data-pending")) {
            section.setAttribute("data-pending", replacement.getAttribute("data-pending"));
          }
        });
      })
      .catch(function () {
        /* offline: the next status change or a reload redraws */
      })
      .then(function () {
        watchLedger(!only);
      });
  }

  // A block seals the task's pending transactions without a word to its socket, so while
  // the ledger section shows one pending it is read again: first after about a block time,
  // then less often (up to LEDGER_POLL_MAX_MS) should no block come; never while the tab
  // is hidden, and not at all once every row is sealed.
  var LEDGER_POLL_MAX_MS = 60000;
  var ledgerTimer = null;
  var ledgerDelay = 0;

  function watchLedger(fresh) {
    var section = byId("task-ledger");
    if (ledgerTimer) window.clearTimeout(ledgerTimer);
    ledgerTimer = null;
    if (!section || section.getAttribute("data-pending") !== "true") {
      ledgerDelay = 0;
      return;
    }
    var base = 1000 * (Number(section.getAttribute("data-poll-seconds")) || 5);
    ledgerDelay = fresh || !ledgerDelay ? base : Math.min(LEDGER_POLL_MAX_MS, Math.round(ledgerDelay * 1.5));
    ledgerTimer = window.setTimeout(function () {
      ledgerTimer = null;
      if (document.hidden) return; // visibilitychange starts it again
      redrawSections(["task-ledger"]);
    }, ledgerDelay);
  }

  document.addEventListener("visibilitychange", function () {
    if (!document.hidden && !ledgerTimer) watchLedger(true);
  });
  // The cancel form swaps #task-main (htmx): its ledger section may show a pending refund.
  document.addEventListener("htmx:afterSwap", function () {
    watchLedger(true);
  });

  // A worker that holds the job but has gone quiet (killed, or cut off) looks alive until
  // its job expires: the rows say how long it has been silent. Its heartbeats reach the
  // server, not this page, so while one is quiet live.json is read again now and then.
  // Not while the tab is hidden, and less often the longer the silence lasts.
  var QUIET_CHECK_MS = 5000;
  var QUIET_READ_MS = 10000;
  var QUIET_READ_MAX_MS = 60000;
  var quietReadMs = QUIET_READ_MS;
  window.setInterval(function () {
    if (!live.quiet()) {
      quietReadMs = QUIET_READ_MS;
      return;
    }
    if (document.hidden || Date.now() - liveReadAt <= quietReadMs) return;
    quietReadMs = Math.min(QUIET_READ_MAX_MS, quietReadMs * 2);
    refreshLive();
  }, QUIET_CHECK_MS);

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
      } else if (data.type === "task.log") {
        if (!live.log(data)) refreshLive(); // likewise
      }
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
  watchLedger(true);
  connect();
})();
