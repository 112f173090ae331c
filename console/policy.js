// The quotad console, the policy form and its read-only view. Loaded after app.js (all
// deferred, in order), whose helpers it uses: h, api, when, route and confirmed (support.js).
"use strict";

// ---- the policy form ----------------------------------------------------------------------

const KINDS = [["window", "sliding window"], ["period", "calendar period"], ["bucket", "token bucket"],
  ["holds", "reservations held at once"], ["held-cost", "reserved cost held at once"]];
const PERIODS = ["second", "minute", "hour", "day", "month"];
/** Each limit field's label: the API's key, and what it holds. */
const LABELS = { max: "max (checks)", window: "window (duration)", burst: "burst (checks)", rate: "rate (checks)", per: "per (duration)", resource: "resource (pattern)" };
/** What a value of each limit field looks like, shown until one is typed. */
const EXAMPLES = { id: "per-minute", max: "100", window: "1m, 90s, 1h", burst: "20", rate: "10", per: "1s", resource: "POST /exports, GET /items/*" };

let fieldIds = 0;
/** A labelled control: the label names it for assistive technology (`for` and `id`). */
function field(label, control, attrs, ...rest) {
  if (!control.id) control.id = "field-" + (++fieldIds);
  // A field's error is read out with it (and announced when it appears).
  const error = rest.find((r) => r && r.classList && r.classList.contains("field-error"));
  if (error) {
    error.id = control.id + "-error";
    error.setAttribute("aria-live", "polite");
    control.setAttribute("aria-describedby", error.id);
  }
  return h("div", Object.assign({ class: "field" }, attrs || {}), h("label", { for: control.id }, label), control, ...rest);
}

function select(attrs, options, value) {
  const s = h("select", attrs, options.map(([v, label]) => h("option", { value: v }, label || v)));
  s.value = value;
  return s;
}

/** A JSON value as typed: a number when it reads as one, else the text (the API names the field). */
function typed(v) {
  const t = v.trim();
  return t !== "" && /^-?[0-9.eE+]+$/.test(t) && !Number.isNaN(Number(t)) ? Number(t) : t;
}

function limitRow(i, l, override) {
  const kind = l.in_flight ? (l.in_flight === "cost" ? "held-cost" : "holds")
    : l.rate !== undefined || l.burst !== undefined ? "bucket" : (l.period ? "period" : "window");
  const f = (name, value, extra) => {
    const input = h("input", Object.assign({ "data-field": "limits[" + i + "]." + name, name, value: value === undefined ? "" : value, class: "small", placeholder: EXAMPLES[name] || "" }, extra || {}));
    return field(LABELS[name] || name, input, {}, h("span", { class: "field-error" }));
  };
  const kindSel = select({ "data-field": "limits[" + i + "]", name: "kind", class: "small" }, KINDS, kind);
  const row = h("div", { class: "row limit", "data-index": i },
    f("id", l.id),
    field("kind", kindSel, {}, h("span", { class: "field-error" })),
    f("max", l.max, { "data-kinds": "window period holds held-cost" }),
    f("window", l.window, { "data-kinds": "window" }),
    field("period", select({ "data-field": "limits[" + i + "].period", name: "period", class: "small" }, PERIODS.map((p) => [p]), l.period || "minute"),
      { "data-kinds": "period" }, h("span", { class: "field-error" })),
    f("burst", l.burst, { "data-kinds": "bucket" }),
    f("rate", l.rate, { "data-kinds": "bucket" }),
    f("per", l.per, { "data-kinds": "bucket" }),
    f("resource", l.resource),
    // An override's limits count its client only: the API refuses `tenant` there.
    field("scope", select({ "data-field": "limits[" + i + "].scope", name: "scope", class: "small" }, override ? [["client"]] : [["client"], ["tenant"]], l.scope || "client"),
      {}, h("span", { class: "field-error" })),
    h("div", { class: "field" }, h("label", {}, "\u00a0"), h("button", { type: "button", class: "remove-limit", onclick: () => { row.remove(); } }, "Remove")));
  const applyKind = () => {
    for (const el of row.querySelectorAll("[data-kinds]")) {
      const box = el.classList.contains("field") ? el : el.closest(".field");
      box.hidden = !el.getAttribute("data-kinds").split(" ").includes(kindSel.value);
    }
  };
  kindSel.addEventListener("change", applyKind);
  applyKind();
  return row;
}

function readLimit(row) {
  const v = (name) => row.querySelector("[name=" + name + "]").value;
  const l = { id: v("id").trim() };
  const kind = v("kind");
  if (kind === "bucket") {
    l.burst = typed(v("burst"));
    l.rate = typed(v("rate"));
    if (v("per").trim()) l.per = v("per").trim();
  } else if (kind === "holds" || kind === "held-cost") {
    l.max = typed(v("max"));
    l.in_flight = kind === "holds" ? "holds" : "cost";
  } else {
    l.max = typed(v("max"));
    if (kind === "window") l.window = v("window").trim();
    else l.period = v("period");
  }
  if (v("resource").trim()) l.resource = v("resource").trim();
  l.scope = v("scope");
  return l;
}

