// The panel beside an answer: /v1/inside's view of the forward pass that wrote it.
"use strict";

const COLORS = { free: "#e8ebf1", cached: "#7aa2e3", held: "#3f9d6b", shared: "#e39b3f" };
const EXPERT_COLORS = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
                       "#9c755f", "#bab0ac"];
let view = null;      // the last /v1/inside answer
let selected = 0;     // the answer token shown

function element(tag, properties = {}, children = []) {
  const node = Object.assign(document.createElement(tag), properties);
  node.append(...children);
  return node;
}

function shown(text) {
  const escaped = JSON.stringify(text).slice(1, -1);  // newlines and tabs made visible
  return escaped.trim() ? escaped : escaped.replaceAll(" ", "␣");  // so are tokens of spaces alone
}

async function showInside(messages, answer, sampling) {
  const panel = document.getElementById("inside");
  const status = document.getElementById("inside-status");
  panel.hidden = false;
  document.getElementById("inside-body").hidden = true;
  status.textContent = "tracing the forward pass through the spec ops…";
  try {
    const body = { model: refllm.model, messages, answer, ...sampling };
    view = await (await refllm.call("/v1/inside", body)).json();
  } catch (error) {
    status.textContent = "could not look inside: " + error.message;
    return;
  }
  const answerTokens = view.tokens.length - view.answer_start;
  status.textContent = `${view.layers} layers, ${view.heads} heads; ${view.answer_start} tokens of conversation, ` +
    `${answerTokens} of answer`;
  const layerChoice = document.getElementById("attention-layer");
  layerChoice.replaceChildren(...Array.from({ length: view.layers }, (_, i) => element("option", { value: i, textContent: i })));
  layerChoice.value = view.layers - 1;
  selected = 0;
  document.getElementById("inside-body").hidden = false;
  drawTokens();
  drawAll();
}

function drawAll() {
  drawDistribution();
  drawLens();
  drawAttention();
  drawExperts();
  drawArena();
}

function drawTokens() {
  const strip = document.getElementById("token-strip");
  strip.replaceChildren(...view.tokens.slice(view.answer_start).map((text, i) => {
    const chip = element("span", { className: "token" + (i === selected ? " selected" : ""), textContent: shown(text) });
    chip.dataset.step = i;
    chip.addEventListener("click", () => { selected = i; drawTokens(); drawAll(); });
    return chip;
  }));
}

function drawDistribution() {
  const step = view.next_token[selected];
  const canvas = document.getElementById("distribution");
  const g = canvas.getContext("2d");
  const width = canvas.width, height = canvas.height, bottom = height - 60, left = 36;
  const bars = step.top, slot = (width - left) / bars.length, top = bars[0][1];
  g.clearRect(0, 0, width, height);
  g.font = "11px system-ui";
  g.fillStyle = "#5d6678";
  g.fillText(top.toFixed(2), 2, 12);
  g.fillText("0", 2, bottom);
  bars.forEach(([text, p, kept], i) => {
    const h = (bottom - 10) * p / top, x = left + i * slot;
    g.fillStyle = kept ? "#2f4a86" : "#c4cad6";
    g.fillRect(x + 2, bottom - h, slot - 4, h);
    if (text === step.chosen) { g.strokeStyle = "#e15759"; g.lineWidth = 2; g.strokeRect(x + 1, bottom - h - 1, slot - 2, h + 2); }
    g.save();
    g.translate(x + slot / 2, bottom + 6);
    g.rotate(Math.PI / 4);
    g.fillStyle = "#1d2330";
    g.fillText(shown(text).slice(0, 10), 0, 0);
    g.restore();
  });
  const cut = (count, label, color) => {
    if (count >= bars.length) return;
    const x = left + count * slot;
    g.strokeStyle = color; g.setLineDash([4, 3]); g.lineWidth = 1.5;
    g.beginPath(); g.moveTo(x, 4); g.lineTo(x, bottom); g.stroke(); g.setLineDash([]);
    g.fillStyle = color; g.fillText(label, x + 3, 14);
  };
  if (step.top_k > 0) cut(step.kept_by_top_k, `top-k ${step.top_k}`, "#b07aa1");
  if (step.top_p < 1) cut(step.kept_by_top_p, `top-p ${step.top_p}`, "#f28e2b");
  if (step.min_p > 0) {
    const y = bottom - (bottom - 10) * step.min_p_threshold / top;
    g.strokeStyle = "#59a14f"; g.setLineDash([4, 3]);
    g.beginPath(); g.moveTo(left, y); g.lineTo(width, y); g.stroke(); g.setLineDash([]);
    g.fillStyle = "#59a14f"; g.fillText(`min-p ${step.min_p}`, width - 70, y - 3);
  }
  const how = step.greedy ? "greedy: the most likely token is taken" : "sampled among the kept (dark) tokens";
  document.getElementById("cutoffs").textContent =
    `chose ${shown(step.chosen)} (outlined); ${how}. Kept: ${step.kept_by_top_k} after top-k, ` +
    `${step.kept_by_top_p} after top-p, ${step.kept_by_min_p} after min-p.`;
}

