// meshsim explore, part 1 of 3: reading the model (traces/explore.h) and the semantics the page
// draws from it: placements, each rank's block of a sharded tensor, the groups of a collective.
// Written for meshsim; inlined into the page at build time (traces/explore/embed.cmake).
"use strict";

const MS = {};

// "[SS(0,2), S(0)]" -> ["SS(0,2)", "S(0)"]; an LTensor's "variant=[..] reduced=[..]" -> null.
MS.parseSpec = function (spec) {
  if (!spec || spec[0] !== "[") return null;
  const out = [];
  let depth = 0, cur = "";
  for (const c of spec.slice(1, -1)) {
    if (c === "(") depth++;
    if (c === ")") depth--;
    if (c === "," && depth === 0) { out.push(cur.trim()); cur = ""; } else cur += c;
  }
  if (cur.trim()) out.push(cur.trim());
  return out;
};

// The long form DTensor prints: S(0) -> Shard(dim=0).
MS.longPlacement = function (p) {
  let m;
  if (p === "R") return "Replicate()";
  if (p === "Rd") return "Reduced (replicated, gradient reduced)";
  if ((m = /^S\((-?\d+)\)$/.exec(p))) return "Shard(dim=" + m[1] + ")";
  if ((m = /^SS\((-?\d+),\s*(\d+)\)$/.exec(p))) return "_StridedShard(dim=" + m[1] + ", split_factor=" + m[2] + ")";
  if ((m = /^P\((\w+)\)$/.exec(p))) return "Partial(" + m[1] + ")";
  return p;
};

// [[count, shape], ...] -> one shape per rank.
MS.expandRuns = function (runs) {
  const out = [];
  for (const [n, shape] of runs || []) for (let k = 0; k < n; k++) out.push(shape);
  return out;
};

MS.numel = (shape) => (shape || []).reduce((a, b) => a * b, 1);
MS.shapeText = (shape) => "[" + (shape || []).join(", ") + "]";

// A rank's coordinates on the mesh, row-major as DeviceMesh numbers them.
MS.coords = function (rank, meshShape) {
  const c = new Array(meshShape.length);
  for (let i = meshShape.length - 1; i >= 0; i--) { c[i] = rank % meshShape[i]; rank = Math.floor(rank / meshShape[i]); }
  return c;
};

MS.rankCount = (meshShape) => meshShape.reduce((a, b) => a * b, 1);

// Each rank's block of a tensor: per dim [start, length], sharding dims over the mesh axes in order
// as torch.chunk does (chunks of ceil(n / k), the last ones shorter or empty). null where the
// placements are not all Shard / Replicate / Partial / Reduced (a strided shard, an LTensor), or
// where the blocks disagree with the local shapes the run recorded.
MS.blocks = function (spec, shape, meshShape, localShapes) {
  const ps = MS.parseSpec(spec);
  if (!ps || !shape) return null;
  const n = MS.rankCount(meshShape);
  const out = [];
  for (let r = 0; r < n; r++) {
    const c = MS.coords(r, meshShape);
    const block = shape.map((len) => [0, len]);
    for (let a = 0; a < ps.length; a++) {
      const m = /^S\((-?\d+)\)$/.exec(ps[a]);
      if (!m) {
        if (/^SS/.test(ps[a])) return null;
        continue;
      }
      let d = Number(m[1]);
      if (d < 0) d += shape.length;
      const [start, len] = block[d];
      const size = Math.ceil(len / meshShape[a]);
      const s = Math.min(len, c[a] * size);
      block[d] = [start + s, Math.max(0, Math.min(size, len - s))];
    }
    if (localShapes && localShapes[r] && localShapes[r].join() !== block.map((b) => b[1]).join()) return null;
    out.push(block);
  }
  return out;
};

// The global shape of a DTensor the run did not list (a value the runtime made for an operand,
// "y.arg1"), from its spec and each rank's local shape: along a dim sharded by some mesh axes, the
// sum of the locals of the ranks at coordinate 0 on every other axis (uneven chunks included).
MS.inferShape = function (spec, locals, meshShape) {
  const ps = MS.parseSpec(spec);
  if (!ps || !locals.length || ps.some((p) => /^SS/.test(p))) return null;
  const shape = locals[0].slice();
  const n = MS.rankCount(meshShape);
  for (let d = 0; d < shape.length; d++) {
    const axes = ps.map((p, a) => (new RegExp("^S\\((" + d + "|" + (d - shape.length) + ")\\)$").test(p) ? a : -1)).filter((a) => a >= 0);
    if (!axes.length) continue;
    let sum = 0;
    for (let r = 0; r < n; r++) {
      const c = MS.coords(r, meshShape);
      if (c.every((x, a) => axes.includes(a) || x === 0)) sum += locals[r][d];
    }
    shape[d] = sum;
  }
  return shape;
};

// The groups of a collective over `axis`: ranks that differ only in that axis's coordinate.
MS.groups = function (axis, axes, meshShape) {
  const a = axes.indexOf(axis);
  const n = MS.rankCount(meshShape);
  const byKey = new Map();
  for (let r = 0; r < n; r++) {
    const c = MS.coords(r, meshShape);
    if (a >= 0) c[a] = "*";
    const key = c.join(",");
    if (!byKey.has(key)) byKey.set(key, []);
    byKey.get(key).push(r);
  }
  return [...byKey.values()];
};

MS.bytesText = function (b) {
  if (b === undefined) return "";
  if (b < 1024) return b + " B";
  if (b < 1048576) return +(b / 1024).toFixed(1) + " KiB";
  return +(b / 1048576).toFixed(1) + " MiB";
};

// What a run's events index: the node each value is drawn as, the layer of each value, the steps.
MS.index = function (run) {
  const nodeOf = new Map(), layerOf = new Map();
  for (const e of run.events) {
    if (e.p !== "f" || !e.v) continue;
    if (e.k === "input") { nodeOf.set(e.v, "v:" + e.v); layerOf.set(e.v, e.g); }
    if (e.k === "op") { nodeOf.set(e.v, "e" + e.s); layerOf.set(e.v, e.g); }
  }
  const steps = run.events.filter((e) => e.k !== "input");
  return { nodeOf, layerOf, steps };
};

// The node a step lights up: a forward step its op's, a backward one that of the value whose
// gradient it makes.
MS.stepNode = function (idx, e) {
  return idx.nodeOf.get(e.v) || null;
};
