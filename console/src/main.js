// The gateway's web console: pages over the REST API (/v1) and the console's own API
// (/ui/api), signed in with an HttpOnly session cookie. The API key is sent once, to
// /ui/api/login, and kept nowhere; the CSRF token lives in this page's memory only.
// Everything a sandbox wrote is shown as text (textContent) or as a blob image, never as
// markup.
import { Terminal } from "@xterm/xterm";
import { FitAddon } from "@xterm/addon-fit";
import "@xterm/xterm/css/xterm.css";
import "./style.css";

let me = null; // {open, admin, key, csrf}
let timer = null; // the current page's refresh
let cleanup = []; // what leaving the current page closes (a terminal, its socket)
const main = document.getElementById("main");

// --- small helpers -------------------------------------------------------------------
function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

class ApiError extends Error {
  constructor(status, body) {
    super((body && body.message) || `HTTP ${status}`);
    this.status = status;
    this.body = body;
  }
}

async function api(method, path, { json, body, headers = {}, raw = false } = {}) {
  const init = { method, headers: { ...headers }, credentials: "same-origin" };
  if (json !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(json);
  } else if (body !== undefined) {
    init.body = body;
  }
  if (!["GET", "HEAD"].includes(method) && me && me.csrf) init.headers["X-CSRF-Token"] = me.csrf;
  const res = await fetch(path, init);
  if (res.status === 401 && path !== "/ui/api/login") {
    me = null;
    go("#/login");
    throw new ApiError(401, { message: "signed out" });
  }
  if (!res.ok) {
    let err = null;
    try { err = await res.json(); } catch { /* not JSON */ }
    throw new ApiError(res.status, err);
  }
  if (raw) return res;
  if (res.status === 204) return null;
  const type = res.headers.get("content-type") || "";
  return type.includes("json") ? res.json() : res.text();
}

const enc = encodeURIComponent;
const sbx = (id) => `/v1/sandboxes/${enc(id)}`;

function flash(text, kind = "error") {
  const box = h("div", { class: `flash ${kind}`, role: kind === "error" ? "alert" : "status" }, text);
  main.prepend(box);
  setTimeout(() => box.remove(), 6000);
}

function guard(fn) {
  return async (...args) => {
    try { await fn(...args); } catch (e) { if (e.status !== 401) flash(e.message); }
  };
}

function age(seconds) {
  if (seconds === null || seconds === undefined || !isFinite(seconds)) return "–";
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
  return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
}

