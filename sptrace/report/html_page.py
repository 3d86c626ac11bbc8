"""The HTML report's page: its template and the loader script that unpacks what sptrace.report.html
packs into it (plotly.js and the figures, LZMA-compressed, in base85 that HTML cannot mistake for
markup)."""

from __future__ import annotations

import json

B85_ALPHABET = bytes(c for c in range(0x21, 0x7F) if chr(c) not in "\"&'-/<>\\`")
"""base64.b85encode's 85 digits without the nine that HTML or a JS string could take for markup
or a quote: no "<" means no "</script" or "<!--" inside a blob."""


# The page's loader: base85 and LZMA decoders (the LZMA SDK's LzmaSpec.cpp, a reference decoder
# of the .lzma format), then plotly.js run as a script and each figure drawn in its place.
LOADER = """(function () {
"use strict";
const ALPHABET = __ALPHABET__;
function base85(text) {
  const digit = new Uint8Array(128);
  for (let i = 0; i < ALPHABET.length; i++) digit[ALPHABET.charCodeAt(i)] = i;
  const out = new Uint8Array(Math.floor(text.length / 5) * 4 + Math.max((text.length % 5) - 1, 0));
  for (let i = 0, j = 0; i < text.length; i += 5, j += 4) {
    let v = 0;  // a short last group is padded with the highest digit, as Python's b85decode does
    for (let k = 0; k < 5; k++) v = v * 85 + (i + k < text.length ? digit[text.charCodeAt(i + k)] : 84);
    for (let k = 0; k < 4 && j + k < out.length; k++) out[j + k] = (v >>> (24 - 8 * k)) & 255;
  }
  return out;
}
function lzma(src, size) {
  const props = src[0], lc = props % 9, lp = Math.floor(props / 9) % 5, pb = Math.floor(props / 45);
  const out = new Uint8Array(size);  // the whole output is the dictionary
  let at = 13, range = 0xffffffff, code = 0;  // after the header: properties, dictionary size, size
  for (let i = 0; i < 5; i++) code = code * 256 + src[at++];
  const probs = (n) => new Uint16Array(n).fill(1024);
  function bit(p, i) {
    const bound = (range >>> 11) * p[i];
    let b;
    if (code < bound) { p[i] += (2048 - p[i]) >>> 5; range = bound; b = 0; }
    else { p[i] -= p[i] >>> 5; code -= bound; range -= bound; b = 1; }
    if (range < 16777216) { range *= 256; code = code * 256 + src[at++]; }
    return b;
  }
  function tree(p, base, bits) {
    let m = 1;
    for (let i = 0; i < bits; i++) m = (m << 1) + bit(p, base + m);
    return m - (1 << bits);
  }
  function reverse(p, base, bits) {
    let m = 1, sym = 0;
    for (let i = 0; i < bits; i++) { const b = bit(p, base + m); m = (m << 1) + b; sym |= b << i; }
    return sym;
  }
  function direct(bits) {
    let res = 0;
    for (let i = 0; i < bits; i++) {
      range = Math.floor(range / 2);
      if (code >= range) { code -= range; res = res * 2 + 1; } else res *= 2;
      if (range < 16777216) { range *= 256; code = code * 256 + src[at++]; }
    }
    return res;
  }
  const lengths = () => ({ choice: probs(2), low: probs(16 << 3), mid: probs(16 << 3), high: probs(256) });
  function length(L, posState) {
    if (bit(L.choice, 0) === 0) return tree(L.low, posState << 3, 3);
    if (bit(L.choice, 1) === 0) return 8 + tree(L.mid, posState << 3, 3);
    return 16 + tree(L.high, 0, 8);
  }
  const literal = probs(0x300 << (lc + lp)), isMatch = probs(192), isRep = probs(12), isRepG0 = probs(12),
    isRepG1 = probs(12), isRepG2 = probs(12), isRep0Long = probs(192), posSlot = probs(256), posProbs = probs(115),
    align = probs(16), matchLen = lengths(), repLen = lengths();
  let state = 0, rep0 = 0, rep1 = 0, rep2 = 0, rep3 = 0, pos = 0;
  while (pos < size) {
    const posState = pos & ((1 << pb) - 1);
    if (bit(isMatch, (state << 4) + posState) === 0) {
      const prev = pos > 0 ? out[pos - 1] : 0;
      const base = 0x300 * (((pos & ((1 << lp) - 1)) << lc) + (prev >>> (8 - lc)));
      let sym = 1;
      if (state >= 7) {
        let match = out[pos - rep0 - 1];
        while (sym < 0x100) {
          const m = (match >>> 7) & 1;
          match <<= 1;
          const b = bit(literal, base + ((1 + m) << 8) + sym);
          sym = (sym << 1) | b;
          if (m !== b) break;
        }
      }
      while (sym < 0x100) sym = (sym << 1) | bit(literal, base + sym);
      out[pos++] = sym - 0x100;
      state = state < 4 ? 0 : state < 10 ? state - 3 : state - 6;
      continue;
    }
    let len;
    if (bit(isRep, state) !== 0) {
      if (bit(isRepG0, state) === 0) {
        if (bit(isRep0Long, (state << 4) + posState) === 0) {
          state = state < 7 ? 9 : 11;
          out[pos] = out[pos - rep0 - 1];
          pos++;
          continue;
        }
      } else {
        let dist;
        if (bit(isRepG1, state) === 0) dist = rep1;
        else {
          if (bit(isRepG2, state) === 0) dist = rep2;
          else { dist = rep3; rep3 = rep2; }
          rep2 = rep1;
        }
        rep1 = rep0;
        rep0 = dist;
      }
      len = length(repLen, posState);
      state = state < 7 ? 8 : 11;
    } else {
      rep3 = rep2; rep2 = rep1; rep1 = rep0;
      len = length(matchLen, posState);
      state = state < 7 ? 7 : 10;
      const slot = tree(posSlot, Math.min(len, 3) << 6, 6);
      if (slot < 4) rep0 = slot;
      else {
        const bits = (slot >>> 1) - 1;
        rep0 = (2 | (slot & 1)) * 2 ** bits;
        if (slot < 14) rep0 += reverse(posProbs, rep0 - slot, bits);
        else rep0 += direct(bits - 4) * 16 + reverse(align, 0, 4);
      }
      if (rep0 === 0xffffffff) break;  // the end marker
      if (rep0 >= pos) throw new Error("corrupt LZMA data: a distance before the start");
    }
    for (let end = Math.min(pos + len + 2, size); pos < end; pos++) out[pos] = out[pos - rep0 - 1];
  }
  if (pos !== size) throw new Error("corrupt LZMA data: " + pos + " bytes of " + size);
  return out;
}
function unpack(id) {
  const element = document.getElementById(id);
  return new TextDecoder().decode(lzma(base85(element.textContent.trim()), Number(element.dataset.bytes)));
}
function draw() {
  const places = document.querySelectorAll("div.plotly-graph-div");
  const fail = (place, error) => {
    place.textContent = "this plot could not be drawn: " + error;
    place.className += " error";
  };
  try {
    const script = document.createElement("script");
    script.text = unpack("sptrace-plotly");
    document.head.appendChild(script);  // runs now, and defines window.Plotly
    const figures = JSON.parse(unpack("sptrace-figures"));
    const config = { displaylogo: false, responsive: true };
    figures.forEach((f, i) => {
      const place = document.getElementById("plot" + i);
      window.Plotly.newPlot(place, f.data, f.layout, config).catch((error) => fail(place, error));
    });
  } catch (error) {
    places.forEach((place) => fail(place, error));
  }
}
document.addEventListener("DOMContentLoaded", () => setTimeout(draw, 0));  // the text shows first
})();""".replace("__ALPHABET__", json.dumps(B85_ALPHABET.decode("ascii")))


PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>sptrace report</title>
<style>body{{font-family:{font};margin:2em;color:#212529}} h1,h2,h3{{font-weight:700}}
table{{border-collapse:collapse;font-size:13px}}
td,th{{padding:3px 10px;border-bottom:1px solid #dee2e6;text-align:left;vertical-align:top}}
th{{background:#f8f9fa}} td.num,th.num{{text-align:right;font-variant-numeric:tabular-nums}}
td.num{{white-space:nowrap}}
.error{{color:#e03131}} .warning{{color:#e8590c}} .verdict{{font-weight:600}}
a{{color:#1971c2;text-decoration:none}} a:hover{{text-decoration:underline}}
.badge{{display:inline-block;color:#fff;font-size:11px;font-weight:700;padding:2px 8px;border-radius:4px;
letter-spacing:.03em;vertical-align:middle}}</style></head>
<body><h1>sptrace report</h1><p>sptrace {version}, {created}</p>
<ul>{index}</ul>
{sections}
{plotly}
{figures}
<script>
{banner}
{loader}
</script>
</body></html>
"""
