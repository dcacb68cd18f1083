// fencelock dashboard: the admin port's own page, no framework, no build step.
//
// Data: the HTTP API of the node that serves this page (`/v1/locks`,
// `/v1/locks/{name}`, `/v1/leases/{id}`, `/v1/cluster`, `/healthz`,
// `/metrics`) and one live stream per page (`/v1/watch`, server-sent events
// read with fetch so that a bearer token can go with it). The stream replays
// the node's event history for the current scope, then stays live; it resumes
// after a dropped connection from the last revision it saw (Last-Event-ID).
// Every event makes the view fetch the state again (at most every 100 ms);
// TTLs count down in the page between fetches, and a fetch every 2 s catches
// keep-alives, which are not events.
//
// Everything a server sends is text put into the page with textContent, never
// as HTML: lock names, identities and values come from any client.
"use strict";

const REFRESH_EVERY_MS = 2000;
const EVENTS_PER_LOCK = 300;
const LOCKS_WITH_HISTORY = 2000;
const METRIC_SAMPLES = 300; // 10 minutes at one sample every 2 s
const LEASES_DESCRIBED = 50;

const S = {
  token: null, // the bearer token, in this tab's memory only
  view: "locks",
  arg: "",
  prefix: "",
  locks: [],
  locksAt: 0,
  locksError: null,
  lock: null, // the lock of the one-lock view
  lockError: null,
  events: new Map(), // lock name -> events, oldest first
  liveFrom: null, // the node's last applied index when the stream started
  lastRev: null,
  streamGen: 0,
  streamAbort: null,
  streamScope: null,
  health: null,
  cluster: null,
  clusterError: null,
  leaseInfo: new Map(),
  samples: [], // [{at, values: Map}] from /metrics
  metricsError: null,
  refreshing: false,
  dirty: false,
  refreshTimer: null,
};

class ApiError extends Error {
  constructor(status, code, message, body) {
    super(message);
    this.status = status;
    this.code = code;
    this.body = body;
  }
}

// ---- DOM helpers -----------------------------------------------------------

/** An element with attributes and children (strings become text nodes). */
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

const $ = (sel) => document.querySelector(sel);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** 1234 ms as "1.2 s", 75 s as "1m 15s", and so on. */
function dur(ms) {
  if (ms === null || ms === undefined || Number.isNaN(ms)) return "–";
  ms = Math.max(0, ms);
  if (ms < 1000) return `${Math.round(ms)} ms`;
  const s = ms / 1000;
  if (s < 60) return `${s.toFixed(1)} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m ${Math.floor(s % 60)}s`;
  const hr = Math.floor(m / 60);
  return `${hr}h ${m % 60}m`;
}

/** 1536 as "1.5 KiB", and so on. */
function bytes(n) {
  if (n === undefined || n === null) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i += 1;
  }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

/** A countdown that the ticker keeps current: `ms` left as of now. */
function countdown(ms, cls) {
  return h("span", { class: `ttl ${cls || ""}`, "data-deadline": performance.now() + ms }, dur(ms));
}

/** A time that keeps growing: `ms` elapsed as of now. */
function elapsed(ms) {
  return h("span", { class: "since", "data-start": performance.now() - ms }, dur(ms));
}

function tick() {
  const now = performance.now();
  for (const el of document.querySelectorAll("[data-deadline]")) {
    const left = Number(el.dataset.deadline) - now;
    el.textContent = left > 0 ? dur(left) : "expiring";
    el.classList.toggle("low", left < 1000);
  }
  for (const el of document.querySelectorAll("[data-start]")) {
    el.textContent = dur(now - Number(el.dataset.start));
  }
}

function b64text(s) {
  if (!s) return "";
  try {
    const bytes = Uint8Array.from(atob(s), (c) => c.charCodeAt(0));
    return new TextDecoder("utf-8", { fatal: true }).decode(bytes);
  } catch {
    return `(${atob(s).length} bytes)`;
  }
}

// ---- The HTTP API ----------------------------------------------------------

async function api(path, opts = {}) {
  const headers = {};
  const sent = S.token;
  if (sent) headers.Authorization = `Bearer ${sent}`;
  if (opts.body !== undefined) headers["Content-Type"] = "application/json";
  const r = await fetch(path, {
    method: opts.method || "GET",
    headers,
    body: opts.body === undefined ? undefined : JSON.stringify(opts.body),
    cache: "no-store",
  });
  const text = await r.text();
  let body = text;
  try {
    body = JSON.parse(text);
  } catch {
    // Prometheus text, or an error page of a proxy.
  }
  if (r.ok) return body;
  const e = body && body.error ? body.error : { code: `http_${r.status}`, message: String(text).slice(0, 300) };
  // Only a refusal of the token held now signs out: a request sent before
  // a sign-in (without a token, or with the one before) can be answered
  // after it.
  if (r.status === 401 && sent === S.token) needLogin(e.message);
  throw new ApiError(r.status, e.code, e.message, body);
}

function needLogin(message) {
  const first = S.token === null;
  $("#main").hidden = true;
  $("#login").hidden = false;
  $("#login-error").textContent = first ? "" : message || "the token was refused";
  $("#token").focus();
  stopStream();
}

// ---- Routing ---------------------------------------------------------------

