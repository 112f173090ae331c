// The quotad console: a few pages over quotad's public API, nothing else. The token lives in
// sessionStorage and travels only as a bearer header; every page is built with DOM calls
// (textContent, never innerHTML), so a tenant's or a client's name cannot inject markup.
"use strict";

const TOKEN_KEY = "quotad.token";
const main = () => document.getElementById("main");

// ---- tiny DOM helpers ---------------------------------------------------------------------

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "text") el.textContent = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function show(...nodes) {
  main().replaceChildren(...nodes);
  // Each page its own title, from its heading (for tabs, history and screen readers).
  const h1 = main().querySelector("h1");
  document.title = (h1 ? h1.textContent + " · " : "") + "quotad console";
}

/** An instant in the browser's zone, with UTC on hover. */
function when(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  return h("time", { datetime: d.toISOString(), title: "UTC " + d.toISOString().replace(".000Z", "Z") },
    d.toLocaleString());
}

function enc(s) {
  return encodeURIComponent(s);
}

/** `.` and `..` are valid ids, but a browser removes them from a URL path (as dot segments). */
function unreachable(id) {
  return id === "." || id === "..";
}

function dotted(id) {
  return h("p", { class: "error", id: "error" },
    "The id " + JSON.stringify(id) + " cannot be used in a URL path (browsers read it as a directory step); use the API with curl --path-as-is.");
}

// ---- the API ------------------------------------------------------------------------------

function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

class ApiError extends Error {
  constructor(status, body) {
    const e = (body && body.error) || {};
    super(e.message || ("HTTP " + status));
    this.status = status;
    this.code = e.code;
    this.field = e.field;
  }
}

async function api(method, path, body, extra) {
  const headers = Object.assign({ Authorization: "Bearer " + token() }, extra || {});
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const r = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  let json = null;
  try { json = await r.json(); } catch (_) { json = null; }
  if (r.status === 401) {
    sessionStorage.removeItem(TOKEN_KEY);
    signin("Signed out: the server no longer accepts this token.", location.hash);
    throw new ApiError(401, json);
  }
  if (!r.ok) throw new ApiError(r.status, json);
  return json;
}

/** A page-level error: 403 says the token may not see this. */
function failure(e) {
  if (e.status === 403) {
    return h("p", { class: "error", id: "error" }, "Permission denied: this token cannot see this page (" + e.message + ").");
  }
  if (e.status === 404) return h("p", { class: "error", id: "error" }, "Not found: " + e.message);
  return h("p", { class: "error", id: "error" }, "Error: " + e.message);
}

/** Who the token is (`GET /v1/whoami`), asked once a sign-in. */
let whoami = null;
async function me() {
  if (!whoami) whoami = api("GET", "/v1/whoami").catch((e) => { whoami = null; throw e; });
  return whoami;
}

// ---- sign-in ------------------------------------------------------------------------------

/** The sign-in form; once signed in, the page at `next` (a hash: a deep link survives). */
function signin(message, next) {
  const target = next && next !== "#/signin" && next !== "#" ? next : "#/tenants";
  document.getElementById("nav").hidden = true;
  const input = h("input", { type: "password", id: "token", autocomplete: "off", size: 40, placeholder: "admin or tenant_admin token" });
  const note = h("p", { id: "signin-error", class: "error" }, message || "");
  const form = h("form", {
    id: "signin",
    onsubmit: async (ev) => {
      ev.preventDefault();
      // Tried here rather than through api(), which signs out on a 401.
      const t = input.value.trim();
      let r;
      try {
        r = await fetch("/v1/quotas?limit=1", { headers: { Authorization: "Bearer " + t } });
      } catch (e) {
        note.textContent = "Could not reach quotad, or the token holds characters a header cannot: " + e.message;
        return;
      }
      if (r.ok) {
        sessionStorage.setItem(TOKEN_KEY, t);
        whoami = null;
        // A changed hash routes by itself; an unchanged one needs a nudge.
        if (location.hash === target) route();
        else location.hash = target;
      } else {
        note.textContent = r.status === 401 ? "Unknown token." : (r.status === 403 ? "This token cannot manage quotas." : "The server answered " + r.status + ".");
      }
    },
  }, h("div", { class: "field" }, h("label", { for: "token" }, "Token"), input), " ", h("button", { class: "primary", type: "submit", id: "signin-submit" }, "Sign in"), note);
  show(h("section", { class: "signin" }, h("h1", {}, "Sign in to quotad"),
    h("p", { class: "muted" }, "The token stays in this tab (sessionStorage) and is sent only as an Authorization header."), form));
}

