// fairway's dashboard: plain JavaScript over the broker's public API, refreshed every few
// seconds. No page holds more than one page of rows.
"use strict";

const REFRESH_MS = 3000;
const SHARE_WINDOW_MS = 5 * 60 * 1000;
const USERS_PAGE = 100;
const COLOURS = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948",
                 "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"];

const $ = (selector) => document.querySelector(selector);

// The bearer token, once the broker asked for one: this tab's session storage only, never
// localStorage or a cookie, so that it goes when the tab does.
const TOKEN_KEY = "fairway-token";

async function api(path, options = {}) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  const headers = new Headers(options.headers || {});
  if (token) headers.set("Authorization", `Bearer ${token}`);
  const response = await fetch(path, { ...options, headers });
  if (response.status === 204) return null;
  const body = await response.json();
  if (response.status === 401) {
    askForToken(token ? body.error.message : null);
    throw new Error(body.error ? body.error.message : response.statusText);
  }
  if (!response.ok) throw new Error(body.error ? body.error.message : response.statusText);
  return body;
}

// Auth is on and the tab has no token, or one the broker refused: ask for one.
function askForToken(refusal) {
  if (refusal) sessionStorage.removeItem(TOKEN_KEY);
  $("#token-error").textContent = refusal ? `The token was refused: ${refusal}` : "";
  $("#token-error").hidden = !refusal;
  $("#token-form").hidden = false;
  $("#token-forget").hidden = true;
  document.body.dataset.needsToken = "true";
}

$("#token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const token = $("#token-input").value.trim();
  if (!token) return;
  sessionStorage.setItem(TOKEN_KEY, token);
  $("#token-input").value = "";
  $("#token-form").hidden = true;
  $("#token-forget").hidden = false;
  delete document.body.dataset.needsToken;
  refresh();
});
$("#token-forget").addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN_KEY);
  $("#token-forget").hidden = true;
  refresh();
});
$("#token-forget").hidden = !sessionStorage.getItem(TOKEN_KEY);

function cell(text) {
  const td = document.createElement("td");
  td.textContent = text === null || text === undefined ? "" : String(text);
  return td;
}

function fillTable(table, rows, columns) {
  const tbody = table.querySelector("tbody");
  tbody.replaceChildren(...rows.map((row) => {
    const tr = document.createElement("tr");
    tr.append(...columns.map((column) => cell(column(row))));
    return tr;
  }));
}

function age(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  if (seconds < 120) return `${Math.round(seconds)} s`;
  if (seconds < 7200) return `${Math.round(seconds / 60)} min`;
  return `${Math.round(seconds / 3600)} h`;
}

function when(at) {
  return at ? new Date(at).toLocaleString() : "never";
}

// Overview ---------------------------------------------------------------------------------

async function refreshOverview() {
  const body = await api("/admin/services");
  const services = body.services;
  $("#overview .empty").hidden = services.length > 0;
  fillTable($("#services"), services, [
    (s) => s.service, (s) => s.ready, (s) => s.running, (s) => s.paused,
    (s) => age(s.oldest_ready_age_seconds), (s) => s.claims_per_second.toFixed(1),
    (s) => s.waiting_workers,
  ]);
  const select = $("#share-service");
  const chosen = select.value;
  select.replaceChildren(...services.map((s) => new Option(s.service, s.service)));
  if (chosen && services.some((s) => s.service === chosen)) select.value = chosen;
}

// Fair share -------------------------------------------------------------------------------

// Samples of {at, shares: {user: share}} for the chosen service, kept for SHARE_WINDOW_MS.
let shareSamples = [];
let shareService = null;

async function refreshShares() {
  if (!$("#share-service").value) await refreshOverview();
  const service = $("#share-service").value;
  if (!service) return;
  if (service !== shareService) {
    shareSamples = [];
    shareService = service;
  }
  const body = await api(`/admin/shares?service=${encodeURIComponent(service)}`);
  const total = body.users.reduce((sum, user) => sum + user.running, 0);
  const shares = {};
  for (const user of body.users) shares[user.user] = total > 0 ? user.running / total : 0;
  const now = Date.now();
  shareSamples.push({ at: now, shares });
  shareSamples = shareSamples.filter((sample) => sample.at >= now - SHARE_WINDOW_MS);
  drawShares(body.users.map((user) => user.user));
}