function route() {
  const hash = location.hash.replace(/^#\/?/, "");
  const [path, query] = hash.split("?");
  const params = new URLSearchParams(query || "");
  if (path.startsWith("lock/")) {
    S.view = "lock";
    S.arg = decodeURIComponent(path.slice(5));
  } else {
    S.view = ["locks", "leases", "elections", "fences", "group", "traffic"].includes(path) ? path : "locks";
    S.arg = "";
  }
  if (params.has("prefix")) S.prefix = params.get("prefix");
  for (const a of document.querySelectorAll("#nav a")) {
    a.classList.toggle("current", a.dataset.view === S.view);
  }
  S.lock = null;
  S.lockError = null;
  buildView();
  ensureStream();
  refresh();
}

function scope() {
  return S.view === "lock" ? S.arg : S.prefix;
}

// ---- The live stream -------------------------------------------------------

function setLive(state, text) {
  const el = $("#live");
  el.dataset.state = state;
  el.textContent = text || state;
}

function stopStream() {
  S.streamGen += 1;
  if (S.streamAbort) S.streamAbort.abort();
  S.streamAbort = null;
  S.streamScope = null;
}

function ensureStream() {
  if (S.streamScope === scope() && S.streamAbort) return;
  stopStream();
  S.streamScope = scope();
  S.events = new Map();
  S.lastRev = null;
  S.liveFrom = null;
  runStream(S.streamScope, S.streamGen);
}

async function runStream(prefix, gen) {
  let from = "0"; // the node's whole history, as far as it keeps it
  while (gen === S.streamGen) {
    setLive("connecting");
    const ctrl = new AbortController();
    S.streamAbort = ctrl;
    try {
      if (S.liveFrom === null) {
        const health = await fetch("/healthz", { cache: "no-store" }).then((r) => r.json()).catch(() => null);
        S.liveFrom = health && health.last_applied !== undefined ? health.last_applied : 0;
      }
      const headers = { Accept: "text/event-stream" };
      const sent = S.token;
      if (sent) headers.Authorization = `Bearer ${sent}`;
      let url = `/v1/watch?prefix=${encodeURIComponent(prefix)}`;
      if (S.lastRev) headers["Last-Event-ID"] = S.lastRev;
      else url += `&from=${encodeURIComponent(from)}`;
      const r = await fetch(url, { headers, signal: ctrl.signal, cache: "no-store" });
      if (r.status === 410) {
        const b = await r.json();
        from = b.error.oldest;
        S.lastRev = null;
        continue;
      }
      if (r.status === 401) {
        if (sent === S.token) return needLogin("the token was refused");
        continue; // sent before a sign-in: ask again with the token held now
      }
      if (!r.ok) {
        const b = await r.json().catch(() => null);
        setLive("error", b && b.error ? `stream: ${b.error.code}` : `stream: HTTP ${r.status}`);
        await sleep(3000);
        continue;
      }
      setLive("live");
      const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done || gen !== S.streamGen) break;
        buf += value.replace(/\r\n/g, "\n");
        let end;
        while ((end = buf.indexOf("\n\n")) >= 0) {
          const block = buf.slice(0, end);
          buf = buf.slice(end + 2);
          const ended = onBlock(block);
          if (ended) from = ended;
        }
      }
    } catch (e) {
      if (gen !== S.streamGen) return;
    }
    if (gen !== S.streamGen) return;
    setLive("connecting", "reconnecting");
    await sleep(1000);
  }
}