// ---- tenants --------------------------------------------------------------------------------

async function tenants(params) {
  const prefix = params.get("prefix") || "";
  const after = params.get("after") || "";
  const search = h("input", { id: "prefix", value: prefix, placeholder: "tenant id prefix" });
  const created = h("input", { id: "new-tenant", placeholder: "new tenant id" });
  const list = h("tbody", { id: "tenants" });
  const page = h("section", {},
    h("h1", {}, "Tenants"),
    h("form", { class: "row", onsubmit: (ev) => { ev.preventDefault(); location.hash = "#/tenants?prefix=" + enc(search.value.trim()); } },
      search, h("button", { type: "submit", id: "search" }, "Search")),
    h("table", {}, h("thead", {}, h("tr", {}, ["Tenant", "Limits", "Mode", "Today (UTC)", "Updated"].map((t) => h("th", {}, t)))), list),
    h("form", { class: "row", id: "create-form", hidden: true, onsubmit: (ev) => { ev.preventDefault(); if (created.value.trim()) location.hash = "#/tenants/" + enc(created.value.trim()); } },
      created, h("button", { type: "submit", id: "create-tenant" }, "New tenant")),
    fleetPanel());
  show(page);
  // Only an admin may create a tenant: a tenant_admin manages the ones it is given.
  me().then((w) => { page.querySelector("#create-form").hidden = w.role !== "admin"; }).catch(() => {});
  try {
    let q = "/v1/quotas?limit=50";
    if (prefix) q += "&prefix=" + enc(prefix);
    if (after) q += "&after=" + enc(after);
    const r = await api("GET", q);
    const today = new Date(new Date().toISOString().slice(0, 10) + "T00:00:00Z").toISOString();
    for (const p of r.quotas) {
      const day = h("td", { class: "today" }, "…");
      list.append(h("tr", { "data-tenant": p.tenant },
        h("td", {}, h("a", { href: "#/tenants/" + enc(p.tenant), class: "tenant-link" }, p.tenant)),
        h("td", {}, p.limits.map((l) => l.id).join(", ")),
        h("td", {}, p.mode === "dry_run" ? h("span", { class: "badge" }, "dry run") : p.mode),
        day,
        h("td", {}, when(p.updated_at))));
      // Each tenant's day from its usage history, filled in as it comes.
      api("GET", "/v1/usage/" + enc(p.tenant) + "/history?step=day&from=" + encodeURIComponent(today))
        .then((d) => { day.replaceChildren(d.total.admitted + " admitted, ", h("span", { class: d.total.denied ? "error" : "" }, d.total.denied + " refused")); })
        .catch(() => { day.textContent = "–"; });
    }
    if (!r.quotas.length) list.append(h("tr", {}, h("td", { colspan: 5, class: "muted" }, "No tenants.")));
    // The cursors of the pages before this one ride in `trail`, so that Previous can go back.
    const trail = (params.get("trail") || "").split(",").filter(Boolean);
    const pageLink = (a, t, id, label) => h("a", { href: "#/tenants?prefix=" + enc(prefix) + (a ? "&after=" + enc(a) : "") + (t.length ? "&trail=" + enc(t.join(",")) : ""), id }, label);
    const nav = h("p", { class: "row" });
    if (after) nav.append(pageLink(trail[trail.length - 1] === "-" ? "" : trail[trail.length - 1] || "", trail.slice(0, -1), "previous", "← Previous page"));
    if (r.next) nav.append(pageLink(r.next, [...trail, after || "-"], "next", "Next page →"));
    if (nav.children.length) page.append(nav);
  } catch (e) {
    page.append(failure(e));
  }
}

// ---- charts ---------------------------------------------------------------------------------

/** The browser's time zone, as the charts name it. */
const ZONE = Intl.DateTimeFormat().resolvedOptions().timeZone || "local time";
/** Colours of the refusals, one a limit, in the order limits first refuse. */
const DENIED_COLOURS = ["#c62828", "#ef6c00", "#6a1b9a", "#ad1457", "#4e342e", "#283593"];
/** The spans a chart offers: [label, step, points]. */
const RANGES = [["24 hours by hour", "hour", 24], ["7 days by hour", "hour", 168], ["30 days by day", "day", 30], ["90 days by day", "day", 90]];

