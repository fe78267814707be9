// meshsim explore, part 2 of 3: pictures drawn as SVG text: the mesh with what each rank holds or
// the groups a collective joins, and a tensor cut into the blocks its ranks hold.
"use strict";

const PIC = {};

PIC.esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);

const PALETTE = ["#1f78b4", "#33a02c", "#e31a1c", "#ff7f00", "#6a3d9a", "#b15928", "#a6cee3", "#b2df8a",
  "#fb9a99", "#fdbf6f", "#cab2d6", "#ffff99"];
PIC.color = (k) => PALETTE[k % PALETTE.length];

// The mesh as a grid: the last axis across, the others down (row-major). Large meshes show their
// first rows and say how many more. cell(rank) -> {fill, lines, title, strong}.
PIC.mesh = function (axes, meshShape, cell, maxRows) {
  const n = MS.rankCount(meshShape);
  const cols = meshShape.length ? meshShape[meshShape.length - 1] : 1;
  const rows = n / cols;
  const shownRows = Math.min(rows, maxRows || 16);
  const big = n <= 64;
  const w = big ? Math.max(52, Math.min(96, 560 / cols)) : Math.max(8, Math.min(24, 560 / cols));
  const h = big ? 40 : w;
  const left = 8, top = 18;
  let svg = "";
  for (let row = 0; row < shownRows; row++)
    for (let col = 0; col < cols; col++) {
      const r = row * cols + col;
      const c = cell(r);
      const x = left + col * w, y = top + row * h;
      svg += '<g class="rank" data-rank="' + r + '"><title>' + PIC.esc(c.title || "rank " + r) + "</title>";
      svg += '<rect x="' + x + '" y="' + y + '" width="' + (w - 2) + '" height="' + (h - 2) + '" rx="3" fill="' +
        (c.fill || "#f4f4f4") + '" stroke="' + (c.strong ? "#ff7f00" : "#999") + '" stroke-width="' +
        (c.strong ? 3 : 1) + '"/>';
      if (big)
        (c.lines || ["r" + r]).slice(0, 3).forEach((line, k) => {
          svg += '<text x="' + (x + 4) + '" y="' + (y + 12 + k * 11) + '" font-size="9.5">' + PIC.esc(line) + "</text>";
        });
      svg += "</g>";
    }
  const width = left * 2 + cols * w, height = top + shownRows * h + (shownRows < rows ? 16 : 4);
  let label = axes.map((a, i) => a + "=" + meshShape[i]).join(" × ");
  if (axes.length > 1) label += " (rows: " + axes.slice(0, -1).join(", ") + "; columns: " + axes[axes.length - 1] + ")";
  svg = '<text x="8" y="12" font-size="10" fill="#555">' + PIC.esc(label) + "</text>" + svg;
  if (shownRows < rows)
    svg += '<text x="8" y="' + (height - 4) + '" font-size="10" fill="#555">… ' + (rows - shownRows) * cols +
      " more ranks (rows " + shownRows + " to " + (rows - 1) + ") not drawn</text>";
  return '<svg class="mesh-svg" xmlns="http://www.w3.org/2000/svg" width="' + width + '" height="' + height +
    '" viewBox="0 0 ' + width + " " + height + '">' +
    svg + "</svg>";
};

// A tensor of `shape` cut into the blocks of `blocks` (MS.blocks): two of its dims drawn (the
// sharded ones first), each distinct block once, labelled with the ranks that hold it; the blocks
// of `focus` ranks filled.
PIC.tensor = function (shape, blocks, focus) {
  if (!shape || !blocks) return "";
  const dims = shape.map((_, d) => d);
  const sharded = dims.filter((d) => blocks.some((b) => b[d][1] !== shape[d]));
  const rest = dims.filter((d) => !sharded.includes(d));
  const show = sharded.concat(rest.reverse()).slice(0, 2).sort((a, b) => a - b);
  const rd = show.length === 2 ? show[0] : null, cd = show.length ? show[show.length - 1] : null;
  const R = rd === null ? 1 : shape[rd], C = cd === null ? 1 : shape[cd];
  const W = 300, H = Math.max(24, Math.min(200, (W * R) / Math.max(1, C)));
  const distinct = new Map();
  blocks.forEach((b, r) => {
    const key = show.map((d) => b[d].join(":")).join("|");
    if (!distinct.has(key)) distinct.set(key, { b, ranks: [] });
    distinct.get(key).ranks.push(r);
  });
  let svg = '<rect x="0.5" y="0.5" width="' + W + '" height="' + H + '" fill="#fff" stroke="#333"/>';
  let k = 0;
  for (const { b, ranks } of distinct.values()) {
    if (k++ > 256) break;
    const y = rd === null ? 0 : (b[rd][0] / R) * H, h = rd === null ? H : (b[rd][1] / R) * H;
    const x = cd === null ? 0 : (b[cd][0] / C) * W, w = cd === null ? W : (b[cd][1] / C) * W;
    const on = focus && ranks.some((r) => focus.includes(r));
    const names = ranks.length > 3 ? "r" + ranks[0] + "…+" + (ranks.length - 1) : ranks.map((r) => "r" + r).join(",");
    svg += '<g><title>' + PIC.esc("ranks " + ranks.join(", ") + ": " + show.map((d) => "dim " + d + " [" + b[d][0] +
      ", " + (b[d][0] + b[d][1]) + ")").join(", ")) + "</title>";
    svg += '<rect x="' + (x + 0.5) + '" y="' + (y + 0.5) + '" width="' + Math.max(0, w) + '" height="' + Math.max(0, h) +
      '" fill="' + (on ? "#fdb863" : PIC.color(k) + "33") + '" stroke="#555"/>';
    if (w > 30 && h > 11) svg += '<text x="' + (x + 3) + '" y="' + (y + 11) + '" font-size="9">' + PIC.esc(names) + "</text>";
    svg += "</g>";
  }
  const cap = "rows: dim " + (rd === null ? "-" : rd + " (" + R + ")") + ", columns: dim " + (cd === null ? "-" : cd + " (" + C + ")");
  return '<svg class="tensor-svg" xmlns="http://www.w3.org/2000/svg" width="' + (W + 2) + '" height="' + (H + 16) +
    '" viewBox="0 0 ' + (W + 2) + " " + (H + 16) + '">' +
    svg + '<text x="0" y="' + (H + 13) + '" font-size="9.5" fill="#555">' + PIC.esc(cap) + "</text></svg>";
};