/** One SSE block; returns a revision to restart from when the stream ended compacted. */
function onBlock(block) {
  let kind = "message";
  let id = null;
  const data = [];
  for (const line of block.split("\n")) {
    if (line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
    if (field === "event") kind = value;
    else if (field === "id") id = value;
    else if (field === "data") data.push(value);
  }
  if (!data.length) return null;
  const body = JSON.parse(data.join("\n"));
  if (kind === "error") {
    const e = body.error || {};
    if (e.code === "compacted") {
      S.lastRev = null;
      return e.oldest;
    }
    setLive("error", `stream: ${e.code}`);
    return null;
  }
  if (id) S.lastRev = id;
  body.live = S.liveFrom !== null && body.index > S.liveFrom;
  body.at = performance.now();
  record(body);
  scheduleRefresh();
  return null;
}

function record(ev) {
  let list = S.events.get(ev.lock);
  if (!list) {
    if (S.events.size >= LOCKS_WITH_HISTORY) S.events.delete(S.events.keys().next().value);
    list = [];
    S.events.set(ev.lock, list);
  }
  list.push(ev);
  if (list.length > EVENTS_PER_LOCK) list.splice(0, list.length - EVENTS_PER_LOCK);
}

// ---- Fetching the state ----------------------------------------------------

function scheduleRefresh() {
  if (S.refreshTimer) return;
  S.refreshTimer = setTimeout(() => {
    S.refreshTimer = null;
    refresh();
  }, 100);
}

async function refresh() {
  if (S.refreshing) {
    S.dirty = true;
    return;
  }
  S.refreshing = true;
  try {
    await fetchFor(S.view);
  } finally {
    S.refreshing = false;
  }
  renderBody();
  if (S.dirty) {
    S.dirty = false;
    scheduleRefresh();
  }
}

async function fetchFor(view) {
  // The lock the view shows as this fetch begins: a navigation meanwhile
  // (another view, another lock) must not make it ask for what it left.
  const arg = S.arg;
  // A node that does not lead answers 503, with its view all the same.
  S.health = await api("/healthz").catch((e) => (e.body && e.body.node_id !== undefined ? e.body : null));
  showNode();
  if (view === "locks" || view === "leases" || view === "elections") await fetchLocks();
  if (view === "lock" && arg) await fetchLock(arg);
  if (view === "leases") await fetchLeases();
  if (view === "group") await fetchCluster();
  if (view === "traffic" || view === "fences" || view === "group") await sampleMetrics();
}

async function fetchLocks() {
  try {
    // From the applied state of the node that serves this page: any member
    // answers, and the leader spends no quorum round trip on a dashboard.
    const r = await api(`/v1/locks?prefix=${encodeURIComponent(S.prefix)}&limit=1000&consistency=local`);
    S.locks = r.locks;
    S.locksAt = performance.now();
    S.locksError = null;
  } catch (e) {
    S.locks = [];
    S.locksError = e;
  }
}

async function fetchLock(name) {
  try {
    const lock = await api(`/v1/locks/${encodeURIComponent(name)}?consistency=local`);
    if (S.view === "lock" && S.arg === name) [S.lock, S.lockError] = [lock, null];
  } catch (e) {
    if (S.view === "lock" && S.arg === name) [S.lock, S.lockError] = [null, e];
  }
}

async function fetchLeases() {
  const ids = [...leaseRows().keys()].slice(0, LEASES_DESCRIBED);
  const infos = await Promise.all(
    ids.map((id) => api(`/v1/leases/${id}`).then((i) => [id, i]).catch((e) => [id, { error: e }])),
  );
  S.leaseInfo = new Map(infos);
}

async function fetchCluster() {
  try {
    S.cluster = await api("/v1/cluster");
    S.clusterError = null;
  } catch (e) {
    S.cluster = null;
    S.clusterError = e;
  }
}

async function sampleMetrics() {
  const last = S.samples[S.samples.length - 1];
  if (last && performance.now() - last.at < REFRESH_EVERY_MS / 2) return;
  try {
    const text = await api("/metrics");
    S.samples.push({ at: performance.now(), values: parseMetrics(String(text)) });
    if (S.samples.length > METRIC_SAMPLES) S.samples.shift();
    S.metricsError = null;
  } catch (e) {
    S.metricsError = e;
  }
}

/** Prometheus text as a Map from `name{labels}` to a number. */
function parseMetrics(text) {
  const m = new Map();
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const sp = line.lastIndexOf(" ");
    m.set(line.slice(0, sp), Number(line.slice(sp + 1)));
  }
  return m;
}

function showNode() {
  const hl = S.health;
  const role = (x) => (x.leader === x.node_id ? "leader" : `follower · leader: node ${x.leader ?? "none"}`);
  $("#node").textContent = hl ? `node ${hl.node_id} · ${role(hl)} · term ${hl.term}` : "node unreachable";
}

// ---- Views -----------------------------------------------------------------

function buildView() {
  const main = $("#main");
  main.replaceChildren();
  const head = h("div", { id: "view-head" });
  const body = h("div", { id: "view-body" }, h("p", { class: "muted" }, "Loading…"));
  main.append(head, body);
  if (S.view === "locks" || S.view === "leases" || S.view === "elections" || S.view === "fences") {
    const titles = { locks: "Locks", leases: "Leases", elections: "Elections", fences: "Stale writes the fences refused" };
    const input = h("input", {
      id: "prefix",
      type: "search",
      placeholder: "all locks",
      value: S.prefix,
      spellcheck: "false",
      "aria-label": "prefix",
    });
    let timer = null;
    input.addEventListener("input", () => {
      clearTimeout(timer);
      timer = setTimeout(() => {
        S.prefix = input.value;
        // Nothing of the old prefix stays on screen while the new one loads.
        S.locks = [];
        S.locksError = null;
        $("#view-body").replaceChildren(h("p", { class: "muted" }, "Loading…"));
        history.replaceState(null, "", `#/${S.view}?prefix=${encodeURIComponent(S.prefix)}`);
        ensureStream();
        refresh();
      }, 300);
    });
    head.append(
      h("h1", {}, titles[S.view]),
      h("div", { class: "toolbar" }, h("label", {}, "Prefix ", input), h("span", { id: "summary", class: "muted" })),
    );
  } else if (S.view === "lock") {
    head.append(h("h1", {},
      h("a", { href: `#/locks?prefix=${encodeURIComponent(S.prefix)}` }, "Locks"), " / ",
      h("span", { id: "lock-name", class: "mono" }, S.arg)));
  } else if (S.view === "group") {
    head.append(h("h1", {}, "The group"));
  } else if (S.view === "traffic") {
    head.append(h("h1", {}, "Throughput and latency"), h("p", { class: "muted" }, "From this node's /metrics, sampled every 2 s while this view is open."));
  }
}

function renderBody() {
  const body = $("#view-body");
  if (!body) return;
  const render = { locks: locksView, lock: lockView, leases: leasesView, elections: electionsView, fences: fencesView, group: groupView, traffic: trafficView }[S.view];
  body.replaceChildren(...[render()].flat());
  tick();
}

function refused(e, what) {
  if (e.status === 403) {
    return h("div", { class: "notice", id: "refused" }, `Not allowed to read ${what}: ${e.message}. `,
      ["locks", "leases", "elections", "fences"].includes(S.view) ? "Enter a prefix this identity may read." : "");
  }
  return h("div", { class: "notice error" }, `${what}: ${e.code}: ${e.message}`);
}

