// Importer console: plain JavaScript, no build step, nothing from elsewhere.
//
// The API key lives in this tab's sessionStorage only and is sent only in the
// Authorization header. The live stream of a job is read with fetch() and a
// ReadableStream, not EventSource: EventSource cannot send an Authorization
// header, and putting the key in the URL would leak it into logs and history.
"use strict";

(function () {
  const KEY_NAME = "importer.apiKey";
  const FINAL = new Set(["completed", "failed"]);
  const LIST_REFRESH_MS = 5000;
  const $ = (id) => document.getElementById(id);

  let following = null;      // {jobId, abort: AbortController, record}
  let listCursor = null;
  let listTimer = null;
  let listExpanded = false;  // "Show more" was used: the timer leaves the list alone

  // -- key ---------------------------------------------------------------
  function apiKey() { return sessionStorage.getItem(KEY_NAME) || ""; }

  function showKeyState() {
    const has = apiKey() !== "";
    $("key-form").hidden = has;
    $("key-set").hidden = !has;
    $("send-section").hidden = !has;
    $("list-section").hidden = !has;
    if (!has) { $("job-section").hidden = true; stopFollowing(); stopListTimer(); }
  }

  // -- messages ------------------------------------------------------------
  function showError(text) {
    const box = $("alert");
    box.textContent = text;
    box.hidden = false;
  }
  function clearError() { $("alert").hidden = true; $("alert").textContent = ""; }
  function announce(text) { $("announce").textContent = text; }

  function retryAfter(headers) {
    const value = parseInt(headers.get("Retry-After") || "", 10);
    return Number.isFinite(value) ? value : null;
  }

  // One clear sentence per answer a person can get.
  // RFC 9530 Content-Digest of an upload: the server refuses a body that
  // arrived cut or changed. crypto.subtle exists only in a secure context
  // (https, or http on localhost); elsewhere the upload goes without it
  // (a browser always sends Content-Length, which the server checks).
  async function contentDigest(bytes) {
    if (!(window.crypto && window.crypto.subtle)) return {};
    const hash = new Uint8Array(await window.crypto.subtle.digest("SHA-256", bytes));
    let binary = "";
    for (const byte of hash) binary += String.fromCharCode(byte);
    return { "Content-Digest": "sha-256=:" + btoa(binary) + ":" };
  }

  function describe(status, body, headers) {
    const code = body && body.code ? body.code : "";
    const wait = retryAfter(headers);
    switch (status) {
      case 401: return code === "auth.invalid"
        ? "This server does not know this key (auth.invalid). Paste the key it gave you (importer dev prints it at start) with \"Forget the key\"."
        : "The API key was refused (auth.required). Check the key, or paste a new one with \"Forget the key\".";
      case 404: return code === "rejections.not_found"
        ? "This import has no rejection report (rejections.not_found): only an import that failed CSV validation has one."
        : code === "location.not_found"
        ? "Your API key cannot send shipments to this location (location.not_found). Check the location; when it is empty, the server's default location is used."
        : "That import was not found (job.not_found): it is not yours, or retention removed its record.";
      case 409: return code === "job.not_retryable"
        ? "This import cannot be retried (job.not_retryable). " + (body && body.detail ? body.detail : "")
        : "This batchId is already used for other content, or by another producer (batch.conflict). Choose a new batchId.";
      case 413: return "The file is larger than the server accepts (request.too_large). Split it into smaller files, each with its own batchId.";
      case 415: return "The server did not accept the file type (request.unsupported_media_type).";
      case 422: {
        const fields = body && body.fields ? Object.entries(body.fields).map(([k, v]) => k + ": " + v.join(" ")).join("; ") : "";
        return "The request is not valid (request.invalid)" + (fields ? ": " + fields : ".");
      }
      case 429: return "Too many imports sent in a short time (request.rate_limited). Wait " + (wait || 1) + " second" + (wait === 1 ? "" : "s") + ", then send again.";
      case 503: return code === "intake.paused"
        ? "Operators paused new shipments for a while (intake.paused). Nothing was recorded: send the same file again in " + (wait || 30) + " seconds; your batchId is still yours."
        : code === "service.busy"
        ? "The server holds as many live streams as it allows (service.busy); this page checks the import every second instead."
        : "The service is unavailable right now (service.unavailable). Try again in " + (wait || 5) + " seconds.";
      default: return "The server answered " + status + (code ? " (" + code + ")" : "") + (body && body.detail ? ": " + body.detail : ".");
    }
  }

  // -- HTTP ------------------------------------------------------------------
  async function api(method, path, options) {
    const opts = options || {};
    const headers = Object.assign({ "Authorization": "Bearer " + apiKey() }, opts.headers || {});
    const response = await fetch(path, { method, headers, body: opts.body, signal: opts.signal, cache: "no-store" });
    if (opts.raw) return response;
    let body = null;
    const text = await response.text();
    try { body = text ? JSON.parse(text) : null; } catch (e) { body = null; }
    if (response.status === 401) onUnauthorized();
    return { status: response.status, body, headers: response.headers };
  }

  function onUnauthorized() {
    showError(describe(401, null, new Headers()));
  }

  // -- send ------------------------------------------------------------------
  function suggestBatchId(name) {
    let id = name.replace(/\.[^.]*$/, "").replace(/[^A-Za-z0-9._-]+/g, "-").replace(/^[^A-Za-z0-9]+/, "");
    return id.slice(0, 64);
  }

  // Several files: one bulk request (POST /api/imports/bulk), each named after its file.
  async function sendMany(files, location) {
    const lines = [];
    for (const file of files) {
      const item = { batchId: suggestBatchId(file.name), csv: await file.text() };
      if (location) item.location = location;
      lines.push(JSON.stringify(item));
    }
    const answer = await api("POST", "/api/imports/bulk",
      { body: lines.join("\n") + "\n", headers: { "Content-Type": "application/x-ndjson" } });
    if (answer.status !== 200) { showError(describe(answer.status, answer.body, answer.headers)); return; }
    const list = $("send-many");
    list.replaceChildren();
    let accepted = 0;
    answer.body.results.forEach((result, i) => {
      const li = document.createElement("li");
      if (result.status === 202) {
        accepted += 1;
        li.textContent = files[i].name + ": 202 Accepted, job " + result.body.jobId + " (" + result.body.state + ")";
      } else {
        li.textContent = files[i].name + ": " + describe(result.status, result.body, new Headers());
      }
      list.appendChild(li);
    });
    list.hidden = false;
    const summary = accepted + " of " + files.length + " files accepted.";
    $("send-result").hidden = false;
    $("send-result").textContent = summary;
    announce(summary);
    loadList();
  }

  async function send(event) {
    event.preventDefault();
    clearError();
    $("send-many").hidden = true;
    const files = Array.from($("file-input").files);
    if (files.length > 1) {
      const where = $("location-input").value.trim();
      if (where && !/^[a-z0-9][a-z0-9_-]{0,31}$/.test(where)) {
        showError("The location must be 1-32 lowercase letters, digits, '_' or '-', starting with a letter or digit (or empty: the default location).");
        return;
      }
      $("send-button").disabled = true;
      try { await sendMany(files, where); } catch (err) {
        showError("The server could not be reached. Check your connection and try again.");
      } finally { $("send-button").disabled = false; }
      return;
    }
    const file = files[0];
    const batchId = $("batch-input").value.trim();
    const location = $("location-input").value.trim();
    if (!file) { showError("Choose a CSV file first."); $("file-input").focus(); return; }
    if (!/^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/.test(batchId)) {
      showError("The batchId must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit.");
      $("batch-input").focus();
      return;
    }
    if (location && !/^[a-z0-9][a-z0-9_-]{0,31}$/.test(location)) {
      showError("The location must be 1-32 lowercase letters, digits, '_' or '-', starting with a letter or digit (or empty: the default location).");
      $("location-input").focus();
      return;
    }
    const button = $("send-button");
    button.disabled = true;
    try {
      const body = await file.arrayBuffer();
      const query = "?batchId=" + encodeURIComponent(batchId) + (location ? "&location=" + encodeURIComponent(location) : "");
      const answer = await api("POST", "/api/imports" + query,
        { body, headers: { "Content-Type": "text/csv", ...(await contentDigest(body)) } });
      if (answer.status !== 202) { showError(describe(answer.status, answer.body, answer.headers)); return; }
      const result = $("send-result");
      result.hidden = false;
      result.textContent = "202 Accepted: job " + answer.body.jobId + " (batch " + answer.body.batchId + " at " + answer.body.location + ", " + answer.body.state + ").";
      announce("Accepted: " + answer.body.jobId);
      follow(answer.body.jobId);
      loadList();
    } catch (err) {
      showError("The server could not be reached. Check your connection and try again.");
    } finally {
      button.disabled = false;
    }
  }

  // -- one import, live --------------------------------------------------------
  function stopFollowing() {
    if (following) { following.abort.abort(); following = null; }
  }

  function applyEvent(record, ev) {
    const r = Object.assign({}, record);
    r.attempt = ev.attempt;
    switch (ev.event) {
      case "waiting":
        r.state = "waiting";
        if (ev.data && ev.data.retry) {  // its owner retried it: a new attempt chain
          r.retries = ev.data.retry; r.retryable = false; r.progress = null; r.result = null; r.error = null;
        }
        break;
      case "active": r.state = "active"; r.progress = null; r.error = null; break;
      case "progress": r.state = r.state === "waiting" ? "active" : r.state; r.progress = ev.data; break;
      case "retrying": r.state = "retrying"; r.error = ev.data; break;
      case "completed": r.state = "completed"; r.result = ev.data; r.error = null; break;
      case "failed": r.state = "failed"; r.error = ev.data; break;
    }
    return r;
  }

  function renderSteps(record) {
    const phase = record.progress ? record.progress.phase : null;
    const rows = record.progress ? record.progress.rows : null;
    const reached = {
      waiting: true,
      active: record.state !== "waiting",
      validated: phase === "validated" || phase === "committed" || record.state === "completed",
      committed: phase === "committed" || record.state === "completed",
    };
    const steps = [
      ["waiting", "waiting", reached.waiting],
      ["active", "active", reached.active],
      ["validated", "validated" + (rows !== null ? " (" + rows + " rows)" : ""), reached.validated],
      ["committed", "committed", reached.committed],
    ];
    if (record.state === "failed") steps.push(["failed", "failed", true]);
    else if (record.state === "retrying") steps.push(["retrying", "retrying", true]);
    else steps.push(["completed", "completed", record.state === "completed"]);
    const list = $("job-steps");
    list.replaceChildren();
    let current = null;
    for (const [key, label, done] of steps) {
      const li = document.createElement("li");
      li.dataset.step = key;
      li.textContent = label + (done ? "" : " (not yet)");
      if (done) { li.className = key === "failed" || key === "retrying" ? "bad" : "done"; current = li; }
      list.appendChild(li);
    }
    if (current) current.setAttribute("aria-current", "step");
  }

  function renderJob(record) {
    $("job-section").hidden = false;
    $("job-id").textContent = record.id;
    const badge = $("job-state");
    badge.textContent = record.state;
    badge.className = "badge " + record.state;
    const retried = record.retries ? "retry " + record.retries : "";
    $("job-attempt").textContent = record.attempt
      ? "(attempt " + record.attempt + (retried ? ", " + retried : "") + ")"
      : (retried ? "(" + retried + ")" : "");
    renderSteps(record);
    const result = $("job-result");
    if (record.state === "completed" && record.result) {
      result.hidden = false;
      result.textContent = "Imported " + record.result.imported + " rows" + (record.result.replay ? " earlier (a replay: nothing was added this time)." : ".");
    } else {
      result.hidden = true;
    }
    const completed = record.state === "completed";
    $("receipt").hidden = !completed;
    if (!completed || $("receipt-show").dataset.batchId !== record.batchId) $("receipt-table").hidden = true;
    $("receipt-show").dataset.batchId = record.batchId;
    $("receipt-show").dataset.location = record.location || "";
    const retry = $("job-retry");
    $("job-retry-row").hidden = !(record.state === "failed" && record.retryable);
    retry.setAttribute("aria-label", "Retry " + record.batchId);
    retry.dataset.jobId = record.id;
    const error = record.error;
    const box = $("job-error");
    if (error && (record.state === "failed" || record.state === "retrying")) {
      box.hidden = false;
      $("job-error-code").textContent = error.code;
      $("job-error-message").textContent = error.message;
      const body = $("issues-table").tBodies[0];
      body.replaceChildren();
      for (const issue of error.issues || []) {
        const tr = document.createElement("tr");
        for (const value of [issue.line, issue.column === null ? "whole line" : issue.column, issue.code, issue.message]) {
          const td = document.createElement("td");
          td.textContent = String(value);
          tr.appendChild(td);
        }
        body.appendChild(tr);
      }
      $("issues-table").hidden = !(error.issues && error.issues.length);
      $("issues-truncated").hidden = !error.issuesTruncated;
      renderRejections(record);
    } else {
      box.hidden = true;
    }
  }

  // The rejection report of a failed CSV validation: every rejected row, as CSV.
  function rejectionsPath(jobId) { return "/api/imports/" + encodeURIComponent(jobId) + "/rejections.csv"; }

  function renderRejections(record) {
    const report = record.state === "failed" && record.error ? record.error.rejections : null;
    $("rejections").hidden = !report;
    if (!report) return;
    const link = $("rejections-link");
    link.href = rejectionsPath(record.id);
    link.dataset.jobId = record.id;
    $("rejections-size").textContent = report.truncated
      ? "(" + report.found + " issues found; the report lists the first " + report.listed + ")"
      : "(" + report.found + " issue" + (report.found === 1 ? "" : "s") + ")";
  }

  // A plain link cannot send the Authorization header: fetch the report with
  // it, then hand the browser the bytes to save.
  async function downloadRejections(event) {
    event.preventDefault();
    const jobId = event.currentTarget.dataset.jobId;
    let response;
    try { response = await api("GET", rejectionsPath(jobId), { raw: true }); } catch (err) {
      showError("The server could not be reached. Check your connection and try again.");
      return;
    }
    if (response.status !== 200) {
      let body = null;
      try { body = await response.json(); } catch (e) { body = null; }
      showError(describe(response.status, body, response.headers));
      return;
    }
    const url = URL.createObjectURL(await response.blob());
    const save = document.createElement("a");
    save.href = url;
    save.download = jobId + "-rejections.csv";
    document.body.appendChild(save);
    save.click();
    save.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
    announce("Rejection report of " + jobId + " downloaded.");
  }

  // The receipt of the completed import shown: each row's stock before and after, each SKU a link to its movements.
  async function showReceipt() {
    const button = $("receipt-show");
    const where = button.dataset.location ? "?location=" + encodeURIComponent(button.dataset.location) : "";
    let reply;
    try { reply = await api("GET", "/api/shipments/" + encodeURIComponent(button.dataset.batchId) + "/receipt" + where); } catch (err) {
      showError("The server could not be reached. Check your connection and try again.");
      return;
    }
    if (reply.status !== 200) { showError(describe(reply.status, reply.body, reply.headers)); return; }
    const body = $("receipt-table").tBodies[0];
    body.replaceChildren();
    for (const item of reply.body.items) {
      const tr = document.createElement("tr");
      tr.append(cell(item.sku), cell(String(item.before)), cell(String(item.after)));
      const td = document.createElement("td");
      const link = document.createElement("button");
      link.type = "button";
      link.className = "link";
      link.textContent = "movements";
      link.setAttribute("aria-label", "Stock movements of " + item.sku);
      link.addEventListener("click", () => showMovements(item.sku, button.dataset.location));
      td.appendChild(link);
      tr.appendChild(td);
      body.appendChild(tr);
    }
    $("receipt-table").hidden = false;
    announce("Receipt of " + button.dataset.batchId + ": " + reply.body.items.length + " rows.");
  }

  // One SKU's movements from the ledger, newest first.
  async function showMovements(sku, location) {
    $("moves-sku").value = sku;
    $("moves-location").value = location || "";
    const query = "?sku=" + encodeURIComponent(sku) + (location ? "&location=" + encodeURIComponent(location) : "") + "&limit=100";
    let reply;
    try { reply = await api("GET", "/api/stock-movements" + query); } catch (err) {
      showError("The server could not be reached. Check your connection and try again.");
      return;
    }
    if (reply.status !== 200) { showError(describe(reply.status, reply.body, reply.headers)); return; }
    const body = $("moves-table").tBodies[0];
    body.replaceChildren();
    for (const m of reply.body.items) {
      const tr = document.createElement("tr");
      tr.append(cell(new Date(m.appliedAt).toLocaleString()), cell(m.location), cell(m.batchId),
        cell(String(m.before)), cell("+" + m.quantity), cell(String(m.after)));
      body.appendChild(tr);
    }
    $("moves-table").hidden = reply.body.items.length === 0;
    $("moves-empty").hidden = reply.body.items.length !== 0;
    $("moves-caption").textContent = "Movements of " + sku + (location ? " at " + location : "");
    $("moves-section").scrollIntoView({ block: "start" });
    announce(reply.body.items.length + " movements of " + sku + ".");
  }

  // The Retry button of the import shown: POST its retry, then follow its new chain.
  async function retryJob() {
    const button = $("job-retry");
    const jobId = button.dataset.jobId;
    if (!jobId) return;
    clearError();
    button.disabled = true;
    try {
      const answer = await api("POST", "/api/imports/" + encodeURIComponent(jobId) + "/retry");
      if (answer.status !== 202) {
        showError(describe(answer.status, answer.body, answer.headers));
        // Its record changed since it was shown (retried elsewhere, or finished): show it as it is now.
        if (answer.status === 409) follow(jobId);
        return;
      }
      announce("Retry accepted: " + answer.body.jobId + " is " + answer.body.state + " again.");
      follow(answer.body.jobId);
      loadList();
    } catch (err) {
      showError("The server could not be reached. Check your connection and try again.");
    } finally {
      button.disabled = false;
    }
  }

  function logEvent(ev) {
    const li = document.createElement("li");
    const detail = ev.event === "progress" ? " " + ev.data.phase + " (" + ev.data.rows + " rows)"
      : (ev.event === "failed" || ev.event === "retrying") ? " " + (ev.data.code || "")
      : (ev.event === "waiting" && ev.data && ev.data.retry) ? " (retry " + ev.data.retry + ")" : "";
    li.textContent = ev.event + detail + (ev.attempt ? " attempt " + ev.attempt : "");
    $("job-events").appendChild(li);
  }

  // Reads "text/event-stream" from a fetch() response: calls onEvent per
  // message; returns the last event id seen.
  async function readEvents(response, onEvent, lastId) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    let id = lastId;
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return id;
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        let data = "";
        for (const line of block.split("\n")) {
          if (line.startsWith("id: ")) id = line.slice(4);
          else if (line.startsWith("data: ")) data += line.slice(6);
        }
        if (data) onEvent(JSON.parse(data));
      }
    }
  }

  async function follow(jobId) {
    stopFollowing();
    const mine = { jobId, abort: new AbortController(), record: null };
    following = mine;
    $("job-events").replaceChildren();
    const first = await api("GET", "/api/imports/" + encodeURIComponent(jobId), { signal: mine.abort.signal });
    if (following !== mine) return;
    if (first.status !== 200) { showError(describe(first.status, first.body, first.headers)); return; }
    mine.record = first.body;
    renderJob(mine.record);
    $("job-section").scrollIntoView({ block: "nearest" });
    let lastId = "";
    // Open the stream even for a job that has already finished: it replays the
    // stored events (the log shows how the job got there) and ends after the last.
    // A final event is the end only when it is the last one: a retried import's
    // history holds its earlier failure, then the retry's events.
    let finished = false;
    while (following === mine) {
      if (finished) {
        // The record is the truth: read it once more for the final view.
        const last = await api("GET", "/api/imports/" + encodeURIComponent(jobId), { signal: mine.abort.signal }).catch(() => null);
        if (following !== mine) return;
        if (last && last.status === 200) { mine.record = last.body; renderJob(mine.record); }
        if (FINAL.has(mine.record.state)) break;
        finished = false;  // retried meanwhile: follow its new chain
      }
      let response;
      try {
        const headers = lastId ? { "Last-Event-ID": lastId } : {};
        response = await api("GET", "/api/imports/" + encodeURIComponent(jobId) + "/events",
          { raw: true, headers, signal: mine.abort.signal });
      } catch (err) {
        if (following !== mine) return;
        response = null;
      }
      if (response && response.status === 200) {
        $("job-live").textContent = "live";
        try {
          lastId = await readEvents(response, (ev) => {
            if (following !== mine) return;
            mine.record = applyEvent(mine.record, ev);
            renderJob(mine.record);
            logEvent(ev);
            finished = FINAL.has(ev.event);
          }, lastId);
        } catch (err) {
          if (following !== mine) return;
        }
      } else {
        if (response) {
          let body = null;
          try { body = await response.json(); } catch (e) { body = null; }
          if (response.status === 401 || response.status === 404) {
            showError(describe(response.status, body, response.headers));
            return;
          }
        }
        // No stream here (busy, not supported, network): poll the record.
        $("job-live").textContent = "checking every second";
        const polled = await api("GET", "/api/imports/" + encodeURIComponent(jobId), { signal: mine.abort.signal }).catch(() => null);
        if (following !== mine) return;
        if (polled && polled.status === 200) {
          mine.record = polled.body;
          renderJob(mine.record);
          finished = FINAL.has(mine.record.state);
        }
      }
      if (!finished) await new Promise((resolve) => setTimeout(resolve, 1000));
    }
    if (following !== mine) return;
    $("job-live").textContent = "";
    announce("Import " + jobId + " " + mine.record.state + ".");
    if (mine.record.state === "failed") {
      showError("Import " + jobId + " failed: " + mine.record.error.code + ". " + mine.record.error.message
        + (mine.record.retryable ? " It can be retried: use its Retry button." : ""));
    }
    loadList();
  }

  // -- my imports ------------------------------------------------------------
  function stopListTimer() { if (listTimer) { clearInterval(listTimer); listTimer = null; } }

  function cell(text) { const td = document.createElement("td"); td.textContent = text; return td; }

  function renderRows(items, append) {
    const body = $("list-table").tBodies[0];
    if (!append) body.replaceChildren();
    for (const item of items) {
      const tr = document.createElement("tr");
      tr.dataset.jobId = item.id;
      tr.appendChild(cell(item.batchId));
      tr.appendChild(cell(item.location));
      const state = document.createElement("td");
      const badge = document.createElement("span");
      badge.className = "badge " + item.state;
      badge.textContent = item.state;
      state.appendChild(badge);
      tr.appendChild(state);
      tr.appendChild(cell(String(item.attempt)));
      tr.appendChild(cell(item.progress ? String(item.progress.rows) : "-"));
      tr.appendChild(cell(new Date(item.createdAt).toLocaleString()));
      const open = document.createElement("td");
      const button = document.createElement("button");
      button.type = "button";
      button.className = "secondary";
      button.textContent = "Open";
      button.setAttribute("aria-label", "Open " + item.batchId);
      button.addEventListener("click", () => { clearError(); follow(item.id); });
      open.appendChild(button);
      tr.appendChild(open);
      body.appendChild(tr);
    }
    $("list-empty").hidden = body.rows.length > 0;
  }

  async function loadList(more) {
    if (!apiKey()) return;
    const params = new URLSearchParams();
    const state = $("state-filter").value;
    if (state) params.set("state", state);
    if (more && listCursor) params.set("cursor", listCursor);
    let answer;
    try { answer = await api("GET", "/api/imports" + (params.toString() ? "?" + params : "")); } catch (e) { return; }
    if (answer.status !== 200) {
      if (answer.status !== 401) showError(describe(answer.status, answer.body, answer.headers));
      return;
    }
    listExpanded = Boolean(more);
    renderRows(answer.body.items, Boolean(more));
    listCursor = answer.body.nextCursor;
    $("list-more").hidden = !listCursor;
  }

  function startListTimer() {
    stopListTimer();
    listTimer = setInterval(() => { if (!document.hidden && !listExpanded) loadList(); }, LIST_REFRESH_MS);
  }

  // -- wiring ------------------------------------------------------------------
  document.addEventListener("DOMContentLoaded", () => {
    $("key-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const value = $("key-input").value.trim();
      if (!value) return;
      sessionStorage.setItem(KEY_NAME, value);
      $("key-input").value = "";
      clearError();
      showKeyState();
      announce("Key set for this tab.");
      loadList();
      startListTimer();
      $("file-input").focus();
    });
    $("key-forget").addEventListener("click", () => {
      sessionStorage.removeItem(KEY_NAME);
      $("list-table").tBodies[0].replaceChildren();
      showKeyState();
      announce("Key forgotten.");
      $("key-input").focus();
    });
    $("file-input").addEventListener("change", () => {
      const files = $("file-input").files;
      const many = files.length > 1;  // each named after its file: no batchId to type
      $("batch-input").disabled = many;
      $("batch-input").required = !many;
      $("batch-input").value = many ? "" : (files[0] ? suggestBatchId(files[0].name) : $("batch-input").value);
    });
    $("send-form").addEventListener("submit", send);
    $("rejections-link").addEventListener("click", downloadRejections);
    $("job-retry").addEventListener("click", retryJob);
    $("receipt-show").addEventListener("click", showReceipt);
    $("moves-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const sku = $("moves-sku").value.trim();
      if (sku) showMovements(sku, $("moves-location").value.trim());
    });
    $("state-filter").addEventListener("change", () => loadList());
    $("list-refresh").addEventListener("click", () => loadList());
    $("list-more").addEventListener("click", () => loadList(true));
    showKeyState();
    if (apiKey()) { loadList(); startListTimer(); }
  });
})();
