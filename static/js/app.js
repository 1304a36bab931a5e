// Small page helpers shared by every page. No dependencies.
(function () {
  "use strict";

  // "Copy" buttons: data-copy holds a selector of the element whose text to copy.
  document.addEventListener("click", function (event) {
    var button = event.target.closest("[data-copy]");
    if (!button) return;
    var source = document.querySelector(button.getAttribute("data-copy"));
    if (!source || !navigator.clipboard) return;
    navigator.clipboard.writeText(source.textContent.trim()).then(function () {
      button.textContent = "Copied";
    });
  });

  // Copy buttons beside hashes and addresses: data-copy-text holds the whole value. They
  // are rendered hidden, so a page without scripts (or without a clipboard) shows only the
  // value as plain text.
  function showCopyButtons() {
    if (!navigator.clipboard) return;
    document.querySelectorAll("button[data-copy-text][hidden]").forEach(function (button) {
      button.hidden = false;
    });
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", showCopyButtons);
  } else {
    showCopyButtons();
  }
  document.addEventListener("click", function (event) {
    var button = event.target.closest("[data-copy-text]");
    if (!button || !navigator.clipboard) return;
    navigator.clipboard.writeText(button.getAttribute("data-copy-text")).then(function () {
      button.textContent = "Copied";
      setTimeout(function () { button.textContent = "Copy"; }, 1500);
    });
  });

  // The header's menu button (narrow screens): it shows and hides the links and the
  // session; Escape folds it again and gives the focus back to the button.
  function setMenu(button, open) {
    button.setAttribute("aria-expanded", open ? "true" : "false");
    var menu = document.getElementById(button.getAttribute("aria-controls"));
    if (menu) menu.classList.toggle("is-open", open);
  }
  document.addEventListener("click", function (event) {
    var button = event.target.closest(".nav-toggle");
    if (!button) return;
    setMenu(button, button.getAttribute("aria-expanded") !== "true");
  });
  document.addEventListener("keydown", function (event) {
    if (event.key !== "Escape") return;
    var button = document.querySelector('.nav-toggle[aria-expanded="true"]');
    if (!button) return;
    setMenu(button, false);
    button.focus();
  });

  // htmx refreshes error slots in place; keep aria-invalid on their inputs in step,
  // so assistive tech and the red outline agree with the message. A field refused inside
  // a closed <details> ("Advanced") opens it, so the message is never hidden.
  document.addEventListener("htmx:oobAfterSwap", function (event) {
    var slot = event.detail.target;
    if (!slot || !slot.id || slot.id.slice(-6) !== "_error") return;
    var input = document.getElementById(slot.id.slice(0, -6));
    if (!input) return;
    if (slot.textContent.trim()) {
      input.setAttribute("aria-invalid", "true");
      var section = slot.closest("details");
      if (section) section.open = true;
    } else {
      input.removeAttribute("aria-invalid");
    }
  });

  // An error summary (a refused form) takes the focus when the page loads, so screen
  // readers read it first; each of its links focuses its field (opening a closed
  // <details> around it) rather than only scrolling to it.
  function focusErrorSummary() {
    var summary = document.querySelector("[data-focus-on-load]");
    if (summary) summary.focus();
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", focusErrorSummary);
  } else {
    focusErrorSummary();
  }
  document.addEventListener("click", function (event) {
    var link = event.target.closest("a[data-field]");
    if (!link) return;
    var input = document.getElementById(link.getAttribute("data-field"));
    if (!input) return;
    event.preventDefault();
    var section = input.closest("details");
    if (section) section.open = true;
    var field = input.closest(".field") || input;
    field.scrollIntoView({ block: "start" });
    input.focus({ preventScroll: true });
  });
})();
