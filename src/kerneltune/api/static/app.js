// The human page: what the service knows, drawn from its JSON endpoints (no other network).
"use strict";

const API = "api/v1";
const SVG_NS = "http://www.w3.org/2000/svg";

const state = { gpus: [], kernels: [], table: null };
const $ = (id) => document.getElementById(id);

async function getJSON(path) {
  const response = await fetch(path, { headers: { Accept: "application/json" } });
  if (!response.ok) {
    let detail = response.statusText;
    try { detail = (await response.json()).detail || detail; } catch (_) { /* not JSON */ }
    throw new Error(`${path}: ${response.status} ${detail}`);
  }
  return response.json();
}

function setStatus(text, isError = false) {
  const el = $("status");
  el.textContent = text;
  el.classList.toggle("error", isError);
}

function fillSelect(select, values, labels, wanted) {
  select.replaceChildren(...values.map((v, i) => new Option(labels ? labels[i] : v, v)));
  if (values.includes(wanted)) select.value = wanted;
  select.disabled = values.length === 0;
}

function fmt(x, digits) {
  return x === null || x === undefined ? "–" : Number(x).toFixed(digits);
}

function configText(config) {
  return Object.entries(config).map(([k, v]) => `${k}=${v}`).join(" ");
}

// ------------------------------------------------------------------------------- state

function selection() {
  return { gpu: $("gpu").value, kernel: $("kernel").value, dtype: $("dtype").value };
}

function remember() {
  const params = new URLSearchParams(selection());
  history.replaceState(null, "", `?${params}`);
}

function entriesShown() {
  if (!state.table) return [];
  const { kernel, dtype } = selection();
  return state.table.entries
    .filter((e) => e.kernel === kernel && e.dtype === dtype)
    .sort((a, b) => a.n - b.n || a.m - b.m);
}

function runningHash(kernel) {
  const spec = state.kernels.find((k) => k.name === kernel);
  return spec ? spec.kernel_hash : null;
}

// ------------------------------------------------------------------------------- views

function renderSummary() {
  const gpu = state.gpus.find((g) => g.name === $("gpu").value);
  const el = $("summary");
  if (!gpu) { el.textContent = ""; return; }
  const copy = gpu.copy_gbps ? `${fmt(gpu.copy_gbps, 0)} GB/s measured copy bandwidth` : "copy bandwidth not measured";
  el.textContent = `${gpu.name} (${gpu.slug}): ${gpu.entries} tuned entries, ${copy}.`;
}

function renderTable(entries) {
  const hash = runningHash($("kernel").value);
  const rows = entries.map((e) => {
    const tr = document.createElement("tr");
    const stale = hash !== null && e.kernel_hash !== hash;
    if (stale) tr.className = "stale";
    const cells = [
      [e.n], [e.m], [e.dtype, "dtype"], [configText(e.config), "config"], [fmt(e.us, 2)],
      [fmt(e.gbps, 0)], [e.frac_copy === undefined ? "–" : `${fmt(100 * e.frac_copy, 1)}%`],
      [e.speedup === null || e.speedup === undefined ? "–" : `${fmt(e.speedup, 2)}×`],
      [e.trials],
    ];
    for (const [text, cls] of cells) {
      const td = document.createElement("td");
      td.textContent = String(text);
      if (cls) td.className = cls;
      tr.append(td);
    }
    if (stale) {
      const badge = document.createElement("span");
      badge.className = "badge";
      badge.title = "measured on other kernel source; not served";
      badge.textContent = "stale";
      tr.children[3].append(" ", badge);
    }
    return tr;
  });
  $("configs").tBodies[0].replaceChildren(...rows);
}

// The colour of the i-th of `count` M buckets: hues from violet (fewest rows) through blue,
// green and yellow to red (most), so every bucket has its own and their order shows.
function bucketColor(i, count) {
  const hue = 270 - (260 * i) / Math.max(count - 1, 1);
  return `hsl(${hue.toFixed(0)}, 75%, 42%)`;
}

function svg(name, attrs, text) {
  const el = document.createElementNS(SVG_NS, name);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  if (text !== undefined) el.textContent = text;
  return el;
}

// A round tick spacing (1, 2 or 5 times a power of ten) at or above `raw`.
function niceStep(raw) {
  const power = 10 ** Math.floor(Math.log10(raw));
  return [1, 2, 5, 10].map((f) => f * power).find((s) => s >= raw);
}

