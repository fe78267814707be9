// meshsim explore, part 3 of 3: the page. The graph (dot's SVG, folded by layer; a fold opens on a
// click), pan and zoom, search, the value panel, the steps of the run, the communication table,
// the failure, and the differences of two runs.
"use strict";

(function () {
  const doc = JSON.parse(document.getElementById("meshsim-model").textContent);
  const A = doc.runs[0], B = doc.runs[1] || null;
  const idx = MS.index(A);
  const idxB = B ? MS.index(B) : null;
  const differs = new Map();
  if (doc.diff) for (const d of doc.diff.values) differs.set(d.value, d.what);
  const state = { view: -1, step: -1, value: null, vb: null, sort: { key: "bytes", down: true } };
  const $ = (id) => document.getElementById(id);
  const esc = PIC.esc;
  const h = (tag, attrs, html) => "<" + tag + (attrs ? " " + attrs : "") + ">" + (html || "") + "</" + tag + ">";

  // ---------------------------------------------------------------- frame
  const mesh = A.mesh;
  const statusClass = { pass: "ok", fail: "bad", error: "bad" }[A.status] || "warn";
  const root = document.createElement("div");
  root.id = "app";
  document.body.appendChild(root);
  root.innerHTML =
    '<header><b>meshsim explore</b> <span id="run-name">' + esc(A.name) + (B ? " vs " + esc(B.name) : "") + "</span>" +
    ' <span id="status" class="badge ' + statusClass + '">' + esc(A.status) + "</span>" +
    (B ? ' <span id="status-b" class="badge">' + esc(B.status) + "</span>" : "") +
    ' <span class="dim">mesh ' + esc(mesh.axes.map((a, i) => a + "=" + mesh.shape[i]).join(" × ")) + " · " +
    idx.steps.length + " steps</span>" +
    '<span class="grow"></span><input id="search" type="search" placeholder="search a value or an op" autocomplete="off">' +
    '<div id="search-results"></div></header>' +
    '<div id="failure"></div>' +
    '<main><section id="graph-pane"><div id="graph-bar"><span id="breadcrumb"></span><span class="grow"></span>' +
    '<button id="fit">fit</button><button id="zoom-in">+</button><button id="zoom-out">−</button></div>' +
    '<div id="graph"></div></section>' +
    '<aside id="side"><div id="step-panel"><div class="bar"><button id="prev">◀ back</button>' +
    '<button id="next">step ▶</button><span id="step-label"></span></div><div id="step-detail"></div></div>' +
    '<div id="value-panel"><p class="dim">Click a value in the graph, or search for one.</p></div></aside></main>' +
    '<section id="tables"><div id="diff-panel"></div><h3>Communication</h3><div id="comm-table"></div>' +
    '<h3>Every collective</h3><div id="comm-list"></div></section>';

  // ---------------------------------------------------------------- graph, pan and zoom
  function showGraph(view) {
    state.view = view;
    const g = A.graphs;
    const svgText = view < 0 ? g.overview : g.layers[view];
    const host = $("graph");
    if (!svgText) {
      host.innerHTML = '<p class="dim">' + esc(g.note || "no graph") + "</p>";
      $("breadcrumb").textContent = "";
      return;
    }
    host.innerHTML = svgText.slice(svgText.indexOf("<svg"));
    const svg = host.querySelector("svg");
    const box = svg.viewBox.baseVal;
    state.home = { x: box.x, y: box.y, w: box.width, h: box.height };
    svg.removeAttribute("width");
    svg.removeAttribute("height");
    setBox(Object.assign({}, state.home));
    $("breadcrumb").innerHTML = view < 0
      ? "whole program" + (A.layers.length ? " · " + A.layers.length + " layers folded (click one to open it)" : "")
      : '<a href="#" id="crumb-home">whole program</a> › <b>' + esc(A.layers[view]) + "</b>";
    if (view >= 0) $("crumb-home").onclick = (ev) => { ev.preventDefault(); showGraph(-1); mark(); };
    for (const node of svg.querySelectorAll("g.node")) {
      const id = node.querySelector("title").textContent;
      node.dataset.id = id;
      node.addEventListener("click", () => clickNode(id));
      const value = valueOfNode(id);
      if (value && differs.has(value)) node.classList.add("differs");
    }
    mark();
  }

  function valueOfNode(id) {
    if (id.startsWith("v:") || id.startsWith("x:")) return id.slice(2);
    const m = /^e(\d+)$/.exec(id);
    if (m) { const e = A.events.find((ev) => ev.s === Number(m[1])); return e ? e.v : null; }
    return null;
  }

  function clickNode(id) {
    let m;
    if ((m = /^g(\d+)$/.exec(id))) return showGraph(Number(m[1]));
    if ((m = /^e(\d+)$/.exec(id))) {
      const s = Number(m[1]);
      const k = idx.steps.findIndex((e) => e.s === s);
      if (k >= 0) setStep(k, false);
    }
    const v = valueOfNode(id);
    if (v) selectValue(v);
  }

  function setBox(b) {
    state.vb = b;
    const svg = $("graph").querySelector("svg");
    if (svg) svg.setAttribute("viewBox", b.x + " " + b.y + " " + b.w + " " + b.h);
  }

  function zoom(f, cx, cy) {
    const b = state.vb;
    if (!b) return;
    cx = cx === undefined ? b.x + b.w / 2 : cx;
    cy = cy === undefined ? b.y + b.h / 2 : cy;
    setBox({ x: cx - (cx - b.x) * f, y: cy - (cy - b.y) * f, w: b.w * f, h: b.h * f });
  }

  function toSvg(ev) {
    const svg = $("graph").querySelector("svg");
    const r = svg.getBoundingClientRect(), b = state.vb;
    const s = Math.max(b.w / r.width, b.h / r.height);
    const ox = b.x + b.w / 2 - (r.width * s) / 2, oy = b.y + b.h / 2 - (r.height * s) / 2;
    return { x: ox + (ev.clientX - r.left) * s, y: oy + (ev.clientY - r.top) * s, s };
  }

  const graphEl = $("graph");
  graphEl.addEventListener("wheel", (ev) => {
    if (!state.vb) return;
    ev.preventDefault();
    const p = toSvg(ev);
    zoom(ev.deltaY > 0 ? 1.15 : 1 / 1.15, p.x, p.y);
  }, { passive: false });
  let drag = null;
  graphEl.addEventListener("mousedown", (ev) => { if (state.vb) drag = { x: ev.clientX, y: ev.clientY, b: state.vb, s: toSvg(ev).s }; });
  window.addEventListener("mousemove", (ev) => {
    if (!drag) return;
    const dx = (ev.clientX - drag.x) * drag.s, dy = (ev.clientY - drag.y) * drag.s;
    if (Math.abs(dx) + Math.abs(dy) > 2) setBox({ x: drag.b.x - dx, y: drag.b.y - dy, w: drag.b.w, h: drag.b.h });
  });
  window.addEventListener("mouseup", () => { drag = null; });
  $("fit").onclick = () => state.home && setBox(Object.assign({}, state.home));
  $("zoom-in").onclick = () => zoom(1 / 1.4);
  $("zoom-out").onclick = () => zoom(1.4);

  // The node of the current step and of the selected value, lit; in a folded view, their layer's.
  function mark() {
    const svg = $("graph").querySelector("svg");
    if (!svg) return;
    for (const n of svg.querySelectorAll(".current,.selected")) n.classList.remove("current", "selected");
    const light = (value, cls) => {
      if (!value) return;
      const layer = idx.layerOf.get(value);
      const id = state.view < 0 && layer >= 0 ? "g" + layer : idx.nodeOf.get(value);
      const n = id && svg.querySelector('g.node[data-id="' + CSS.escape(id) + '"]');
      if (n) n.classList.add(cls);
      return n;
    };
    light(state.value, "selected");
    const e = idx.steps[state.step];
    const n = e && light(e.v, "current");
    if (n && state.follow) centerOn(n);
  }

  function centerOn(node) {
    // The node's middle in the root's user space (the viewBox's): dot draws the graph in a
    // translated group.
    const svg = $("graph").querySelector("svg");
    const bb = node.getBBox(), b = state.vb;
    const p = svg.createSVGPoint();
    p.x = bb.x + bb.width / 2;
    p.y = bb.y + bb.height / 2;
    const c = p.matrixTransform(svg.getScreenCTM().inverse().multiply(node.getScreenCTM()));
    const cx = c.x, cy = c.y;
    if (cx < b.x || cx > b.x + b.w || cy < b.y || cy > b.y + b.h) setBox({ x: cx - b.w / 2, y: cy - b.h / 2, w: b.w, h: b.h });
  }

  // ---------------------------------------------------------------- steps
  function setStep(k, follow) {
    if (!idx.steps.length) {
      $("step-label").textContent = "no steps: the run stopped before its first event";
      return;
    }
    state.step = Math.max(0, Math.min(idx.steps.length - 1, k));
    state.follow = follow;
    const e = idx.steps[state.step];
    if (follow && e.p === "f" && e.g >= 0 && state.view !== e.g && state.view >= 0) showGraph(e.g);
    const phase = e.p === "f" ? "forward" : "backward";
    const what = e.k === "collective" ? e.n + " over " + e.x + ", " + MS.bytesText(e.b) + " per rank"
      : e.k === "op" ? e.v + " = " + e.n + "(" + (e.a || []).join(", ") + ")"
      : e.k + " " + e.n + " " + e.v;
    $("step-label").innerHTML = "step " + (state.step + 1) + " of " + idx.steps.length + ": <b>" + phase + "</b> " +
      esc(what) + (e.m ? ' <span class="implicit">implicit</span>' : "");
    let detail = h("div", 'class="kv"', "spec: " + esc((e.i || []).join(", ") || "–") + " → " + esc(e.o || "–") +
      (e.g >= 0 ? " · " + esc(A.layers[e.g]) : ""));
    if (e.t) detail += h("div", 'class="dim"', esc(e.t));
    if (e.m) detail += h("div", 'class="implicit-why"', esc(e.m));
    if (e.k === "collective") {
      const groups = MS.groups(e.x, mesh.axes, mesh.shape);
      const groupOf = new Map();
      groups.forEach((g, k2) => g.forEach((r) => groupOf.set(r, k2)));
      detail += h("div", 'class="dim"', esc(e.n) + " over " + esc(e.x) + ": " + groups.length + " groups of " +
        groups[0].length + " ranks exchange " + MS.bytesText(e.b) + " each (" + esc((e.i || [""])[0]) + " → " +
        esc(e.o) + "); a color per group");
      detail += PIC.mesh(mesh.axes, mesh.shape, (r) => ({
        fill: PIC.color(groupOf.get(r)) + "55",
        lines: ["r" + r, "group " + groupOf.get(r), MS.bytesText(e.b)],
        title: "rank " + r + ": group " + groupOf.get(r) + " (ranks " + groups[groupOf.get(r)].join(", ") + ")",
      }));
    }
    $("step-detail").innerHTML = detail;
    mark();
  }
  $("prev").onclick = () => setStep(state.step - 1, true);
  $("next").onclick = () => setStep(state.step + 1, true);
  document.addEventListener("keydown", (ev) => {
    if (ev.target.tagName === "INPUT") return;
    if (ev.key === "ArrowRight") setStep(state.step + 1, true);
    if (ev.key === "ArrowLeft") setStep(state.step - 1, true);
  });

  // ---------------------------------------------------------------- values
  function valuePanel(run, name, tag) {
    const v = run.values[name];
    if (!v) return h("p", 'class="dim"', esc(name) + " is not in " + tag);
    const locals = MS.expandRuns(v.local);
    const ps = MS.parseSpec(v.spec);
    const inferred = !v.shape && MS.inferShape(v.spec, locals, mesh.shape);
    const shape = v.shape || inferred || null;
    let html = "";
    if (ps) {
      let rows = h("tr", "", h("th", "", "axis") + h("th", "", "size") + h("th", "", "placement") + h("th", "", "as DTensor prints it"));
      ps.forEach((p, i) => { rows += h("tr", "", h("td", "", esc(mesh.axes[i])) + h("td", "", mesh.shape[i]) + h("td", "", h("code", "", esc(p))) + h("td", "", esc(MS.longPlacement(p)))); });
      html += h("table", 'class="placements"', rows);
    } else {
      html += h("div", 'class="kv"', "LTensor: " + h("code", "", esc(v.spec || "–")));
    }
    html += h("div", 'class="kv"', "global shape " + h("code", "", esc(shape ? MS.shapeText(shape) : "unknown")) +
      (inferred ? " (from its local shapes)" : "") + " · local " +
      v.local.map(([n, s]) => h("code", "", esc(MS.shapeText(s))) + " ×" + n).join(", "));
    const maxNumel = Math.max(1, ...locals.map(MS.numel));
    const blocks = MS.blocks(v.spec, shape, mesh.shape, locals);
    const focus = state.rank === undefined ? null : [state.rank];
    html += PIC.mesh(mesh.axes, mesh.shape, (r) => {
      const b = blocks && blocks[r];
      const frac = MS.numel(locals[r]) / maxNumel;
      return {
        fill: "rgba(33,113,181," + (0.12 + 0.6 * frac).toFixed(2) + ")",
        lines: ["r" + r, MS.shapeText(locals[r]), b ? b.map((x) => x[0] + ":" + (x[0] + x[1])).join(",") : ""],
        title: "rank " + r + " holds " + MS.shapeText(locals[r]) + (b ? ", block " + b.map((x) => "[" + x[0] + ", " + (x[0] + x[1]) + ")").join(" × ") : ""),
        strong: state.rank === r,
      };
    });
    if (blocks) html += h("div", 'class="dim"', "the blocks each rank holds (hover for ranks and ranges):") + PIC.tensor(shape, blocks, focus);
    if (v.grad || v.gspec) {
      html += h("div", 'class="kv grad"', "gradient: " + h("code", "", esc(v.gspec || (v.grad && v.grad[0]) || "–")) +
        (v.grad ? " · tracked " + h("code", "", esc(v.grad[0])) + " · cotangent " + h("code", "", esc(v.grad[1])) : ""));
    }
    for (const err of (v.errors || []).concat(v.gerrors || [])) html += h("div", 'class="error"', "✗ " + esc(err));
    if (v.recorded) {
      for (const kind of ["value", "oracle", "grad", "oracle_grad"]) {
        const r = v.recorded[kind];
        if (!r) continue;
        html += h("div", 'class="kv recorded"', esc(kind) + " " + h("code", "", esc(MS.shapeText(r.shape))) + ": " +
          h("code", "", esc(r.head.map((x) => (typeof x === "number" ? +x.toPrecision(6) : x)).join(", ")) + (r.elements > r.head.length ? ", …" : "")));
      }
    }
    return html;
  }

  function selectValue(name) {
    state.value = name;
    const v = A.values[name];
    const maker = v && A.events.find((e) => e.s === v.at);
    let html = h("h3", 'id="value-title"', esc(name)) +
      h("div", 'class="dim"', maker ? (maker.k === "input" ? "input" : "made by " + esc(maker.n) + " (event " + maker.s + ")") +
        (v.layer >= 0 ? " in " + esc(A.layers[v.layer]) : "") + (v.source ? " · " + esc(v.source) : "") : "");
    if (differs.has(name)) html += h("div", 'class="differs-note"', "differs in B: " + esc(differs.get(name).join("; ")));
    if (B) html += '<div class="sbs"><div>' + h("h4", "", "A: " + esc(A.name)) + valuePanel(A, name, "A") + "</div><div>" +
      h("h4", "", "B: " + esc(B.name)) + valuePanel(B, name, "B") + "</div></div>";
    else html += valuePanel(A, name, "this run");
    $("value-panel").innerHTML = html;
    for (const g of $("value-panel").querySelectorAll("g.rank"))
      g.addEventListener("click", () => { state.rank = Number(g.dataset.rank); selectValue(name); });
    mark();
  }

  // ---------------------------------------------------------------- search
  $("search").addEventListener("input", () => {
    const q = $("search").value.trim().toLowerCase();
    const out = $("search-results");
    if (!q) { out.innerHTML = ""; return; }
    const hits = [];
    for (const e of A.events) {
      if (e.p !== "f" || !(e.k === "op" || e.k === "input")) continue;
      if (e.v.toLowerCase().includes(q) || e.n.toLowerCase().includes(q)) hits.push(e);
      if (hits.length >= 40) break;
    }
    out.innerHTML = hits.map((e) => '<div class="hit" data-v="' + esc(e.v) + '">' + esc(e.v) + ' <span class="dim">' +
      esc(e.k === "input" ? "input" : e.n) + (e.g >= 0 ? " · " + esc(A.layers[e.g]) : "") + "</span></div>").join("") ||
      '<div class="dim">nothing matches</div>';
    for (const d of out.querySelectorAll(".hit")) d.onclick = () => { goToValue(d.dataset.v); out.innerHTML = ""; };
  });

  function goToValue(name) {
    const layer = idx.layerOf.get(name);
    if (layer !== undefined && layer >= 0 && state.view !== layer) showGraph(layer);
    selectValue(name);
    const n = $("graph").querySelector('g.node[data-id="' + CSS.escape(idx.nodeOf.get(name) || "") + '"]');
    if (n) centerOn(n);
  }

  // ---------------------------------------------------------------- communication
  function commRows(run) {
    const by = new Map();
    for (const e of run.events) {
      if (e.k !== "collective") continue;
      const key = e.x + "|" + e.p + "|" + e.n;
      if (!by.has(key)) by.set(key, { axis: e.x, phase: e.p === "f" ? "forward" : "backward", collective: e.n, count: 0, bytes: 0, implicit: 0, implicit_bytes: 0 });
      const r = by.get(key);
      r.count++; r.bytes += e.b || 0;
      if (e.m) { r.implicit++; r.implicit_bytes += e.b || 0; }
    }
    return [...by.values()];
  }

  function table(id, rows, cols, sortState) {
    const s = sortState;
    rows.sort((a, b) => (a[s.key] < b[s.key] ? -1 : a[s.key] > b[s.key] ? 1 : 0) * (s.down ? -1 : 1));
    let html = "<tr>" + cols.map(([k, label]) => '<th data-k="' + k + '">' + esc(label) + (s.key === k ? (s.down ? " ▼" : " ▲") : "") + "</th>").join("") + "</tr>";
    for (const r of rows) html += "<tr" + (r.implicit ? ' class="has-implicit"' : "") + ">" + cols.map(([k]) => "<td>" + (k.includes("bytes") ? MS.bytesText(r[k]) : esc(r[k])) + "</td>").join("") + "</tr>";
    $(id).innerHTML = '<table class="sortable">' + html + "</table>";
    for (const th of $(id).querySelectorAll("th"))
      th.onclick = () => { s.down = s.key === th.dataset.k ? !s.down : true; s.key = th.dataset.k; table(id, rows, cols, s); };
  }

  table("comm-table", commRows(A), [["axis", "axis"], ["phase", "phase"], ["collective", "collective"], ["count", "count"],
    ["bytes", "bytes per rank"], ["implicit", "implicit (planner's)"], ["implicit_bytes", "implicit bytes"]], state.sort);
  const every = A.events.filter((e) => e.k === "collective").slice(0, 3000).map((e) => ({
    seq: e.s, phase: e.p === "f" ? "forward" : "backward", collective: e.n, axis: e.x, bytes: e.b || 0, value: e.v, implicit: e.m ? "implicit" : "",
  }));
  table("comm-list", every, [["seq", "event"], ["phase", "phase"], ["collective", "collective"], ["axis", "axis"], ["bytes", "bytes"],
    ["value", "value"], ["implicit", "implicit"]], { key: "seq", down: false });

  // ---------------------------------------------------------------- two runs
  if (doc.diff) {
    const d = doc.diff;
    let html = h("h3", "", "A vs B: " + d.values.length + " values and " + d.collectives.length + " collectives differ");
    html += h("div", 'class="dim"', "A: " + esc(A.file) + " (" + esc(JSON.stringify(A.options)) + ")<br>B: " + esc(B.file) + " (" + esc(JSON.stringify(B.options)) + ")");
    html += '<table class="diff"><tr><th>value</th><th>what differs</th></tr>' + d.values.map((x) =>
      '<tr><td><a href="#" class="diff-value" data-v="' + esc(x.value) + '">' + esc(x.value) + "</a></td><td>" + esc(x.what.join("; ")) + "</td></tr>").join("") + "</table>";
    html += '<table class="diff"><tr><th>collective</th><th>A</th><th>B</th></tr>' + d.collectives.map((x) =>
      "<tr><td>" + esc(x.collective) + "</td><td>" + x.a + "</td><td>" + x.b + "</td></tr>").join("") + "</table>";
    $("diff-panel").innerHTML = html;
    for (const a of document.querySelectorAll(".diff-value")) a.onclick = (ev) => { ev.preventDefault(); goToValue(a.dataset.v); };
  }

  // ---------------------------------------------------------------- failure, and where the page opens
  const failure = A.failure || {};
  if (A.status === "fail" || A.status === "error") {
    const fd = failure.first_divergence;
    const mm = fd && fd.mismatch;
    let html = h("b", "", A.status === "error" ? "error" : "this run fails") + " ";
    if (failure.error) html += esc(failure.error.kind + ": " + failure.error.message);
    if (fd) html += esc(fd.message);
    if (mm && mm.max_abs)
      html += h("div", 'id="mismatch"', "at " + esc(MS.shapeText(mm.max_abs.index)) + ": expected " + h("b", "", esc(mm.max_abs.expected)) +
        ", actual " + h("b", "", esc(mm.max_abs.actual)) + " (difference " + esc(mm.max_abs.diff) + "); " + mm.mismatched + " of " + mm.total +
        " elements differ" + (mm.factor ? "; " + esc(mm.factor.direction) : "") + (mm.ranks ? " on ranks " + esc(mm.ranks.join(", ")) : ""));
    else if (failure.failures) html += h("div", "", failure.failures.map((f) => "✗ " + esc(f)).join("<br>"));
    $("failure").innerHTML = html;
    $("failure").className = "shown";
  }
  showGraph(-1);
  const fd = failure.first_divergence;
  let start = 0;
  if (fd) {
    const name = fd.gradient_of || fd.value;
    const phase = fd.phase === "backward" ? "b" : "f";
    const k = idx.steps.findIndex((e) => e.p === phase && e.v === name && (phase === "f" || e.k === "grad" || e.k === "input_grad"));
    if (k >= 0) start = k;
    if (name) selectValue(name);
  }
  setStep(start, true);
  document.body.dataset.ready = "1";
})();
