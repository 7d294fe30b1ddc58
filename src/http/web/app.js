// The gpuq page: reads /api/v1/ and draws the queue, the nodes as a GPU
// map, the cluster's Raft status, GPUs allocated over the last day and
// one job's page. Without a token it reads (from the server's own host);
// with one it may cancel and hold.
"use strict";

const $ = (id) => document.getElementById(id);
let token = sessionStorage.getItem("gpuq-token") || "";

async function api(path, method = "GET") {
  const headers = token ? { Authorization: "Bearer " + token } : {};
  const resp = await fetch("/api/v1/" + path, { method, headers });
  const body = await resp.json().catch(() => ({}));
  if (!resp.ok) throw new Error(body.error || resp.status + " " + resp.statusText);
  return body;
}

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v;
    else if (k === "style") e.style.cssText = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : String(c ?? ""));
  return e;
}

// The same for SVG, whose elements need their namespace.
function svg(tag, attrs = {}, ...children) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  e.append(...children);
  return e;
}

function when(ms) {
  return ms ? new Date(ms).toISOString().replace("T", " ").slice(0, 19) : "";
}

// A job's colour on the GPU map: the same job, the same hue.
function colour(id) {
  return "hsl(" + ((id * 137) % 360) + ", 60%, 42%)";
}

function showError(e) {
  $("error").hidden = !e;
  $("error").textContent = e ? String(e.message || e) : "";
}

async function act(id, verb) {
  try {
    if (verb === "cancel") await api("jobs/" + id, "DELETE");
    else await api("jobs/" + id + "/" + verb, "POST");
    showError(null);
  } catch (e) {
    showError(e);
  }
  route();
}
window.cancelJob = (id) => act(id, "cancel");

function actions(job) {
  if (!token || ["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED"].includes(job.state)) return "";
  const span = el("span");
  span.append(el("button", { class: "act cancel", "data-job": job.id, onclick: () => act(job.id, "cancel") }, "Cancel"));
  if (job.state === "PENDING") {
    const verb = job.held ? "release" : "hold";
    span.append(el("button", { class: "act " + verb, onclick: () => act(job.id, verb) }, verb[0].toUpperCase() + verb.slice(1)));
  }
  return span;
}

function gpusOf(job) {
  const s = job.spec || {};
  return (s.total_gpus ?? (s.gpus_per_node || 0) * (s.nodes || 1));
}

// GPUs allocated over time, from /api/v1/utilisation: a bar per bucket
// (its mean), and the cluster's GPUs now as a dashed line above them.
function utilisationChart(u) {
  const width = 960, height = 180, axis = 36, base = height - 18;
  const top = Math.max(u.total_gpus, ...u.allocated, 1);
  const y = (gpus) => base - (base - 8) * gpus / top;
  const step = (width - axis) / u.allocated.length;
  const minutes = Math.round(u.bucket_ms / 60000);
  const bars = u.allocated.map((gpus, i) => {
    const at = { x: axis + i * step, y: y(gpus), width: Math.max(step - 1, 0.5), height: base - y(gpus) };
    const start = when(u.from + i * u.bucket_ms).slice(5, 16);
    return svg("rect", { class: "bucket", "data-gpus": gpus, ...at }, svg("title", {}, start + ": " + gpus.toFixed(1) + " GPUs"));
  });
  const label = (x, yy, anchor, text) => svg("text", { x, y: yy, "text-anchor": anchor }, text);
  const chart = svg("svg", { viewBox: "0 0 " + width + " " + height, role: "img" },
    svg("line", { class: "axis", x1: axis, x2: width, y1: base, y2: base }),
    ...bars,
    svg("line", { class: "total", "data-gpus": u.total_gpus, x1: axis, x2: width, y1: y(u.total_gpus), y2: y(u.total_gpus) }),
    label(axis - 4, y(top) + 4, "end", +top.toFixed(1)), label(axis - 4, base, "end", 0),
    label(axis, height - 2, "start", when(u.from).slice(5, 16)), label(width, height - 2, "end", "now"));
  const caption = el("figcaption", {}, "Mean GPUs allocated per " + minutes + " min; dashed: the " + u.total_gpus + " GPUs of the cluster now.");
  return [chart, caption];
}