/**
 * Checks per hour or day as stacked bars: admitted at the bottom, then the refusals of each
 * limit (`denied_by`). Hours are in the browser's zone, days are UTC days (the history's), and
 * the axis says which. A text summary stands for the chart for screen readers.
 */
function historyChart(title, hist, id) {
  const box = h("div", { class: "chart", id });
  const day = hist.step === "day";
  const step = day ? 86400 : 3600;
  const xs = hist.points.map((p) => Date.parse(p.start) / 1000);
  const limits = Object.keys(hist.total.denied_by || {});
  const raw = [hist.points.map((p) => p.admitted), ...limits.map((l) => hist.points.map((p) => (p.denied_by || {})[l] || 0))];
  // Stacked: each series is drawn at the sum of those below it, the tallest first.
  const stacked = raw.map((_, i) => xs.map((_, j) => raw.slice(0, i + 1).reduce((t, r) => t + r[j], 0)));
  const names = ["admitted", ...limits.map((l) => "denied by " + l)];
  const colours = ["#2e7d32", ...limits.map((_, i) => DENIED_COLOURS[i % DENIED_COLOURS.length])];
  const by = limits.map((l) => hist.total.denied_by[l] + " by " + l).join(", ");
  const zone = day ? "UTC days" : "hours in " + ZONE;
  box.append(h("h3", {}, title),
    h("p", { class: "muted summary" }, hist.total.admitted + " admitted, " + hist.total.denied + " denied" + (by ? " (" + by + ")" : "") +
      "; " + zone + ", " + new Date(hist.from).toISOString().slice(0, day ? 10 : 16).replace("T", " ") + " to " +
      new Date(hist.to).toISOString().slice(0, day ? 10 : 16).replace("T", " ") + " UTC"),
    h("ul", { class: "legend", "aria-hidden": "true" }, names.map((n, i) => h("li", {}, h("span", { class: "swatch", "data-colour": colours[i] }), n))));
  for (const sw of box.querySelectorAll(".swatch")) sw.style.background = sw.getAttribute("data-colour");
  const plot = h("div", { class: "plot", role: "img", "aria-label": title + ": " + box.querySelector(".summary").textContent });
  box.append(plot);
  const order = names.map((_, i) => names.length - 1 - i);
  const opts = {
    width: 400, height: 200,
    legend: { show: false },
    // Half a step of room each side, so that the first and the last bar show whole.
    scales: { x: { time: true, range: () => [xs[0] - step / 2, xs[xs.length - 1] + step / 2] } },
    tzDate: day ? (ts) => uPlot.tzDate(new Date(ts * 1e3), "Etc/UTC") : undefined,
    series: [{}, ...order.map((i) => ({
      label: names[i], stroke: colours[i], fill: colours[i], width: 0,
      points: { show: false },
      paths: uPlot.paths.bars({ size: [0.7, 40], align: 0 }),
    }))],
    axes: [{ label: day ? "day (UTC)" : "hour (" + ZONE + ")", labelSize: 20 }, { label: "checks", labelSize: 20, size: 50 }],
  };
  // Drawn once this task ends (the caller puts the box in the page first), as wide as its box,
  // and drawn again when the box changes width.
  queueMicrotask(() => {
    opts.width = Math.max(260, plot.clientWidth || 400);
    const u = new uPlot(opts, [xs, ...order.map((i) => stacked[i])], plot);
    new ResizeObserver(() => {
      const w = Math.max(260, plot.clientWidth);
      if (Math.abs(w - u.width) > 4) u.setSize({ width: w, height: 200 });
    }).observe(plot);
  });
  return box;
}

/** Downloads a history as CSV (the API's `Accept: text/csv`), with the token as a header. */
async function downloadCsv(url, name) {
  const r = await fetch(url, { headers: { Authorization: "Bearer " + token(), Accept: "text/csv" } });
  if (!r.ok) throw new ApiError(r.status, null);
  const a = h("a", { href: URL.createObjectURL(await r.blob()), download: name });
  document.body.append(a);
  a.click();
  a.remove();
}

