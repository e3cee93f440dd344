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
    throw new ApiError(response, body);
  }
  if (!response.ok) throw new ApiError(response, body);
  return body;
}

// A refusal by the API: its message, HTTP status and error code (`nothing_to_retry`).
class ApiError extends Error {
  constructor(response, body) {
    super(body.error ? body.error.message : response.statusText);
    this.status = response.status;
    this.code = body.error ? body.error.code : null;
  }

  // The message with the status and code, which name the reason where the message may not.
  get explained() {
    return this.code ? `${this.message} (${this.status}, ${this.code})` : this.message;
  }
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

// A cell of text, or of a node (a link) when given one.
function cell(content) {
  const td = document.createElement("td");
  if (content instanceof Node) td.append(content);
  else td.textContent = content === null || content === undefined ? "" : String(content);
  return td;
}

// A link to a page of the dashboard, e.g. link("jobs", id) for "#jobs/<id>".
function link(page, value, text = value) {
  const a = document.createElement("a");
  a.href = `#${page}/${encodeURIComponent(value)}`;
  a.textContent = text;
  return a;
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

// A share as a whole percentage: "25 %".
function percent(share) {
  return `${Math.round(share * 100)} %`;
}

// A cap on running items; 0 is none.
function cap(maxRunning) {
  return maxRunning > 0 ? maxRunning : "none";
}

// A rate limit in items per second, with its burst when known; 0 is none.
function rateLimit(rate, burst) {
  if (!rate) return "none";
  return burst ? `${rate}/s, burst ${burst}` : `${rate}/s`;
}

// Why claims pass something over now, as words in badges (their colour only repeats the
// words); falsy marks are left out, and none leaves the cell empty.
function badges(marks) {
  const fragment = document.createDocumentFragment();
  marks.filter(Boolean).forEach(({ kind, text, title }, index) => {
    if (index > 0) fragment.append(" ");
    const badge = document.createElement("span");
    badge.className = `badge ${kind}`;
    badge.title = title;
    badge.textContent = text;
    fragment.append(badge);
  });
  return fragment;
}

// At its cap on running items (`over` says what the cap counts).
function atCap(maxRunning, over = "") {
  return { kind: "at-cap", text: "at cap",
           title: `At its cap of ${maxRunning} running items${over}: claims pass it over ` +
                  "until one of them ends" };
}

// Out of tokens: its rate limit's bucket is empty until `until`, when known.
function rateLimited(until) {
  const due = until ? `until its next item is due, ${when(until)}` : "until its next item is due";
  return { kind: "throttled", text: "rate-limited",
           title: `Its rate limit's bucket is empty: claims pass it over ${due}` };
}

// The answer, or null when the API says there is no such thing (404).
async function unlessMissing(request) {
  try {
    return await request;
  } catch (error) {
    if (error.status === 404) return null;
    throw error;
  }
}

// Overview ---------------------------------------------------------------------------------

// Ready work that no worker asked for within this long is marked: the service has no worker,
// not busy ones.
const UNSERVED_AFTER_SECONDS = 60;

function lastAsked(service) {
  const since = service.last_asked ? (Date.now() - Date.parse(service.last_asked)) / 1000 : null;
  const text = since === null ? "never" : `${age(Math.max(since, 0))} ago`;
  if (service.ready === 0 || (since !== null && since < UNSERVED_AFTER_SECONDS)) return text;
  const mark = document.createElement("span");
  mark.className = "unserved";
  mark.title = "Ready work, and no worker asked for this service's work within a minute";
  mark.textContent = `${text}: no worker`;
  return mark;
}

async function refreshOverview() {
  const body = await api("/admin/services");
  const services = body.services;
  $("#overview .empty").hidden = services.length > 0;
  fillTable($("#services"), services, [
    (s) => link("shares", s.service), (s) => s.ready, (s) => s.scheduled, (s) => s.running,
    (s) => s.paused,
    (s) => age(s.oldest_ready_age_seconds), (s) => s.claims_per_second.toFixed(1),
    (s) => s.waiting_workers, lastAsked,
  ]);
  const select = $("#share-service");
  const chosen = select.value;
  select.replaceChildren(...services.map((s) => new Option(s.service, s.service)));
  if (chosen && services.some((s) => s.service === chosen)) {
    select.value = chosen;
  } else if (services.length > 0) {
    // The busiest service is the one worth watching, not the alphabetically first.
    const busiest = services.reduce((best, s) =>
      s.running > best.running || (s.running === best.running && s.ready > best.ready) ? s : best);
    select.value = busiest.service;
  }
}

// Fair share -------------------------------------------------------------------------------

// Samples of {at, shares: {user: share}} for the chosen service, kept for SHARE_WINDOW_MS.
let shareSamples = [];
let shareService = null;

async function refreshShares(linked) {
  const select = $("#share-service");
  if (!select.value) await refreshOverview();
  if (linked) {
    if (![...select.options].some((option) => option.value === linked)) {
      select.append(new Option(linked, linked));
    }
    select.value = linked;
  }
  const service = select.value;
  if (!service) return;
  if (service !== shareService) {
    shareSamples = [];
    shareService = service;
  }
  const [body, policy] = await Promise.all([
    api(`/admin/shares?service=${encodeURIComponent(service)}`),
    unlessMissing(api(`/admin/services/${encodeURIComponent(service)}`)),
  ]);
  const users = body.users;
  const total = users.reduce((sum, user) => sum + user.running, 0);
  const shares = {};
  for (const user of users) shares[user.user] = total > 0 ? user.running / total : 0;
  // Entitled: each active user's weight's fraction of the weights of the active users shown.
  const active = users.filter((user) => user.running > 0 || user.ready > 0);
  const weights = active.reduce((sum, user) => sum + user.weight, 0);
  const entitled = new Map(active.map((user) => [user.user, user.weight / weights]));
  // A burst, and when a rate-limited user's next item is due, are in its own policy only:
  // asked for the users with a rate limit.
  const limited = users.filter((user) => user.rate_per_second > 0);
  const policies = await Promise.all(
    limited.map((user) => unlessMissing(api(`/admin/users/${encodeURIComponent(user.user)}`))));
  const userPolicies = new Map(limited.map((user, index) => [user.user, policies[index]]));
  const now = Date.now();
  shareSamples.push({ at: now, shares });
  shareSamples = shareSamples.filter((sample) => sample.at >= now - SHARE_WINDOW_MS);
  drawShares(users.map((user) => user.user), shares, entitled);
  drawServicePolicy(policy);
  drawShareTable(users, shares, entitled, userPolicies);
}

// The service's own cap and rate limit, over every user; none shown for a service the API
// does not know.
function drawServicePolicy(policy) {
  $("#service-policy").hidden = !policy;
  fillTable($("#service-policy"), policy ? [policy] : [], [
    (p) => p.service, (p) => p.running, (p) => cap(p.max_running),
    (p) => rateLimit(p.rate_per_second, p.burst),
    (p) => badges([p.max_running > 0 && p.running >= p.max_running && atCap(p.max_running)]),
  ]);
}

// Each user's entitled share beside its actual share, its policy, and what holds it back.
function drawShareTable(users, shares, entitled, userPolicies) {
  $("#share-empty").hidden = users.length > 0;
  fillTable($("#share-table"), users.map((user, index) => ({ index, ...user })), [
    (u) => swatched(u.user, COLOURS[u.index % COLOURS.length]),
    (u) => u.weight,
    (u) => u.tier,
    (u) => (entitled.has(u.user) ? shareBar(entitled.get(u.user), "entitled") : "–"),
    (u) => shareBar(shares[u.user] || 0, "actual"),
    (u) => u.running, (u) => u.ready, (u) => cap(u.max_running),
    (u) => rateLimit(u.rate_per_second, userPolicies.get(u.user)?.burst),
    (u) => badges([
      u.at_cap && atCap(u.max_running, " over every service"),
      u.throttled && rateLimited(userPolicies.get(u.user)?.throttled_until),
    ]),
  ]);
}

// A name after a square of the colour its series has in the chart.
function swatched(name, colour) {
  const fragment = document.createDocumentFragment();
  const swatch = document.createElement("span");
  swatch.className = "swatch";
  swatch.style.background = colour;
  swatch.setAttribute("aria-hidden", "true");
  fragment.append(swatch, name);
  return fragment;
}

// A share drawn as a bar before its percentage; the bar only repeats the text.
function shareBar(share, kind) {
  const fragment = document.createDocumentFragment();
  const bar = document.createElement("span");
  bar.className = `share-bar ${kind}`;
  bar.setAttribute("aria-hidden", "true");
  const fill = document.createElement("span");
  fill.style.width = `${(share * 100).toFixed(1)}%`;
  bar.append(fill);
  fragment.append(bar, percent(share));
  return fragment;
}

function drawShares(activeUsers, sharesNow, entitled) {
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
  // The time axis: how long ago the first sample was taken, and now.
  const last = shareSamples[shareSamples.length - 1].at;
  for (const [at, text, anchor] of [[first, `${age((last - first) / 1000)} ago`, "start"],
                                    [last, "now", "end"]]) {
    const label = document.createElementNS(ns, "text");
    Object.entries({ x: x(at), y: height - 8, class: "axis", "text-anchor": anchor })
      .forEach(([k, v]) => label.setAttribute(k, v));
    label.textContent = text;
    parts.push(label);
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
    // Earlier series are drawn wider, so that lines at the same share (two users at 0 %) show
    // as bands of each colour instead of one hiding the other.
    line.style.strokeWidth = `${2 + 3 * (activeUsers.length - 1 - index)}px`;
    line.dataset.user = user;
    parts.push(line);
    // The share the user's weight entitles it to: a dashed line across the chart.
    if (entitled.has(user)) {
      const mark = document.createElementNS(ns, "line");
      const level = y(entitled.get(user));
      Object.entries({ x1: pad, x2: width - pad, y1: level, y2: level, stroke: colour,
                       class: "entitled" })
        .forEach(([k, v]) => mark.setAttribute(k, v));
      mark.dataset.user = user;
      parts.push(mark);
    }
    const item = document.createElement("li");
    item.style.color = colour;
    // Lines at the same share hide each other; the legend gives each user's share now.
    const due = entitled.has(user) ? ` (entitled ${percent(entitled.get(user))})` : "";
    item.textContent = `${user} ${percent(sharesNow[user] || 0)}${due}`;
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
    (r) => r.user, (r) => r.tenant, (r) => r.service, (r) => r.component,
    (r) => link("jobs", r.job_id),
    (r) => r.step, (r) => r.ready_count, (r) => r.running_count, (r) => r.paused,
    (r) => when(r.last_worked),
  ]);
}

// Jobs -------------------------------------------------------------------------------------

let shownJob = null;
// The filter the list shows, as the API names its fields; empty: the most recent jobs of
// every tenant.
let listedFilter = {};
let listedSignature = null;
const RECENT_JOBS = 20;
const LISTED_JOBS = 50;
const ITEMS_PAGE = 20;
const FINISHED = ["successful", "complete_with_errors", "failed", "canceled"];
const FILTER_FIELDS = ["user", "tenant", "status", "service", "submitted_before"];

// The job's items on show: the cursor this page starts after (null: the first page), and the
// one the next page starts after.
let itemsCursor = null;
let itemsNextCursor = null;

async function findJobs(event) {
  event.preventDefault();
  const form = new FormData($("#job-find"));
  $("#job-error").hidden = true;
  try {
    if (form.get("job").trim()) {
      location.hash = `#jobs/${encodeURIComponent(form.get("job").trim())}`;
      return;
    }
    const filter = {};
    for (const name of FILTER_FIELDS) {
      const value = form.get(name).trim();
      if (value) filter[name] = value;
    }
    hideBulk();
    // Kept only once the API took it, so that a refused filter is not asked every refresh.
    await listJobs(filter);
    listedFilter = filter;
  } catch (error) {
    showJobError(error);
  }
}

// The Jobs page: the job the address names, and a list of jobs (those the filter matches, or
// the most recent).
async function refreshJobs(linked) {
  if (linked !== shownJob) {
    itemsCursor = null;
    $("#job-message").hidden = true;
  }
  shownJob = linked;
  $("#job-detail").hidden = !shownJob;
  if (shownJob) await refreshJob();
  await listJobs();
}

// The jobs the filter matches, newest first: GET /jobs when it names a user or a tenant, or
// else the newest of each of the first tenants, merged.
async function listJobs(filter = listedFilter) {
  let jobs;
  if (filter.user || filter.tenant) {
    const query = new URLSearchParams({ ...filter, limit: LISTED_JOBS });
    jobs = (await api(`/jobs?${query}`)).jobs;
  } else {
    const tenants = (await api("/admin/tenants")).tenants.slice(0, 20);
    const lists = await Promise.all(tenants.map((t) => {
      const query = new URLSearchParams({ ...filter, tenant: t.tenant, limit: RECENT_JOBS });
      return api(`/jobs?${query}`);
    }));
    jobs = lists.flatMap((list) => list.jobs)
      .sort((a, b) => (a.created_at < b.created_at ? 1 : a.created_at > b.created_at ? -1 : 0))
      .slice(0, RECENT_JOBS);
  }
  // Redrawn only when it changed, so that a link is not replaced under the pointer.
  const signature = JSON.stringify([filter, jobs.map((j) => [j.job_id, j.status, j.progress])]);
  if (signature === listedSignature) return;
  listedSignature = signature;
  $("#job-list-title").textContent = describeFilter(filter);
  $("#job-list-title").hidden = false;
  $("#job-list").hidden = false;
  $("#bulk").hidden = Object.keys(filter).length === 0;
  fillTable($("#job-list"), jobs, [
    (j) => link("jobs", j.job_id), (j) => j.status, (j) => j.progress, (j) => when(j.created_at),
    (j) => j.user, (j) => j.tenant,
  ]);
}

// "alice's failed jobs in tenant acme on service svc": what a filter lists, in words.
function describeFilter(filter) {
  if (Object.keys(filter).length === 0) return "Recent jobs";
  const words = [filter.user ? `${filter.user}'s` : "", filter.status || "", "jobs",
                 filter.tenant ? `in tenant ${filter.tenant}` : "",
                 filter.service ? `on service ${filter.service}` : "",
                 filter.submitted_before ? `submitted before ${filter.submitted_before}` : ""];
  const text = words.filter((word) => word).join(" ");
  return filter.user ? text : capitalized(text);
}

function capitalized(text) {
  return text.charAt(0).toUpperCase() + text.slice(1);
}

function showJobError(error) {
  $("#job-error").textContent = error.explained || error.message;
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
  // Only the actions the job's state allows; a retry, whenever an item failed for good, so
  // that a refusal (a canceled job) says why.
  $("#job-detail button[data-action=pause]").hidden =
    !["accepted", "running"].includes(job.status);
  $("#job-detail button[data-action=resume]").hidden = job.status !== "paused";
  $("#job-detail button[data-action=cancel]").hidden = FINISHED.includes(job.status);
  $("#job-detail button[data-action=retry]").hidden = !job.steps.some((step) => step.failed > 0);
  fillTable($("#job-steps"), job.steps.map((step, index) => ({ index, ...step })), [
    (s) => s.index, (s) => s.service, (s) => s.total, (s) => s.ready, (s) => s.scheduled,
    (s) => s.running, (s) => s.successful, (s) => s.failed, (s) => s.canceled,
  ]);
  await refreshItems();
}

// A page of the shown job's items, of the status the filter names.
async function refreshItems() {
  const query = new URLSearchParams({ limit: ITEMS_PAGE });
  const status = $("#item-filter select[name=status]").value;
  if (status) query.set("status", status);
  if (itemsCursor) query.set("cursor", itemsCursor);
  const page = await api(`/jobs/${encodeURIComponent(shownJob)}/items?${query}`);
  itemsNextCursor = page.more ? page.next_cursor : null;
  $("#items-next").disabled = !itemsNextCursor;
  $("#items-first").disabled = !itemsCursor;
  fillTable($("#job-items"), page.items, [
    (i) => i.id, (i) => i.step, (i) => i.status, (i) => i.attempt, (i) => i.error,
  ]);
}

// The message under a job's buttons: what an action did, or why it was refused.
function showJobMessage(text, refused) {
  $("#job-message").textContent = text;
  $("#job-message").classList.toggle("error", refused);
  $("#job-message").hidden = false;
}

async function steerJob(action) {
  if (!shownJob || !window.confirm(`${action} job ${shownJob}?`)) return;
  try {
    const answer = await api(`/jobs/${encodeURIComponent(shownJob)}/${action}`, { method: "POST" });
    const retried = answer.retried === 1
      ? "1 failed item is ready again." : `${answer.retried} failed items are ready again.`;
    showJobMessage(action === "retry" ? retried : `Done: ${action}.`, false);
    await refreshJob();
  } catch (error) {
    showJobMessage(`${action} refused: ${error.explained || error.message}`, true);
  }
}

// Bulk actions: a dry run counts the jobs the listed filter matches, and only the
// confirmation of that count sends the action, with the filter that was counted.
let bulkPending = null;

function hideBulk() {
  bulkPending = null;
  $("#bulk-confirm").hidden = true;
  $("#bulk-result").hidden = true;
}

function showBulkResult(text, refused) {
  $("#bulk-result").textContent = text;
  $("#bulk-result").classList.toggle("error", refused);
  $("#bulk-result").hidden = false;
}

async function countForBulk(event) {
  event.preventDefault();
  hideBulk();
  const action = new FormData($("#bulk")).get("action");
  const filter = { ...listedFilter };
  try {
    const count = await api(`/admin/jobs/${action}`, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ ...filter, dry_run: true }),
    });
    if (count.matched === 0) {
      showBulkResult("No job matches the filter: nothing to do.", false);
      return;
    }
    const jobs = count.matched === 1 ? "1 job" : `${count.matched} jobs`;
    bulkPending = { action, filter };
    $("#bulk-question").textContent = `${capitalized(action)} ${jobs}? That many match ` +
      `"${describeFilter(filter)}" now; nothing has changed yet.`;
    $("#bulk-yes").textContent = `Yes, ${action} ${jobs}`;
    $("#bulk-confirm").hidden = false;
  } catch (error) {
    showBulkResult(`${action} refused: ${error.explained || error.message}`, true);
  }
}

