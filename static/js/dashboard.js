// Provider pages and "My tasks": confirm destructive buttons (retire), and follow
// /ws/dashboard/ so worker status badges and task status / progress change live. The
// feed is advisory: a reload shows the truth.
(function () {
  "use strict";

  document.addEventListener("submit", function (event) {
    var form = event.target.closest("form[data-confirm]");
    if (form && !window.confirm(form.getAttribute("data-confirm"))) event.preventDefault();
  });

  var liveNode = document.getElementById("dashboard-live");
  if (!liveNode || !("WebSocket" in window)) return;
  var wsUrl = (location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/ws/dashboard/";
  var attempts = 0;
  var socket = null;

  function applyWorker(event) {
    var row = document.querySelector('[data-worker-id="' + String(event.worker_id).replace(/[^0-9a-f-]/gi, "") + '"]');
    var badge = row ? row.querySelector("[data-worker-status]") : null;
    if (!badge || typeof event.status !== "string") return;
    badge.textContent = event.status.charAt(0).toUpperCase() + event.status.slice(1);
    badge.className = "badge worker-status worker-status-" + event.status;
    badge.setAttribute("data-worker-status", event.status);
  }

  function applyTask(event) {
    var row = document.querySelector('[data-task-id="' + String(event.task_id).replace(/[^0-9a-f-]/gi, "") + '"]');
    if (!row) return;
    var badge = row.querySelector("[data-task-status]");
    if (badge && typeof event.status === "string" && typeof event.status_label === "string") {
      badge.textContent = event.status_label;
      badge.className = "badge badge-" + event.status.replace(/[^a-z_]/g, "");
      badge.setAttribute("data-task-status", event.status);
    }
    var progress = row.querySelector("[data-task-progress]");
    if (progress && typeof event.progress === "number") progress.textContent = Math.round(event.progress) + "%";
  }

  function connect() {
    socket = new WebSocket(wsUrl);
    socket.addEventListener("open", function () {
      attempts = 0;
      liveNode.textContent = "Live updates on.";
    });
    socket.addEventListener("message", function (message) {
      var data;
      try {
        data = JSON.parse(message.data);
      } catch (e) {
        return;
      }
      if (data.type === "dashboard.worker") applyWorker(data);
      else if (data.type === "dashboard.task") applyTask(data);
    });
    socket.addEventListener("close", function (event) {
      // 4403: signed out or deactivated; 4401: this browser logged out. Retrying cannot help.
      if (event.code === 4403 || event.code === 4401) {
        liveNode.textContent = "";
        return;
      }
      // 4000: the password changed; this browser may still be signed in (the one that
      // changed it, once its new cookie is set): reconnect after a moment, and let the
      // server's session check say.
      if (event.code === 4000) {
        liveNode.textContent = "Reconnecting…";
        window.setTimeout(connect, 1500 + Math.random() * 1000);
        return;
      }
      attempts += 1;
      liveNode.textContent = "Reconnecting…";
      var delay = Math.min(30000, 1000 * Math.pow(2, attempts - 1)) * (0.75 + Math.random() * 0.5);
      window.setTimeout(connect, delay);
    });
  }

  window.addEventListener("beforeunload", function () {
    if (socket) socket.close();
  });
  connect();
})();