/** What a limit counts, in words. */
function limitWords(l) {
  if (l.in_flight) return "at most " + l.max + (l.in_flight === "cost" ? " of reserved cost" : " reservations") + " held at once";
  if (l.rate !== undefined || l.burst !== undefined) return "token bucket: burst " + l.burst + ", " + l.rate + " per " + (l.per || "1s");
  return (l.period ? "calendar " + l.period : "sliding window of " + l.window) + ", at most " + l.max;
}

/** A stored policy or override, read-only. */
function policyView(p) {
  return h("div", { id: "policy-view" },
    h("table", {}, h("thead", {}, h("tr", {}, ["Limit", "Counts", "Checks on", "Whose"].map((t) => h("th", {}, t)))),
      h("tbody", {}, p.limits.map((l) => h("tr", { "data-limit": l.id },
        h("td", {}, l.id), h("td", {}, limitWords(l)), h("td", {}, l.resource || "every resource"),
        h("td", {}, l.scope === "tenant" ? "all the tenant's clients together" : "each client"))))),
    h("p", { class: "muted" }, "Mode " + p.mode + (p.mode === "dry_run" ? " (refusals are reported, not enforced)" : "") +
      ", consistency " + p.consistency + ", on a store failure: " + p.on_store_failure + ". Version " + p.version + ", updated ", when(p.updated_at), "."));
}

/**
 * A policy (or an override) shown read-only, with Edit (the form) and Delete (asked first);
 * with no policy yet, the form at once. `url` is its /v1/quotas path.
 */
function policySection(policy, url, o) {
  const box = h("div", { class: "policy" });
  const status = h("p", { id: "policy-status", role: "status", "aria-live": "polite" });
  const render = (p) => {
    const form = policyForm(p, async (doc) => {
      const saved = await api("PUT", url, doc);
      render(saved);
      return saved;
    }, status, o.override);
    if (!p) { box.replaceChildren(o.none, form, status); return; }
    form.hidden = true;
    const edit = h("button", { type: "button", id: "edit-policy", onclick: () => { form.hidden = false; view.hidden = true; edit.hidden = true; status.textContent = ""; } }, "Edit");
    const view = policyView(p);
    const del = confirmed("delete-policy", "Delete", o.deleteQuestion, async () => {
      await api("DELETE", url);
      setTimeout(route, 600);
      return "Deleted.";
    });
    box.replaceChildren(view, h("div", { class: "row" }, edit, del), form, status);
  };
  render(policy);
  return box;
}

/** The policy form; `save` PUTs the document and answers the stored record. */
function policyForm(policy, save, status, override) {
  const p = policy || { limits: [{ id: "", window: "1m" }], mode: "enforce", consistency: "cached", on_store_failure: "local" };
  const rows = h("div", { id: "limits", "data-field": "limits" });
  const renumber = () => {
    [...rows.children].forEach((row, i) => {
      for (const el of row.querySelectorAll("[data-field]")) {
        el.setAttribute("data-field", el.getAttribute("data-field").replace(/^limits\[\d+\]/, "limits[" + i + "]"));
      }
    });
  };
  p.limits.forEach((l, i) => rows.append(limitRow(i, l, override)));
  const opt = (name, values) => field(name,
    select({ "data-field": name, name }, values.map((v) => [v]), p[name]), {}, h("span", { class: "field-error" }));
  const form = h("form", {
    id: "policy-form",
    onsubmit: async (ev) => {
      ev.preventDefault();
      renumber();
      for (const el of form.querySelectorAll(".invalid")) el.classList.remove("invalid");
      for (const el of form.querySelectorAll(".field-error")) el.textContent = "";
      status.className = "";
      status.textContent = "";
      // What the form does not edit is kept as it was.
      const kept = {};
      for (const k of ["regions", "hold"]) if (p[k] !== undefined && p[k] !== null) kept[k] = p[k];
      const doc = {
        ...kept,
        limits: [...rows.children].map(readLimit),
        mode: form.querySelector("[name=mode]").value,
        consistency: form.querySelector("[name=consistency]").value,
        on_store_failure: form.querySelector("[name=on_store_failure]").value,
      };
      try {
        const saved = await save(doc);
        status.className = "notice";
        status.textContent = "Saved: version " + saved.version + ".";
      } catch (e) {
        status.className = "error";
        // The API names the field: show its message beside it.
        const el = e.field && form.querySelector('[data-field="' + CSS.escape(e.field) + '"]');
        const beside = el && el.closest(".field") && el.closest(".field").querySelector(".field-error");
        if (el) {
          el.classList.add("invalid");
          if (beside) beside.textContent = e.message;
          status.textContent = "Not saved: " + e.field + " — " + e.message;
        } else {
          status.textContent = "Not saved: " + (e.field ? e.field + " — " : "") + e.message;
        }
      }
    },
  },
  rows,
  h("p", {}, h("button", { type: "button", id: "add-limit", onclick: () => { rows.append(limitRow(rows.children.length, { id: "" }, override)); } }, "Add a limit")),
  h("div", { class: "row" },
    opt("mode", ["enforce", "dry_run"]),
    opt("consistency", ["cached", "strict"]),
    opt("on_store_failure", ["local", "allow", "deny"])),
  h("button", { type: "submit", class: "primary", id: "save-policy" }, "Save"));
  return form;
}