function drawShares(activeUsers) {
  const svg = $("#share-chart");
  const [width, height, pad] = [800, 300, 30];
  const first = shareSamples[0].at;
  const span = Math.max(shareSamples[shareSamples.length - 1].at - first, 1);
  const x = (at) => pad + ((at - first) / span) * (width - 2 * pad);
  const y = (share) => height - pad - share * (height - 2 * pad);
  const ns = "http://www.w3.org/2000/svg";
  const parts = [];
  for (const level of [0, 0.5, 1]) {
    const line = document.createElementNS(ns, "line");
    Object.entries({ x1: pad, x2: width - pad, y1: y(level), y2: y(level), class: "grid" })
      .forEach(([k, v]) => line.setAttribute(k, v));
    const label = document.createElementNS(ns, "text");
    Object.entries({ x: 2, y: y(level) + 4, class: "axis" }).forEach(([k, v]) => label.setAttribute(k, v));
    label.textContent = `${level * 100}%`;
    parts.push(line, label);
  }
  const legend = [];
  activeUsers.forEach((user, index) => {
    const colour = COLOURS[index % COLOURS.length];
    const points = shareSamples
      .map((sample) => `${x(sample.at).toFixed(1)},${y(sample.shares[user] || 0).toFixed(1)}`)
      .join(" ");
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("points", points);
    line.setAttribute("stroke", colour);
    line.setAttribute("class", "series");
    line.dataset.user = user;
    parts.push(line);
    const item = document.createElement("li");
    item.style.color = colour;
    item.textContent = user;
    legend.push(item);
  });
  svg.replaceChildren(...parts);
  $("#share-legend").replaceChildren(...legend);
}

// Users ------------------------------------------------------------------------------------

// Keyset cursors of the pages before this one, so that "next" and "first" need no offset.
let usersCursor = null;
let usersNextCursor = null;
let usersRows = [];
let usersSort = null;

async function refreshUsers() {
  const form = new FormData($("#users-filter"));
  const query = new URLSearchParams({ limit: USERS_PAGE });
  for (const name of ["service", "user"]) if (form.get(name)) query.set(name, form.get(name));
  if (usersCursor) query.set("after", usersCursor);
  const body = await api(`/admin/user-work?${query}`);
  usersRows = body.rows;
  usersNextCursor = body.next_cursor || null;
  $("#users-next").disabled = !usersNextCursor;
  drawUsers();
}

function drawUsers() {
  const rows = [...usersRows];
  if (usersSort) {
    const { key, direction } = usersSort;
    rows.sort((a, b) => (a[key] > b[key] ? 1 : a[key] < b[key] ? -1 : 0) * direction);
  }
  fillTable($("#user-work"), rows, [
    (r) => r.user, (r) => r.tenant, (r) => r.service, (r) => r.component, (r) => r.job_id,
    (r) => r.step, (r) => r.ready_count, (r) => r.running_count, (r) => r.paused,
    (r) => when(r.last_worked),
  ]);
}

// Jobs -------------------------------------------------------------------------------------

let shownJob = null;

async function findJobs(event) {
  event.preventDefault();
  const form = new FormData($("#job-find"));
  $("#job-error").hidden = true;
  try {
    if (form.get("job")) {
      shownJob = form.get("job").trim();
      $("#job-list").hidden = true;
      await refreshJob();
    } else if (form.get("user")) {
      const body = await api(`/jobs?user=${encodeURIComponent(form.get("user"))}&limit=50`);
      $("#job-list").hidden = false;
      const tbody = $("#job-list tbody");
      tbody.replaceChildren(...body.jobs.map((job) => {
        const tr = document.createElement("tr");
        const link = document.createElement("a");
        link.href = "#jobs";
        link.textContent = job.job_id;
        link.addEventListener("click", () => { shownJob = job.job_id; refreshJob(); });
        const td = document.createElement("td");
        td.append(link);
        tr.append(td, cell(job.status), cell(job.progress), cell(when(job.created_at)));
        return tr;
      }));
    }
  } catch (error) {
    showJobError(error);
  }
}