async function home() {
  const [cluster, nodes, queue, usage, policy] = await Promise.all([api("cluster"), api("nodes"), api("jobs"), api("utilisation"), api("policy")]);
  const st = cluster.status;
  $("cluster-name").textContent = st.cluster_name;
  const facts = [
    ["leader", st.leader || "none"], ["term", st.term], ["applied index", st.applied_index ?? 0],
    ["members", st.members.map((m) => m.name + (m.leader ? " (leader)" : "") + (m.problem ? ": " + m.problem : "")).join(", ")],
    ["jobs", st.jobs.map(([s, n]) => s + " " + n).join(", ")],
  ];
  $("cluster").replaceChildren(el("dl", { id: "raft" }, ...facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)])));
  $("utilisation").replaceChildren(...utilisationChart(usage));

  // Which job holds each GPU, from the running jobs' allocations.
  const holder = {};
  for (const j of queue.jobs) {
    for (const a of (j.run && j.run.allocation && j.run.allocation.nodes) || []) {
      if (j.state === "RUNNING" || j.state === "COMPLETING") for (const g of a.gpus) holder[a.node + "/" + g] = j;
    }
  }
  $("nodes").replaceChildren(...nodes.nodes.map((n) => {
    const gpus = n.inventory.gpus.map((g) => {
      const j = holder[n.name + "/" + g.index];
      const slice = !g.mig ? "" : g.mig.slots
        ? " (slot " + (g.mig.placement + 1) + " of " + g.mig.slots + " of shared GPU " + g.mig.parent + ")"
        : " (MIG " + g.mig.profile + " of GPU " + g.mig.parent + ")";
      const what = "GPU " + g.index + slice;
      const attrs = { class: "gpu" + (g.mig ? " slice" : "") + (g.healthy ? "" : " unhealthy") + (j ? " busy" : ""), title: what + (j ? ": job " + j.id + " (" + j.user + ")" : g.healthy ? ": free" : ": " + (g.fault || "unhealthy")) };
      if (j) { attrs.style = "background:" + colour(j.id); attrs["data-job"] = j.id; attrs.href = "#/job/" + j.id; }
      return el(j ? "a" : "span", attrs, j ? j.id : g.index);
    });
    return el("div", { class: "node " + n.state, "data-node": n.name },
      el("span", { class: "name" }, n.name),
      el("span", { class: "gpus" }, ...gpus),
      el("span", { class: "meta" }, n.state + (n.reason ? " (" + n.reason + ")" : "") + " · " + n.gpus_used + "/" + n.inventory.gpus.length + " GPUs · " + n.running_jobs + " jobs"));
  }));

  // Advance reservations (gpuq admin reservation), when there are any.
  const now = Date.now();
  const resv = Object.values(policy.policy.reservations || {});
  $("reservations-part").hidden = resv.length === 0;
  $("reservations").tBodies[0].replaceChildren(...resv.map((r) => el("tr", { "data-reservation": r.name },
    el("td", {}, r.name),
    el("td", {}, r.end <= now ? "over" : r.start <= now ? "active" : "planned"),
    el("td", {}, when(r.start)), el("td", {}, when(r.end)),
    el("td", {}, r.nodes.join(", ")),
    el("td", {}, r.maint ? "maint" : "-"),
    el("td", {}, [...(r.users || []).map((u) => "user " + u), ...(r.accounts || []).map((a) => "account " + a)].join(", ") || "anyone"))));

  $("queue").tBodies[0].replaceChildren(...queue.jobs.map((j) => el("tr", { "data-job": j.id },
    el("td", {}, el("a", { href: "#/job/" + j.id }, j.array ? j.array.job + "_" + j.array.index : j.id)),
    el("td", {}, j.user), el("td", {}, j.spec.name),
    el("td", { class: "state-" + j.state }, j.state + (j.held ? " (held)" : "")),
    el("td", {}, j.spec.nodes), el("td", {}, gpusOf(j)),
    el("td", {}, j.reason_code ? j.reason_code + ": " + (j.reason || "") : (j.reason || "")),
    el("td", {}, when(j.expected_start)),
    el("td", {}, actions(j)))));
}

async function jobPage(id) {
  const { job, placement } = await api("jobs/" + id);
  $("job-title").textContent = "Job " + job.id + ": " + job.spec.name;
  $("job-actions").replaceChildren(actions(job));
  const facts = [
    ["state", job.state + (job.reason ? " (" + job.reason + ")" : "")], ["user", job.user],
    ["account", job.spec.account || "default"], ["partition", job.spec.partition || "default"],
    ["submitted", when(job.submit_time)], ["started", when(job.start_time)], ["ended", when(job.end_time)],
    ["expected start", when(job.expected_start)], ["restarts", job.restart_count], ["exit code", job.exit_code ?? ""],
  ];
  $("job-facts").replaceChildren(...facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", { class: k === "state" ? "state-" + job.state : "" }, v)]));
  $("job-ranks").tBodies[0].replaceChildren(...placement.map((p) => el("tr", {},
    el("td", {}, p.node_rank), el("td", {}, p.first_rank + "-" + p.last_rank), el("td", {}, p.node),
    el("td", {}, p.gpus.map((g) => g.index).join(",")), el("td", {}, p.cpus || p.cpu_count), el("td", {}, p.memory_mb + " MiB"))));
  try {
    const log = await api("jobs/" + id + "/logs?rank=0");
    const text = log.text || (log.missing ? "(no output yet)" : "");
    $("job-log").textContent = text.length > 20000 ? text.slice(-20000) : text;
  } catch (e) {
    $("job-log").textContent = "(" + e.message + ")";
  }
}

async function route() {
  const m = location.hash.match(/^#\/job\/(\d+)/);
  $("home").hidden = !!m;
  $("job").hidden = !m;
  try {
    if (m) await jobPage(m[1]); else await home();
    document.body.dataset.loaded = "yes";
  } catch (e) {
    showError(e);
  }
}

$("token-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  token = $("token").value.trim();
  sessionStorage.setItem("gpuq-token", token);
  whoami();
  route();
});

async function whoami() {
  try {
    const w = await api("whoami");
    $("who").textContent = w.anonymous ? "read-only (no token)" : w.user + (w.read_only ? " (read-only)" : "");
  } catch (e) {
    $("who").textContent = "token refused";
  }
}

window.addEventListener("hashchange", route);
whoami();
route();
setInterval(route, 5000);