/** The checks of `base` (a history route): a range picker, the chart, a CSV link. */
async function charts(base, what) {
  const range = select({ id: "chart-range" }, RANGES.map(([label], i) => [String(i), label]), "0");
  const holder = h("div", { class: "charts" });
  const status = h("p", { class: "muted", role: "status" });
  const draw = async () => {
    const [label, step, points] = RANGES[Number(range.value)];
    const from = new Date(Date.now() - (points - 1) * (step === "day" ? 86400e3 : 3600e3));
    const url = base + "?step=" + step + "&from=" + encodeURIComponent(from.toISOString());
    const hist = await api("GET", url);
    holder.replaceChildren(historyChart(what + ": " + label, hist, step === "day" ? "chart-days" : "chart-hours"));
    status.textContent = "Updated " + new Date().toLocaleTimeString() + "; the history is written every few seconds.";
    csv.onclick = () => downloadCsv(url, what + "-" + step + ".csv").catch((e) => { status.textContent = "CSV: " + e.message; });
  };
  const csv = h("button", { type: "button", id: "chart-csv" }, "Download CSV");
  range.addEventListener("change", () => draw().catch((e) => { status.textContent = e.message; }));
  await draw();
  return h("div", {}, h("div", { class: "row" }, field("range", range), h("div", { class: "field" }, h("span", { class: "label-gap" }, "\u00a0"), csv)), holder, status);
}

/** How often a page's current figures are read again. */
const REFRESH_MS = 5000;

/** Runs `read` every REFRESH_MS while the tab is visible, until `el` leaves the page. */
function refreshing(el, read) {
  const timer = setInterval(() => {
    if (!el.isConnected) { clearInterval(timer); return; }
    if (document.visibilityState === "visible") read().catch(() => {});
  }, REFRESH_MS);
}

// ---- usage bars -----------------------------------------------------------------------------

function bar(count, limit) {
  const used = limit ? count / limit : 0;
  const fill = h("div", { class: used >= 1 ? "full" : (used >= 0.8 ? "near" : "") });
  fill.style.width = Math.min(100, used * 100).toFixed(1) + "%";
  const pct = (used * 100).toFixed(1) + "%";
  return h("span", { class: "bar", title: pct, role: "img", "aria-label": pct + " used" }, fill);
}

function resetIn(ms) {
  if (!ms) return "now";
  if (ms < 1000) return ms + " ms";
  const s = Math.ceil(ms / 1000);
  if (s < 120) return s + " s";
  if (s < 7200) return Math.ceil(s / 60) + " min";
  return Math.ceil(s / 3600) + " h";
}

// ---- a tenant -------------------------------------------------------------------------------

