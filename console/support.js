// The quotad console, part two: the audit log and the actions support takes on a client. Loaded
// after app.js (both deferred, in order), whose helpers it uses: h, api, field, select, enc,
// when, show, failure and route; app.js calls fleetPanel back once the page is built.
"use strict";

// ---- the audit log --------------------------------------------------------------------------

function localInput(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  const pad = (n) => String(n).padStart(2, "0");
  return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + "T" + pad(d.getHours()) + ":" + pad(d.getMinutes());
}

/** Every leaf of a JSON value by its path (`limits[0].max`). */
function leaves(v, path, out) {
  if (v !== null && typeof v === "object") {
    for (const [k, x] of Object.entries(v)) leaves(x, Array.isArray(v) ? path + "[" + k + "]" : (path ? path + "." : "") + k, out);
  } else {
    out.set(path, v);
  }
  return out;
}

/** What changed between an audit entry's before and after, a line a value. */
function diffLines(before, after) {
  if (before == null && after == null) return [];
  const b = leaves(before ?? {}, "", new Map());
  const a = leaves(after ?? {}, "", new Map());
  const show = (x) => (x === undefined ? "–" : JSON.stringify(x));
  const lines = [];
  for (const k of new Set([...b.keys(), ...a.keys()])) {
    if (JSON.stringify(b.get(k)) !== JSON.stringify(a.get(k))) lines.push(k + ": " + show(b.get(k)) + " → " + show(a.get(k)));
  }
  return lines.length ? lines : ["no change"];
}

/** The actions the audit log records. */
const ACTIONS = ["quota.put", "quota.delete", "override.put", "override.delete", "usage.reset", "usage.grant"];

async function audit(params) {
  const tenant = h("input", { id: "audit-tenant", value: params.get("tenant") || "", placeholder: "every tenant you may see" });
  const from = h("input", { id: "audit-from", type: "datetime-local", value: localInput(params.get("from")) });
  const to = h("input", { id: "audit-to", type: "datetime-local", value: localInput(params.get("to")) });
  const action = select({ id: "audit-action" }, [["", "every action"], ...ACTIONS.map((a) => [a])], params.get("action") || "");
  const client = h("input", { id: "audit-client", value: params.get("client") || "", placeholder: "every client" });
  const actor = h("input", { id: "audit-actor", value: params.get("actor") || "", placeholder: "every token" });
  const body = h("tbody", { id: "audit-entries" });
  const page = h("section", {}, h("h1", {}, "Audit log"),
    h("form", {
      class: "row",
      onsubmit: (ev) => {
        ev.preventDefault();
        const q = new URLSearchParams();
        if (tenant.value.trim()) q.set("tenant", tenant.value.trim());
        if (from.value) q.set("from", new Date(from.value).toISOString());
        if (to.value) q.set("to", new Date(to.value).toISOString());
        if (action.value) q.set("action", action.value);
        if (client.value.trim()) q.set("client", client.value.trim());
        if (actor.value.trim()) q.set("actor", actor.value.trim());
        location.hash = "#/audit?" + q.toString();
      },
    },
    field("tenant", tenant),
    field("from (your time)", from),
    field("to (your time)", to),
    field("action", action),
    field("client", client),
    field("by (token name)", actor),
    h("div", { class: "field" }, h("label", {}, "\u00a0"), h("button", { type: "submit", id: "audit-filter" }, "Filter"))),
    h("div", { class: "scroll" }, h("table", {}, h("thead", {}, h("tr", {}, ["When", "Who", "Action", "Tenant", "Client", "Version", "Change", "Request"].map((t) => h("th", {}, t)))), body)));
  show(page);
  try {
    const q = new URLSearchParams({ limit: "50" });
    for (const k of ["tenant", "from", "to", "after", "action", "client", "actor"]) if (params.get(k)) q.set(k, params.get(k));
    const r = await api("GET", "/v1/audit?" + q.toString());
    for (const e of r.entries) {
      const ver = (e.version_before ?? "–") + " → " + (e.version_after ?? "–");
      const tenantLink = h("a", { href: "#/tenants/" + enc(e.tenant) }, e.tenant);
      const clientLink = e.client ? h("a", { href: "#/tenants/" + enc(e.tenant) + "/clients/" + enc(e.client) }, e.client) : "";
      body.append(h("tr", { class: "audit-entry" },
        h("td", {}, when(e.at)),
        h("td", {}, h("a", { href: "#/audit?actor=" + enc(e.actor) }, e.actor), " (" + e.role + ")"),
        h("td", { class: "action" }, e.action),
        h("td", {}, tenantLink),
        h("td", {}, clientLink),
        h("td", {}, ver),
        h("td", { class: "diff" }, diffLines(e.body_before, e.body_after).map((l) => h("div", {}, l))),
        h("td", {}, h("code", {}, e.request_id))));
    }
    if (!r.entries.length) body.append(h("tr", {}, h("td", { colspan: 8, class: "muted" }, "No entries.")));
    // The cursors of the newer pages ride in `trail` ("-": the newest), so that Newer can go back.
    const trail = (params.get("trail") || "").split(",").filter(Boolean);
    const link = (after, t, id, label) => {
      const q2 = new URLSearchParams(params);
      q2.delete("after");
      q2.delete("trail");
      if (after && after !== "-") q2.set("after", after);
      if (t.length) q2.set("trail", t.join(","));
      return h("a", { href: "#/audit?" + q2.toString(), id }, label);
    };
    const nav = h("p", { class: "row" });
    if (params.get("after")) nav.append(link(trail[trail.length - 1] || "-", trail.slice(0, -1), "newer", "← Newer"));
    if (r.next) nav.append(link(r.next, [...trail, params.get("after") || "-"], "older", "Older →"));
    if (nav.children.length) page.append(nav);
  } catch (e) {
    page.append(failure(e));
  }
}

