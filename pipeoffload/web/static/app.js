// pipeoffload playground: read the form, ask /api/chart, draw the Gantt chart, copy lanes and memory as SVG.
// Hand-written, no framework and no network beyond this server.
"use strict";
(() => {
  const form = document.getElementById("inputs");
  const familySelect = document.getElementById("family");
  const errorBox = document.getElementById("error");
  const chartBox = document.getElementById("chart");
  const numbers = document.querySelector("#numbers tbody");
  const summaryLine = document.getElementById("summary-line");
  const commandEl = document.getElementById("command");
  const legendEl = document.getElementById("legend");
  const familyNote = document.getElementById("family-note");
  const DEVICE = "#1f4e79", HOST = "#b5651d";
  // [JSON key, heading, unit]: every number says its unit. Host peaks are shown in rank units.
  // [JSON key, heading, unit]: every number says its unit ("TIME": the server's time unit). Host peaks in rank units.
  const FIELDS = [
    ["makespan", "makespan", "TIME"], ["bubble_ratio", "bubble", "%"],
    ["peak_rank_units", "device peak", "rank units"], ["peak_host_rank_units", "host peak", "rank units"],
    ["stall", "stall", "TIME"], ["offloaded", "offloaded", "activations"], ["recomputed", "recomputed", "activations"],
    ["actions", "actions", "lowered"],
  ];
  // What a family must take for a field to be enabled: a field it does not take is disabled and not sent.
  const TAKES = {
    stages_per_rank: (f) => !f.fixed_stages_per_rank,
    group_size: (f) => f.options.includes("group_size"),
    backward: (f) => f.options.includes("backward"),
  };
  // Shown dimmed while the numbers and chart do not match the inputs (an error, or a request on its way).
  const STALE = [chartBox, document.getElementById("numbers"), legendEl, summaryLine, commandEl];
  let families = [], sequence = 0, timer = null, resizeTimer = null, controller = null, last = null;

  const fmt = (v) => (typeof v === "number" ? String(Number(v.toPrecision(6))) : String(v));
  const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
  const stale = (on) => STALE.forEach((el) => el.classList.toggle("stale", on));

  // The query for the form, or the message for a required field left empty. Everything typed is sent as
  // typed (the server checks it with the CLI's checks), so "1e" or "--" is an error, never the default.
  function readForm() {
    const params = new URLSearchParams();
    for (const el of form.elements) {
      if (!el.name || el.disabled) continue;
      const text = el.value.trim();
      if (text === "") {
        if (el.required) return {params, error: `${el.name}: empty; give a value (e.g. ${el.defaultValue})`};
        continue;
      }
      params.set(el.name, text);
    }
    return {params, error: null};
  }

  function schedule(delay) {
    clearTimeout(timer);
    timer = setTimeout(refresh, delay);
  }

  async function refresh() {
    const mine = ++sequence;
    if (controller) controller.abort();
    const {params, error} = readForm();
    history.replaceState(null, "", "?" + params.toString());  // the state is the URL: share it
    if (error) { showError(error); return; }
    controller = new AbortController();
    stale(true);
    let response, body;
    try {
      response = await fetch("/api/chart?" + params.toString(), {signal: controller.signal});
      body = await response.json();
    } catch (err) {
      if (err.name === "AbortError") return;
      if (mine === sequence) showError("cannot reach the playground server: " + err.message);
      return;
    }
    if (mine !== sequence) return;  // a newer request is on its way
    if (!response.ok || body.error) { showError(body.error || response.statusText); return; }
    errorBox.hidden = true;
    errorBox.textContent = "";
    last = body;
    render(body);
  }

  function showError(message) {
    errorBox.textContent = message;
    errorBox.hidden = false;
    stale(true);  // the numbers below are for other inputs
  }

  function render(body) {
    const result = body.result, chart = body.chart, unit = chart.time_unit;
    document.querySelectorAll(".unit").forEach((el) => { el.textContent = unit; });
    summaryLine.textContent = chart.title + " — " + chart.summary;
    commandEl.textContent = body.command;
    const unitOf = (u) => (u === "TIME" ? unit : u);
    const heads = FIELDS.map(([, head, u]) => `<th>${esc(head)}${u !== "%" ? ` (${esc(unitOf(u))})` : ""}</th>`);
    const cells = FIELDS.map(([key, , u]) => {
      const value = result[key];
      const shown = u === "%" ? (100 * value).toFixed(2) + "%" : fmt(value);
      return `<td data-key="${key}" data-value="${esc(JSON.stringify(value))}">${esc(shown)}</td>`;
    });
    numbers.innerHTML = `<tr>${heads.join("")}</tr><tr>${cells.join("")}</tr>`;
    legendEl.innerHTML = legend(chart);
    chartBox.innerHTML = svg(chart);
    stale(false);
  }

  function shade(colour, index, v) {
    const amount = v > 1 ? 0.55 * index / (v - 1) : 0;
    const rgb = [1, 3, 5].map((i) => parseInt(colour.slice(i, i + 2), 16));
    return "#" + rgb.map((c) => Math.round(c + (255 - c) * amount).toString(16).padStart(2, "0")).join("");
  }

  // Swatches are small SVGs: the page's CSP allows no inline style attributes.
  const swatch = (fill) => `<svg width="14" height="10"><rect width="14" height="10" fill="${fill}"/></svg>`;
  const stroke = (colour, dash) => `<svg width="14" height="10"><line x1="0" x2="14" y1="5" y2="5" stroke="${colour}" stroke-width="2"${dash ? ' stroke-dasharray="3 2"' : ""}/></svg>`;

  function legend(chart) {
    const items = chart.kinds.map((k) => `<span>${swatch(chart.colours[k])}${esc(chart.labels[k])}</span>`);
    for (let s = 1; s < chart.stages_per_rank; s++) {
      items.push(`<span>${swatch(shade(chart.colours.F, s, chart.stages_per_rank))}lighter: rank's stage ${s + 1} of ${chart.stages_per_rank}</span>`);
    }
    if (chart.boxes.some((b) => b[1] === "copy" && b[6] <= b[5])) {
      items.push(`<span><svg width="14" height="10"><rect x="6" width="2" height="10" fill="#555"/></svg>tick: instant copy (k = 0)</span>`);
    }
    items.push(`<span>${stroke(DEVICE, false)}device memory</span>`);
    if (chart.host.some((c) => c.peak > 0)) items.push(`<span>${stroke(HOST, true)}host memory (own scale)</span>`);
    return items.join("");
  }

  function ticks(max) {
    if (!(max > 0)) return [0];
    const raw = max / 10, p = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 2.5, 5, 10].map((s) => s * p).find((s) => s >= raw);
    const out = [];
    for (let t = 0; t <= max * (1 + 1e-9); t += step) out.push(Number(t.toPrecision(10)));
    return out;
  }

  function stepPath(points, x, y) {
    let d = "";
    points.forEach(([t, level], i) => {
      d += i === 0 ? `M${x(t).toFixed(1)},${y(level).toFixed(1)}` : `H${x(t).toFixed(1)}V${y(level).toFixed(1)}`;
    });
    return d;
  }

  function svg(chart) {
    const width = Math.max(720, chartBox.clientWidth || 1200);
    const left = 64, right = 96, plotW = width - left - right, d = chart.ranks, v = chart.stages_per_rank;
    const computeH = d > 8 ? 14 : 20, copyH = chart.copy_lanes ? (d > 8 ? 8 : 10) : 0;
    const rowH = computeH + copyH + 3, ganttH = d * rowH, panelH = d > 8 ? 26 : 36;
    const memTop = ganttH + 44, height = memTop + d * panelH + 44;
    const span = chart.makespan > 0 ? chart.makespan : 1;
    const x = (t) => left + (t / span) * plotW;
    const out = [];
    out.push(`<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" data-ranks="${d}" data-boxes="${chart.boxes.length}" data-makespan="${chart.makespan}" font-size="10">`);
    for (let r = 0; r < d; r++) {
      const y = r * rowH;
      out.push(`<text x="${left - 6}" y="${y + computeH / 2 + 3}" text-anchor="end">rank ${r}</text>`);
      if (copyH) out.push(`<text x="${left - 6}" y="${y + computeH + copyH / 2 + 3}" text-anchor="end" fill="#888" font-size="7">copy</text>`);
    }
    out.push(`<g class="boxes" stroke="#fff" stroke-width="0.3">`);
    for (const [rank, lane, kind, stageShade, microbatch, start, end, action] of chart.boxes) {
      let y = rank * rowH, h = computeH, fill = chart.colours[kind];
      if (lane === "copy") { h = copyH / 2; y += computeH + 1 + (kind === "OFFLOAD" ? 0 : h); }
      else fill = shade(fill, stageShade, v);
      const x0 = x(start), instant = lane === "copy" && end <= start;  // k = 0: a tick, not a vanishing bar
      const w = instant ? 1.5 : Math.max(x(end) - x0, 0.5);
      out.push(`<rect class="box${instant ? " tick" : ""}" x="${x0.toFixed(2)}" y="${y}" width="${w.toFixed(2)}" height="${h}" fill="${fill}"><title>${action} on rank ${rank}: ${fmt(start)} to ${fmt(end)} ${esc(chart.time_unit)}</title></rect>`);
      const label = String(microbatch);
      if (lane === "compute" && w >= 6 * label.length + 3) {
        out.push(`<text x="${(x0 + w / 2).toFixed(1)}" y="${y + h / 2 + 3}" text-anchor="middle" font-size="8" fill="${stageShade === 0 ? "#fff" : "#111"}" stroke="none" pointer-events="none">${label}</text>`);
      }
    }
    out.push("</g>");
    const axis = (y, label) => {
      out.push(`<line x1="${left}" x2="${left + plotW}" y1="${y}" y2="${y}" stroke="#444"/>`);
      for (const t of ticks(span)) {
        out.push(`<line x1="${x(t)}" x2="${x(t)}" y1="${y}" y2="${y + 4}" stroke="#444"/><text x="${x(t)}" y="${y + 14}" text-anchor="middle">${fmt(t)}</text>`);
      }
      if (label) out.push(`<text x="${left + plotW / 2}" y="${y + 30}" text-anchor="middle" font-size="11">${label}</text>`);
    };
    axis(ganttH + 2, "");
    const topDevice = Math.max(1e-9, ...chart.device.map((c) => c.peak));
    const topHost = Math.max(0, ...chart.host.map((c) => c.peak));
    out.push(`<text x="${left}" y="${memTop - 6}" font-size="11">activation memory per rank, ${esc(chart.memory_unit)} (device solid, shared scale 0 to ${fmt(topDevice)}${topHost > 0 ? `; host dashed, own scale 0 to ${fmt(topHost)}` : ""})</text>`);
    for (let r = 0; r < d; r++) {
      const y0 = memTop + r * panelH, inner = panelH - 4;
      const yDev = (level) => y0 + panelH - (level / topDevice) * inner;
      out.push(`<line x1="${left}" x2="${left + plotW}" y1="${y0 + panelH}" y2="${y0 + panelH}" stroke="#ccc"/>`);
      out.push(`<text x="${left - 6}" y="${y0 + panelH / 2 + 3}" text-anchor="end">rank ${r}</text>`);
      const device = chart.device[r], host = chart.host[r];
      const path = stepPath(device.points, x, yDev);
      out.push(`<path class="device" data-rank="${r}" d="${path}V${y0 + panelH}H${x(0)}Z" fill="${DEVICE}" fill-opacity="0.15" stroke="none"/>`);
      out.push(`<path d="${path}" fill="none" stroke="${DEVICE}" stroke-width="1"/>`);
      if (topHost > 0) {
        const yHost = (level) => y0 + panelH - (level / topHost) * inner;
        out.push(`<path class="host" data-rank="${r}" d="${stepPath(host.points, x, yHost)}" fill="none" stroke="${HOST}" stroke-width="1" stroke-dasharray="4 2"/>`);
      }
      const note = `peak ${fmt(device.peak)}` + (topHost > 0 ? ` · host ${fmt(host.peak)}` : "");
      out.push(`<text x="${left + plotW + 6}" y="${y0 + panelH / 2 + 3}" fill="${DEVICE}" font-size="9" class="peak">${note}</text>`);
    }
    const unit = chart.time_unit;
    axis(memTop + d * panelH + 2, `time (${esc(unit)}${unit === "t" ? " = one rank's forward of one microbatch" : ""})`);
    out.push("</svg>");
    return out.join("");
  }

  async function start() {
    const response = await fetch("/api/families");
    families = await response.json();
    familySelect.innerHTML = families.map((f) => `<option value="${esc(f.name)}">${esc(f.name)}</option>`).join("");
    familySelect.value = families.some((f) => f.name === "group-interleaved") ? "group-interleaved" : families[0].name;
    const shared = new URLSearchParams(location.search);  // a shared link: its state, then the defaults
    for (const [name, value] of shared) {
      const el = form.elements.namedItem(name);
      if (el && el.name) el.value = value;
    }
    if (!familySelect.value) familySelect.value = families[0].name;
    noteFamily();
    form.addEventListener("input", () => schedule(150));
    form.addEventListener("change", (e) => { if (e.target === familySelect) noteFamily(); schedule(0); });
    form.addEventListener("submit", (e) => e.preventDefault());
    window.addEventListener("resize", () => {  // only the drawing depends on the width: redraw, do not re-simulate
      clearTimeout(resizeTimer);
      resizeTimer = setTimeout(() => { if (last && errorBox.hidden) chartBox.innerHTML = svg(last.chart); }, 100);
    });
    refresh();
  }

  function noteFamily() {
    const f = families.find((x) => x.name === familySelect.value);
    if (!f) { familyNote.textContent = ""; return; }
    for (const [name, takes] of Object.entries(TAKES)) {
      const el = form.elements.namedItem(name);
      el.disabled = !takes(f);
      el.title = el.disabled ? `${f.name} does not take this option` : "";
    }
    familyNote.textContent = `${f.name}: ${f.summary} (default v = ${f.stages_per_rank}; options: ${f.options.join(", ") || "none"})`;
  }

  start().catch((err) => showError("could not start: " + err.message));
})();