function holderCells(l) {
  if (!l.holders.length) {
    const reopen = l.reopens_in_ms ? ["closed for ", countdown(l.reopens_in_ms), " (lock-delay)"] : ["free"];
    return [h("td", { class: "free", colspan: 4 }, ...reopen)];
  }
  return [
    h("td", { class: "holder" }, l.holders.map((x) => h("div", { "data-lease": x.lease_id }, x.identity || "(no identity)", x.owner ? h("span", { class: "muted" }, ` · ${x.owner}`) : "", h("div", { class: "muted mono" }, `lease ${x.lease_id}`)))),
    h("td", { class: "token" }, l.holders.map((x) => h("div", {}, x.token))),
    h("td", {}, l.holders.map((x) => h("div", {}, elapsed(x.token_age_ms)))),
    h("td", {}, l.holders.map((x) => h("div", {}, countdown(x.ttl_left_ms)))),
  ];
}

function modeChip(l) {
  if (l.permits > 0) return h("span", { class: "chip" }, `semaphore ${l.holders.reduce((n, x) => n + x.weight, 0)}/${l.permits}`);
  const mode = l.holders.length ? l.holders[0].mode : "exclusive";
  return h("span", { class: `chip ${mode}` }, l.holders.length > 1 ? `shared ×${l.holders.length}` : mode);
}

function queue(l) {
  if (!l.waiters.length) return h("span", { class: "muted" }, "–");
  return h("ol", { class: "queue" }, l.waiters.map((w) =>
    h("li", { "data-lease": w.lease_id }, w.identity || "(no identity)", h("span", { class: "muted" }, " · waiting "), elapsed(w.waited_ms))));
}

function locksView() {
  const summary = $("#summary");
  if (S.locksError) {
    if (summary) summary.textContent = "";
    return refused(S.locksError, `locks under "${S.prefix}"`);
  }
  const held = S.locks.filter((l) => l.holders.length).length;
  const waiting = S.locks.reduce((n, l) => n + l.waiters.length, 0);
  const follower = S.health && S.health.leader !== S.health.node_id ? " · read from this follower's applied state" : "";
  if (summary) summary.textContent = `${S.locks.length} locks · ${held} held · ${waiting} waiting${follower}`;
  if (!S.locks.length) return h("p", { class: "muted", id: "empty" }, "No lock is held or waited on under this prefix.");
  const rows = S.locks.map((l) => h("tr", {
    "data-lock": l.name,
    "data-token": l.holders.length ? l.holders[0].token : "",
    "data-holder-lease": l.holders.length ? l.holders[0].lease_id : "",
    "data-waiters": l.waiters.length,
  },
  h("td", { class: "name" }, h("a", { href: `#/lock/${encodeURIComponent(l.name)}` }, l.name), refusedChip(l.name)),
  h("td", {}, modeChip(l)),
  ...holderCells(l),
  h("td", { class: "waiters" }, queue(l))));
  return h("table", { id: "locks" },
    h("thead", {}, h("tr", {}, ["Lock", "Mode", "Holder", "Token", "Held for", "TTL left", "Waiters (queue order)"].map((t) => h("th", {}, t)))),
    h("tbody", {}, rows));
}

function lockView() {
  const out = [];
  if (S.lockError) out.push(refused(S.lockError, `lock "${S.arg}"`));
  const l = S.lock;
  const events = S.events.get(S.arg) || [];
  const left = [];
  if (l) {
    left.push(h("div", { class: "cards" },
      card("Mode", modeChip(l)),
      card("Holders", String(l.holders.length)),
      card("Waiters", String(l.waiters.length)),
      card("Lock-delay", l.reopens_in_ms ? countdown(l.reopens_in_ms) : "open"),
    ));
    left.push(h("table", { id: "lock-state" },
      h("thead", {}, h("tr", {}, ["Holder", "Token", "Held for", "TTL left", "Value", ""].map((t) => h("th", {}, t)))),
      h("tbody", {}, l.holders.length ? l.holders.map((x) => h("tr", { "data-lease": x.lease_id, "data-token": x.token },
        h("td", {}, x.identity || "(no identity)", h("div", { class: "muted mono nowrap" }, `lease ${x.lease_id}`)),
        h("td", { class: "token" }, x.token),
        h("td", {}, elapsed(x.token_age_ms)),
        h("td", {}, countdown(x.ttl_left_ms)),
        h("td", { class: "mono" }, b64text(x.value_base64)),
        h("td", {}, h("button", { class: "small danger", onclick: () => revoke(x, l) }, "Revoke lease…")),
      )) : h("tr", {}, h("td", { colspan: 6, class: "free" }, "free")))));
    if (l.permits > 0) left.push(h("p", {}, h("button", { onclick: () => resize(l) }, `Resize semaphore (${l.permits} permits)…`)));
    left.push(h("h2", {}, "Queue"), queue(l));
  }
  const right = [h("h2", { class: "first" }, "Tokens granted"), tokenChart(events.filter((e) => e.kind === "granted")),
    h("h2", {}, "Waits and holds seen live on this page"), latencyTable(events)];
  out.push(h("div", { class: "split" }, h("div", {}, left), h("div", {}, right)));
  out.push(h("h2", {}, "Recent events"), eventTable(events));
  return out;
}

function card(label, value) {
  return h("div", { class: "card" }, h("div", { class: "label" }, label), h("div", { class: "value" }, value));
}

