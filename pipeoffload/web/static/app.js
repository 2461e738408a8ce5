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
  const policyLine = document.getElementById("policy-line"), linkNote = document.getElementById("link-note");
  const DEVICE = "#1f4e79", HOST = "#b5651d";
  // [JSON key, heading, unit]: every number says its unit ("TIME": the server's time unit). Host peaks in rank units.
  const FIELDS = [
    ["makespan", "makespan", "TIME"], ["bubble_ratio", "bubble", "%"],
    ["peak_rank_units", "device peak", "rank units"], ["peak_host_rank_units", "host peak", "rank units"],
    ["stall", "total stall", "TIME"], ["offloaded", "offloaded", "activations"], ["recomputed", "recomputed", "activations"],
    ["actions", "actions", "lowered"],
  ];
  // Headings that need more than their words (a tooltip): the table's stall is `simulate --json`'s top-level
  // one, summed over ranks, where the summary line above gives the worst rank's.
  const HEAD_TITLES = {stall: "summed over ranks (the summary line gives the worst rank's)"};
  // What a family must take for a field to be enabled: a field it does not take is disabled and not sent.
  const TAKES = {
    stages_per_rank: (f) => !f.fixed_stages_per_rank,
    group_size: (f) => f.options.includes("group_size"),
    backward: (f) => f.options.includes("backward"),
  };
  // Shown dimmed while the numbers and chart do not match the inputs (an error, or a request on its way).
  const STALE = [chartBox, document.getElementById("numbers"), legendEl, summaryLine, commandEl, policyLine];
  let families = [], sequence = 0, timer = null, resizeTimer = null, controller = null, last = null;
  let view = null;  // [t0, t1]: the time window shown (null: the whole step); zoom with the wheel, pan by dragging
  // The URL's `view=T0,T1` (text as given), applied to the next chart that arrives; `viewNote` says why a
  // link's window was not used. A window is in the URL once the user stops zooming (`VIEW_SETTLE` ms).
  let pendingView = null, viewNote = "", viewTimer = null, lastQuery = null;
  const VIEW_SETTLE = 300, MIN_SPAN = 1e-4;  // the narrowest window: this share of the step
  let index = null;  // boxes by rank and lane, sorted by start, and by (kind, stage, microbatch): hover and "waited for"
  const CANVAS_ABOVE = 10000;
  const tooltip = document.getElementById("tooltip"), viewLine = document.getElementById("view-line");
  // "simulating…" while a chart request is in flight; the keyboard cursor's box, as the tooltip says it.
  const busy = document.getElementById("busy"), details = document.getElementById("chart-details");
  let cursor = null, inFlight = null;  // inFlight: the query of the chart request on its way  // the box the keyboard cursor is on (null: none); a new chart drops it

  const fmt = (v) => (typeof v === "number" ? String(Number(v.toPrecision(6))) : String(v));
  const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
  const stale = (on) => STALE.forEach((el) => el.classList.toggle("stale", on));

  // The query for the form, or the message for a required field left empty. Everything typed is sent as
  // typed (the server checks it with the CLI's checks), so "1e" or "--" is an error, never the default.
  // An emptied required box stays in the query as `name=` (and every box after it too), so the URL, a reload
  // and a shared link keep all the inputs and show the same message.
  function readForm() {
    const params = new URLSearchParams();
    let error = null;
    for (const el of form.elements) {
      if (!el.name || el.disabled) continue;
      const text = el.value.trim();
      if (text === "" && !el.required) continue;
      if (text === "" && !error) error = `${el.name}: empty; give a value (e.g. ${el.defaultValue})`;
      params.set(el.name, text);
    }
    return {params, error};
  }

  function schedule(delay) {
    clearTimeout(timer);
    timer = setTimeout(refresh, delay);
  }

  async function refresh() {
    const {params, error} = readForm(), query = params.toString();
    // Leaving a box fires "change" for inputs its "input" events already sent: those are not simulated again
    // (the redraw would show the whole step and drop the keyboard cursor of a user tabbing to the chart).
    if (!error && (query === inFlight || (inFlight === null && query === lastQuery && errorBox.hidden))) return;
    const mine = ++sequence;
    if (controller) controller.abort();
    history.replaceState(null, "", urlFor(params, pendingView));  // the state is the URL: share it
    if (error) { inFlight = null; busy.textContent = ""; showError(error); return; }
    controller = new AbortController();
    stale(true);
    inFlight = query;
    busy.textContent = "simulating…";  // a big pipeline takes a few seconds
    let response, body;
    try {
      response = await fetch("/api/chart?" + params.toString(), {signal: controller.signal});
      body = await response.json();
    } catch (err) {
      if (err.name === "AbortError") return;  // superseded: the newer request owns the status line
      if (mine === sequence) { inFlight = null; busy.textContent = ""; showError(unreachable(err)); }
      return;
    }
    if (mine !== sequence) return;  // a newer request is on its way
    inFlight = null;
    busy.textContent = "";
    if (!response.ok || body.error) { showError(body.error || response.statusText); return; }
    errorBox.hidden = true;
    errorBox.textContent = "";
    last = body;
    lastQuery = params.toString();
    render(body);
  }

  // The browser's words for a failed request ("Failed to fetch") say neither what failed nor the fix.
  const unreachable = (err) => "cannot reach the playground server (the `pipeoffload playground` command that served " +
    `this page; the browser says: ${err.message}): start it again if it stopped, then reload this page`;

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
    policyLine.textContent = body.policy_line;  // the CLI's line under its table: what was offloaded, kept, planned
    policyLine.hidden = !body.policy_line;
    const unitOf = (u) => (u === "TIME" ? unit : u);
    const heads = FIELDS.map(([key, head, u]) => `<th${HEAD_TITLES[key] ? ` title="${esc(HEAD_TITLES[key])}"` : ""}>${esc(head)}${u !== "%" ? ` (${esc(unitOf(u))})` : ""}</th>`);
    const cells = FIELDS.map(([key, , u]) => {
      const value = result[key];
      const shown = u === "%" ? (100 * value).toFixed(2) + "%" : fmt(value);
      return `<td data-key="${key}" data-value="${esc(JSON.stringify(value))}">${esc(shown)}</td>`;
    });
    numbers.innerHTML = `<tr>${heads.join("")}</tr><tr>${cells.join("")}</tr>`;
    legendEl.innerHTML = legend(chart);
    index = buildIndex(chart);
    cursor = null;
    details.textContent = "";
    applyPendingView(chart);
    draw();
    stale(false);
  }

  // ---- the zoom window in the URL -------------------------------------------------------------------
  const fmtView = (v) => `${fmt(v[0])},${fmt(v[1])}`;

  // "?query&view=T0,T1": the comma left as it is, so the link stays readable.
  function urlFor(params, v) {
    const parts = [params.toString()];
    if (typeof v === "string") parts.push("view=" + encodeURIComponent(v).replace(/%2C/gi, ","));
    else if (v) parts.push("view=" + fmtView(v));
    return "?" + parts.filter(Boolean).join("&");
  }

  // The window a URL's text names in a step of length `makespan`, or null with the reason: two finite
  // numbers, the first below the second, both inside the step, not narrower than zooming allows.
  function parseView(text, makespan) {
    const full = makespan > 0 ? makespan : 1, number = /^[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?$/i;
    const parts = String(text).split(",");
    if (parts.length !== 2 || !parts.every((p) => number.test(p.trim()))) return {error: "not two numbers T0,T1"};
    const [a, b] = parts.map(Number), slack = full * 1e-6;  // the URL keeps 6 significant digits
    if (!(a < b)) return {error: "T0 is not below T1"};
    if (a < -slack || b > full + slack) return {error: `outside the step (0 to ${fmt(full)})`};
    const t0 = Math.max(0, a), t1 = Math.min(full, b);
    if (t1 - t0 < full * MIN_SPAN * (1 - 1e-6)) return {error: "narrower than the zoom allows"};
    return {view: t0 <= 0 && t1 >= full ? null : [t0, t1]};
  }

  function applyPendingView(chart) {
    const wanted = pendingView;
    pendingView = null;
    view = null;
    viewNote = "";
    if (wanted === null) return;
    const parsed = parseView(wanted, chart.makespan);
    if (parsed.error) viewNote = `the link's zoom window view=${wanted} is ${parsed.error}; showing the whole step`;
    else view = parsed.view;
    history.replaceState(history.state, "", withView(view));  // a bad window leaves the URL: no loop
  }

  function withView(v) {
    const params = new URLSearchParams(location.search);
    params.delete("view");
    return urlFor(params, v);
  }

  // The window changed (zoom, pan, reset): redraw now, and once it settles make it a history entry, so
  // that back and forward step through windows and a reload or a shared link reopens this one.
  function viewChanged() {
    viewNote = "";
    draw();
    clearTimeout(viewTimer);
    viewTimer = setTimeout(() => {
      const url = withView(view);
      if (url !== location.search) history.pushState(null, "", url);
    }, VIEW_SETTLE);
  }

  // Back or forward: the form and the window of that entry; simulate again only if the inputs differ.
  function onPopState() {
    clearTimeout(viewTimer);
    applyUrl();
    const {params, error} = readForm();
    if (!error && last && errorBox.hidden && params.toString() === lastQuery) {
      applyPendingView(last.chart);
      draw();
      return;
    }
    refresh();
  }

  // The form's values and the pending window from the URL; a field the URL leaves out takes its default.
  function applyUrl() {
    const shared = new URLSearchParams(location.search);
    setLinkNote("");
    for (const el of form.elements) {
      if (!el.name) continue;
      if (el === familySelect && shared.has("family")) familySelect.value = familyFromLink(shared.get("family"));
      else if (shared.has(el.name)) el.value = shared.get(el.name);
      else if (el === familySelect) el.value = defaultFamily();
      else el.value = el.tagName === "SELECT" ? "" : el.defaultValue;
    }
    pendingView = shared.has("view") ? shared.get("view") : null;
    noteFamily();
  }

  // The family a link names (its name or an alias, in any case, as the command line reads it); a name this
  // server does not know shows the default family with a note saying so, never silently another schedule.
  function familyFromLink(text) {
    const wanted = text.trim().toLowerCase();
    const found = families.find((f) => [f.name, ...(f.aliases || [])].some((n) => n.toLowerCase() === wanted));
    if (found) return found.name;
    const shown = defaultFamily();
    setLinkNote(`the link's family=${text} is not a schedule family of this playground ` +
      `(${families.map((f) => f.name).join(", ")}); showing ${shown}: choose one in the family list`);
    return shown;
  }

  function setLinkNote(text) {
    linkNote.textContent = text;
    linkNote.hidden = !text;
  }

  const defaultFamily = () => (families.some((f) => f.name === "group-interleaved") ? "group-interleaved" : families[0].name);

  function shade(colour, index, v) {
    const amount = v > 1 ? 0.55 * index / (v - 1) : 0;
    const rgb = [1, 3, 5].map((i) => parseInt(colour.slice(i, i + 2), 16));
    return "#" + rgb.map((c) => Math.round(c + (255 - c) * amount).toString(16).padStart(2, "0")).join("");
  }

  // Swatches are small SVGs: the page's CSP allows no inline style attributes.
  const swatch = (fill) => `<svg width="14" height="10"><rect width="14" height="10" fill="${fill}"/></svg>`;

  // The legend's entries, [mark, colour, label] (mark: box, tick, line or dashed): drawn as the page's
  // legend and into an exported image, which must say what it shows on its own.
  function legendItems(chart) {
    const items = chart.kinds.map((k) => ["box", chart.colours[k], chart.labels[k]]);
    for (let s = 1; s < chart.stages_per_rank; s++) {
      items.push(["box", shade(chart.colours.F, s, chart.stages_per_rank), `lighter: rank's stage ${s + 1} of ${chart.stages_per_rank}`]);
    }
    if (chart.boxes.some((b) => b[1] === "copy" && b[6] <= b[5])) {
      items.push(["tick", "#555", "tick: copy taking no time (the host already holds the bytes, or k = 0)"]);
    }
    items.push(["line", DEVICE, "device memory"]);
    if (chart.host.some((c) => c.peak > 0)) items.push(["dashed", HOST, "host memory (own scale)"]);
    return items;
  }

  function mark(kind, colour, x = 0, y = 0) {  // a legend entry's 14x10 mark at (x, y)
    if (kind === "box") return `<rect x="${x}" y="${y}" width="14" height="10" fill="${colour}"/>`;
    if (kind === "tick") return `<rect x="${x + 6}" y="${y}" width="2" height="10" fill="${colour}"/>`;
    return `<line x1="${x}" x2="${x + 14}" y1="${y + 5}" y2="${y + 5}" stroke="${colour}" stroke-width="2"${kind === "dashed" ? ' stroke-dasharray="3 2"' : ""}/>`;
  }

  function legend(chart) {
    return legendItems(chart).map(([kind, colour, label]) => `<span><svg width="14" height="10">${mark(kind, colour)}</svg>${esc(label)}</span>`).join("");
  }

  // The exported SVG: the chart under its title, headline numbers and legend (wrapped to the chart's width).
  const EXPORT_CHAR_PX = 6;  // a generous width of one character at the legend's 10 px font
  function exportSvg(chart) {
    const L = layout(chart), head = [`<text x="8" y="16" font-size="12" font-weight="600">${esc(chart.title)}</text>`,
      `<text x="8" y="32" font-size="10">${esc(chart.summary)}</text>`];
    let x = 8, y = 42;
    for (const [kind, colour, label] of legendItems(chart)) {
      const w = 20 + EXPORT_CHAR_PX * label.length;
      if (x > 8 && x + w > L.width - 8) { x = 8; y += 16; }
      head.push(mark(kind, colour, x, y), `<text x="${x + 18}" y="${y + 9}">${esc(label)}</text>`);
      x += w + 12;
    }
    const top = y + 22, height = top + L.height;
    const svgText = `<svg xmlns="http://www.w3.org/2000/svg" width="${L.width}" height="${height}" font-size="10" font-family="system-ui,sans-serif">` +
      `<rect width="${L.width}" height="${height}" fill="#fff"/>${head.join("")}<g transform="translate(0,${top})">${svg(chart, true)}</g></svg>`;
    return {svgText, width: L.width, height};
  }

  function ticks(max) {
    if (!(max > 0)) return [0];
    const raw = max / 10, p = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 2.5, 5, 10].map((s) => s * p).find((s) => s >= raw);
    const out = [];
    for (let t = 0; t <= max * (1 + 1e-9); t += step) out.push(Number(t.toPrecision(10)));
    return out;
  }

  function ticksIn(t0, t1) {  // round times between t0 and t1
    const step = ticks(t1 - t0)[1] || (t1 - t0);
    const out = [];
    for (let t = Math.ceil(t0 / step - 1e-9) * step; t <= t1 * (1 + 1e-9); t += step) out.push(Number(t.toPrecision(10)));
    return out;
  }

  function stepPath(points, x, y) {
    let d = "";
    points.forEach(([t, level], i) => {
      d += i === 0 ? `M${x(t).toFixed(1)},${y(level).toFixed(1)}` : `H${x(t).toFixed(1)}V${y(level).toFixed(1)}`;
    });
    return d;
  }

  // Each rank's peak label at the right of its memory panel: the margin is made wide enough for the longest
  // (PEAK_CHAR_PX: a generous width of one character at the label's 9 px font), so none is cut off.
  const PEAK_CHAR_PX = 5.6;
  function peakNotes(chart) {
    const topHost = Math.max(0, ...chart.host.map((c) => c.peak));
    return chart.device.map((c, r) => `peak ${fmt(c.peak)}` + (topHost > 0 ? ` · host ${fmt(chart.host[r].peak)}` : ""));
  }

  // Layout of a chart at the current width and time window; shared by drawing, hit-testing and export.
  function layout(chart, win = view) {
    const width = Math.max(720, chartBox.clientWidth || 1200);
    const left = 64, right = Math.max(96, 12 + PEAK_CHAR_PX * Math.max(...peakNotes(chart).map((n) => n.length))), plotW = width - left - right, d = chart.ranks;
    const computeH = d > 8 ? (d > 32 ? 8 : 14) : 20, copyH = chart.copy_lanes ? (d > 8 ? (d > 32 ? 5 : 8) : 10) : 0;
    const rowH = computeH + copyH + (d > 32 ? 1 : 3), ganttH = d * rowH, panelH = d > 8 ? (d > 32 ? 14 : 26) : 36;
    const memTop = ganttH + 44, height = memTop + d * panelH + 44;
    const t0 = win ? win[0] : 0, t1 = win ? win[1] : (chart.makespan > 0 ? chart.makespan : 1);
    const x = (t) => left + ((t - t0) / (t1 - t0)) * plotW;
    return {width, left, plotW, d, computeH, copyH, rowH, ganttH, panelH, memTop, height, t0, t1, x};
  }

  // Where a box sits: [x, y, w, h, fill, instant].
  function boxGeometry(chart, L, box) {
    const [rank, lane, kind, stageShade, , start, end] = box;
    let y = rank * L.rowH, h = L.computeH, fill = chart.colours[kind];
    if (lane === "copy") { h = L.copyH / 2; y += L.computeH + 1 + (kind === "OFFLOAD" || kind === "OFFLOAD_W" ? 0 : h); }
    else fill = shade(fill, stageShade, chart.stages_per_rank);
    const x0 = L.x(start), instant = lane === "copy" && end <= start;  // k = 0: a tick, not a vanishing bar
    return [x0, y, instant ? 1.5 : Math.max(L.x(end) - x0, 0.5), h, fill, instant];
  }

  const visible = (L, box) => box[6] >= L.t0 && box[5] <= L.t1;

  // Above CANVAS_ABOVE boxes the Gantt boxes are drawn on a canvas under the SVG (tens of thousands of SVG
  // elements take seconds per redraw); `forSvg` (export) always writes them into the SVG.
  // `win`: the time window (the playground's zoom unless given); `clip`: the clip path's id, one per chart on the page.
  function svg(chart, forSvg, win = view, clip = "plot") {
    const L = layout(chart, win), {width, left, plotW, d, computeH, copyH, rowH, ganttH, panelH, memTop, height, x} = L;
    const onCanvas = !forSvg && chart.boxes.length > CANVAS_ABOVE;
    const out = [];
    out.push(`<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" data-ranks="${d}" data-boxes="${chart.boxes.length}" data-makespan="${chart.makespan}" data-drawn="${onCanvas ? "canvas" : "svg"}" data-view="${fmt(L.t0)},${fmt(L.t1)}" font-size="10" font-family="system-ui,sans-serif">`);
    out.push(`<defs><clipPath id="${clip}"><rect x="${left}" y="0" width="${plotW}" height="${height}"/></clipPath></defs>`);
    for (let r = 0; r < d; r++) {
      const y = r * rowH;
      out.push(`<text class="rank-label" data-rank="${r}" x="${left - 6}" y="${y + Math.min(computeH, 10) / 2 + computeH / 2 - 2}" text-anchor="end"${d > 32 ? ' font-size="7"' : ""}>rank ${r}</text>`);
      if (copyH && d <= 32) out.push(`<text x="${left - 6}" y="${y + computeH + copyH / 2 + 3}" text-anchor="end" fill="#888" font-size="7">copy</text>`);
    }
    out.push(`<g class="boxes" stroke="#fff" stroke-width="0.3" clip-path="url(#${clip})">`);
    if (!onCanvas) {
      for (const box of chart.boxes) {
        if (!visible(L, box)) continue;
        const [rank, lane, , stageShade, microbatch] = box;
        const [x0, y, w, h, fill, instant] = boxGeometry(chart, L, box);
        out.push(`<rect class="box${instant ? " tick" : ""}" data-rank="${rank}" data-mb="${microbatch}" x="${x0.toFixed(2)}" y="${y}" width="${w.toFixed(2)}" height="${h}" fill="${fill}"/>`);
        const label = String(microbatch);
        if (lane === "compute" && w >= 6 * label.length + 3 && h >= 10) {
          out.push(`<text x="${(x0 + w / 2).toFixed(1)}" y="${y + h / 2 + 3}" text-anchor="middle" font-size="8" fill="${stageShade === 0 ? "#fff" : "#111"}" stroke="none" pointer-events="none">${label}</text>`);
        }
      }
    }
    out.push("</g>");
    const axis = (y, label) => {
      out.push(`<line x1="${left}" x2="${left + plotW}" y1="${y}" y2="${y}" stroke="#444"/>`);
      for (const t of ticksIn(L.t0, L.t1)) {
        out.push(`<line x1="${x(t)}" x2="${x(t)}" y1="${y}" y2="${y + 4}" stroke="#444"/><text x="${x(t)}" y="${y + 14}" text-anchor="middle">${fmt(t)}</text>`);
      }
      if (label) out.push(`<text x="${left + plotW / 2}" y="${y + 30}" text-anchor="middle" font-size="11">${label}</text>`);
    };
    axis(ganttH + 2, "");
    const topDevice = Math.max(1e-9, ...chart.device.map((c) => c.peak));
    const topHost = Math.max(0, ...chart.host.map((c) => c.peak)), notes = peakNotes(chart);
    out.push(`<text x="${left}" y="${memTop - 6}" font-size="11">activation memory per rank, ${esc(chart.memory_unit)} (device solid, shared scale 0 to ${fmt(topDevice)}${topHost > 0 ? `; host dashed, own scale 0 to ${fmt(topHost)}` : ""})</text>`);
    for (let r = 0; r < d; r++) {
      const y0 = memTop + r * panelH, inner = panelH - 4;
      const yDev = (level) => y0 + panelH - (level / topDevice) * inner;
      out.push(`<line x1="${left}" x2="${left + plotW}" y1="${y0 + panelH}" y2="${y0 + panelH}" stroke="#ccc"/>`);
      out.push(`<text x="${left - 6}" y="${y0 + panelH / 2 + 3}" text-anchor="end"${d > 32 ? ' font-size="7"' : ""}>rank ${r}</text>`);
      const device = chart.device[r], host = chart.host[r];
      const path = stepPath(device.points, x, yDev);
      out.push(`<g clip-path="url(#${clip})"><path class="device" data-rank="${r}" d="${path}V${y0 + panelH}H${x(0)}Z" fill="${DEVICE}" fill-opacity="0.15" stroke="none"/>`);
      out.push(`<path d="${path}" fill="none" stroke="${DEVICE}" stroke-width="1"/></g>`);
      if (topHost > 0) {
        const yHost = (level) => y0 + panelH - (level / topHost) * inner;
        out.push(`<path class="host" data-rank="${r}" d="${stepPath(host.points, x, yHost)}" fill="none" stroke="${HOST}" stroke-width="1" stroke-dasharray="4 2" clip-path="url(#${clip})"/>`);
      }
      out.push(`<text x="${left + plotW + 6}" y="${y0 + panelH / 2 + 3}" fill="${DEVICE}" font-size="9" class="peak">${notes[r]}</text>`);
    }
    const unit = chart.time_unit;
    axis(memTop + d * panelH + 2, `time (${esc(unit)}${unit === "t" ? " = one rank's forward of one microbatch" : ""})`);
    out.push("</svg>");
    return out.join("");
  }

  // Draw the current chart in the current window: the SVG, and the boxes on a canvas beneath when many.
  function draw(highlight) {
    const chart = last.chart;
    chartBox.innerHTML = svg(chart, false);
    drawCursor(chart);
    viewLine.textContent = viewNote || (view ? `showing ${fmt(view[0])} to ${fmt(view[1])} ${chart.time_unit} of ${fmt(chart.makespan)} (double-click: whole step)` : "wheel or + and -: zoom the time axis · drag or arrow keys: pan · hover, or up, down, comma and period on the focused chart: a box's details");
    if (chart.boxes.length <= CANVAS_ABOVE) return;
    const L = layout(chart), canvas = document.createElement("canvas"), ratio = window.devicePixelRatio || 1;
    canvas.width = L.width * ratio;
    canvas.height = L.ganttH * ratio;
    canvas.className = "boxes";
    canvas.style.width = L.width + "px";  // CSSOM, which the CSP allows (unlike style attributes)
    canvas.style.height = L.ganttH + "px";
    const ctx = canvas.getContext("2d");
    ctx.scale(ratio, ratio);
    ctx.beginPath();
    ctx.rect(L.left, 0, L.plotW, L.ganttH);
    ctx.clip();
    for (const box of chart.boxes) {
      if (!visible(L, box)) continue;
      const [x0, y, w, h, fill] = boxGeometry(chart, L, box);
      ctx.globalAlpha = highlight && !highlight(box) ? 0.2 : 1;
      ctx.fillStyle = fill;
      ctx.fillRect(x0, y, w, h);
    }
    chartBox.prepend(canvas);
  }

  function buildIndex(chart) {
    const lanes = new Map(), byKey = new Map();
    chart.boxes.forEach((box) => {
      const key = box[0] + "/" + box[1];
      if (!lanes.has(key)) lanes.set(key, []);
      lanes.get(key).push(box);
      byKey.set(`${box[2]}/${box[8]}/${box[4]}`, box);
    });
    for (const list of lanes.values()) list.sort((a, b) => a[5] - b[5]);
    return {lanes, byKey, stages: 1 + Math.max(0, ...chart.boxes.map((b) => b[8]))};
  }

  // The box under the mouse (from the layout, not from SVG elements: works for the canvas too).
  function boxAt(chart, L, px, py) {
    const rank = Math.floor(py / L.rowH);
    if (rank < 0 || rank >= L.d || px < L.left || px > L.left + L.plotW) return null;
    const lane = py - rank * L.rowH <= L.computeH ? "compute" : "copy";
    const t = L.t0 + ((px - L.left) / L.plotW) * (L.t1 - L.t0), slack = 2 * (L.t1 - L.t0) / L.plotW;
    const list = index.lanes.get(rank + "/" + lane) || [];
    let lo = 0, hi = list.length;
    while (lo < hi) { const mid = (lo + hi) >> 1; if (list[mid][5] <= t + slack) lo = mid + 1; else hi = mid; }
    for (let i = lo - 1; i >= 0 && i >= lo - 4; i--) if (list[i][6] + slack >= t) return list[i];
    return null;
  }

  // What an action waited for: its input (the previous stage's forward, the next stage's backward, its
  // own I before W) or its reload, when that ended after the rank was free; else the previous action.
  function waitedFor(chart, box) {
    const [rank, lane, kind, , mb, start, , , stage] = box;
    if (lane === "copy") return kind.startsWith("RELOAD") ? "issued when its backward drew near" : "issued after the action that made it";
    const deps = [];
    if (kind === "F" && stage > 0) deps.push(`F/${stage - 1}/${mb}`);
    if ((kind === "B" || kind === "I") && stage < index.stages - 1) deps.push(`B/${stage + 1}/${mb}`, `I/${stage + 1}/${mb}`);
    if ((kind === "B" || kind === "I") && stage === index.stages - 1) deps.push(`F/${stage}/${mb}`);
    if (kind === "W") deps.push(`I/${stage}/${mb}`);
    if (kind === "WAIT") return `its offload ${stage}OFFLOAD${mb}: the rank waits until that copy has ended`;
    deps.push(`RELOAD/${stage}/${mb}`, `RELOAD_W/${stage}/${mb}`);
    const list = index.lanes.get(rank + "/compute"), at = list.indexOf(box), prev = at > 0 ? list[at - 1] : null;
    const free = prev ? prev[6] : 0;
    if (start <= free + 1e-9) return prev ? `the rank: it started when ${prev[7]} ended` : "nothing: the first action";
    const found = deps.map((k) => index.byKey.get(k)).filter((b) => b && b[6] <= start + 1e-9).sort((a, b) => b[6] - a[6])[0];
    const idle = fmt(start - free) + " " + chart.time_unit;
    return found ? `${found[7]} on rank ${found[0]} (ended at ${fmt(found[6])}; the rank idled ${idle})` : `its input (the rank idled ${idle})`;
  }

  // What the tooltip says of a box, and the keyboard cursor's details line (its two lines joined).
  const boxDetails = (chart, box) => `${box[7]} on rank ${box[0]} (stage ${box[8]}, microbatch ${box[4]}): ` +
    `${fmt(box[5])} to ${fmt(box[6])} ${chart.time_unit}\nwaited for: ${waitedFor(chart, box)}`;

  function onHover(event) {
    if (!last || drag) return;
    const chart = last.chart, L = layout(chart), rect = chartBox.getBoundingClientRect();
    const px = event.clientX - rect.left, py = event.clientY - rect.top;
    const box = boxAt(chart, L, px, py);
    const rankRow = px < L.left && py < L.ganttH ? Math.floor(py / L.rowH) : null;
    const key = box ? "mb" + box[4] : rankRow !== null ? "rank" + rankRow : "";
    if (key !== hovered) {
      hovered = key;
      highlight(chart, box ? (b) => b[4] === box[4] : rankRow !== null ? (b) => b[0] === rankRow : null,
                box ? `[data-mb="${box[4]}"]` : rankRow !== null ? `[data-rank="${rankRow}"]` : null);
    }
    if (!box) { tooltip.hidden = true; return; }
    tooltip.textContent = boxDetails(chart, box);
    tooltip.hidden = false;
    placeTooltip(event.clientX, event.clientY);
  }

  // Below and right of the pointer, or left of / above it where the window ends, so that the text is never
  // cut off at the window's edge (a box near the right end of the step).
  function placeTooltip(x, y) {
    const w = tooltip.offsetWidth, h = tooltip.offsetHeight, gap = 12, margin = 4;
    const left = x + gap + w <= window.innerWidth - margin ? x + gap : Math.max(margin, x - gap - w);
    const top = y + gap + h <= window.innerHeight - margin ? y + gap : Math.max(margin, y - gap - h);
    tooltip.style.left = left + "px";
    tooltip.style.top = top + "px";
  }

  // One microbatch (across ranks) or one rank highlighted, the rest faded.
  function highlight(chart, keep, selector) {
    const svgEl = chartBox.querySelector("svg");
    if (chart.boxes.length > CANVAS_ABOVE) { draw(keep); return; }
    svgEl.classList.toggle("highlighting", !!keep);
    chartBox.querySelectorAll("rect.box.hl").forEach((el) => el.classList.remove("hl"));
    if (selector) chartBox.querySelectorAll("rect.box" + selector).forEach((el) => el.classList.add("hl"));
  }

  let hovered = "", drag = null;

  function zoom(factor, aroundPx) {
    const chart = last.chart, L = layout(chart), full = chart.makespan > 0 ? chart.makespan : 1;
    const at = L.t0 + ((aroundPx - L.left) / L.plotW) * (L.t1 - L.t0);
    let span = Math.min(full, Math.max(full * MIN_SPAN, (L.t1 - L.t0) * factor));
    let t0 = Math.max(0, Math.min(full - span, at - (at - L.t0) * span / (L.t1 - L.t0)));
    view = span >= full ? null : [t0, t0 + span];
    viewChanged();
  }

  // The chart from the keyboard (it takes focus with Tab): arrows pan by a tenth of the window, + and -
  // zoom around its middle, 0 or Home shows the whole step: what the wheel, dragging and a double-click do.
  function onChartKey(e) {
    if (!last || e.ctrlKey || e.metaKey || e.altKey) return;
    const L = layout(last.chart), full = last.chart.makespan > 0 ? last.chart.makespan : 1, span = L.t1 - L.t0;
    if (e.key === "+" || e.key === "=") zoom(0.5, L.left + L.plotW / 2);
    else if (e.key === "-") zoom(2, L.left + L.plotW / 2);
    else if (e.key === "0" || e.key === "Home") { view = null; viewChanged(); }
    else if ((e.key === "ArrowLeft" || e.key === "ArrowRight") && span < full) {
      const t0 = Math.max(0, Math.min(full - span, L.t0 + (e.key === "ArrowLeft" ? -0.1 : 0.1) * span));
      view = [t0, t0 + span];
      viewChanged();
    } else if (!moveCursor(e.key)) return;
    e.preventDefault();
  }

  // The keyboard cursor, the hover's counterpart: up and down pick a rank's lane (compute, then its copies),
  // comma and period step to the previous and next action on it; the window pans to keep the box in sight,
  // its microbatch is highlighted and the details line says what the tooltip would. Escape leaves it.
  function moveCursor(key) {
    const chart = last.chart, lanes = [...index.lanes.keys()].sort(laneOrder);
    if (key === "Escape") { if (!cursor) return false; setCursor(chart, null); return true; }
    if (!["ArrowUp", "ArrowDown", ",", ".", "<", ">"].includes(key) || !lanes.length) return false;
    if (!cursor) {  // the first action in the window on rank 0's compute lane
      const list = index.lanes.get(lanes[0]), L = layout(chart);
      setCursor(chart, list.find((b) => b[6] >= L.t0) || list[0]);
      return true;
    }
    const here = cursor[0] + "/" + cursor[1], list = index.lanes.get(here), at = list.indexOf(cursor);
    if (key === "," || key === "<") setCursor(chart, list[Math.max(0, at - 1)]);
    else if (key === "." || key === ">") setCursor(chart, list[Math.min(list.length - 1, at + 1)]);
    else {
      const next = lanes[Math.max(0, Math.min(lanes.length - 1, lanes.indexOf(here) + (key === "ArrowDown" ? 1 : -1)))];
      const mid = (cursor[5] + cursor[6]) / 2, near = (b) => Math.abs((b[5] + b[6]) / 2 - mid);
      setCursor(chart, index.lanes.get(next).reduce((best, b) => (near(b) < near(best) ? b : best)));
    }
    return true;
  }

  const laneOrder = (a, b) => { const [ra, la] = a.split("/"), [rb, lb] = b.split("/"); return ra - rb || (la === "compute" ? -1 : 1) - (lb === "compute" ? -1 : 1); };

  function setCursor(chart, box) {
    cursor = box;
    details.textContent = box ? boxDetails(chart, box).replace("\n", "; ") : "";
    const L = layout(chart);
    if (box && view && (box[5] < L.t0 || box[6] > L.t1)) {  // pan (same span) to centre the box
      const full = chart.makespan > 0 ? chart.makespan : 1, span = L.t1 - L.t0;
      const t0 = Math.max(0, Math.min(full - span, (box[5] + box[6]) / 2 - span / 2));
      view = [t0, t0 + span];
      viewChanged();  // redraws, with the cursor
    } else drawCursor(chart);
    hovered = box ? "mb" + box[4] : "";
    highlight(chart, box ? (b) => b[4] === box[4] : null, box ? `[data-mb="${box[4]}"]` : null);
  }

  // The cursor's box outlined on top of the chart (SVG or canvas boxes alike).
  function drawCursor(chart) {
    const svgEl = chartBox.querySelector("svg");
    svgEl.querySelector("rect.cursor")?.remove();
    if (!cursor) return;
    const [x0, y, w, h] = boxGeometry(chart, layout(chart), cursor);
    const mark = document.createElementNS("http://www.w3.org/2000/svg", "rect");
    Object.entries({class: "cursor", "data-rank": cursor[0], "data-mb": cursor[4], x: x0 - 1, y: y - 1, width: Math.max(w, 2) + 2,
      height: h + 2, fill: "none", stroke: "#000", "stroke-width": 1.5, "pointer-events": "none", "clip-path": "url(#plot)"}).forEach(([k, v]) => mark.setAttribute(k, v));
    svgEl.append(mark);
  }

  function setupInteraction() {
    chartBox.addEventListener("mousemove", (e) => {
      if (drag && last) {
        const L = layout(last.chart), full = last.chart.makespan, span = L.t1 - L.t0;
        const dt = ((drag.x - e.clientX) / L.plotW) * span, t0 = Math.max(0, Math.min(full - span, drag.t0 + dt));
        if (span < full) { view = [t0, t0 + span]; viewChanged(); }
        return;
      }
      onHover(e);
    });
    chartBox.addEventListener("mouseleave", () => { tooltip.hidden = true; hovered = ""; if (last) highlight(last.chart, null, null); });
    chartBox.addEventListener("wheel", (e) => {
      if (!last) return;
      e.preventDefault();
      zoom(e.deltaY < 0 ? 0.8 : 1.25, e.clientX - chartBox.getBoundingClientRect().left);
    }, {passive: false});
    chartBox.addEventListener("mousedown", (e) => { if (last) drag = {x: e.clientX, t0: layout(last.chart).t0}; });
    window.addEventListener("mouseup", () => { drag = null; });
    chartBox.addEventListener("dblclick", () => { if (last) { view = null; viewChanged(); } });
    chartBox.addEventListener("keydown", onChartKey);
    document.getElementById("zoom-in").addEventListener("click", () => last && zoom(0.5, layout(last.chart).left + layout(last.chart).plotW / 2));
    document.getElementById("zoom-out").addEventListener("click", () => last && zoom(2, layout(last.chart).left + layout(last.chart).plotW / 2));
    document.getElementById("zoom-reset").addEventListener("click", () => { if (last) { view = null; viewChanged(); } });
    document.getElementById("export-svg").addEventListener("click", () => last && download(new Blob([exportSvg(last.chart).svgText], {type: "image/svg+xml"}), "svg"));
    document.getElementById("export-png").addEventListener("click", () => last && exportPng());
  }

  function fileName(ext) {
    return (last.command.replace(/^pipeoffload simulate /, "").replace(/[^A-Za-z0-9._-]+/g, "_") || "chart") + "." + ext;
  }

  function download(blob, ext) {
    const a = document.createElement("a");
    a.href = URL.createObjectURL(blob);
    a.download = fileName(ext);
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(a.href), 1000);
  }

  function exportPng() {  // the export SVG drawn on a canvas: the same picture, every box in it
    const {svgText: text, width, height} = exportSvg(last.chart), image = new Image();
    image.onload = () => {
      const canvas = document.createElement("canvas");
      canvas.width = width * 2;
      canvas.height = height * 2;
      const ctx = canvas.getContext("2d");
      ctx.fillStyle = "#fff";
      ctx.fillRect(0, 0, canvas.width, canvas.height);
      ctx.scale(2, 2);
      ctx.drawImage(image, 0, 0);
      URL.revokeObjectURL(image.src);
      canvas.toBlob((blob) => download(blob, "png"), "image/png");
    };
    image.src = URL.createObjectURL(new Blob([text], {type: "image/svg+xml"}));
  }

  // A training run's metrics.jsonl: per rank, the largest measured (peak_act_bytes) and simulated
  // (sim_peak_act_bytes) activation peak over its rows, as `pipeoffload report` reads them.
  function perRankMax(rows, key) {
    const out = [];
    for (const row of rows) {
      if (!Array.isArray(row[key])) continue;
      row[key].forEach((value, rank) => {
        if (typeof value !== "number" || !isFinite(value)) return;
        while (out.length <= rank) out.push(0);
        out[rank] = Math.max(out[rank], value);
      });
    }
    return out;
  }

  function parseMetrics(text, name) {
    const rows = [];
    text.split("\n").forEach((line, i) => {
      if (!line.trim()) return;
      let row;
      try { row = JSON.parse(line); } catch (err) { throw new Error(`${name}:${i + 1}: not a JSON object (${err.message}); the file is corrupt`); }
      if (row === null || typeof row !== "object" || Array.isArray(row)) throw new Error(`${name}:${i + 1}: expected a JSON object per line`);
      rows.push(row);
    });
    if (!rows.length) throw new Error(`${name} has no metrics yet; run at least one training step first`);
    return rows;
  }

  function measuredSvg(measured, simulated) {
    const MIB = 1048576, ranks = Math.max(measured.length, simulated.length);
    if (!ranks) return `<p class="note">no memory figures (peak_act_bytes) in this file</p>`;
    const top = Math.max(1, ...measured, ...simulated) / MIB, barW = 18, gap = 14, left = 60, h = 160;
    const width = left + ranks * (2 * barW + gap) + 20, y = (v) => 10 + h - (v / MIB / top) * h;
    const out = [`<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${h + 50}" font-size="10" data-ranks="${ranks}">`];
    out.push(`<text x="4" y="${10 + h / 2}">MiB</text><text x="${left - 4}" y="14" text-anchor="end">${fmt(top)}</text><text x="${left - 4}" y="${10 + h}" text-anchor="end">0</text>`);
    for (let r = 0; r < ranks; r++) {
      const x0 = left + r * (2 * barW + gap);
      [[measured[r], DEVICE, "measured"], [simulated[r], "#8AB17D", "simulated"]].forEach(([v, colour, kind], i) => {
        if (v === undefined) return;
        out.push(`<rect class="${kind}" data-rank="${r}" data-bytes="${v}" x="${x0 + i * barW}" y="${y(v)}" width="${barW - 2}" height="${10 + h - y(v)}" fill="${colour}"/>`);
      });
      // three decimals, as `pipeoffload report` prints measured/simulated (six digits overlapped the next rank's)
      const ratio = measured[r] !== undefined && simulated[r] ? ` ${(measured[r] / simulated[r]).toFixed(3)}` : "";
      out.push(`<text x="${x0 + barW}" y="${h + 24}" text-anchor="middle">rank ${r}</text><text class="ratio" data-rank="${r}" x="${x0 + barW}" y="${h + 38}" text-anchor="middle" fill="#555">${ratio ? "×" + ratio : ""}</text>`);
    }
    out.push("</svg>");
    return `<p class="legend-line">${swatch(DEVICE)} measured (runtime) ${swatch("#8AB17D")} simulated · under each rank: measured / simulated</p>` + out.join("");
  }

  function loadMetrics(file) {
    const box = document.getElementById("measured"), err = document.getElementById("measured-error");
    const reader = new FileReader();
    reader.onload = () => {
      try {
        const rows = parseMetrics(String(reader.result), file.name);
        box.innerHTML = measuredSvg(perRankMax(rows, "peak_act_bytes"), perRankMax(rows, "sim_peak_act_bytes"));
        err.hidden = true;
      } catch (e) {
        box.innerHTML = "";
        err.textContent = e.message;
        err.hidden = false;
      }
    };
    reader.readAsText(file);
  }

  // ---- a runtime trace beside its simulation ----------------------------------------------------------
  const MAX_TRACE_BYTES = 33554432;  // the server's MAX_TRACE_BYTES (32 MiB)
  let traceResult = null, traceSequence = 0;
  // "reading the trace…" while the server reads one, as #busy says "simulating…" for a chart
  const traceBusy = document.getElementById("trace-busy");

  // The file goes to this playground's server, which reads it with `pipeoffload trace compare`'s code and
  // simulates the run's schedule with its own measured durations; a wrong file answers one line. A newer
  // file supersedes one on its way: the older answer then neither draws nor clears the status line.
  async function loadTrace(file) {
    const err = document.getElementById("trace-error"), box = document.getElementById("trace-charts");
    const fail = (message) => { err.textContent = `${file.name}: ${message}`; err.hidden = false; box.classList.add("stale"); };
    const mine = ++traceSequence;
    if (file.size > MAX_TRACE_BYTES) {
      traceBusy.textContent = "";
      fail(`${file.size.toLocaleString("en")} bytes, over the playground's limit of ${MAX_TRACE_BYTES.toLocaleString("en")}; use pipeoffload trace compare`);
      return;
    }
    traceBusy.textContent = "reading the trace…";  // the server reads and simulates it: seconds for a big one
    let body;
    try {
      const response = await fetch("/api/trace", {method: "POST", body: file});
      body = await response.json();
    } catch (e) {
      if (mine === traceSequence) { traceBusy.textContent = ""; fail(unreachable(e)); }
      return;
    }
    if (mine !== traceSequence) return;
    traceBusy.textContent = "";
    if (body.error) { fail(body.error); return; }
    err.hidden = true;
    err.textContent = "";
    box.classList.remove("stale");
    traceResult = body;
    drawTrace();
  }

  function drawTrace() {
    const t = traceResult, box = document.getElementById("trace-charts");
    if (!t) return;
    const ms = (s) => fmt(1000 * s) + " ms";
    const rows = t.per_rank.map((r) => `<tr data-rank="${r.rank}"><td>${r.rank}</td><td class="measured-span">${esc(ms(r.measured_span_s))}</td>` +
      `<td class="simulated-end">${esc(ms(r.simulated_end_s))}</td><td class="start-skew">${esc(ms(r.start_skew_s))}</td><td class="measured-peak">${t.has_memory ? esc(fmt(r.measured_peak_mib)) : "—"}</td>` +
      `<td class="simulated-peak">${esc(fmt(r.simulated_peak_rank_units))}</td></tr>`);
    const win = [0, Math.max(t.measured.makespan, t.simulated.makespan) || 1];  // one time axis for both
    box.innerHTML = `<p class="summary">${esc(t.measured.title)}: measured step ${esc(ms(t.measured_step_s))} ` +
      `(from the first rank's first action; first actions up to ${esc(ms(t.start_skew_s))} apart), ` +
      `simulated with its own measured durations ${esc(ms(t.simulated_makespan_s))} (every rank from 0)</p>` +
      `<table class="trace-table"><tr><th>rank</th><th>measured (from its first action)</th><th>simulated end</th><th>first action after the first rank's</th><th>measured peak (MiB)</th>` +
      `<th>simulated peak (rank units)</th></tr>${rows.join("")}</table>` +
      `<div class="legend">${legend(t.measured)}</div>` +
      `<h3>measured (${esc(t.measured.summary)})</h3><div id="trace-measured">${svg(t.measured, true, win, "trace-measured-plot")}</div>` +
      `<h3>simulated (${esc(t.simulated.summary)})</h3><div id="trace-simulated">${svg(t.simulated, true, win, "trace-simulated-plot")}</div>`;
  }

  async function start() {
    const response = await fetch("/api/families");
    families = await response.json();
    familySelect.innerHTML = families.map((f) => `<option value="${esc(f.name)}">${esc(f.name)}</option>`).join("");
    applyUrl();  // a shared link: its state, then the defaults
    // New inputs: a new step, shown whole (a window the link gave is for the link's inputs).
    const newInputs = () => { pendingView = null; clearTimeout(viewTimer); setLinkNote(""); };
    form.addEventListener("input", () => { newInputs(); schedule(150); });
    form.addEventListener("change", (e) => { newInputs(); if (e.target === familySelect) noteFamily(); schedule(0); });
    window.addEventListener("popstate", onPopState);
    form.addEventListener("submit", (e) => e.preventDefault());
    window.addEventListener("resize", () => {  // only the drawing depends on the width: redraw, do not re-simulate
      clearTimeout(resizeTimer);
      resizeTimer = setTimeout(() => { if (last && errorBox.hidden) draw(); drawTrace(); }, 100);
    });
    setupInteraction();
    document.getElementById("metrics-file").addEventListener("change", (e) => { if (e.target.files[0]) loadMetrics(e.target.files[0]); });
    document.getElementById("trace-file").addEventListener("change", (e) => { if (e.target.files[0]) loadTrace(e.target.files[0]); });
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

  start().catch((err) => showError(err instanceof TypeError ? unreachable(err) : "could not start: " + err.message));
})();