function renderChart(all) {
  const hash = runningHash($("kernel").value);
  const entries = all.filter((e) => hash === null || e.kernel_hash === hash);  // as served
  const chart = $("chart");
  chart.replaceChildren();
  const W = 820, H = 420, left = 64, right = 130, top = 20, bottom = 48;
  const plotW = W - left - right, plotH = H - top - bottom;
  if (entries.length === 0) {
    chart.append(svg("text", { x: W / 2, y: H / 2, "text-anchor": "middle" }, "no tuned entries"));
    return;
  }
  const copy = state.table.copy_gbps;
  const ns = entries.map((e) => Math.log2(e.n));
  let xMin = Math.floor(Math.min(...ns)), xMax = Math.ceil(Math.max(...ns));
  if (xMax === xMin) { xMin -= 1; xMax += 1; }
  const highest = 1.05 * Math.max(copy || 0, ...entries.map((e) => e.gbps)) || 1;
  const step = niceStep(highest / 5);
  const yMax = step * Math.ceil(highest / step);
  const x = (n) => left + ((Math.log2(n) - xMin) / (xMax - xMin)) * plotW;
  const y = (g) => top + plotH - (g / yMax) * plotH;

  for (let g = 0; g <= yMax + step / 2; g += step) {  // horizontal grid with GB/s labels
    chart.append(svg("line", { class: "grid", x1: left, x2: left + plotW, y1: y(g), y2: y(g) }));
    chart.append(svg("text", { x: left - 6, y: y(g) + 4, "text-anchor": "end" }, fmt(g, 0)));
  }
  for (let p = xMin; p <= xMax; p++) {  // vertical grid at powers of two of N
    const n = 2 ** p;
    chart.append(svg("line", { class: "grid", x1: x(n), x2: x(n), y1: top, y2: top + plotH }));
    chart.append(svg("text", { x: x(n), y: top + plotH + 16, "text-anchor": "middle" }, String(n)));
  }
  chart.append(svg("line", { class: "axis", x1: left, x2: left + plotW, y1: top + plotH, y2: top + plotH }));
  chart.append(svg("line", { class: "axis", x1: left, x2: left, y1: top, y2: top + plotH }));
  chart.append(svg("text", { x: left + plotW / 2, y: H - 8, "text-anchor": "middle" }, "N (hidden size)"));
  chart.append(svg("text", { x: 14, y: top + plotH / 2, "text-anchor": "middle",
                             transform: `rotate(-90 14 ${top + plotH / 2})` }, "GB/s"));
  if (copy) {
    chart.append(svg("line", { class: "copy", x1: left, x2: left + plotW, y1: y(copy), y2: y(copy) }));
  }

  const buckets = [...new Set(entries.map((e) => e.m))].sort((a, b) => a - b);
  buckets.forEach((m, i) => {
    const color = bucketColor(i, buckets.length);
    const points = entries.filter((e) => e.m === m);
    const d = points.map((e, j) => `${j ? "L" : "M"}${x(e.n).toFixed(1)},${y(e.gbps).toFixed(1)}`);
    chart.append(svg("path", { class: "series", d: d.join(" "), stroke: color, "data-m": m }));
    for (const e of points) {
      const dot = svg("circle", { cx: x(e.n), cy: y(e.gbps), r: 3, fill: color });
      dot.append(svg("title", {}, `N=${e.n} M=${e.m}: ${fmt(e.gbps, 0)} GB/s, ${fmt(e.us, 2)} µs`));
      chart.append(dot);
    }
    const ly = top + 14 + 18 * i;
    chart.append(svg("line", { x1: left + plotW + 12, x2: left + plotW + 32, y1: ly - 4, y2: ly - 4,
                               stroke: color, "stroke-width": 2 }));
    chart.append(svg("text", { x: left + plotW + 38, y: ly }, `M ≤ ${m}`));
  });
}

function render() {
  const entries = entriesShown();
  renderSummary();
  renderTable(entries);
  renderChart(entries);
  const { gpu, kernel, dtype } = selection();
  setStatus(gpu ? `${entries.length} tuned configs for ${kernel} (${dtype}) on ${gpu}.`
                : "No GPU has a tuned table yet.");
}

function renderKernelList() {
  const items = state.kernels.map((k) => {
    const li = document.createElement("li");
    const params = Object.entries(k.parameters).map(([p, c]) => `${p} ∈ {${c.join(", ")}}`);
    li.textContent = `${k.name}: ${k.description} Parameters: ${params.join("; ")}.`;
    return li;
  });
  $("kernel-list").replaceChildren(...items);
}

// ------------------------------------------------------------------------------- events

function refillDtypes(wanted) {
  const kernel = $("kernel").value;
  const present = state.table ? state.table.entries.filter((e) => e.kernel === kernel) : [];
  const dtypes = [...new Set(present.map((e) => e.dtype))].sort();
  const options = dtypes.length ? dtypes : ["bfloat16", "float16", "float32"];
  const fallback = options.includes("bfloat16") ? "bfloat16" : options[0];
  fillSelect($("dtype"), options, null, options.includes(wanted) ? wanted : fallback);
}

async function loadGpu(wanted) {
  const gpu = $("gpu").value;
  state.table = null;
  if (gpu) {
    setStatus(`Loading the table of ${gpu}…`);
    state.table = await getJSON(`${API}/tables/${encodeURIComponent(gpu)}`);
  }
  const kernels = state.kernels.map((k) => k.name);
  const info = state.gpus.find((g) => g.name === gpu);
  const tuned = info ? kernels.filter((k) => info.kernels.includes(k)) : [];
  const first = tuned.length ? tuned[0] : kernels[0];
  fillSelect($("kernel"), kernels, kernels.map((k) => (tuned.includes(k) ? k : `${k} (not tuned)`)),
             kernels.includes(wanted.kernel) ? wanted.kernel : first);
  refillDtypes(wanted.dtype);
  remember();
  render();
}

function guarded(action) {
  return (...args) => action(...args).catch((err) => setStatus(String(err.message || err), true));
}

async function main() {
  const wanted = Object.fromEntries(new URLSearchParams(location.search));
  [state.gpus, state.kernels] = await Promise.all([getJSON(`${API}/gpus`), getJSON(`${API}/kernels`)]);
  renderKernelList();
  const names = state.gpus.map((g) => g.name);
  const bySlug = state.gpus.find((g) => g.slug === wanted.gpu);
  fillSelect($("gpu"), names, null, bySlug ? bySlug.name : wanted.gpu);
  $("gpu").addEventListener("change", guarded(() => loadGpu(selection())));
  $("kernel").addEventListener("change", () => { refillDtypes($("dtype").value); remember(); render(); });
  $("dtype").addEventListener("change", () => { remember(); render(); });
  await loadGpu(wanted);
}

guarded(main)();