/** The tokens of the lock's grants in order: a line that only goes up. */
function tokenChart(grants) {
  if (!grants.length) return h("p", { class: "muted" }, "No grant in the node's history for this lock.");
  const tokens = grants.map((g) => BigInt(g.token));
  const min = tokens.reduce((a, b) => (b < a ? b : a));
  const max = tokens.reduce((a, b) => (b > a ? b : a));
  const span = Number(max - min) || 1;
  const W = 600, H = 110, P = 8;
  const x = (i) => P + (grants.length === 1 ? (W - 2 * P) / 2 : (i * (W - 2 * P)) / (grants.length - 1));
  const y = (t) => H - P - (Number(t - min) / span) * (H - 2 * P);
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("preserveAspectRatio", "none");
  svg.setAttribute("id", "token-chart");
  const line = document.createElementNS(ns, "polyline");
  line.setAttribute("class", "line");
  line.setAttribute("points", tokens.map((t, i) => `${x(i)},${y(t)}`).join(" "));
  svg.append(line);
  const title = document.createElementNS(ns, "title");
  title.textContent = grants.map((g) => `token ${g.token} (lease ${g.lease_id})`).join("\n");
  line.append(title);
  const first = grants[0].token, last = grants[grants.length - 1].token;
  return h("div", { class: "chart" },
    h("h3", {}, `${grants.length} grants; every token above the one before`),
    h("div", { class: "muted mono" }, `first ${first} · last ${last} · +${max - min} in all`), svg);
}

function quantile(sorted, q) {
  if (!sorted.length) return null;
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))];
}

/** Waits (queued → granted) and holds (granted → released, expired, revoked) of live events. */
function latencyTable(events) {
  const queuedAt = new Map();
  const grantedAt = new Map();
  const waits = [];
  const holds = [];
  for (const e of events) {
    if (!e.live) continue;
    const key = `${e.lease_id}`;
    if (e.kind === "queued") queuedAt.set(key, e.at);
    if (e.kind === "granted") {
      if (queuedAt.has(key)) waits.push(e.at - queuedAt.get(key));
      queuedAt.delete(key);
      grantedAt.set(`${key}/${e.token}`, e.at);
    }
    if (e.kind === "released" || e.kind === "expired" || e.kind === "revoked") {
      const g = grantedAt.get(`${key}/${e.token}`);
      if (g !== undefined) holds.push(e.at - g);
    }
  }
  const row = (name, xs) => {
    const s = [...xs].sort((a, b) => a - b);
    return h("tr", {}, h("td", {}, name), h("td", {}, String(s.length)), h("td", {}, dur(quantile(s, 0.5))), h("td", {}, dur(quantile(s, 0.99))), h("td", {}, dur(s[s.length - 1])));
  };
  return h("table", { id: "latency" },
    h("thead", {}, h("tr", {}, ["", "Count", "p50", "p99", "Max"].map((t) => h("th", {}, t)))),
    h("tbody", {}, row("Wait in queue", waits), row("Hold", holds)));
}

function eventTable(events) {
  if (!events.length) return h("p", { class: "muted" }, "No event in the node's history for this lock.");
  const recent = events.slice(-100).reverse();
  return h("table", { class: "events", id: "events" },
    h("thead", {}, h("tr", {}, ["Revision", "Event", "Lease", "Token", "Identity", "Detail"].map((t) => h("th", {}, t)))),
    h("tbody", {}, recent.map((e) => h("tr", { "data-kind": e.kind },
      h("td", { class: "mono" }, e.revision),
      h("td", {}, h("span", { class: `kind ${e.kind}` }, e.kind.replace("_", " ")), e.mode === "shared" ? h("span", { class: "chip shared" }, "shared") : ""),
      h("td", { class: "mono" }, e.lease_id),
      h("td", { class: "mono" }, e.token === "0" ? "–" : e.token),
      h("td", {}, e.identity),
      h("td", { class: "muted" }, eventDetail(e))))));
}

/** What an event's Detail column says. */
function eventDetail(e) {
  if (e.kind === "write_refused") {
    return `a write with token ${e.token} refused: the fence had seen ${e.highest_token}${e.resource ? ` (${e.resource})` : ""}`;
  }
  return [e.reason === e.kind ? "" : e.reason, b64text(e.value_base64)].filter(Boolean).join(" · ");
}

/** Every lease seen in the lock table: what it holds and waits for. */
function leaseRows() {
  const rows = new Map();
  const row = (id) => {
    if (!rows.has(id)) rows.set(id, { id, identity: "", owner: "", ttlLeft: null, holds: [], waits: [] });
    return rows.get(id);
  };
  for (const l of S.locks) {
    for (const x of l.holders) {
      const r = row(x.lease_id);
      r.identity = r.identity || x.identity;
      r.owner = r.owner || x.owner || "";
      r.ttlLeft = x.ttl_left_ms;
      r.holds.push(`${l.name} (${x.token})`);
    }
    for (const w of l.waiters) {
      const r = row(w.lease_id);
      r.identity = r.identity || w.identity;
      r.waits.push(l.name);
    }
  }
  return rows;
}