async function confirmBulk() {
  const pending = bulkPending;
  hideBulk();
  if (!pending) return;
  try {
    const outcome = await api(`/admin/jobs/${pending.action}`, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(pending.filter),
    });
    const { matched, changed } = outcome;
    showBulkResult(`${pending.action}: ${matched} jobs matched, ${changed} changed.`, false);
    listedSignature = null;
    await listJobs();
  } catch (error) {
    showBulkResult(`${pending.action} refused: ${error.explained || error.message}`, true);
  }
}

// Tenants and queriers ---------------------------------------------------------------------

async function refreshTenants() {
  const [tenants, queriers] = await Promise.all([api("/admin/tenants"), api("/admin/queriers")]);
  const state = Object.fromEntries(queriers.queriers.map((q) => [q.querier, q.state]));
  // A querier that is not active is still in the shard until it is forgotten: say so.
  const serving = (q) => (state[q] && state[q] !== "active" ? `${q} (${state[q]})` : q);
  fillTable($("#tenant-list"), tenants.tenants, [
    (t) => t.tenant,
    (t) => (t.max_queriers === 0 ? "all" : t.max_queriers),
    (t) => (t.max_outstanding === 0 ? "unlimited" : t.max_outstanding),
    (t) => t.outstanding,
    (t) => t.weight,
    (t) => t.tier,
    (t) => t.running,
    (t) => cap(t.max_running),
    (t) => rateLimit(t.rate_per_second, t.burst),
    (t) => badges([t.at_cap && atCap(t.max_running, " over every service"),
                   t.throttled_until && rateLimited(t.throttled_until)]),
    (t) => (t.sharded ? t.queriers.map(serving).join(", ") : "every querier"),
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
  jobs: refreshJobs,
  tenants: refreshTenants,
};

// The page and what it shows, from the address: "#jobs/<id>", "#shares/<service>", "#users".
function currentRoute() {
  const [page, ...rest] = location.hash.slice(1).split("/");
  if (!(page in REFRESHERS)) return { page: "overview", linked: null };
  return { page, linked: rest.length > 0 ? decodeURIComponent(rest.join("/")) : null };
}

async function refresh() {
  const { page, linked } = currentRoute();
  for (const section of document.querySelectorAll(".page")) section.hidden = section.id !== page;
  for (const link of document.querySelectorAll("nav a")) {
    link.classList.toggle("current", link.dataset.page === page);
  }
  try {
    await REFRESHERS[page](linked);
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
$("#item-filter select[name=status]").addEventListener("change", () => {
  itemsCursor = null;
  refreshItems().catch(showJobError);
});
$("#items-next").addEventListener("click", () => {
  itemsCursor = itemsNextCursor;
  refreshItems().catch(showJobError);
});
$("#items-first").addEventListener("click", () => {
  itemsCursor = null;
  refreshItems().catch(showJobError);
});
$("#bulk").addEventListener("submit", countForBulk);
$("#bulk-yes").addEventListener("click", confirmBulk);
$("#bulk-no").addEventListener("click", () => {
  hideBulk();
  showBulkResult("Nothing was changed.", false);
});
$("#share-service").addEventListener("change", () => {
  location.hash = `#shares/${encodeURIComponent($("#share-service").value)}`;
});
window.addEventListener("hashchange", refresh);
refresh();
setInterval(refresh, REFRESH_MS);
