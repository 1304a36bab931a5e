// The dataset upload form, in parts: the server holds a request's whole body in memory,
// so the file goes up as ordered slices of at most data-part-bytes through
// /api/v1/dataset-uploads/ (marketplace/dataset_uploads.py), with a progress bar. A part
// the server says does not follow (409) resumes from its `received`; a part lost to the
// network or a 5xx is retried with backoff. Without JavaScript (or fetch) the form posts
// the whole file as before.
(function () {
  "use strict";
  const form = document.getElementById("dataset-upload-form");
  if (!form || !window.fetch || !window.Blob || !Blob.prototype.slice) return;
  const partBytes = parseInt(form.dataset.partBytes, 10);
  if (!(partBytes > 0)) return;
  const csrf = form.querySelector("[name=csrfmiddlewaretoken]").value;
  const fileInput = form.elements.file;
  const nameInput = form.elements.name;
  const button = document.getElementById("dataset-upload-submit");
  const box = document.getElementById("upload-progress");
  const bar = document.getElementById("upload-progress-bar");
  const barText = document.getElementById("upload-progress-text");
  const formErrors = document.getElementById("form-errors");
  const RETRIES = 4; // attempts after the first, waiting 0.5, 1, 2, 4 s
  // Where each API error key is shown: next to the input it is about, like the
  // server-rendered form does; anything else goes above the form.
  const SLOT_OF = { file: fileInput, size_bytes: fileInput, filename: fileInput, name: nameInput };

  class Refused extends Error {
    constructor(body) {
      super("refused");
      this.body = body;
    }
  }

  function megabytes(n) {
    return (n / (1024 * 1024)).toFixed(1) + " MB";
  }

  function showProgress(done, total) {
    bar.max = total;
    bar.value = done;
    barText.textContent = `${megabytes(done)} of ${megabytes(total)}`;
  }

  function clearErrors() {
    formErrors.replaceChildren();
    for (const input of [fileInput, nameInput]) {
      if (!input) continue;
      input.removeAttribute("aria-invalid");
      input.closest(".field").classList.remove("has-error");
      document.getElementById(`${input.id}_error`).replaceChildren();
    }
  }

  function say(slot, text) {
    const p = document.createElement("p");
    p.textContent = text;
    slot.append(p);
  }

  function showErrors(body) {
    const entries = body && typeof body === "object" ? Object.entries(body) : [];
    if (!entries.length) entries.push(["non_field_errors", "The upload failed; try again."]);
    for (const [key, value] of entries) {
      if (key === "received") continue;
      const messages = Array.isArray(value) ? value.map(String) : [String(value)];
      const input = SLOT_OF[key];
      if (input) {
        input.setAttribute("aria-invalid", "true");
        input.closest(".field").classList.add("has-error");
        messages.forEach((m) => say(document.getElementById(`${input.id}_error`), m));
      } else {
        const prefix = key === "non_field_errors" || key === "detail" ? "" : `${key}: `;
        messages.forEach((m) => say(formErrors, prefix + m));
      }
    }
  }

  async function call(url, options) {
    const response = await fetch(url, {
      credentials: "same-origin",
      ...options,
      headers: { "X-CSRFToken": csrf, Accept: "application/json", ...(options.headers || {}) },
    });
    const body = await response.json().catch(() => ({}));
    return { status: response.status, body };
  }

  const pause = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

  // One part, retried when the network or the server (5xx, 429) failed, not when it refused.
  async function sendPart(url, file, start) {
    const end = Math.min(file.size, start + partBytes) - 1;
    for (let attempt = 0; ; attempt++) {
      try {
        const answer = await call(url, {
          method: "PUT",
          headers: {
            "Content-Type": "application/octet-stream",
            "Content-Range": `bytes ${start}-${end}/${file.size}`,
          },
          body: file.slice(start, end + 1),
        });
        if (answer.status < 500 && answer.status !== 429) return answer;
      } catch (error) {
        // A network error: the part may or may not have arrived; a retry or a 409 tells.
      }
      if (attempt >= RETRIES) throw new Refused({ detail: "The connection keeps failing; try again later." });
      await pause(500 * 2 ** attempt);
    }
  }

  async function upload(file) {
    const created = await call(form.dataset.api, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ name: nameInput ? nameInput.value : "", filename: file.name, size_bytes: file.size }),
    });
    if (created.status !== 201) throw new Refused(created.body);
    const url = `${form.dataset.api}${created.body.id}/`;
    let received = 0;
    try {
      for (;;) {
        showProgress(received, file.size);
        if (received >= file.size) {
          // Complete already (an answer was lost): the upload names its dataset.
          const state = await call(url, { method: "GET" });
          if (state.status === 200 && state.body.dataset) return state.body.dataset;
          received = 0;
        }
        const { status, body } = await sendPart(url, file, received);
        if (status === 201) return body.id;
        if ((status === 202 || status === 409) && Number.isInteger(body.received)) {
          received = body.received;
        } else {
          throw new Refused(body);
        }
      }
    } catch (error) {
      // Give the unfinished bytes back now rather than when the upload expires.
      fetch(url, { method: "DELETE", credentials: "same-origin", headers: { "X-CSRFToken": csrf } }).catch(() => {});
      throw error;
    }
  }

  form.addEventListener("submit", async (event) => {
    const file = fileInput.files && fileInput.files[0];
    if (!file) return; // the server says the file is required, as without JavaScript
    event.preventDefault();
    clearErrors();
    button.disabled = true;
    box.hidden = false;
    showProgress(0, file.size);
    try {
      const datasetId = await upload(file);
      showProgress(file.size, file.size);
      barText.textContent = "Uploaded.";
      // The list again, with the message a plain form post would have shown.
      window.location.assign(form.dataset.doneUrl + encodeURIComponent(datasetId));
    } catch (error) {
      box.hidden = true;
      showErrors(error instanceof Refused ? error.body : { detail: "The upload failed; try again." });
      button.disabled = false;
    }
  });
})();