function leasesView() {
  if (S.locksError) return refused(S.locksError, `locks under "${S.prefix}"`);
  const rows = [...leaseRows().values()];
  const summary = $("#summary");
  if (summary) summary.textContent = `${rows.length} leases hold or wait on locks under this prefix`;
  if (!rows.length) return h("p", { class: "muted" }, "No lease holds or waits on a lock under this prefix.");
  return h("table", { id: "leases" },
    h("thead", {}, h("tr", {}, ["Lease", "Identity", "Owner", "TTL", "TTL left", "Last keep-alive", "Holds", "Waits for"].map((t) => h("th", {}, t)))),
    h("tbody", {}, rows.map((r) => {
      const info = S.leaseInfo.get(r.id);
      const ok = info && !info.error;
      return h("tr", { "data-lease": r.id },
        h("td", { class: "lease" }, r.id),
        h("td", {}, r.identity || "–"),
        h("td", {}, (ok && info.owner) || r.owner || "–"),
        h("td", {}, ok ? dur(info.ttl_ms) : "–"),
        h("td", {}, ok ? countdown(info.ttl_left_ms) : r.ttlLeft !== null ? countdown(r.ttlLeft) : "–"),
        h("td", {}, ok ? [elapsed(info.ttl_ms - info.ttl_left_ms), " ago"] : h("span", { class: "muted", title: info && info.error ? info.error.message : "" }, "not visible")),
        h("td", {}, r.holds.map((x) => h("div", { class: "mono" }, x))),
        h("td", {}, r.waits.map((x) => h("div", { class: "mono" }, x))));
    })));
}

function electionsView() {
  if (S.locksError) return refused(S.locksError, `elections under "${S.prefix}"`);
  const summary = $("#summary");
  const elections = S.locks.filter((l) => l.permits === 0 && l.holders.length === 1 && l.holders[0].mode === "exclusive" && l.holders[0].value_base64);
  if (summary) summary.textContent = `${elections.length} elections with a leader`;
  const note = h("p", { class: "muted" }, "An election is a lock: its leader is the holder, the term the holder's fencing token, the candidates its queue. Shown here: the locks whose holder publishes a value (fencelock elect --value, a campaign's value), as leaders do; every lock is under Locks. Observers: the watches following the election on this node (fencelock leader --watch, a client's observe).");
  if (!elections.length) return [note, h("p", { class: "muted" }, "No election has a leader under this prefix.")];
  return [note, h("table", { id: "elections" },
    h("thead", {}, h("tr", {}, ["Election", "Leader", "Term", "Value", "Leading for", "Candidates", "Observers"].map((t) => h("th", {}, t)))),
    h("tbody", {}, elections.map((l) => {
      const x = l.holders[0];
      return h("tr", { "data-lock": l.name },
        h("td", {}, h("a", { href: `#/lock/${encodeURIComponent(l.name)}` }, l.name)),
        h("td", {}, x.identity || "(no identity)"),
        h("td", { class: "token" }, x.token),
        h("td", { class: "mono" }, b64text(x.value_base64) || "–"),
        h("td", {}, elapsed(x.token_age_ms)),
        h("td", { class: "waiters" }, queue(l)),
        h("td", { class: "observers" }, String(l.watchers)));
    })))];
}

function groupView() {
  const out = [];
  const hl = S.health;
  if (hl) {
    out.push(h("div", { class: "cards" },
      card("This node", String(hl.node_id)),
      card("Leader", hl.leader === null ? "none" : `node ${hl.leader}`),
      card("Term", String(hl.term)),
      card("Applied index", String(hl.last_applied ?? "–")),
      card("Serves clients", hl.status === "ok" ? "yes" : hl.leader === hl.node_id ? "not yet" : "no (follows)")));
  }
  const m = S.samples.length ? S.samples[S.samples.length - 1].values : null;
  if (m) {
    const part = (p) => m.get(`fencelock_data_dir_bytes{part="${p}"}`);
    const free = m.get("fencelock_data_dir_available_bytes");
    const size = m.get("fencelock_data_dir_filesystem_bytes");
    out.push(h("div", { class: "cards", id: "disk" },
      card("Log on disk", bytes(part("log"))),
      card("Snapshots on disk", bytes(part("snapshots"))),
      card("Database", bytes(part("database"))),
      card("Disk free", free === undefined ? "–" : `${bytes(free)} (${Math.round((100 * free) / size)}%)`)));
  }
  if (S.clusterError) {
    out.push(S.clusterError.status === 403 ? h("div", { class: "notice" }, "The members and their replication need the admin permission.") : refused(S.clusterError, "the group"));
    return out;
  }
  const c = S.cluster;
  if (!c) return out;
  out.push(h("p", {}, `Node ${c.node_id} is ${c.state}; last log index ${c.last_log_index ?? "–"}, applied ${c.last_applied ?? "–"}.`));
  out.push(h("table", { id: "members" },
    h("thead", {}, h("tr", {}, ["Node", "Role", "Client address", "Peer address", "Replicated to", "Lag (entries)"].map((t) => h("th", {}, t)))),
    h("tbody", {}, c.members.map((m) => {
      const role = m.id === c.leader ? "leader" : m.voter ? "voter" : "learner";
      const lag = m.matched === null || c.last_log_index === null ? null : c.last_log_index - m.matched;
      return h("tr", { "data-node": m.id },
        h("td", {}, String(m.id)),
        h("td", {}, h("span", { class: "chip" }, role)),
        h("td", { class: "mono" }, m.addr),
        h("td", { class: "mono" }, m.peer_addr || "–"),
        h("td", {}, m.matched === null ? (c.state === "leader" ? "not answered yet" : "known to the leader only") : String(m.matched)),
        h("td", {}, lag === null ? "–" : String(lag)));
    }))));
  return out;
}