async function tenantPage(tenant) {
  const page = h("div", { id: "tenant-page" }, h("h1", {}, "Tenant ", h("code", {}, tenant)));
  show(page);
  if (unreachable(tenant)) { page.append(dotted(tenant)); return; }
  let policy = null;
  try {
    policy = await api("GET", "/v1/quotas/" + enc(tenant));
  } catch (e) {
    if (e.status !== 404) { page.append(failure(e)); return; }
  }
  if (policy && policy.mode === "dry_run") page.querySelector("h1").append(" ", h("span", { class: "badge" }, "dry run"));
  page.append(h("section", {}, h("h2", {}, "Policy"),
    policySection(policy, "/v1/quotas/" + enc(tenant), {
      none: h("p", { class: "muted", id: "no-policy" }, "No policy yet: fill the form to create one."),
      deleteQuestion: "Delete " + tenant + "'s policy? Its checks then answer 404 (or meet the default policy); its client overrides are kept.",
    })));

  const nearest = h("tbody", { id: "nearest" });
  const overrides = h("tbody", { id: "overrides" });
  const lookup = h("input", { id: "client-lookup", placeholder: "client id" });
  page.append(
    h("section", {}, h("h2", {}, "Clients nearest to a limit now"),
      h("table", {}, h("thead", {}, h("tr", {}, h("th", {}, "Client"), h("th", {}, "Limit"), h("th", {}, "Used"), h("th", {}, ""), h("th", {}, "Resets in"))), nearest),
      h("form", { class: "row", onsubmit: (ev) => { ev.preventDefault(); if (lookup.value.trim()) location.hash = "#/tenants/" + enc(tenant) + "/clients/" + enc(lookup.value.trim()); } },
        lookup, h("button", { type: "submit" }, "Open client"))),
    h("section", {}, h("h2", {}, "Client overrides"),
      h("table", {}, h("thead", {}, h("tr", {}, h("th", {}, "Client"), h("th", {}, "Limits"), h("th", {}, "Updated"))), overrides)));
  const chartBox = h("section", { id: "tenant-charts" }, h("h2", {}, "Checks"));
  const topBox = h("section", { id: "top-clients" }, h("h2", {}, "Busiest clients today (UTC)"));
  page.append(chartBox, topBox);
  try {
    const [n, o] = await Promise.all([
      api("GET", "/v1/usage/" + enc(tenant) + "/nearest?limit=10"),
      api("GET", "/v1/quotas/" + enc(tenant) + "/clients?limit=100"),
    ]);
    const nearestRows = (clients) => clients.length ? clients.map((c) => h("tr", {},
      h("td", {}, h("a", { href: "#/tenants/" + enc(tenant) + "/clients/" + enc(c.client) }, c.client)),
      h("td", {}, c.limit_id),
      h("td", {}, c.count + " / " + c.limit),
      h("td", {}, bar(c.count, c.limit)),
      h("td", {}, resetIn(c.reset_after_ms))))
      : [h("tr", {}, h("td", { colspan: 5, class: "muted" }, "No client was active today or yesterday."))];
    nearest.append(...nearestRows(n.clients));
    refreshing(nearest, async () => {
      const again = await api("GET", "/v1/usage/" + enc(tenant) + "/nearest?limit=10");
      nearest.replaceChildren(...nearestRows(again.clients));
    });
    // The first ten; the rest behind a button, so that many overrides do not push the charts away.
    o.overrides.forEach((p, i) => {
      overrides.append(h("tr", { class: i >= OVERRIDES_SHOWN ? "more" : "", hidden: i >= OVERRIDES_SHOWN },
        h("td", {}, h("a", { href: "#/tenants/" + enc(tenant) + "/clients/" + enc(p.client) }, p.client)),
        h("td", {}, p.limits.map((l) => l.id).join(", ")),
        h("td", {}, when(p.updated_at))));
    });
    if (o.overrides.length > OVERRIDES_SHOWN) {
      const all = h("button", { type: "button", id: "all-overrides", onclick: () => {
        for (const tr of overrides.querySelectorAll("tr.more")) tr.hidden = false;
        all.remove();
      } }, "Show all " + o.overrides.length + (o.next ? "+" : ""));
      overrides.parentElement.after(all);
    }
    if (!o.overrides.length) overrides.append(h("tr", {}, h("td", { colspan: 3, class: "muted" }, "None.")));
    if (o.next) overrides.append(h("tr", { class: "more", hidden: true }, h("td", { colspan: 3, class: "muted" }, "The first 100 are shown: open another client by its id above.")));
    if (policy && policy.mode === "dry_run") {
      chartBox.append(h("p", { class: "muted", id: "dry-run-note" }, "Dry run: checks a limit would refuse are answered allowed (flagged dry_run_denied) and counted here as admitted; the bars above show which limits are full."));
    }
    chartBox.append(await charts("/v1/usage/" + enc(tenant) + "/history", "All clients"));
    topBox.append(await topClients(tenant));
  } catch (e) {
    page.append(failure(e));
  }
}

/** Overrides listed before "Show all". */
const OVERRIDES_SHOWN = 10;

/** The tenant's busiest clients of the UTC day, with their refusals. */
async function topClients(tenant) {
  const t = await api("GET", "/v1/usage/" + enc(tenant) + "/top?limit=10");
  const rows = t.clients.map((c) => h("tr", {},
    h("td", {}, h("a", { href: "#/tenants/" + enc(tenant) + "/clients/" + enc(c.client) }, c.client)),
    h("td", {}, String(c.admitted)), h("td", {}, String(c.cost)), h("td", { class: c.denied ? "error" : "" }, String(c.denied))));
  return h("table", {}, h("thead", {}, h("tr", {}, ["Client", "Admitted", "Cost", "Refused"].map((x) => h("th", {}, x)))),
    h("tbody", { id: "top" }, rows.length ? rows : [h("tr", {}, h("td", { colspan: 4, class: "muted" }, "No checks today."))]));
}

// ---- a client -------------------------------------------------------------------------------

/** Paths where `/v1/usage/{tenant}/{name}` is another route: such a client's usage is not there. */
const RESERVED = ["history", "nearest", "top"];

