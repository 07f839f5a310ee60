
(function (root) {
  "use strict";
  if (!root || root.getAttribute("data-hsx-ready")) return;
  root.setAttribute("data-hsx-ready", "1");
  var data = JSON.parse(root.querySelector("script.hsx-data").textContent);
  var L = data.n_layers, H = data.n_heads, KV = data.n_kv_heads || H, S = data.scale;
  var G = KV > 0 && H % KV === 0 ? H / KV : 1;
  var W = data.windows || [];  // [layer] -> sliding window or null: query q sees keys k > q - window
  var app = root.querySelector(".hsx-app");
  var scoreNames = Object.keys(data.scores || {}), labelNames = Object.keys(data.labels || {});
  var st = {ex: 0, l: 0, h: 0, colour: "score:" + (data.default_score || scoreNames[0]), view: "heatmap",
            heads: [[0, 0]], combine: "mean", q: null, preview: null, shade: "attention"};
  var methods = [], taskNames = [];
  data.examples.forEach(function (e) {
    if (e.task && taskNames.indexOf(e.task) < 0) taskNames.push(e.task);
    Object.keys(e.attribution || {}).forEach(function (m) { if (methods.indexOf(m) < 0) methods.push(m); });
  });
  var cache = {};

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function svg(tag, attrs) {
    var e = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    return e;
  }
  // A token as shown: a space as "\u2423" (a byte-level BPE's " Sever" is "\u2423Sever", a lone space token
  // "\u2423", never a blank label), a newline as "\u21b5", a tab as "\u21e5" (review 10a B2).
  function visible(t) {  // tokens_view.visible_token: spaces, newlines, tabs, then any other control or zero-width mark
    return String(t).replace(/ /g, "\u2423").replace(/\n/g, "\u21b5").replace(/\t/g, "\u21e5").replace(
      /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u00ad\u200b-\u200f\u2028-\u202e\u2060-\u2064\ufeff]/g, function (c) {
        var code = c.charCodeAt(0), hex = code.toString(16);
        if (code === 0x0d) { return "\\r"; }
        return code < 0x100 ? "\\x" + ("0" + hex).slice(-2) : "\\u" + ("000" + hex).slice(-4);
      });
  }
  var shownTokens = data.examples.map(function (e) { return e.tokens.map(visible); });
  function tokens() { return shownTokens[st.ex]; }
  // review 11b C1: a several-token answer's pieces the prompt runs on with (teacher forcing) are marked
  var FORCED = "answer, teacher-forced";
  function forced(k) { var f = data.examples[st.ex].answer_from; return f != null && k >= f; }
  function markForced(node, k) {  // a token label of the answer's forced pieces: its style and tooltip line
    if (!forced(k)) return;
    node.classList.add("hsx-forced");
    if (k === data.examples[st.ex].answer_from) node.classList.add("hsx-forced-first");
    node.title = (node.title ? node.title + "\n" : "") + FORCED;
  }
  function pattern(ex, l, h) {  // [query][key] floats, zeros restored
    var key = ex + "/" + l + "/" + h;
    if (cache[key]) return cache[key];
    var rows = data.examples[ex].patterns[l][h], n = data.examples[ex].tokens.length, out = [];
    for (var q = 0; q < n; q++) {
      var r = rows[q] || [], row = new Array(n);
      for (var k = 0; k < n; k++) row[k] = k < r.length ? r[k] / S : 0;
      out.push(row);
    }
    return (cache[key] = out);
  }
  function windowOf(heads) {  // the sliding window every shown head's layer shares, else 0 (none, or mixed)
    var w = W[heads[0][0]] || 0;
    return heads.every(function (lh) { return (W[lh[0]] || 0) === w; }) ? w : 0;
  }
  // a cut example (review 14c C5) shows its first token and its end: shown index -> position in the prompt
  function posOf(ex) { return data.examples[ex].positions || null; }
  function at(i) { var ps = posOf(st.ex); return ps ? ps[i] : i; }
  function hidden(heads, q, k) {  // key k outside every shown head's window for query q: masked, not zero
    q = at(q); k = at(k);
    return heads.every(function (lh) { var w = W[lh[0]]; return !!w && k <= q - w; });
  }
  // mean over the queries that can see the first token of their weight on it; null where no shown query can (a cut
  // example whose kept queries all lie beyond the window, review 14cv C1): no measurement, not a sink of 0
  function sinkOver(p, w, ps) {
    var q0 = (!data.is_encoder && p.length > 1) ? 1 : 0, s = 0, c = 0;
    for (var q = 0; q < p.length; q++) {
      var pos = ps ? ps[q] : q;
      if (pos >= q0 && (!w || pos < w)) { s += p[q][0]; c++; }
    }
    return c ? s / c : null;
  }
  var NO_SINK = "no shown query can see the first token";
  // review 19b A2: a model with a learned sink logit per head (GPT-OSS) gives part of each row to it; the first
  // token is then not "the sink", and each row's weights over the keys sum to less than 1
  var FIRST = data.learned_sinks ? "first token (not the model's learned sink)" : "sink";
  function learnedShare(p) {  // mean over the queries of 1 - the row's sum over the keys: the learned sink's share
    var s = 0;
    for (var q = 0; q < p.length; q++) { var r = 0; for (var k = 0; k < p[q].length; k++) r += p[q][k]; s += 1 - r; }
    return p.length ? s / p.length : null;
  }
  function sink(ex, l, h) { return sinkOver(pattern(ex, l, h), W[l] || 0, posOf(ex)); }
  function fmt(v) { return v.toFixed(4); }
  function q_(toks, i) { return "\u201c" + toks[i] + "\u201d (" + at(i) + ")"; }  // a token, quoted, and its position
  function short(v) {
    if (v === null || v === undefined) return "";
    var a = Math.abs(v);
    return a >= 100 ? v.toFixed(0) : a >= 10 ? v.toFixed(1) : a >= 0.01 || a === 0 ? v.toFixed(2) : v.toExponential(0);
  }
  // a head grid's cell labels, one format for the whole grid (review 13c B2: one significant digit made 41 of 72
  // MiniLM cells read "1e-3" or "2e-3"): grids whose largest |value| is under 0.1 or from 1000 up are written in
  // units of a power of ten the legend names ("x 1e-3"); decimals give the largest 3 significant digits, one more
  // where that still writes two different values alike (a label fits 6 characters)
  function gridFormat(g) {
    var vals = [], m = 0;
    g.forEach(function (r) { r.forEach(function (v) { if (v !== null) { vals.push(v); m = Math.max(m, Math.abs(v)); } }); });
    var e = m > 0 && (m < 0.1 || m >= 1000) ? Math.floor(Math.log10(m)) : 0, u = Math.pow(10, e);
    var lead = m > 0 ? Math.floor(Math.log10(m / u) + 1e-9) : 0, d = Math.max(0, 2 - lead);
    var count = function (f) { var seen = {}, n = 0; vals.forEach(function (v) { var k = f(v); if (!seen[k]) { seen[k] = 1; n++; } }); return n; };
    var distinct = count(function (v) { return v; });
    if (count(function (v) { return (v / u).toFixed(d); }) < distinct && d < 3) d += 1;
    return {text: function (v) { return v === null ? "" : (v / u).toFixed(d); }, unit: e ? " (\u00d7 1e" + e + ")" : ""};
  }
  function kvOf(h) { return Math.floor(h / G); }
  function headName(l, h) { return "L" + l + " H" + h + (G > 1 ? " (kv" + kvOf(h) + ")" : ""); }
  var PALETTE = ["#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d", "#1f78b4", "#b2df8a", "#fb9a99"];
  var SEQ = __SEQ__;  // the sequential scale's dark end: the figures' Reds at 1 (white at 0); explorer_view.SEQ_END
  function seq(v) {  // attention weight 0..1 -> white .. dark red (the figures' sequential Reds, linear in RGB)
    v = Math.max(0, Math.min(1, v));
    return "rgb(" + SEQ.map(function (x) { return Math.round(255 + (x - 255) * v); }).join(",") + ")";
  }
  function combined(ex, heads, how) {  // several heads' patterns, averaged or their elementwise max
    var ps = heads.map(function (lh) { return pattern(ex, lh[0], lh[1]); }), n = ps[0].length, out = [];
    for (var q = 0; q < n; q++) {
      var row = new Array(n);
      for (var k = 0; k < n; k++) {
        var acc = 0;
        for (var i = 0; i < ps.length; i++) acc = how === "max" ? Math.max(acc, ps[i][q][k]) : acc + ps[i][q][k];
        row[k] = how === "max" ? acc : acc / ps.length;
      }
      out.push(row);
    }
    return out;
  }
  function shown() {  // {p: [query][key], heads: [[l, h]], preview: bool} of what the main view shows
    if (st.preview) return {p: pattern(st.ex, st.preview[0], st.preview[1]), heads: [st.preview], preview: true};
    if (st.heads.length > 1) return {p: combined(st.ex, st.heads, st.combine), heads: st.heads, preview: false};
    return {p: pattern(st.ex, st.l, st.h), heads: [[st.l, st.h]], preview: false};
  }
  function sinkOf(p) { return sinkOver(p, windowOf(cur.heads), posOf(st.ex)); }
  var RED = [178, 24, 43], BLUE = [33, 102, 172];  // the figures' RdBu_r ends: red positive, blue negative
  function toward(c, t) {  // white (t = 0) -> colour c (t = 1)
    t = Math.max(0, Math.min(1, t));
    return "rgb(" + c.map(function (x) { return Math.round(255 + (x - 255) * t); }).join(",") + ")";
  }
  function faint(css) {  // a colour muted: 60% towards its grey, then 60% towards white
    var c = /^rgb/.test(css) ? css.match(/\d+/g).map(Number) : null;
    if (!c) return css;
    var grey = (c[0] + c[1] + c[2]) / 3;
    return "rgb(" + c.slice(0, 3).map(function (x) {
      return Math.round(0.4 * (0.4 * x + 0.6 * grey) + 0.6 * 245);
    }).join(",") + ")";
  }
  function colouring() {  // {colour(l, h) -> [background, text colour], value(l, h) -> text, legend element}
    var kind = st.colour.split(":")[0], name = st.colour.slice(kind.length + 1), legend = el("div", "hsx-legend");
    if (kind === "label") {
      var grid = data.labels[name], cats = [];
      grid.forEach(function (r) { r.forEach(function (v) { if (cats.indexOf(v) < 0) cats.push(v); }); });
      cats.sort();
      var colourOf = function (v) { return v === "" || v === "other" ? "#eeeeee" : PALETTE[cats.indexOf(v) % PALETTE.length]; };
      cats.forEach(function (c) {
        var item = el("span"), chip = el("span", "hsx-chip");
        chip.style.background = colourOf(c);
        item.appendChild(chip); item.appendChild(document.createTextNode(c === "" ? "(none)" : c)); legend.appendChild(item);
      });
      return {colour: function (l, h) { return [colourOf(grid[l][h]), "#000"]; },
              value: function (l, h) { return grid[l][h]; }, text: function () { return ""; }, legend: legend};
    }
    var g = data.scores[name], lo = Infinity, hi = -Infinity;
    g.forEach(function (r) { r.forEach(function (v) { if (v !== null) { lo = Math.min(lo, v); hi = Math.max(hi, v); } }); });
    // the figures' convention: a score with a value below 0 is signed, diverging about 0 (blue, white, red,
    // -m..m); an unsigned one is sequential from 0 (white at 0 to red at its max), never stretched min..max
    var signed = lo < 0, m = Math.max(Math.abs(lo), Math.abs(hi)) || 1;
    var floor = (data.floors || {})[name] || 0;  // the heads figure's rounding floor: cells within it read "≈0"
    var within = function (v) { return floor > 0 && v !== null && Math.abs(v) < floor; };
    var colour = function (l, h) {
      var v = g[l][h];
      if (v === null) return ["#f0f0f0", "#999"];
      if (within(v)) return ["#e6e6e6", "#777"];
      var t = Math.abs(v) / m;
      return [toward(v < 0 ? BLUE : RED, t), t > 0.6 ? "#fff" : "#000"];
    };
    var ramp = el("span", "hsx-ramp");
    ramp.style.background = signed ? "linear-gradient(90deg," + toward(BLUE, 1) + ",#fff," + toward(RED, 1) + ")"
                                    : "linear-gradient(90deg,#fff," + toward(RED, 1) + ")";
    var cellf = gridFormat(g);  // cell labels and the legend's ends, in one unit
    legend.appendChild(el("span", null, name + cellf.unit + ":"));  // the ends in the cells' units
    var ends = el("span", "hsx-ends");  // the bar and its two ends never wrap apart (review 14c C6)
    ends.appendChild(el("span", "hsx-lo", cellf.text(signed ? -m : 0)));
    ends.appendChild(ramp);
    ends.appendChild(el("span", "hsx-hi", cellf.text(m)));
    legend.appendChild(ends);
    if (floor > 0) legend.appendChild(el("span", "hsx-floor", "grey \u22480: within the rounding floor " +
                                         floor.toPrecision(2)));
    var why = (data.muted || {})[name] || null;  // a score the report says is noise: drawn faint and grey
    if (why) legend.classList.add("hsx-muted");
    // a score from a section whose chance verdict is undetermined: in colour, with the finding's caveat above the grid
    var caveat = why ? null : (data.caveats || {})[name] || null;
    return {colour: why ? function (l, h) { return [faint(colour(l, h)[0]), "#777"]; } : colour,
            value: function (l, h) { return g[l][h]; },
            text: function (l, h) { return within(g[l][h]) ? "\u22480" : cellf.text(g[l][h]); },
            legend: legend, muted: why, caveat: caveat};
  }

  // ---- layout ----
  app.appendChild(el("p", "hsx-help", "Click a head or its thumbnail (or focus the grid and use the arrow keys) to see its " +
    "attention pattern; hover a thumbnail to preview it; shift+click heads to overlay several. " +
    "Hover a token: its row shows where it attends, its column what attends to it. Click a query token to pin it: " +
    "the tokens above are then shaded by its attention weights. Orange bars: attention on the first token" +
    (data.learned_sinks ? " (not the model's learned sink, whose share of each row is the weight missing from it). "
                        : " (the sink). ") +
    "A link ending in #L1H3 opens layer 1, head 3; head names in the findings open on the prompt of their section's task."));
  var controls = el("div", "hsx-controls");
  function select(labelText, options, value, onchange) {
    var label = el("label", null, labelText), s = el("select");
    options.forEach(function (o) { var opt = el("option", null, o[1]); opt.value = o[0]; s.appendChild(opt); });
    s.value = value;
    s.addEventListener("change", function () { onchange(s.value); });
    label.appendChild(s); controls.appendChild(label);
    return s;
  }
  var exSelect = select("example", data.examples.map(function (e, i) {
    // the prompt as text (its tokens decoded), not its pieces joined by spaces; older data: the pieces
    var text = e.text != null ? e.text : e.tokens.join(" "), of = e.sample_of || [];
    if (e.answer_from != null && e.prompt_text != null) {  // where the prompt ends: its end, then the forced pieces
      var p = e.prompt_text;
      text = (p.length > 45 ? "\u2026" + p.slice(-45) : p) + " \u2016 " + e.answer_text + " (" + FORCED + ")";
    }
    return [String(i), (taskNames.length > 1 ? "[" + e.task + "] " : "") + (i + 1) + ": " +
                       (!of.length ? "" : of.length === (e.sections || []).length ? "(sample) " :
                        "(sample of " + of.join(", ") + ") ") +
                       (text.length > 60 && e.answer_from == null ? text.slice(0, 60) + "\u2026" : text)];
  }), "0", function (v) { showExample(+v); drawHead(); });
  select("colour heads by", scoreNames.map(function (n) { return ["score:" + n, n]; })
    .concat(labelNames.map(function (n) { return ["label:" + n, n]; })), st.colour, function (v) { st.colour = v; drawGrid(); });
  select("view", [["heatmap", "heatmap (query x key)"], ["lines", "lines (query \u2192 key)"]], st.view,
    function (v) { st.view = v; drawHead(); });
  select("overlaid heads", [["mean", "mean of their patterns"], ["max", "max of their patterns"]], st.combine,
    function (v) { st.combine = v; drawHead(); });
  if (methods.length) select("shade tokens by", [["attention", "attention from the pinned query"]].concat(
    methods.map(function (m) { return [m, "attribution: " + m]; })), st.shade, function (v) { st.shade = v; clearMarks(); });
  var clearBtn = el("button", "hsx-clear", "one head only");
  clearBtn.type = "button";
  clearBtn.addEventListener("click", function () { selectHead(st.l, st.h, false); });
  controls.appendChild(clearBtn);
  app.appendChild(controls);
  var main = el("div", "hsx-main"), left = el("div", "hsx-left"), right = el("div", "hsx-right");
  main.appendChild(left); main.appendChild(right); app.appendChild(main);

  // ---- grid ----
  function layerHeadTable(cls, corner, makeCell) {  // layers x heads: a header row h0.., a row L0.. per layer
    var t = el("table", cls), head = el("thead"), body = el("tbody"), hr = el("tr"), kept = [];
    hr.appendChild(el("th", null, corner));
    for (var h = 0; h < H; h++) hr.appendChild(el("th", null, "h" + h));
    head.appendChild(hr);
    for (var l = 0; l < L; l++) {
      var tr = el("tr"), row = [];
      tr.appendChild(el("th", null, "L" + l));
      for (h = 0; h < H; h++) {
        var made = makeCell(l, h);  // [the cell, the element kept for it]
        tr.appendChild(made[0]); row.push(made[1]);
      }
      body.appendChild(tr); kept.push(row);
    }
    t.appendChild(head); t.appendChild(body);
    return {table: t, head: head, cells: kept};
  }
  var gridT = layerHeadTable("hsx-grid", "layer", function (l, h) {
    var td = el("td", G > 1 && h > 0 && h % G === 0 ? "hsx-kvstart" : "");
    td.setAttribute("role", "gridcell");
    td.setAttribute("data-layer", l); td.setAttribute("data-head", h);
    td.tabIndex = -1;
    td.appendChild(el("span", "hsx-v"));
    var bar = el("span", "hsx-sink"); bar.appendChild(el("span")); td.appendChild(bar);
    return [td, td];
  });
  var grid = gridT.table, cells = gridT.cells;
  grid.setAttribute("role", "grid");
  grid.setAttribute("aria-label", "attention heads: layers by heads");
  if (G > 1) {
    var kvRow = el("tr");
    kvRow.appendChild(el("th"));
    for (var g = 0; g < KV; g++) {
      var th = el("th", "hsx-kv", "kv" + g);
      th.colSpan = G;
      th.title = "heads " + (g * G) + "\u2013" + (g * G + G - 1) + " share KV head " + g;
      kvRow.appendChild(th);
    }
    gridT.head.insertBefore(kvRow, gridT.head.firstChild);
  }
  var mutedNote = el("div", "hsx-mutednote");  // why the grid is muted (a score within noise), else hidden
  mutedNote.hidden = true;
  var caveatNote = el("div", "hsx-caveat");  // the section's caveat (chance undetermined), else hidden
  caveatNote.hidden = true;
  left.appendChild(mutedNote); left.appendChild(caveatNote); left.appendChild(grid);
  var legendBox = el("div"); left.appendChild(legendBox);
  if (G > 1 && data.kv_note) left.appendChild(el("div", "hsx-note", data.kv_note));  // explorer.kv_note's words

  // ---- thumbnails: every head's pattern on the chosen example ----
  var thumbBox = el("div", "hsx-thumbs");
  thumbBox.appendChild(el("div", "hsx-note", "Every head's pattern (rows: queries, columns: keys; same colour scale " +
    "as the main view). Click to open, hover to preview, shift+click to overlay."));
  var thumbsT = layerHeadTable(null, null, function (l, h) {
    var tcell = el("td"), cv = el("canvas", "hsx-thumb");
    cv.setAttribute("data-layer", l); cv.setAttribute("data-head", h);
    cv.title = headName(l, h);
    tcell.appendChild(cv);
    return [tcell, cv];
  });
  var tt = thumbsT.table, thumbs = thumbsT.cells;
  thumbBox.appendChild(tt); left.appendChild(thumbBox);
  function drawThumbs() {
    var n = tokens().length;
    for (var l = 0; l < L; l++) for (var h = 0; h < H; h++) {
      var cv = thumbs[l][h], p = pattern(st.ex, l, h);
      cv.width = n; cv.height = n;
      var ctx = cv.getContext("2d"), img = ctx.createImageData(n, n);
      for (var q = 0; q < n; q++) for (var k = 0; k < n; k++) {
        var v = Math.max(0, Math.min(1, p[q][k])), o = 4 * (q * n + k);
        for (var c = 0; c < 3; c++) img.data[o + c] = Math.round(255 + (SEQ[c] - 255) * v);  // as seq(v)
        img.data[o + 3] = 255;
      }
      ctx.putImageData(img, 0, 0);
    }
  }
  function markThumbs() {
    for (var l = 0; l < L; l++) for (var h = 0; h < H; h++) {
      thumbs[l][h].classList.toggle("hsx-sel", l === st.l && h === st.h);
      thumbs[l][h].classList.toggle("hsx-in", st.heads.length > 1 && inHeads(l, h) >= 0);
    }
  }
  tt.addEventListener("click", function (e) {
    var cv = e.target.closest("canvas[data-layer]");
    if (!cv) return;
    selectHead(+cv.getAttribute("data-layer"), +cv.getAttribute("data-head"), false, e.shiftKey || e.ctrlKey || e.metaKey);
  });
  // a link opens its head and scrolls here, which moves thumbnails under a pointer that did not move; the browser
  // then reports a mouseover there, and the preview would replace the linked head: no preview until the pointer moves
  var pointer = null;
  ["mousemove", "click"].forEach(function (t) {
    document.addEventListener(t, function (e) { pointer = [e.clientX, e.clientY]; }, true);
  });
  tt.addEventListener("mouseover", function (e) {
    var cv = e.target.closest("canvas[data-layer]");
    if (!cv) return;
    if (st.still && e.clientX === st.still[0] && e.clientY === st.still[1]) return;
    st.still = null;
    var lh = [+cv.getAttribute("data-layer"), +cv.getAttribute("data-head")];
    if (st.preview ? st.preview[0] === lh[0] && st.preview[1] === lh[1]
                   : st.heads.length === 1 && lh[0] === st.l && lh[1] === st.h) return;
    st.preview = lh; drawHead();
  });
  tt.addEventListener("mouseleave", function () { if (st.preview) { st.preview = null; drawHead(); } });

  function drawGrid() {
    var c = colouring();
    for (var l = 0; l < L; l++) for (var h = 0; h < H; h++) {
      var td = cells[l][h], col = c.colour(l, h), s = sink(st.ex, l, h), v = c.value(l, h);
      td.style.background = col[0]; td.style.color = col[1];
      td.firstChild.textContent = c.text(l, h);
      td.lastChild.style.display = s === null ? "none" : "";  // no bar where nothing was measured
      td.lastChild.firstChild.style.width = s === null ? "0" : (100 * s).toFixed(1) + "%";
      td.title = headName(l, h) + "\n" + st.colour.replace(/^[a-z]+:/, "") + ": " +
        (v === null ? "n/a" : typeof v === "number" ? v.toPrecision(4) : v) +
        "\n" + FIRST + " (attention on the first token): " + (s === null ? NO_SINK : s.toFixed(3));
      td.setAttribute("aria-label", td.title.replace(/\n/g, ", "));
      td.classList.toggle("hsx-sel", inHeads(l, h) >= 0);
      td.setAttribute("aria-selected", l === st.l && h === st.h ? "true" : "false");
      td.tabIndex = l === st.l && h === st.h ? 0 : -1;
    }
    legendBox.textContent = "";
    legendBox.appendChild(c.legend);
    grid.classList.toggle("hsx-muted", !!c.muted);
    mutedNote.hidden = !c.muted;
    mutedNote.textContent = c.muted ? "Muted: " + c.muted : "";
    caveatNote.hidden = !c.caveat;
    caveatNote.textContent = c.caveat || "";
  }
  function inHeads(l, h) {
    for (var i = 0; i < st.heads.length; i++) if (st.heads[i][0] === l && st.heads[i][1] === h) return i;
    return -1;
  }
  function selectHead(l, h, focus, add) {  // add: toggle the head in the overlaid set (shift+click)
    l = Math.max(0, Math.min(L - 1, l)); h = Math.max(0, Math.min(H - 1, h));
    if (add) {
      var i = inHeads(l, h);
      if (i >= 0 && st.heads.length > 1) {
        st.heads.splice(i, 1);
        if (l === st.l && h === st.h) { l = st.heads[st.heads.length - 1][0]; h = st.heads[st.heads.length - 1][1]; }
      } else if (i < 0) st.heads.push([l, h]);
    } else st.heads = [[l, h]];
    st.l = l; st.h = h; st.preview = null;
    root.setAttribute("data-layer", st.l); root.setAttribute("data-head", st.h);
    drawGrid(); markThumbs(); drawHead();
    if (focus) cells[st.l][st.h].focus();
  }
  grid.addEventListener("click", function (e) {
    var td = e.target.closest("td[data-layer]");
    if (td) selectHead(+td.getAttribute("data-layer"), +td.getAttribute("data-head"), true, e.shiftKey || e.ctrlKey || e.metaKey);
  });
  grid.addEventListener("keydown", function (e) {
    var moves = {ArrowLeft: [0, -1], ArrowRight: [0, 1], ArrowUp: [-1, 0], ArrowDown: [1, 0]};
    var td = e.target.closest("td[data-layer]");
    var l = td ? +td.getAttribute("data-layer") : st.l, h = td ? +td.getAttribute("data-head") : st.h;
    if (moves[e.key]) { selectHead(l + moves[e.key][0], h + moves[e.key][1], true); e.preventDefault(); }
    else if (e.key === "Home") { selectHead(l, 0, true); e.preventDefault(); }
    else if (e.key === "End") { selectHead(l, H - 1, true); e.preventDefault(); }
    else if (e.key === "Enter" || e.key === " ") { selectHead(l, h, true); e.preventDefault(); }
  });

  // ---- the selected head ----
  var windowLine = el("div", "hsx-windowline"), forcedLine = el("div", "hsx-forcedline");
  var title = el("div", "hsx-title"), sinkLine = el("div", "hsx-sinkline"), strip = el("div", "hsx-tokens"),
      info = el("div", "hsx-info"), view = el("div", "hsx-view"), scale = el("div", "hsx-scale");
  scale.setAttribute("data-min", "0"); scale.setAttribute("data-max", "1");
  scale.appendChild(el("span", null, "attention weight:"));
  scale.appendChild(el("span", null, "0"));
  var sramp = el("span", "hsx-ramp"); sramp.style.background = "linear-gradient(90deg," + seq(0) + "," + seq(1) + ")";
  scale.appendChild(sramp);
  scale.appendChild(el("span", null, "1"));
  scale.appendChild(el("span", "hsx-note", __SCALE_NOTE__));  // explorer_view.SCALE_NOTE
  [title, sinkLine, windowLine, scale, forcedLine, strip, info, view].forEach(function (e) { right.appendChild(e); });
  var hl = {rows: [], cols: [], toks: [], texts: []}, marks = [], cur = null;

  function clearMarks() {
    marks.forEach(function (e) { e.classList.remove("hsx-hl"); e.classList.remove("hsx-on"); });
    marks = [];
    hl.toks.forEach(function (t) {
      t.style.background = ""; t.style.color = ""; t.style.borderBottomColor = "transparent"; t.removeAttribute("data-w");
      t.removeAttribute("data-a");
    });
    if (hl.lines) hl.lines.forEach(function (ln) { ln.el.style.display = ""; });
    info.textContent = "";
    paintStrip();
  }
  function paintStrip() {  // the tokens' shading: an attribution method's scores, else the pinned query's weights
    var scores = st.shade !== "attention" && (data.examples[st.ex].attribution || {})[st.shade];
    if (scores) paintAttribution(scores); else if (st.q !== null) paintQuery();
  }
  function paintAttribution(scores) {  // signed: red positive, blue negative, white 0; scaled by the largest |score|
    var m = 0, toks = tokens();
    scores.forEach(function (v) { m = Math.max(m, Math.abs(v)); });
    for (var k = 0; k < toks.length; k++) {
      var t = m > 0 ? Math.abs(scores[k]) / m : 0, c = scores[k] > 0 ? [178, 24, 43] : [33, 102, 172];
      hl.toks[k].style.background = "rgb(" + c.map(function (x) { return Math.round(255 + (x - 255) * t); }).join(",") + ")";
      hl.toks[k].style.color = t > 0.6 ? "#fff" : "";
      hl.toks[k].setAttribute("data-a", String(scores[k]));
    }
    info.textContent = "Tokens shaded by " + st.shade + " attribution (the attribution analysis's scores for this " +
      "example): red positive, blue negative, white 0; full colour at \u00b1" + short(m) + "." +
      (data.attribution_caveat ? " " + data.attribution_caveat : "");
  }
  function paintQuery() {  // the pinned query's attention weights as the key tokens' background
    var p = cur.p, toks = tokens(), i = st.q;
    if (i === null || i >= toks.length) return;
    for (var k = 0; k < toks.length; k++) {
      hl.toks[k].style.background = seq(p[i][k]);
      hl.toks[k].style.color = p[i][k] > 0.5 ? "#fff" : "";
      hl.toks[k].setAttribute("data-w", fmt(p[i][k]));
      hl.toks[k].classList.toggle("hsx-pin", k === i);
    }
    info.textContent = "Pinned query " + q_(toks, i) + ": each token shaded by the attention weight it gets from it " +
      "(click the query again to unpin).";
  }
  function pinQuery(i) {
    st.q = st.q === i ? null : i;
    hl.toks.forEach(function (t) { t.classList.remove("hsx-pin"); });
    clearMarks();
  }
  function mark(e, cls) { if (e) { e.classList.add(cls || "hsx-hl"); marks.push(e); } }
  function focusToken(i, j) {  // row i (where token i attends), column j (what attends to token j)
    clearMarks();
    var p = cur.p, toks = tokens(), n = toks.length;
    if (j === undefined) j = i;
    (hl.rows[i] || []).forEach(function (c) { mark(c); });
    for (var q = 0; q < n; q++) mark(hl.rows[q] && hl.rows[q][j]);
    mark(hl.qHead[i]); mark(hl.kHead[j]);
    mark(hl.toks[i], "hsx-on");
    for (var k = 0; k < n; k++) {
      hl.toks[k].style.background = seq(p[i][k]);
      hl.toks[k].setAttribute("data-w", fmt(p[i][k]));
      hl.toks[k].style.color = p[i][k] > 0.5 ? "#fff" : "";
      hl.toks[k].style.borderBottomColor = "rgba(217,95,2," + p[k][j].toFixed(3) + ")";
    }
    if (hl.lines) hl.lines.forEach(function (ln) { ln.el.style.display = (ln.q === i || ln.k === j) ? "" : "none"; });
    if (hl.texts.length) { mark(hl.texts[0][i]); mark(hl.texts[1][j]); }
    var best = 0, by = j < n - 1 ? j + 1 : j;
    for (k = 0; k < n; k++) if (p[i][k] > p[i][best]) best = k;
    for (q = 0; q < n; q++) if (p[q][j] > p[by][j] && q !== j) by = q;
    info.textContent = q_(toks, i) + " attends most to " + q_(toks, best) + " (" + fmt(p[i][best]) + ")" +
      (by !== j ? "; " + q_(toks, j) + " is attended most by " + q_(toks, by) + " (" + fmt(p[by][j]) + ")" : "");
  }
  function drawHead() {
    cur = shown();
    var p = cur.p, toks = tokens(), n = toks.length, ex = data.examples[st.ex];
    var one = cur.heads.length === 1, l0 = cur.heads[0][0], h0 = cur.heads[0][1];
    var of = ex.sample_of || [];
    var tail = " \u00b7 example " + (st.ex + 1) + (taskNames.length > 1 ? " of " + ex.task : "") +
      (of.length ? ", the sample prompt of " + of.join(", ") : "") +
      (!ex.truncated ? "" : ex.cut ? " (" + n + " of " + ex.n_tokens_total + " tokens: the first and the last " + (n - 1) +
       "; positions " + ex.cut[0] + "\u2013" + ex.cut[1] + " cut, a query's weights on them not drawn)"
       : " (first " + n + " of " + ex.n_tokens_total + " tokens)");
    title.textContent = one ? (cur.preview ? "Preview: " : "") + "Layer " + l0 + ", head " + h0 +
      (G > 1 ? " \u00b7 KV head " + kvOf(h0) + " (shared by heads " + (kvOf(h0) * G) + "\u2013" +
               (kvOf(h0) * G + G - 1) + ")" : "") + tail
      : (st.combine === "max" ? "Max" : "Mean") + " of " + cur.heads.length + " heads' patterns: " +
        cur.heads.map(function (lh) { return "L" + lh[0] + "H" + lh[1]; }).join(", ") + tail;
    if (one && !cur.preview) {
      var hash = "#L" + l0 + "H" + h0 + (of.length ? "@" + of[0] : "");
      var a = el("a", "hsx-link", "link to this head"); a.href = hash;
      a.title = "a link to report.html ending in " + hash + " opens this head" + (of.length ? " on this prompt" : "");
      title.appendChild(a);
    }
    root.setAttribute("data-shown", cur.heads.map(function (lh) { return "L" + lh[0] + "H" + lh[1]; }).join(","));
    var s = sinkOf(p);
    sinkLine.textContent = "";
    var win = windowOf(cur.heads);
    if (s === null) {
      sinkLine.appendChild(el("span", null, FIRST + ": attention on the first token: " + NO_SINK +
                              " (every shown query lies beyond the window), so none is measured"));
    } else {
      sinkLine.appendChild(el("span", null, FIRST + ": attention on the first token, mean over " +
                              (win ? "the queries that can see it" : "queries")));
      var bar = el("span", "hsx-bar"), fill = el("span"); fill.style.width = (100 * s).toFixed(1) + "%";
      bar.appendChild(fill); sinkLine.appendChild(bar); sinkLine.appendChild(el("span", "hsx-sinkvalue", s.toFixed(3)));
    }
    if (data.learned_sinks && p.length && !data.examples[st.ex].cut) {  // a cut example's rows miss the cut keys
      sinkLine.appendChild(el("span", null, "; learned sink: share of each row, mean over queries " +
                              learnedShare(p).toFixed(3)));
    }
    var slides = {};
    cur.heads.forEach(function (lh) { if (W[lh[0]]) slides[lh[0]] = W[lh[0]]; });
    var said = Object.keys(slides).map(function (l) { return "layer " + l + " attends over a sliding window of " +
                                                     slides[l] + " keys"; });
    windowLine.textContent = said.length ? said.join("; ") + ": " + __HATCHED__ : "";  // explorer_view.window_words
    windowLine.style.display = said.length ? "" : "none";
    var from = ex.answer_from;
    forcedLine.textContent = "";
    if (from != null) {
      var chip = el("span", "hsx-tok hsx-forced", "\u2026");
      forcedLine.appendChild(chip);
      forcedLine.appendChild(el("span", null, " " + FORCED + ": the prompt ends before position " + from +
                                "; from there on it runs on with the answer's first tokens, which the model is scored on"));
    }
    forcedLine.style.display = from != null ? "" : "none";
    strip.textContent = ""; hl.toks = [];
    toks.forEach(function (t, i) {
      if (i === 1 && ex.cut) {  // the cut positions, between the first token and the end
        var gap = el("span", "hsx-gap", "\u2026"); gap.title = "positions " + ex.cut[0] + "\u2013" + ex.cut[1] + " cut";
        strip.appendChild(gap);
      }
      var span = el("span", "hsx-tok", t); span.title = "position " + at(i);
      markForced(span, i);
      span.addEventListener("mouseenter", function () { focusToken(i); });
      span.addEventListener("click", function () { pinQuery(i); });
      span.style.cursor = "pointer";
      strip.appendChild(span); hl.toks.push(span);
    });
    strip.onmouseleave = clearMarks;
    view.textContent = ""; hl.rows = []; hl.qHead = []; hl.kHead = []; hl.texts = []; hl.lines = null; marks = [];
    if (st.view === "lines") drawLines(p, toks, n); else drawHeat(p, toks, n);
    info.textContent = "";
    paintStrip();
  }
  function drawHeat(p, toks, n) {
    var t = el("table", "hsx-heat"), head = el("thead"), hr = el("tr"), body = el("tbody");
    t.setAttribute("data-layer", cur.heads[0][0]); t.setAttribute("data-head", cur.heads[0][1]);
    t.setAttribute("data-example", st.ex);
    var corner = el("th", "hsx-corner"); hr.appendChild(corner);
    corner.appendChild(el("span", null, "keys \u2192")); corner.appendChild(el("span", null, "queries \u2193"));
    toks.forEach(function (tok, k) {
      var th = el("th", "hsx-key"); th.setAttribute("data-k", k); th.title = "key " + at(k) + ": " + tok;
      markForced(th, k);
      th.appendChild(el("span", null, tok));  // upright in a horizontal cell, which grows to the whole token
      th.addEventListener("mouseenter", function () { focusToken(k); });
      hr.appendChild(th); hl.kHead.push(th);
    });
    head.appendChild(hr);
    for (var q = 0; q < n; q++) {
      var tr = el("tr"), qh = el("th", null, toks[q]), row = [];
      qh.setAttribute("data-q", q); qh.title = "query " + at(q) + ": " + toks[q];
      markForced(qh, q);
      (function (q) {
        qh.addEventListener("mouseenter", function () { focusToken(q); });
        qh.addEventListener("click", function () { pinQuery(q); });
      })(q);
      tr.appendChild(qh); hl.qHead.push(qh);
      for (var k = 0; k < n; k++) {
        var v = p[q][k], td = el("td"), masked = hidden(cur.heads, q, k);
        td.style.background = seq(v);
        td.setAttribute("data-q", q); td.setAttribute("data-k", k); td.setAttribute("data-v", fmt(v));
        td.title = toks[q] + " \u2192 " + toks[k] + ": " + (masked ? __MASKED__ : fmt(v));
        if (masked) { td.className = "hsx-masked"; td.style.background = ""; }
        tr.appendChild(td); row.push(td);
      }
      body.appendChild(tr); hl.rows.push(row);
    }
    body.addEventListener("mouseover", function (e) {
      var td = e.target.closest("td[data-q]");
      if (td) focusToken(+td.getAttribute("data-q"), +td.getAttribute("data-k"));
    });
    t.addEventListener("mouseleave", clearMarks);
    t.appendChild(head); t.appendChild(body); view.appendChild(t);
  }
  var measure = document.createElement("canvas").getContext("2d");
  function textWidth(t) {  // px of a token in the lines view's font (its labels are laid out to fit whole)
    measure.font = "11px ui-monospace,Menlo,Consolas,monospace";
    return measure.measureText(t).width;
  }
  function drawLines(p, toks, n) {
    var widest = Math.max.apply(null, toks.map(textWidth).concat([40]));
    var rowH = 16, colW = Math.max(130, Math.ceil(widest) + 12), width = 160 + 2 * colW, top = 20, height = top + n * rowH + 4;
    var s = svg("svg", {"class": "hsx-lines", width: width, height: height, viewBox: "0 0 " + width + " " + height});
    s.setAttribute("data-layer", cur.heads[0][0]); s.setAttribute("data-head", cur.heads[0][1]);
    s.setAttribute("data-example", st.ex);
    var t1 = svg("text", {x: colW - 6, y: 12, "text-anchor": "end"}); t1.textContent = "query"; s.appendChild(t1);
    var t2 = svg("text", {x: width - colW + 6, y: 12}); t2.textContent = "key"; s.appendChild(t2);
    hl.lines = [];
    for (var q = 0; q < n; q++) for (var k = 0; k < n; k++) {
      var v = p[q][k];
      if (v < 0.01) continue;
      var y1 = top + q * rowH + rowH / 2 - 4, y2 = top + k * rowH + rowH / 2 - 4;
      var ln = svg("line", {x1: colW, y1: y1, x2: width - colW, y2: y2, stroke: "#08306b",
        "stroke-opacity": Math.min(1, v).toFixed(3), "stroke-width": (0.5 + 2.5 * v).toFixed(2)});
      ln.setAttribute("data-q", q); ln.setAttribute("data-k", k); ln.setAttribute("data-v", fmt(v));
      var tt = svg("title", {}); tt.textContent = toks[q] + " \u2192 " + toks[k] + ": " + fmt(v); ln.appendChild(tt);
      s.appendChild(ln); hl.lines.push({el: ln, q: q, k: k});
    }
    var lefts = [], rights = [];
    toks.forEach(function (tok, i) {
      var a = svg("text", {x: colW - 6, y: top + i * rowH + rowH / 2, "text-anchor": "end"}); a.textContent = tok;
      var b = svg("text", {x: width - colW + 6, y: top + i * rowH + rowH / 2}); b.textContent = tok;
      if (forced(i)) [a, b].forEach(function (t) {
        t.classList.add("hsx-forced"); var tt = svg("title", {}); tt.textContent = FORCED; t.appendChild(tt);
      });
      a.addEventListener("mouseenter", function () { focusToken(i, -1); });
      b.addEventListener("mouseenter", function () { focusToken(-1, i); });
      s.appendChild(a); s.appendChild(b); lefts.push(a); rights.push(b);
    });
    hl.texts = [lefts, rights];
    s.addEventListener("mouseleave", clearMarks);
    view.appendChild(s);
  }
  // in the lines view a hover on one side shows that side's lines only
  var focusBoth = focusToken;
  focusToken = function (i, j) {
    if (hl.lines && (i === -1 || j === -1)) {
      clearMarks();
      var toks = tokens();
      hl.lines.forEach(function (ln) { ln.el.style.display = (i >= 0 ? ln.q === i : ln.k === j) ? "" : "none"; });
      if (i >= 0) { mark(hl.texts[0][i]); info.textContent = q_(toks, i) + " attends to the keys drawn"; }
      else { mark(hl.texts[1][j]); info.textContent = q_(toks, j) + " is attended to by the queries drawn"; }
      return;
    }
    focusBoth(i, j);
  };
  function sampleOf(section) {  // the example whose sample_of lists the section (-1: none)
    for (var i = 0; i < data.examples.length; i++) if ((data.examples[i].sample_of || []).indexOf(section) >= 0) return i;
    return -1;
  }
  function showExample(i) { st.ex = i; st.q = null; exSelect.value = String(i); drawGrid(); drawThumbs(); }
  function fromHash(scroll) {  // #L1H3 opens layer 1, head 3; #L1H3@patching on patching's sample prompt
    var m = /^#L(\d+)H(\d+)(?:@([A-Za-z][\w-]*))?$/i.exec(window.location.hash || "");
    if (!m || +m[1] >= L || +m[2] >= H) return;
    var ex = m[3] ? sampleOf(m[3]) : -1;
    if (ex >= 0 && ex !== st.ex) showExample(ex);
    selectHead(+m[1], +m[2], false);
    st.preview = null; st.still = pointer ? pointer.slice() : null;
    if (scroll && root.scrollIntoView) root.scrollIntoView({block: "start"});
  }
  drawThumbs();
  selectHead(0, 0, false);
  fromHash(true);
  window.addEventListener("hashchange", function () { fromHash(true); });
  document.addEventListener("click", function (e) {  // a link to the head already in the URL: no hashchange, open it again
    var a = e.target && e.target.closest ? e.target.closest("a.head-link") : null;
    if (a && a.hash && a.hash === window.location.hash) fromHash(true);
  });
})((function (id) {  // the enclosing explorer: this script's parent, else by id
  var s = document.currentScript, p = s && s.parentNode;
  return p && p.id === id ? p : document.getElementById(id);
})(__ID__));