function bytes(n) {
  if (n === null || n === undefined || !isFinite(n)) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

function table(columns, rows, { sort, onSort, empty = "nothing here" } = {}) {
  const head = h("tr", {}, columns.map((c) => {
    if (!c.sort || !onSort) return h("th", { scope: "col" }, c.title);
    const dir = sort && sort.key === c.sort ? (sort.desc ? "descending" : "ascending") : "none";
    return h("th", { scope: "col", "aria-sort": dir },
      h("button", { type: "button", class: "sort", onclick: () => onSort(c.sort) },
        c.title, dir === "none" ? "" : dir === "ascending" ? " ▲" : " ▼"));
  }));
  const body = rows.length
    ? rows.map((r) => h("tr", {}, columns.map((c) => h("td", { "data-label": c.title }, c.cell(r)))))
    : [h("tr", {}, h("td", { colspan: columns.length, class: "muted" }, empty))];
  return h("div", { class: "scroll" }, h("table", {}, h("thead", {}, head), h("tbody", {}, body)));
}

function page(title, ...content) {
  main.replaceChildren(h("h1", {}, title), ...content);
  document.title = `${title} · abx console`;
}

// --- routing -------------------------------------------------------------------------
const routes = [
  [/^#\/login$/, loginPage],
  [/^#\/(sandboxes)?$/, sandboxesPage],
  [/^#\/sandbox\/(sbx-[a-z0-9]+)(?:\/(\w+))?$/, sandboxPage],
  [/^#\/templates$/, templatesPage],
  [/^#\/volumes$/, volumesPage],
  [/^#\/keys$/, keysPage],
  [/^#\/health$/, healthPage],
];

function go(hash) {
  if (location.hash !== hash) location.hash = hash;
  else route();
}

function leave() {
  clearInterval(timer);
  timer = null;
  for (const fn of cleanup.splice(0)) { try { fn(); } catch { /* gone already */ } }
}

async function route() {
  leave();
  const hash = location.hash || "#/";
  if (!me && hash !== "#/login") {
    try { me = await api("GET", "/ui/api/me"); } catch { return; }
  }
  chrome();
  for (const [re, fn] of routes) {
    const m = hash.match(re);
    if (m) {
      await guard(fn)(...m.slice(1));
      main.focus({ preventScroll: true });
      return;
    }
  }
  page("Not found", h("p", {}, "No such page. ", h("a", { href: "#/" }, "Sandboxes")));
}

function chrome() {
  const top = document.getElementById("top");
  top.hidden = !me;
  if (!me) return;
  const links = [["#/", "Sandboxes"], ["#/templates", "Templates"], ["#/volumes", "Volumes"]];
  if (me.admin) links.push(["#/keys", "Keys"], ["#/health", "Health"]);
  const here = location.hash || "#/";
  document.getElementById("nav").replaceChildren(...links.map(([href, text]) =>
    h("a", { href, "aria-current": here === href ? "page" : null }, text)));
  document.getElementById("who").textContent = me.open
    ? "open gateway (no keys)" : `${me.key.name}${me.admin ? " (admin)" : ""}`;
  document.getElementById("logout").hidden = !!me.open;
}

// --- sign-in -------------------------------------------------------------------------
function loginPage() {
  const key = h("input", { id: "key", type: "password", name: "key", autocomplete: "off",
    required: true, placeholder: "abx_…", "aria-label": "API key" });
  const form = h("form", { class: "card login", onsubmit: guard(async (ev) => {
    ev.preventDefault();
    const who = await api("POST", "/ui/api/login", { json: { key: key.value } });
    key.value = "";
    me = who.open ? await api("GET", "/ui/api/me") : who;
    go("#/");
  }) },
  h("label", { for: "key" }, "API key"), key,
  h("p", { class: "muted" }, "The key is exchanged once for a session cookie; the page keeps no copy."),
  h("button", { type: "submit", class: "primary" }, "Sign in"));
  page("Sign in", form);
  document.getElementById("top").hidden = true;
  key.focus();
}

async function logout() {
  try { await api("POST", "/ui/api/logout"); } catch { /* signed out anyway */ }
  me = null;
  go("#/login");
}

// --- sandboxes -----------------------------------------------------------------------
const listState = { filter: "", sort: { key: "created_at", desc: true } };
const metricsCache = new Map(); // sandbox id -> latest metrics (or null: none offered)

function metricsOf(info) {
  // The E2B-parity metrics when the API offers them; the sandbox's own fields otherwise.
  const m = metricsCache.get(info.sandbox_id) || info.metrics || null;
  if (!m) return { cpu: null, mem: null };
  const last = Array.isArray(m) ? m[m.length - 1] : m;
  if (!last) return { cpu: null, mem: null };
  return { cpu: last.cpu_used_pct ?? last.cpuUsedPct ?? last.cpu_percent ?? null,
    mem: last.mem_used ?? last.memUsed ?? last.memory_bytes ?? null };
}

let metricsAt = 0;
const METRICS_EVERY = 10000; // ms: one request per sandbox at most this often

async function refreshMetrics(infos) {
  if (Date.now() - metricsAt < METRICS_EVERY) return;
  metricsAt = Date.now();
  await Promise.all(infos.filter((i) => i.state === "running").map(async (i) => {
    if (metricsCache.get(i.sandbox_id) === null) return; // none offered: asked once
    try {
      metricsCache.set(i.sandbox_id, await api("GET", `${sbx(i.sandbox_id)}/metrics`));
    } catch (e) {
      // None offered here (an older gateway, a backend without metrics): ask no more.
      if ([400, 404, 405, 501].includes(e.status)) metricsCache.set(i.sandbox_id, null);
    }
  }));
}

async function sandboxesPage() {
  const templates = await api("GET", "/v1/templates").catch(() => []);
  const filter = h("input", { type: "search", id: "filter", placeholder: "filter (/)",
    value: listState.filter, "aria-label": "filter sandboxes" });
  const list = h("div", { id: "sandboxes" });
  const pick = h("select", { id: "template", "aria-label": "template" },
    templates.map((t) => h("option", { value: t.name, selected: t.name === "base" }, t.name)));
  const create = h("form", { class: "row", onsubmit: guard(async (ev) => {
    ev.preventDefault();
    const info = await api("POST", "/v1/sandboxes", { json: { template: pick.value } });
    flash(`created ${info.sandbox_id}`, "ok");
    await draw();
  }) }, pick, h("button", { type: "submit", class: "primary", id: "create" }, "Create sandbox"));
  let infos = [];

  function render() {
    const q = listState.filter.toLowerCase();
    const rows = infos.filter((i) => !q || [i.sandbox_id, i.state, i.template, i.owner,
      i.network && i.network.mode].join(" ").toLowerCase().includes(q));
    const { key, desc } = listState.sort;
    rows.sort((a, b) => {
      const x = a[key] ?? "", y = b[key] ?? "";
      return (x < y ? -1 : x > y ? 1 : 0) * (desc ? -1 : 1);
    });
    const now = Date.now() / 1000;
    list.replaceChildren(table([
      { title: "Sandbox", sort: "sandbox_id", cell: (i) => h("a", { href: `#/sandbox/${i.sandbox_id}` }, i.sandbox_id) },
      { title: "State", sort: "state", cell: (i) => h("span", { class: `state ${i.state}` }, i.state) },
      { title: "Template", sort: "template", cell: (i) => i.template },
      { title: "Owner", sort: "owner", cell: (i) => i.owner || "–" },
      { title: "Age", sort: "created_at", cell: (i) => age(now - i.created_at) },
      { title: "Idle timer", sort: "last_used", cell: (i) => i.state === "running"
        ? `${age(i.last_used + i.timeout - now)} → ${i.on_timeout}` : "–" },
      { title: "Network", cell: (i) => (i.network && i.network.mode) || "–" },
      { title: "CPU", cell: (i) => { const c = metricsOf(i).cpu; return c === null ? "–" : `${Number(c).toFixed(1)}%`; } },
      { title: "Memory", cell: (i) => bytes(metricsOf(i).mem) },
      { title: "Actions", cell: (i) => actions(i, draw) },
    ], rows, { sort: listState.sort, empty: "no sandboxes", onSort: (k) => {
      listState.sort = { key: k, desc: listState.sort.key === k ? !listState.sort.desc : false };
      render();
    } }));
  }

  async function draw() {
    infos = await api("GET", "/v1/sandboxes");
    render();
    refreshMetrics(infos).then(render, () => {});
  }

  filter.addEventListener("input", () => { listState.filter = filter.value; render(); });
  page("Sandboxes", create, filter, list);
  await draw();
  timer = setInterval(guard(draw), 2000);
}

function actions(info, after) {
  const id = info.sandbox_id;
  const act = (label, method, path, confirmText, opts = {}) => h("button", {
    type: "button", class: opts.danger ? "danger" : "", "data-action": label,
    onclick: guard(async () => {
      if (confirmText && !confirm(confirmText)) return;
      await api(method, path);
      flash(`${label}: ${id}`, "ok");
      await after();
    }) }, label);
  return h("span", { class: "actions" },
    info.state === "running" ? act("pause", "POST", `${sbx(id)}/pause`) : null,
    info.state === "paused" ? act("resume", "POST", `${sbx(id)}/resume`) : null,
    act("reset", "POST", `${sbx(id)}/reset-rootfs`, `Reset ${id}'s system layer?`),
    act("kill", "DELETE", sbx(id), `Kill ${id} (its volume is kept)?`, { danger: true }),
    act("kill + volume", "DELETE", `${sbx(id)}?delete_volumes=true`,
      `Kill ${id} and delete its volume?`, { danger: true }));
}

// --- one sandbox ---------------------------------------------------------------------
const TABS = ["terminal", "files", "processes", "ports", "audit"];

async function sandboxPage(id, tab = "terminal") {
  if (!TABS.includes(tab)) tab = "terminal";
  const info = await api("GET", sbx(id));
  const m = metricsOf(info);
  const facts = [["State", h("span", { class: `state ${info.state}` }, info.state)],
    ["Template", info.template], ["Owner", info.owner || "–"], ["Network", info.network.mode],
    ["Volume", info.volume_id], ["Idle timeout", `${age(info.timeout)} → ${info.on_timeout}`],
    ["CPU", m.cpu === null ? "–" : `${Number(m.cpu).toFixed(1)}%`], ["Memory", bytes(m.mem)]];
  const summary = h("dl", { class: "facts" }, facts.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
  const tabs = h("nav", { class: "tabs", "aria-label": "sandbox sections" }, TABS.map((t) =>
    h("a", { href: `#/sandbox/${id}/${t}`, "aria-current": t === tab ? "page" : null }, t)));
  const body = h("section", { id: `tab-${tab}` });
  page(id, summary, h("p", {}, actions(info, () => go(`#/sandbox/${id}/${tab}`))), tabs, body);
  await { terminal, files, processes, ports, audit }[tab](id, body, info);
}

function terminal(id, body, info) {
  if (info.state !== "running") {
    body.append(h("p", { class: "muted" }, "The sandbox is not running: resume it for a terminal."));
    return;
  }
  const box = h("div", { class: "terminal", id: "terminal" });
  const status = h("p", { class: "muted", id: "terminal-status" }, "connecting…");
  body.append(box, status);
  const dark = document.documentElement.dataset.theme === "dark" ||
    (!document.documentElement.dataset.theme && matchMedia("(prefers-color-scheme: dark)").matches);
  const term = new Terminal({ cursorBlink: true, fontSize: 14, convertEol: false,
    theme: dark ? {} : { background: "#fdfdfd", foreground: "#1c1c1c", cursor: "#1c1c1c",
      selectionBackground: "#b5d5ff" } });
  const fit = new FitAddon();
  term.loadAddon(fit);
  term.open(box);
  fit.fit();
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const ws = new WebSocket(`${scheme}://${location.host}${sbx(id)}/pty`);
  ws.binaryType = "arraybuffer";
  const encoder = new TextEncoder();
  ws.onopen = () => ws.send(JSON.stringify({ cols: term.cols, rows: term.rows }));
  ws.onmessage = (ev) => {
    if (typeof ev.data !== "string") { term.write(new Uint8Array(ev.data)); return; }
    let msg = {};
    try { msg = JSON.parse(ev.data); } catch { return; }
    if (msg.pid !== undefined) { status.textContent = `terminal pid ${msg.pid}`; term.focus(); }
    if (msg.exit_code !== undefined) status.textContent = `exited with ${msg.exit_code}`;
    if (msg.error) status.textContent = `error: ${msg.error.message || msg.error.code}`;
  };
  ws.onclose = () => { if (!status.textContent.startsWith("exited")) status.textContent += " (closed)"; };
  const input = term.onData((d) => { if (ws.readyState === 1) ws.send(encoder.encode(d)); });
  const resized = term.onResize(({ cols, rows }) => {
    if (ws.readyState === 1) ws.send(JSON.stringify({ resize: [cols, rows] }));
  });
  const refit = () => fit.fit();
  addEventListener("resize", refit);
  cleanup.push(() => ws.close(), () => input.dispose(), () => resized.dispose(),
    () => removeEventListener("resize", refit), () => term.dispose());
}

const IMAGE_TYPES = { png: "image/png", jpg: "image/jpeg", jpeg: "image/jpeg", gif: "image/gif",
  webp: "image/webp", bmp: "image/bmp", ico: "image/x-icon", svg: "image/svg+xml" };
const IMAGE = /\.(png|jpe?g|gif|webp|bmp|ico|svg)$/i;
const PREVIEW_BYTES = 256 * 1024; // of a text file
const IMAGE_BYTES = 8 * 1024 * 1024; // an image is shown whole, up to this

function join(dir, name) { return `${dir.replace(/\/+$/, "")}/${name}`; }

async function blobOf(id, path, limit) {
  const q = `path=${enc(path)}${limit ? `&limit=${limit}` : ""}`;
  const res = await api("GET", `${sbx(id)}/files/content?${q}`, { raw: true });
  return res.blob();
}

async function files(id, body) {
  let dir = sessionStorage.getItem(`dir:${id}`) || "/workspace";
  const where = h("input", { id: "path", value: dir, "aria-label": "directory" });
  const upload = h("input", { type: "file", id: "upload", multiple: true, "aria-label": "upload files" });
  const listing = h("div", { id: "files" });
  const preview = h("div", { id: "preview", class: "preview" });

  async function show(path) {
    dir = path;
    where.value = path;
    sessionStorage.setItem(`dir:${id}`, path);
    const entries = await api("GET", `${sbx(id)}/files?path=${enc(path)}`);
    entries.sort((a, b) => (a.type !== b.type ? (a.type === "dir" ? -1 : 1) : a.name < b.name ? -1 : 1));
    const parent = path.replace(/\/[^/]+\/?$/, "") || "/";
    listing.replaceChildren(table([
      { title: "Name", cell: (e) => e.type === "dir"
        ? h("button", { type: "button", class: "link", onclick: guard(() => show(join(path, e.name))) }, `${e.name}/`)
        : h("button", { type: "button", class: "link", onclick: guard(() => look(join(path, e.name))) }, e.name) },
      { title: "Type", cell: (e) => e.type },
      { title: "Size", cell: (e) => (e.type === "dir" ? "–" : bytes(e.size)) },
      { title: "Actions", cell: (e) => h("span", { class: "actions" },
        e.type === "dir" ? null : h("button", { type: "button", "data-action": "download",
          onclick: guard(() => download(join(path, e.name), e.name)) }, "download"),
        h("button", { type: "button", class: "danger", "data-action": "delete", onclick: guard(async () => {
          if (!confirm(`Delete ${join(path, e.name)}?`)) return;
          await api("DELETE", `${sbx(id)}/files?path=${enc(join(path, e.name))}`);
          await show(path);
        }) }, "delete")) },
    ], entries, { empty: "empty directory" }));
    if (path !== "/") listing.prepend(h("button", { type: "button", class: "link", onclick: guard(() => show(parent)) }, "↑ up"));
  }

  function download(path, name) {
    // A link with `download`: the browser streams the file to disk (with the session's
    // cookie; a GET changes nothing), however big; the answer is octet-stream, never shown.
    const a = h("a", { href: `${sbx(id)}/files/content?path=${enc(path)}`, download: name });
    document.body.append(a);
    a.click();
    a.remove();
  }

  async function look(path) {
    const image = path.match(IMAGE);
    const blob = await blobOf(id, path, image ? IMAGE_BYTES : PREVIEW_BYTES);
    if (image) {
      // A data: URL, not a blob: one: a blob URL is this page's origin, and one opened in
      // a tab of its own would run what an SVG carries as this page; a data: URL can be
      // neither navigated to nor given an origin. An <img> runs no script either way.
      const typed = blob.slice(0, blob.size, IMAGE_TYPES[image[1].toLowerCase()]);
      const url = await new Promise((resolve, reject) => {
        const reader = new FileReader();
        reader.onload = () => resolve(reader.result);
        reader.onerror = () => reject(reader.error);
        reader.readAsDataURL(typed);
      });
      preview.replaceChildren(h("h2", {}, path), h("img", { src: url, alt: path, id: "preview-image" }));
    } else {
      const text = await blob.text();
      preview.replaceChildren(h("h2", {}, path), h("pre", { id: "preview-text" }, text),
        blob.size >= PREVIEW_BYTES ? h("p", { class: "muted" }, "(first 256 KiB)") : null);
    }
  }

  upload.addEventListener("change", guard(async () => {
    for (const file of upload.files) {
      await api("PUT", `${sbx(id)}/files/content?path=${enc(join(dir, file.name))}`,
        { body: file, headers: { "Content-Type": "application/octet-stream" } });
    }
    flash(`uploaded ${[...upload.files].map((f) => f.name).join(", ")}`, "ok");
    upload.value = "";
    await show(dir);
  }));
  body.append(h("form", { class: "row", onsubmit: guard(async (ev) => { ev.preventDefault(); await show(where.value); }) },
    where, h("button", { type: "submit" }, "Open")),
  h("p", {}, h("label", { for: "upload" }, "Upload into this directory: "), upload), listing, preview);
  await show(dir);
}

async function processes(id, body) {
  const out = h("pre", { id: "process-output", class: "output" });
  const list = h("div");
  async function draw() {
    const procs = await api("GET", `${sbx(id)}/processes`);
    list.replaceChildren(table([
      { title: "PID", cell: (p) => h("button", { type: "button", class: "link", "data-pid": p.pid, onclick: guard(async () => {
        const o = await api("GET", `${sbx(id)}/processes/${p.pid}/output`);
        out.textContent = `${o.stdout || ""}${o.stderr ? `\n[stderr]\n${o.stderr}` : ""}`;
      }) }, String(p.pid)) },
      { title: "Command", cell: (p) => p.cmd || "" },
      { title: "State", cell: (p) => (p.running ? "running" : `exited ${p.exit_code ?? "?"}`) },
      { title: "Actions", cell: (p) => (!p.running ? "–" : h("button", { type: "button", class: "danger", onclick: guard(async () => {
        await api("POST", `${sbx(id)}/processes/${p.pid}/kill`, { json: { signal: 9 } });
        await draw();
      }) }, "kill")) },
    ], procs, { empty: "no background processes" }));
  }
  body.append(list, h("h2", {}, "Output"), out);
  await draw();
  timer = setInterval(guard(draw), 3000);
}

function safeUrl(url) {
  // A link only to http(s): never javascript: or data:, whatever the API says.
  try { return ["http:", "https:"].includes(new URL(url, location.href).protocol); } catch { return false; }
}

async function ports(id, body, info) {
  // Share links (preview URLs a browser opens) when the API has them; otherwise the
  // gateway's port proxy, for API clients with a key.
  const list = h("div", { id: "shares" });
  const made = h("div", { id: "new-share" });
  let shares = null;
  try {
    shares = await api("GET", `${sbx(id)}/shares`);
  } catch (e) {
    if (e.status === 401) throw e;
  }
  const given = info.previews || info.ports || null;
  const entries = shares || (Array.isArray(given) ? given
    : given && typeof given === "object" ? Object.entries(given).map(([port, url]) => ({ port, url })) : []);
  const link = (url) => (safeUrl(url) ? h("a", { href: url, target: "_blank", rel: "noopener noreferrer" }, url) : String(url || "–"));
  list.append(entries.length
    ? table([
      { title: "Port", cell: (p) => String(p.port) },
      { title: "Preview", cell: (p) => (p.url ? link(p.url) : "(a link with a token: shown once, when made)") },
      { title: "Expires", cell: (p) => (p.expires_at ? new Date(p.expires_at * 1000).toLocaleString() : "–") },
      { title: "Actions", cell: (p) => (p.share_id ? h("button", { type: "button", class: "danger", onclick: guard(async () => {
        await api("DELETE", `${sbx(id)}/shares/${enc(p.share_id)}`);
        go(`#/sandbox/${id}/ports`);
      }) }, "revoke") : "–") },
    ], entries)
    : h("p", { class: "muted" }, shares ? "No share links to this sandbox's ports." : "No ports exposed (the API gives no preview links for this sandbox)."));
  const port = h("input", { id: "share-port", type: "number", min: 1, max: 65535, required: true, "aria-label": "port" });
  const form = shares === null ? null : h("form", { class: "row", onsubmit: guard(async (ev) => {
    ev.preventDefault();
    const share = await api("POST", `${sbx(id)}/shares`, { json: { port: Number(port.value) } });
    made.replaceChildren(h("p", { class: "flash ok" }, `Port ${share.port}: `, link(share.url), " — the link is shown this once."));
  }) }, port, h("button", { type: "submit" }, "Share a port"));
  body.append(form || "", made, list, h("p", { class: "muted" }, "API clients reach port N through ",
    h("code", {}, `${location.origin}${sbx(id)}/ports/N/`), " with their key."));
}

async function audit(id, body) {
  const trail = await api("GET", `/ui/api/sandboxes/${enc(id)}/audit`);
  body.append(table([
    { title: "Time", cell: (e) => new Date(e.time * 1000).toLocaleString() },
    { title: "Via", cell: (e) => (e.tool ? `mcp (${e.transport || "?"})` : e.transport || e.event || "–") },
    { title: "What", cell: (e) => e.tool || (e.method ? `${e.method} ${e.route}` : e.event || "–") },
    { title: "Outcome", cell: (e) => String(e.status ?? e.reason ?? "–") },
    { title: "Duration", cell: (e) => (e.duration_ms !== undefined ? `${e.duration_ms} ms` : "–") },
  ], trail.slice().reverse(), { empty: "no audit records (is the audit log on?)" }));
}

// --- operator pages ------------------------------------------------------------------
async function templatesPage() {
  const rows = await api("GET", "/v1/templates");
  page("Templates", table([
    { title: "Name", cell: (t) => t.name },
    { title: "Description", cell: (t) => t.description || "–" },
    { title: "Size", cell: (t) => bytes(t.size_bytes ?? t.size) },
  ], rows, { empty: "no templates" }));
}

async function volumesPage() {
  async function draw() {
    const rows = await api("GET", "/v1/volumes");
    page("Volumes", table([
      { title: "Volume", cell: (v) => v.volume_id },
      { title: "Owner", cell: (v) => v.owner || "–" },
      { title: "In use by", cell: (v) => v.sandbox_id || v.in_use_by || "–" },
      { title: "Size", cell: (v) => bytes(v.size_bytes ?? v.size) },
      { title: "Actions", cell: (v) => h("button", { type: "button", class: "danger", onclick: guard(async () => {
        if (!confirm(`Delete volume ${v.volume_id}?`)) return;
        await api("DELETE", `/v1/volumes/${enc(v.volume_id)}`);
        await draw();
      }) }, "delete") },
    ], rows, { empty: "no volumes" }));
  }
  await draw();
}

function adminOnly(title) {
  if (me.admin) return false;
  page(title, h("p", { class: "muted", id: "admin-only" }, "Only an admin key sees this page."));
  return true;
}

async function keysPage() {
  if (adminOnly("Keys")) return;
  const field = (id, label, attrs = {}) => [h("label", { for: id }, label), h("input", { id, name: id, ...attrs })];
  const made = h("div", { id: "new-token" });
  const list = h("div");
  const form = h("form", { class: "card grid", onsubmit: guard(async (ev) => {
    ev.preventDefault();
    const v = (n) => form.elements[n].value.trim();
    const num = (n) => (v(n) === "" ? null : Number(v(n)));
    const key = await api("POST", "/ui/api/keys", { json: { name: v("name"),
      admin: form.elements.admin.checked, max_sandboxes: num("max_sandboxes"),
      max_commands: num("max_commands"), network: v("network") || null } });
    made.replaceChildren(h("p", { class: "flash ok" }, `Key ${key.name} (${key.id}): `,
      h("code", {}, key.token), " — shown this once."));
    form.reset();
    await draw();
  }) },
  ...field("name", "Name", { required: true }),
  ...field("max_sandboxes", "Max sandboxes", { type: "number", min: 0, placeholder: "default" }),
  ...field("max_commands", "Max commands", { type: "number", min: 0, placeholder: "default" }),
  ...field("network", "Network ceiling", { placeholder: "none, full or a policy (default: the gateway's)" }),
  h("label", { for: "admin" }, "Admin"), h("input", { id: "admin", name: "admin", type: "checkbox" }),
  h("span"), h("button", { type: "submit", class: "primary" }, "Create key"));
  async function draw() {
    const keys = await api("GET", "/ui/api/keys");
    list.replaceChildren(table([
      { title: "Id", cell: (k) => k.id }, { title: "Name", cell: (k) => k.name },
      { title: "Admin", cell: (k) => (k.admin ? "yes" : "no") },
      { title: "Created", cell: (k) => new Date(k.created_at * 1000).toLocaleString() },
      { title: "Quotas", cell: (k) => `${k.max_sandboxes} sandboxes, ${k.max_commands} commands` },
      { title: "Network ceiling", cell: (k) => (k.network_ceiling ? k.network_ceiling.mode : "gateway's") },
      { title: "State", cell: (k) => (k.revoked ? "revoked" : "live") },
      { title: "Actions", cell: (k) => (k.revoked ? "–" : h("button", { type: "button", class: "danger", onclick: guard(async () => {
        if (!confirm(`Revoke ${k.name}? Its sessions end now.`)) return;
        await api("DELETE", `/ui/api/keys/${enc(k.id)}`);
        await draw();
      }) }, "revoke")) },
    ], keys));
  }
  page("Keys", form, made, list);
  await draw();
}

async function healthPage() {
  if (adminOnly("Health")) return;
  async function draw() {
    const hl = await api("GET", "/ui/api/health");
    const disk = hl.disk || {};
    const sup = hl.supervisor;
    const pool = hl.pool;
    page("Health", h("dl", { class: "facts", id: "health" },
      h("dt", {}, "Status"), h("dd", {}, hl.status),
      h("dt", {}, "Disk free"), h("dd", {}, hl.disk ? bytes(disk.free ?? disk.free_bytes) : "not this host's"),
      h("dt", {}, "Disk reserve"), h("dd", {}, hl.disk ? bytes(disk.reserve ?? disk.reserve_bytes) : "–"),
      h("dt", {}, "Sandboxes"), h("dd", {}, Object.entries(hl.sandboxes || {}).map(([s, n]) => `${n} ${s}`).join(", ") || "none"),
      h("dt", {}, "Supervisor"), h("dd", {}, sup ? (sup.running ? `running (pid ${sup.pid}, ${age(Date.now() / 1000 - sup.since)})` : "not running (nothing to time out)") : "none here"),
      h("dt", {}, "Warm pool"), h("dd", {}, pool ? `${pool.warm} warm of ${pool.size} per template (${(pool.templates || []).join(", ")})` : "none here")));
  }
  await draw();
  timer = setInterval(guard(draw), 5000);
}

// --- start ---------------------------------------------------------------------------
function theme(next) {
  const root = document.documentElement;
  if (next) root.dataset.theme = next;
  else delete root.dataset.theme;
}
theme(localStorage.getItem("abx-theme"));
document.getElementById("theme").addEventListener("click", () => {
  const dark = document.documentElement.dataset.theme
    ? document.documentElement.dataset.theme === "dark"
    : matchMedia("(prefers-color-scheme: dark)").matches;
  const next = dark ? "light" : "dark";
  localStorage.setItem("abx-theme", next); // a preference, not a secret
  theme(next);
});
document.getElementById("logout").addEventListener("click", logout);
document.addEventListener("keydown", (ev) => {
  if (ev.key === "/" && !["INPUT", "TEXTAREA"].includes(document.activeElement.tagName)
      && !document.activeElement.closest(".terminal")) {
    const f = document.getElementById("filter");
    if (f) { ev.preventDefault(); f.focus(); }
  }
});
addEventListener("hashchange", route);
route();