function drawLens() {
  const answer = view.tokens.slice(view.answer_start);
  const heading = element("tr", {}, [element("th", { textContent: "layer" }),
    ...answer.map((text, i) => element("th", { className: i === selected ? "selected" : "", textContent: shown(text) }))]);
  const rows = view.lens.map((layer, l) => {
    const row = element("tr", {}, [element("th", { textContent: l })]);
    row.dataset.layer = l;
    layer.forEach((candidates, i) => {
      const [text, p] = candidates[0];
      const cell = element("td", { className: i === selected ? "selected" : "", textContent: shown(text) });
      cell.dataset.token = text;
      cell.style.background = `rgba(47, 74, 134, ${0.08 + 0.6 * p})`;
      cell.title = candidates.map(([t, q]) => `${shown(t)} ${(100 * q).toFixed(1)}%`).join("\n");
      row.appendChild(cell);
    });
    return row;
  });
  document.getElementById("lens").replaceChildren(heading, ...rows);
}

function drawAttention() {
  const layer = Number(document.getElementById("attention-layer").value);
  const bytes = Uint8Array.from(atob(view.attention[layer]), (c) => c.charCodeAt(0));
  const queries = view.tokens.length - view.answer_start, keys = view.tokens.length - 1;
  const cell = Math.max(1, Math.min(6, Math.floor(240 / keys)));
  const rowHeight = Math.max(cell, Math.min(12, Math.floor(72 / queries)));
  const heads = Array.from({ length: view.heads }, (_, h) => {
    const canvas = element("canvas", { width: keys * cell, height: queries * rowHeight });
    canvas.dataset.layer = layer;
    canvas.dataset.head = h;
    const g = canvas.getContext("2d");
    const image = g.createImageData(canvas.width, canvas.height);
    for (let q = 0; q < queries; q++) {
      for (let k = 0; k < keys; k++) {
        const w = bytes[(h * queries + q) * keys + k] / 255, shade = Math.round(255 * (1 - Math.sqrt(w)));
        for (let dy = 0; dy < rowHeight; dy++) {
          for (let dx = 0; dx < cell; dx++) {
            const at = 4 * ((q * rowHeight + dy) * canvas.width + k * cell + dx);
            image.data.set(q === selected && w === 0 ? [250, 236, 236, 255] : [shade, shade, 255 - (255 - shade) / 3, 255], at);
          }
        }
      }
    }
    g.putImageData(image, 0, 0);
    return element("div", { className: "head" }, [canvas, `head ${h}`]);
  });
  document.getElementById("attention").replaceChildren(...heads);
}

function drawExperts() {
  const section = document.getElementById("experts-section");
  section.hidden = !view.experts;
  if (!view.experts) return;
  const answer = view.tokens.slice(view.answer_start);
  const heading = element("tr", {}, [element("th", { textContent: "layer" }),
    ...answer.map((text) => element("th", { textContent: shown(text) }))]);
  const rows = view.experts.map(({ layer, ids, weights }) => element("tr", {}, [
    element("th", { textContent: layer }),
    ...ids.map((chosen, i) => {
      const cell = element("td", { className: i === selected ? "selected" : "", textContent: chosen.join(" ") });
      cell.style.background = EXPERT_COLORS[chosen[0] % EXPERT_COLORS.length] + "55";
      cell.title = chosen.map((e, j) => `expert ${e}: weight ${weights[i][j]}`).join("\n");
      return cell;
    }),
  ]));
  document.getElementById("experts").replaceChildren(heading, ...rows);
}

function drawArena() {
  const section = document.getElementById("arena-section");
  section.hidden = !view.arena;
  if (!view.arena) return;
  const states = Uint8Array.from(atob(view.arena.states), (c) => c.charCodeAt(0));
  const names = ["free", "cached", "held", "shared"], mine = new Set(view.arena.conversation);
  const canvas = document.getElementById("arena"), g = canvas.getContext("2d");
  const columns = Math.min(states.length, 96), size = Math.max(3, Math.floor(canvas.width / columns));
  canvas.height = Math.ceil(states.length / columns) * size;
  states.forEach((state, block) => {
    const x = (block % columns) * size, y = Math.floor(block / columns) * size;
    g.fillStyle = mine.has(block) ? "#e15759" : COLORS[names[state]];
    g.fillRect(x, y, size - (size > 3 ? 1 : 0), size - (size > 3 ? 1 : 0));
  });
  const counts = names.map((name, s) => `${states.filter((x) => x === s).length} ${name}`).join(", ");
  document.getElementById("arena-legend").textContent =
    `${states.length} blocks of ${view.arena.block_size} tokens: ${counts}. In red, the ${mine.size} cached ` +
    `blocks that hold this conversation: the next message starts on them instead of computing them again. ` +
    `Blue: cached, free to reuse; green: held by a live sequence; orange: shared by several.`;
}

document.getElementById("attention-layer").addEventListener("change", drawAttention);
document.getElementById("close-inside").addEventListener("click", () => { document.getElementById("inside").hidden = true; });