/** The stale writes fences reported refusing, in the stream's history. */
function refusals() {
  const out = [];
  for (const list of S.events.values()) out.push(...list.filter((e) => e.kind === "write_refused"));
  return out.sort((a, b) => b.index - a.index || b.seq - a.seq);
}

/** A warning beside a lock whose late writes a fence refused. */
function refusedChip(lock) {
  const n = (S.events.get(lock) || []).filter((e) => e.kind === "write_refused").length;
  return n ? h("span", { class: "chip refused", title: "stale writes a fence refused (see Fences)" }, ` ⚠ ${n} late write${n > 1 ? "s" : ""} refused`) : "";
}

function fencesView() {
  const summary = $("#summary");
  const list = refusals();
  const last = S.samples.length ? S.samples[S.samples.length - 1].values : null;
  const total = last ? last.get("fencelock_writes_refused_total") : undefined;
  if (summary) summary.textContent = `${list.length} in this node's history under this prefix` + (total === undefined ? "" : ` · ${total} since the node started`);
  const note = h("p", { class: "muted" },
    "Each row is a write that a fence (fencelock storage --report-to, or a service using the fencelock-fence reporter) refused because its token was older than one it had seen: a holder that lost its lock, paused or cut off, tried to write late. The fence stopped it; the holder's work is lost.");
  if (!list.length) return [note, h("p", { class: "muted", id: "no-refusals" }, "No refused write reported under this prefix.")];
  return [note, h("table", { id: "refusals" },
    h("thead", {}, h("tr", {}, ["Revision", "Lock", "Refused token", "Highest seen", "Resource", "Reported by", "Seen"].map((t) => h("th", {}, t)))),
    h("tbody", {}, list.map((e) => h("tr", { "data-lock": e.lock, "data-token": e.token },
      h("td", { class: "mono" }, e.revision),
      h("td", {}, h("a", { href: `#/lock/${encodeURIComponent(e.lock)}` }, e.lock)),
      h("td", { class: "token bad" }, e.token),
      h("td", { class: "token" }, e.highest_token),
      h("td", { class: "mono" }, e.resource || "–"),
      h("td", {}, e.identity || "–"),
      h("td", {}, e.live ? [elapsed(performance.now() - e.at), " ago"] : "before this page opened")))))];
}

// ---- Traffic ---------------------------------------------------------------

/** The rate per second of counter `name` between consecutive samples. */
function rates(name) {
  const out = [];
  for (let i = 1; i < S.samples.length; i++) {
    const a = S.samples[i - 1], b = S.samples[i];
    const dv = (b.values.get(name) ?? 0) - (a.values.get(name) ?? 0);
    out.push(Math.max(0, dv) / ((b.at - a.at) / 1000));
  }
  return out;
}

function gauge(name) {
  return S.samples.map((s) => s.values.get(name) ?? 0);
}

/** Quantile `q` of histogram `name` over each window of `w` samples, in ms. */
function histQuantiles(name, q, w = 5) {
  const out = [];
  for (let i = 1; i < S.samples.length; i++) {
    const a = S.samples[Math.max(0, i - w)], b = S.samples[i];
    const buckets = [];
    for (const [k, v] of b.values) {
      const m = k.match(new RegExp(`^${name}_bucket\\{le="([^"]+)"\\}$`));
      if (m) buckets.push([m[1] === "+Inf" ? Infinity : Number(m[1]), v - (a.values.get(k) ?? 0)]);
    }
    buckets.sort((x, y) => x[0] - y[0]);
    const total = buckets.length ? buckets[buckets.length - 1][1] : 0;
    if (!total) {
      out.push(null);
      continue;
    }
    const rank = q * total;
    let prevLe = 0, prevCount = 0, value = null;
    for (const [le, count] of buckets) {
      if (count >= rank) {
        value = le === Infinity ? prevLe : prevLe + ((le - prevLe) * (rank - prevCount)) / Math.max(1, count - prevCount);
        break;
      }
      prevLe = le;
      prevCount = count;
    }
    out.push(value === null ? null : value * 1000);
  }
  return out;
}

function lineChart(id, title, series, unit) {
  const W = 400, H = 110, P = 6;
  const all = series.flatMap((s) => s.values.filter((v) => v !== null));
  const max = Math.max(1e-9, ...all);
  const n = Math.max(2, ...series.map((s) => s.values.length));
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("preserveAspectRatio", "none");
  const axis = document.createElementNS(ns, "line");
  axis.setAttribute("class", "axis");
  axis.setAttribute("x1", 0); axis.setAttribute("x2", W); axis.setAttribute("y1", H - P); axis.setAttribute("y2", H - P);
  svg.append(axis);
  series.forEach((s, k) => {
    const pts = s.values.map((v, i) => (v === null ? null : `${(i * W) / (n - 1)},${H - P - (v / max) * (H - 2 * P)}`)).filter(Boolean);
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("class", k === 0 ? "line" : "line2");
    line.setAttribute("points", pts.join(" "));
    svg.append(line);
  });
  const show = (v) => (unit === "ms" ? dur(v) : `${v.toFixed(v < 10 ? 1 : 0)}${unit}`);
  const latest = series.map((s, k) => {
    const v = [...s.values].reverse().find((x) => x !== null);
    return [h("span", { class: `s${k}` }, `■ ${s.name}`), ` ${v === undefined ? "–" : show(v)}  `];
  });
  return h("div", { class: "chart", id }, h("h3", {}, title),
    h("div", { class: "muted" }, "now: ", latest, `· peak ${show(max)}`), svg);
}