async function clientPage(tenant, client) {
  const page = h("div", { id: "client-page" },
    h("p", {}, h("a", { href: "#/tenants/" + enc(tenant) }, "← " + tenant)),
    h("h1", {}, "Client ", h("code", {}, client), " of ", h("code", {}, tenant)));
  show(page);
  if (unreachable(tenant) || unreachable(client)) { page.append(dotted(unreachable(tenant) ? tenant : client)); return; }
  // Each part on its own: one that fails does not hide the others.
  const usageBox = h("section", {}, h("h2", {}, "Usage now"));
  const chartBox = h("section", { id: "client-charts" }, h("h2", {}, "Checks"));
  const overBox = h("section", {}, h("h2", {}, "Override"));
  const actBox = h("section", { id: "actions" }, h("h2", {}, "Act on this client"));
  page.append(usageBox, actBox, chartBox, overBox);
  try {
    if (RESERVED.includes(client)) {
      usageBox.append(h("p", { class: "muted" }, "A client named " + client + " cannot have its current usage read: that path is another route."));
    } else {
      // Every limit, resource-scoped and tenant-wide ones too, each saying what it counts.
      const u = await api("GET", "/v1/usage/" + enc(tenant) + "/" + enc(client) + "?all=true");
      const counts = (l) => [l.in_flight ? (l.in_flight === "cost" ? "reserved cost held now" : "reservations held now")
        : l.resource ? "checks on " + l.resource : "every check",
        l.scope === "tenant" ? "of all the tenant's clients" : ""].filter(Boolean).join(" ");
      const rowsOf = (limits) => limits.map((l) => h("tr", { "data-limit": l.limit_id },
        h("td", {}, l.limit_id, h("div", { class: "muted" }, counts(l))),
        h("td", { class: "count" }, l.count + " / " + l.limit),
        h("td", {}, bar(l.count, l.limit)),
        h("td", {}, l.remaining + " left"),
        h("td", {}, l.in_flight ? "as they end" : resetIn(l.reset_after_ms))));
      const tbody = h("tbody", {}, rowsOf(u.limits));
      usageBox.append(h("table", { id: "usage" }, h("thead", {}, h("tr", {}, h("th", {}, "Limit"), h("th", {}, "Used"), h("th", {}, ""), h("th", {}, "Remaining"), h("th", {}, "Resets in"))), tbody),
        h("p", { class: "muted" }, "Read again every " + REFRESH_MS / 1000 + " s while this tab is visible."));
      refreshing(usageBox, async () => {
        const again = await api("GET", "/v1/usage/" + enc(tenant) + "/" + enc(client) + "?all=true");
        tbody.replaceChildren(...rowsOf(again.limits));
      });
      actions(actBox, tenant, client, u.limits.filter((l) => l.scope === "client" && !l.in_flight));
    }
  } catch (e) {
    usageBox.append(failure(e));
    actBox.remove();
    if (e.status === 403) { chartBox.remove(); overBox.remove(); return; }
  }
  try {
    chartBox.append(await charts("/v1/usage/" + enc(tenant) + "/" + enc(client) + "/history", client));
  } catch (e) {
    chartBox.append(failure(e));
  }
  try {
    let over = null;
    try {
      over = await api("GET", "/v1/quotas/" + enc(tenant) + "/clients/" + enc(client));
    } catch (e) {
      if (e.status !== 404) throw e;
    }
    overBox.append(policySection(over, "/v1/quotas/" + enc(tenant) + "/clients/" + enc(client), {
      none: h("p", { class: "muted" }, "None: the tenant's policy applies. Fill the form to give " + client + " limits of its own."),
      deleteQuestion: "Delete " + client + "'s override? The tenant's policy then applies to it.",
      override: true,
    }));
  } catch (e) {
    overBox.append(failure(e));
  }
}

// ---- routing --------------------------------------------------------------------------------

async function route() {
  const hash = location.hash.replace(/^#/, "") || "/tenants";
  const [path, query] = hash.split("?");
  const params = new URLSearchParams(query || "");
  if (!token() || path === "/signin") { signin("", location.hash); return; }
  document.getElementById("nav").hidden = false;
  me().then((w) => {
    document.getElementById("who").textContent = "Signed in as " + w.name + " (" + w.role.replace("_", " ") + ")";
  }).catch(() => {});
  let parts;
  try {
    parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  } catch (_) {
    show(h("p", { class: "error" }, "No such page."));
    return;
  }
  if (parts[0] === "tenants" && parts.length === 1) return tenants(params);
  if (parts[0] === "tenants" && parts.length === 2) return tenantPage(parts[1]);
  if (parts[0] === "tenants" && parts[2] === "clients" && parts.length === 4) return clientPage(parts[1], parts[3]);
  if (parts[0] === "audit") return audit(params);
  show(h("p", { class: "error" }, "No such page."));
}

window.addEventListener("hashchange", route);
document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("signout").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    whoami = null;
    document.getElementById("who").textContent = "";
    location.hash = "#/signin";
  });
  route();
});