function showJobError(error) {
  $("#job-error").textContent = error.message;
  $("#job-error").hidden = false;
}

async function refreshJob() {
  if (!shownJob) return;
  const job = await api(`/jobs/${encodeURIComponent(shownJob)}`);
  $("#job-detail").hidden = false;
  $("#job-id").textContent = job.job_id;
  $("#job-user").textContent = job.user;
  $("#job-tenant").textContent = job.tenant;
  $("#job-status").textContent = job.status;
  $("#job-progress").textContent = job.progress;
  fillTable($("#job-steps"), job.steps.map((step, index) => ({ index, ...step })), [
    (s) => s.index, (s) => s.service, (s) => s.total, (s) => s.ready, (s) => s.running,
    (s) => s.successful, (s) => s.failed, (s) => s.canceled,
  ]);
  const items = await api(`/jobs/${encodeURIComponent(shownJob)}/items?limit=100`);
  fillTable($("#job-items"), items.items, [
    (i) => i.id, (i) => i.step, (i) => i.status, (i) => i.attempt, (i) => i.error,
  ]);
}

async function steerJob(action) {
  if (!shownJob || !window.confirm(`${action} job ${shownJob}?`)) return;
  try {
    await api(`/jobs/${encodeURIComponent(shownJob)}/${action}`, { method: "POST" });
    await refreshJob();
  } catch (error) {
    showJobError(error);
  }
}

// Tenants and queriers ---------------------------------------------------------------------

async function refreshTenants() {
  const [tenants, queriers] = await Promise.all([api("/admin/tenants"), api("/admin/queriers")]);
  fillTable($("#tenant-list"), tenants.tenants, [
    (t) => t.tenant, (t) => t.max_queriers, (t) => t.max_outstanding, (t) => t.outstanding,
    (t) => (t.sharded ? t.queriers.join(", ") : "every querier"),
  ]);
  fillTable($("#querier-list"), queriers.queriers, [
    (q) => q.querier, (q) => q.state, (q) => q.leases, (q) => when(q.last_request_at),
    (q) => q.tenants.join(", "),
  ]);
}

// Navigation and refresh -------------------------------------------------------------------

const REFRESHERS = {
  overview: refreshOverview,
  shares: refreshShares,
  users: refreshUsers,
  jobs: refreshJob,
  tenants: refreshTenants,
};

function currentPage() {
  const page = location.hash.slice(1);
  return page in REFRESHERS ? page : "overview";
}

async function refresh() {
  const page = currentPage();
  for (const section of document.querySelectorAll(".page")) section.hidden = section.id !== page;
  for (const link of document.querySelectorAll("nav a")) {
    link.classList.toggle("current", link.dataset.page === page);
  }
  try {
    await REFRESHERS[page]();
    $("#refreshed").textContent = `refreshed ${new Date().toLocaleTimeString()}`;
    document.body.dataset.loaded = page;
  } catch (error) {
    $("#refreshed").textContent = `refresh failed: ${error.message}`;
  }
}

$("#users-filter").addEventListener("submit", (event) => {
  event.preventDefault();
  usersCursor = null;
  refreshUsers();
});
$("#users-next").addEventListener("click", () => { usersCursor = usersNextCursor; refreshUsers(); });
$("#users-first").addEventListener("click", () => { usersCursor = null; refreshUsers(); });
for (const header of document.querySelectorAll("#user-work th[data-sort]")) {
  header.addEventListener("click", () => {
    const key = header.dataset.sort;
    usersSort = { key, direction: usersSort && usersSort.key === key ? -usersSort.direction : 1 };
    drawUsers();
  });
}
$("#job-find").addEventListener("submit", findJobs);
for (const button of document.querySelectorAll("#job-detail button[data-action]")) {
  button.addEventListener("click", () => steerJob(button.dataset.action));
}
$("#share-service").addEventListener("change", refreshShares);
window.addEventListener("hashchange", refresh);
refresh();
setInterval(refresh, REFRESH_MS);
