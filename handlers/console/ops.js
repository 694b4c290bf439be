// Importer operators' page: plain JavaScript, no build step, nothing from elsewhere.
// It reads GET /api/ops/overview every two seconds and acts with the operators'
// routes (POST /api/ops/retry-failed, POST /api/ops/intake). The key lives in this
// tab's sessionStorage only, under its own name (not the producer console's).
"use strict";

(function () {
  const KEY_NAME = "importer.opsKey";
  const REFRESH_MS = 2000;
  const $ = (id) => document.getElementById(id);
  let timer = null;
  let cursor = null;

  function apiKey() { return sessionStorage.getItem(KEY_NAME) || ""; }
  function showError(text) { $("alert").textContent = text; $("alert").hidden = false; }
  function clearError() { $("alert").hidden = true; $("alert").textContent = ""; }
  function announce(text) { $("announce").textContent = text; }

  function describe(status, body) {
    const code = body && body.code ? body.code : "";
    if (status === 401) return "This server does not know this key (" + (code || "auth.required") + "). Forget it and paste an operator key.";
    if (status === 403) return "This key has no ops scope (auth.scope_required): operators' keys are made with importer keys create NAME --scopes ops.";
    if (status === 422 && body && body.fields) {
      return "Not done (request.invalid): " + Object.entries(body.fields).map(([k, v]) => k + ": " + v.join(" ")).join("; ");
    }
    return "The server answered " + status + (code ? " (" + code + ")" : "") + (body && body.detail ? ": " + body.detail : ".");
  }

  async function api(method, path, payload) {
    const headers = { "Authorization": "Bearer " + apiKey() };
    if (payload !== undefined) headers["Content-Type"] = "application/json";
    const response = await fetch(path, {
      method, headers, cache: "no-store", body: payload === undefined ? undefined : JSON.stringify(payload),
    });
    const text = await response.text();
    let body = null;
    try { body = text ? JSON.parse(text) : null; } catch (e) { body = null; }
    return { status: response.status, body };
  }

  function cell(row, text, header) {
    const td = document.createElement(header ? "th" : "td");
    if (header) td.scope = "row";
    td.textContent = text;
    row.appendChild(td);
    return td;
  }

  function seconds(value) {
    if (value === null || value === undefined) return "–";
    return value < 60 ? value.toFixed(1) + " s" : Math.round(value / 60) + " min";
  }

  function failures(tr, counts, location) {
    const td = cell(tr, "");
    const hour = counts.lastHour, day = counts.lastDay;
    const codes = Object.keys(day);
    if (!codes.length) { td.textContent = "none"; return td; }
    for (const code of codes) {
      const line = document.createElement("div");
      line.textContent = code + ": " + (hour[code] || 0) + " (" + day[code] + ") ";
      const button = document.createElement("button");
      button.type = "button";
      button.className = "secondary";
      button.textContent = "Retry " + code + " at " + location;
      button.addEventListener("click", () => retryFailed(location, code, button));
      line.appendChild(button);
      td.appendChild(line);
    }
    return td;
  }

  function render(view) {
    const paused = view.intake.map((p) => p.location === "*" ? "everywhere" : p.location);
    const state = $("intake-state");
    state.textContent = paused.length ? "paused (" + paused.join(", ") + ")" : "running";
    state.className = "badge " + (paused.length ? "failed" : "completed");

    const workers = $("workers-table").querySelector("tbody");
    workers.replaceChildren();
    for (const w of view.workers) {
      const tr = document.createElement("tr");
      cell(tr, w.id, true);
      cell(tr, w.release);
      cell(tr, w.acceptedVersions.join(", "));
      cell(tr, seconds(w.lastBeatAgeSeconds) + " ago");
      cell(tr, String(w.inFlight));
      workers.appendChild(tr);
    }
    $("workers-empty").hidden = view.workers.length > 0;

    const locations = $("locations-table").querySelector("tbody");
    locations.replaceChildren();
    for (const row of view.locations) {
      const tr = document.createElement("tr");
      tr.dataset.location = row.location;
      cell(tr, row.location, true);
      cell(tr, String(row.waiting));
      cell(tr, row.waiting ? seconds(row.oldestWaitingAgeSeconds) : "–");
      cell(tr, String(row.active));
      cell(tr, String(row.retrying));
      cell(tr, String(row.stalls));
      failures(tr, row.failures, row.location);
      cell(tr, row.ledger && row.ledger.behindShipments
        ? "Redis behind the ledger by " + row.ledger.behindShipments + ": being brought forward"
        : row.ledger ? row.ledger.lagEntries + " (" + seconds(row.ledger.lagSeconds) + ")" : view.ledgerUp === null ? "no ledger" : "ledger down");
      cell(tr, row.intakePaused ? "paused" : "running");
      locations.appendChild(tr);
    }
    $("locations-more").hidden = !view.nextCursor;
    $("locations-more").dataset.cursor = view.nextCursor || "";
  }

  async function refresh() {
    if (!apiKey()) return;
    const path = "/api/ops/overview" + (cursor ? "?cursor=" + encodeURIComponent(cursor) : "");
    const [overview, actions] = await Promise.all([api("GET", path), api("GET", "/api/ops/actions?limit=20")]);
    if (overview.status !== 200) { showError(describe(overview.status, overview.body)); $("ops-panels").hidden = true; return; }
    $("ops-panels").hidden = false;
    render(overview.body);
    if (actions.status === 200) {
      const list = $("actions-list");
      list.replaceChildren();
      for (const a of actions.body.items) {
        const li = document.createElement("li");
        li.textContent = a.at + " " + a.by + " " + a.action + " " + JSON.stringify(a.detail);
        list.appendChild(li);
      }
    }
  }

  async function retryFailed(location, code, button) {
    clearError();
    button.disabled = true;
    let retried = 0, answer;
    do {  // bounded pages: go on while the server says more remain
      answer = await api("POST", "/api/ops/retry-failed", { location, errorCode: code, limit: 500 });
      if (answer.status !== 200) { showError(describe(answer.status, answer.body)); break; }
      retried += answer.body.retried.length;
    } while (answer.body.more && answer.body.retried.length);
    button.disabled = false;
    announce("Retried " + retried + " import" + (retried === 1 ? "" : "s") + " that failed with " + code + " at " + location + ".");
    refresh();
  }

  async function setIntake(paused) {
    clearError();
    const answer = await api("POST", "/api/ops/intake", { paused });
    if (answer.status !== 200) { showError(describe(answer.status, answer.body)); return; }
    announce(paused ? "Intake paused everywhere." : "Intake resumed everywhere.");
    refresh();
  }

  function showKeyState() {
    const has = apiKey() !== "";
    $("key-form").hidden = has;
    $("key-set").hidden = !has;
    if (!has) { $("ops-panels").hidden = true; }
    if (timer) clearInterval(timer);
    timer = has ? setInterval(refresh, REFRESH_MS) : null;
    if (has) refresh();
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("key-form").addEventListener("submit", (event) => {
      event.preventDefault();
      sessionStorage.setItem(KEY_NAME, $("key-input").value.trim());
      $("key-input").value = "";
      clearError();
      showKeyState();
    });
    $("key-forget").addEventListener("click", () => { sessionStorage.removeItem(KEY_NAME); clearError(); showKeyState(); });
    $("intake-pause").addEventListener("click", () => setIntake(true));
    $("intake-resume").addEventListener("click", () => setIntake(false));
    $("locations-more").addEventListener("click", () => { cursor = $("locations-more").dataset.cursor || null; refresh(); });
    $("inspect-form").addEventListener("submit", async (event) => {
      event.preventDefault();
      clearError();
      const answer = await api("GET", "/api/ops/imports/" + encodeURIComponent($("inspect-job").value.trim()));
      if (answer.status !== 200) { showError(describe(answer.status, answer.body)); return; }
      $("inspect-out").textContent = JSON.stringify(answer.body, null, 2);
      $("inspect-out").hidden = false;
    });
    showKeyState();
  });
})();