function trafficView() {
  if (S.metricsError) return refused(S.metricsError, "the metrics");
  if (S.samples.length < 2) return h("p", { class: "muted" }, "Collecting samples…");
  const last = S.samples[S.samples.length - 1].values;
  const minutes = ((S.samples[S.samples.length - 1].at - S.samples[0].at) / 60000).toFixed(1);
  return [
    h("div", { class: "cards" },
      card("Held locks", String(last.get("fencelock_held_locks") ?? "–")),
      card("Waiting", String(last.get("fencelock_queue_depth") ?? "–")),
      card("Active leases", String(last.get("fencelock_active_leases") ?? "–")),
      card("Grants (total)", String(last.get("fencelock_grants_total") ?? "–")),
      card("Leases expired (total)", String(last.get("fencelock_lease_expirations_total") ?? "–")),
      card("Stuck holders", String(last.get("fencelock_stuck_holders") ?? "–")),
      card("Stale writes refused", String(last.get("fencelock_writes_refused_total") ?? "–"))),
    h("p", { class: "muted" }, `The last ${minutes} minutes.`),
    h("div", { class: "charts" },
      lineChart("chart-grants", "Grants and releases per second", [
        { name: "grants", values: rates("fencelock_grants_total") },
        { name: "releases", values: rates("fencelock_releases_total") }], "/s"),
      lineChart("chart-expiries", "Leases expired and waits timed out per second", [
        { name: "expired", values: rates("fencelock_lease_expirations_total") },
        { name: "timed out", values: rates("fencelock_wait_timeouts_total") }], "/s"),
      lineChart("chart-wait", "Wait in queue (p50, p99 over 10 s)", [
        { name: "p50", values: histQuantiles("fencelock_wait_seconds", 0.5) },
        { name: "p99", values: histQuantiles("fencelock_wait_seconds", 0.99) }], "ms"),
      lineChart("chart-hold", "Hold time (p50, p99 over 10 s)", [
        { name: "p50", values: histQuantiles("fencelock_hold_seconds", 0.5) },
        { name: "p99", values: histQuantiles("fencelock_hold_seconds", 0.99) }], "ms"),
      lineChart("chart-held", "Held locks and waiters", [
        { name: "held", values: gauge("fencelock_held_locks") },
        { name: "waiting", values: gauge("fencelock_queue_depth") }], ""))];
}

// ---- Admin actions ---------------------------------------------------------

/** A modal confirmation; resolves to true when the user confirms. */
function confirmAction(title, text, okLabel, extra) {
  const d = $("#confirm");
  $("#confirm-title").textContent = title;
  $("#confirm-text").textContent = text;
  $("#confirm-ok").textContent = okLabel;
  $("#confirm-extra").replaceChildren(...(extra ? [extra] : []));
  d.returnValue = "";
  d.showModal();
  return new Promise((resolve) => d.addEventListener("close", () => resolve(d.returnValue === "ok"), { once: true }));
}

async function revoke(holder, l) {
  const others = l.waiters.length ? `The first waiter in the queue gets "${l.name}" at once.` : "No one waits for it.";
  const text = `The lease ${holder.lease_id} (${holder.identity || "no identity"}) ends now: its holder loses "${l.name}" and every other lock it holds, and learns it at its next keep-alive. A fenced resource refuses token ${holder.token} from then on. ${others}`;
  if (!(await confirmAction("Revoke this lease?", text, "Revoke lease"))) return;
  try {
    await api(`/v1/leases/${holder.lease_id}`, { method: "DELETE" });
    flash(`Lease ${holder.lease_id} revoked.`);
  } catch (e) {
    flash(`Not revoked: ${e.code}: ${e.message}`, true);
  }
  refresh();
}

async function resize(l) {
  const input = h("input", { type: "number", min: 1, max: 1000000, value: l.permits, id: "permits" });
  const text = `"${l.name}" has ${l.permits} permit${l.permits === 1 ? "" : "s"}. A larger number grants the queue's waiters at once, from its head; a number below the permits in use (or below the largest waiting request) is refused. No holder loses its permit.`;
  if (!(await confirmAction("Resize the semaphore?", text, "Resize", h("label", {}, "New permits ", input)))) return;
  try {
    const r = await api(`/v1/locks/${encodeURIComponent(l.name)}/permits`, { method: "PUT", body: { permits: Number(input.value) } });
    flash(`Resized from ${r.was} to ${input.value} permits.`);
  } catch (e) {
    flash(`Not resized: ${e.code}: ${e.message}`, true);
  }
  refresh();
}

function flash(text, bad) {
  const el = h("div", { class: `notice ${bad ? "error" : ""}`, id: "flash" }, text);
  const old = $("#flash");
  if (old) old.remove();
  $("#view-head").append(el);
  setTimeout(() => el.remove(), 8000);
}

// ---- Start -----------------------------------------------------------------

function start() {
  $("#login").addEventListener("submit", (ev) => {
    ev.preventDefault();
    S.token = $("#token").value;
    $("#token").value = "";
    $("#login").hidden = true;
    $("#main").hidden = false;
    $("#signout").hidden = false;
    route();
  });
  $("#signout").addEventListener("click", () => {
    S.token = null;
    $("#signout").hidden = true;
    needLogin("");
  });
  window.addEventListener("hashchange", route);
  setInterval(tick, 250);
  setInterval(refresh, REFRESH_EVERY_MS);
  route();
}

start();