// ---- acting on a client -------------------------------------------------------------------

/** A key that makes a retried request count once (the API's Idempotency-Key). */
function idempotencyKey() {
  if (crypto.randomUUID) return crypto.randomUUID();
  return [...crypto.getRandomValues(new Uint8Array(16))].map((b) => b.toString(16).padStart(2, "0")).join("");
}

/**
 * A button that asks before it acts: the first click shows what will happen with Confirm and
 * Cancel; Confirm runs `act` with one Idempotency-Key per confirmation, so a retry of it counts
 * once. The outcome is announced (a live region).
 */
function confirmed(id, label, question, act) {
  const status = h("p", { id: id + "-status", role: "status", "aria-live": "polite" });
  const ask = h("div", { class: "row confirm", hidden: true });
  let key = null;
  const start = h("button", { type: "button", id, onclick: () => { key = idempotencyKey(); ask.hidden = false; start.hidden = true; } }, label + "…");
  const cancel = () => { ask.hidden = true; start.hidden = false; };
  ask.append(h("span", {}, question), " ",
    h("button", { type: "button", class: "primary", id: id + "-confirm", onclick: async () => {
      status.textContent = "Working…";
      try {
        status.textContent = await act(key);
        cancel();
      } catch (e) {
        status.textContent = "Not done: " + e.message;
      }
    } }, "Confirm"), " ",
    h("button", { type: "button", onclick: cancel }, "Cancel"));
  return h("div", {}, start, ask, status);
}

/** Reset and grant, on the client page (client-scoped limits only: a tenant's are shared). */
function actions(box, tenant, client, limits) {
  if (!limits.length) {
    box.append(h("p", { class: "muted" }, "No client-scoped limit to reset or credit."));
    return;
  }
  const base = "/v1/usage/" + enc(tenant) + "/" + enc(client);
  box.append(confirmed("reset-usage", "Reset usage", "Bring " + client + "'s use of its client limits to zero, on every instance?", async (key) => {
    await api("POST", base + "/reset", {}, { "Idempotency-Key": key });
    setTimeout(route, 600);
    return "Reset: " + client + " starts again from zero.";
  }));
  const limit = select({ id: "grant-limit" }, limits.map((l) => [l.limit_id]), limits[0].limit_id);
  const amount = h("input", { id: "grant-amount", type: "number", min: "1", value: "1", class: "small" });
  box.append(h("div", { class: "row" }, field("limit", limit), field("amount (checks)", amount)),
    confirmed("grant", "Grant", "Credit " + client + " this many checks of this limit, once?", async (key) => {
      const r = await api("POST", base + "/grant", { limit_id: limit.value, amount: Number(amount.value) }, { "Idempotency-Key": key });
      setTimeout(route, 600);
      return "Granted " + (r.granted ?? amount.value) + " of " + limit.value + ".";
    }));
}


// ---- the fleet ------------------------------------------------------------------------------

/**
 * The fleet's regions as this instance sees them (`GET /readyz`, which needs no token): members,
 * replication lag and whether a region is cut off. Nothing on a store without regions.
 */
function fleetPanel() {
  const box = h("section", { id: "fleet", hidden: true }, h("h2", {}, "Fleet"));
  fetch("/readyz").then((r) => r.json()).then((r) => {
    if (!r.regions || !r.regions.length) return;
    const rows = r.regions.map((g) => h("tr", { "data-region": g.region },
      h("td", {}, g.region + (g.local ? " (this instance)" : "")),
      h("td", {}, String(g.members)),
      h("td", {}, g.local ? "–" : (g.lag_ms / 1000).toFixed(2) + " s"),
      h("td", { class: g.cut_off ? "error" : "" }, g.cut_off ? "cut off: each region keeps to its budget" : "heard")));
    box.append(h("table", {}, h("thead", {}, h("tr", {}, ["Region", "Instances", "Replication lag", "State"].map((t) => h("th", {}, t)))), h("tbody", {}, rows)));
    box.hidden = false;
  }).catch(() => {});
  return box;
}
