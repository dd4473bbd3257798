// lathe webui: plain JavaScript, no library. The server is the source of truth; this only draws forms and charts.
"use strict";
const $ = (id) => document.getElementById(id);
let S = {}, META = {}, selected = new Set(), history = [];
const COLORS = ["#2d6cdf", "#d9534f", "#2a8a2a", "#e08e0b", "#7b4fd0", "#17a2b8"];
const HYPER = ["learning_rate", "num_train_epochs", "max_samples", "per_device_train_batch_size",
  "gradient_accumulation_steps", "lr_scheduler_type", "max_grad_norm", "cutoff_len", "val_size",
  "logging_steps", "save_steps", "warmup_steps"];

function showError(text) { const e = $("error"); e.textContent = text || ""; e.hidden = !text; }

async function api(path, body) {
  const options = body === undefined ? {} : {method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body)};
  const response = await fetch(path, options);
  const data = await response.json();
  if (!response.ok) { showError(data.error || response.statusText); throw new Error(data.error); }
  showError("");
  return data;
}

function escapeHtml(text) {
  return text.replace(/[&<>"]/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}[c]));
}

function hyperFields() {
  const box = $("hyper");
  box.innerHTML = "";
  const keys = HYPER.concat(META.method_keys[$("method").value] || [], (META.stage_keys || {})[$("stage").value] || []);
  for (const key of keys) {
    const label = document.createElement("label");
    label.innerHTML = `<span>${key}</span><input id="h_${key}" data-key="${key}">`;
    label.querySelector("input").value = META.defaults[key] ?? "";
    box.appendChild(label);
  }
}

function form() {
  const values = {};
  for (const id of ["model_name_or_path", "template", "stage", "dataset_dir", "output_dir"]) values[id] = $(id).value;
  values.dataset = Array.from($("dataset").selectedOptions).map((o) => o.value).join(",");
  if ($("trust_remote_code").checked) values.trust_remote_code = "true";
  for (const input of $("hyper").querySelectorAll("input")) values[input.dataset.key] = input.value;
  return {method: $("method").value, action: $("action").value, values, extra: $("extra").value, confirm_remote_code: $("trust_remote_code").dataset.confirmed === "1"};
}

// The YAML follows every change at once; the plan (a `lathe train --dry_run`, which loads the model) follows
// once the form has been still for 2 s, one at a time, and once more if the form changed meanwhile.
let yamlTimer = null, planTimer = null, planBusy = false, planAgain = false;
function changed() {
  clearTimeout(yamlTimer);
  yamlTimer = setTimeout(async () => {
    try { $("yaml").textContent = (await api("/api/config", form())).yaml; } catch (e) { return; }
    clearTimeout(planTimer);
    planTimer = setTimeout(runPlan, 2000);
  }, 300);
}

async function runPlan() {
  if (planBusy) { planAgain = true; return; }
  planBusy = true;
  $("plan_out").textContent = S.working;
  try { $("plan_out").textContent = (await api("/api/plan", form())).output; } catch (e) { $("plan_out").textContent = ""; }
  planBusy = false;
  if (planAgain) { planAgain = false; runPlan(); }
}

async function runPreview() {
  $("preview_out").textContent = S.working;
  const result = await api("/api/preview", form());
  // lathe data preview marks the trained tokens [[like this]]: show them highlighted.
  $("preview_out").innerHTML = escapeHtml(result.output).replace(/\[\[([\s\S]*?)\]\]/g, '<span class="trained">$1</span>');
}

async function loadDatasets() {
  const info = (await api("/api/datasets?dataset_dir=" + encodeURIComponent($("dataset_dir").value))).datasets;
  $("dataset").innerHTML = Object.keys(info).map((n) => `<option value="${escapeHtml(n)}">${escapeHtml(n)}</option>`).join("");
  if ($("dataset").options.length) $("dataset").options[0].selected = true;
  changed();
}

// A data file into the dataset folder (the server bounds its size); register it in dataset_info.json to train on it.
async function upload() {
  const file = $("upload_file").files[0];
  if (!file) return;
  const query = `name=${encodeURIComponent(file.name)}&dataset_dir=${encodeURIComponent($("dataset_dir").value)}`;
  const response = await fetch("/api/upload?" + query, {method: "POST", body: file});
  const data = await response.json();
  if (!response.ok) { showError(data.error); return; }
  $("upload_out").textContent = `${data.saved} (${data.bytes} bytes)`;
}

// The suggestion loads the tokenizer, which takes seconds: it is checked when the answer arrives, and fills the
// field only if neither the template nor the model changed meanwhile (a value the user typed always wins).
async function suggestTemplate() {
  const model = $("model_name_or_path").value, typed = $("template").value;
  const found = (await api("/api/template?model=" + encodeURIComponent(model))).templates;
  $("suggest_out").dataset.answer = found.join(",");
  if ($("template").value !== typed || $("model_name_or_path").value !== model) { $("suggest_out").textContent = ""; return; }
  $("suggest_out").textContent = found.length ? "" : S.no_suggestion;
  if (found.length) { $("template").value = found[0]; changed(); }
}

// Start shows the YAML of the form as it is now, then starts exactly that: the server refuses (and nothing runs)
// when the YAML it would save differs from the one on the page.
async function start() {
  const box = $("trust_remote_code");
  if (box.checked && !confirm(S.confirm_remote_code)) return;
  box.dataset.confirmed = box.checked ? "1" : "0";
  clearTimeout(yamlTimer);
  const values = form();
  const shown = (await api("/api/config", values)).yaml;
  $("yaml").textContent = shown;
  const result = await api("/api/start", {...values, yaml: shown});
  $("yaml").textContent = result.yaml;
  selected = new Set([result.run]);
  showTab("watch");
}

function showTab(name) {
  for (const page of document.querySelectorAll(".page")) page.hidden = page.id !== name;
  for (const tab of document.querySelectorAll(".tab")) tab.classList.toggle("active", tab.dataset.tab === name);
  if (name === "watch") refreshRuns();
}

async function refreshRuns() {
  const runs = (await api("/api/runs")).runs;
  const body = $("runs").querySelector("tbody");
  if (!runs.length) { body.innerHTML = `<tr><td colspan="8">${S.no_runs}</td></tr>`; return; }
  if (!selected.size) selected.add(runs[runs.length - 1].run);
  body.innerHTML = runs.map((r) => `<tr data-run="${escapeHtml(r.run)}"><td><input type="checkbox" ${selected.has(r.run) ? "checked" : ""}></td>
    <td>${escapeHtml(r.run)}</td><td class="status">${r.status}</td><td>${r.step}/${r.total_steps ?? "?"} ${r.percentage ?? ""}%</td>
    <td>${r.loss == null ? "" : r.loss.toFixed(4)}</td><td>${r.throughput ?? ""}</td><td>${r.remaining ?? ""}</td>
    <td>${r.status === "running" ? `<button class="stop">${S.stop}</button>` : ""}
    ${r.status !== "running" && r.status !== "finished" && r.checkpoints.length ? `<button class="resume">${S.resume}</button>` : ""}</td></tr>`).join("");
  for (const row of body.querySelectorAll("tr[data-run]")) {
    const run = row.dataset.run;
    row.querySelector("input").onchange = (e) => { e.target.checked ? selected.add(run) : selected.delete(run); drawCharts(); };
    const stop = row.querySelector(".stop"), resume = row.querySelector(".resume");
    if (stop) stop.onclick = () => api("/api/stop", {run}).then(refreshRuns);
    if (resume) resume.onclick = () => api("/api/resume", {run}).then(refreshRuns);
  }
  drawCharts();
}

async function drawCharts() {
  const details = [];
  for (const run of selected) { try { details.push(await api("/api/run?run=" + encodeURIComponent(run))); } catch (e) { selected.delete(run); } }
  const box = $("charts");
  box.innerHTML = "";
  for (const [key, label] of [["loss", S.loss], ["eval_loss", S.eval_loss], ["lr", S.lr], ["grad_norm", S.grad_norm], ["reward", S.reward], ["throughput", S.tokens_per_second]]) {
    const series = details.map((d) => d.points.filter((p) => p[key] != null).map((p) => [p.current_steps, p[key]]));
    if (!series.some((s) => s.length)) continue;
    const div = document.createElement("div");
    div.className = "chart";
    div.innerHTML = `<h4>${label}</h4>`;
    div.appendChild(chart(series, details.map((d) => d.run)));
    div.dataset.key = key;
    box.appendChild(div);
  }
  for (const d of details) {
    const div = document.createElement("div");
    div.className = "chart log";
    const links = d.results.map((f) => `<a href="/api/download?path=${encodeURIComponent(f)}">${escapeHtml(f.split("/").pop())}</a>`).join(" ");
    div.innerHTML = `<h4>${S.log_tail}: ${escapeHtml(d.run)} (${d.status})</h4><div class="results">${links}</div><pre>${escapeHtml(d.log.slice(-4000))}</pre>`;
    box.appendChild(div);
  }
}

// A line chart on a canvas: one line per run, axes with the first and last step and the value range.
function chart(series, names, width = 360, height = 200) {
  const canvas = document.createElement("canvas");
  canvas.width = width; canvas.height = height;
  const g = canvas.getContext("2d"), pad = 40;
  const all = series.flat();
  const xs = all.map((p) => p[0]), ys = all.map((p) => p[1]);
  const [x0, x1, y0, y1] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
  const X = (x) => pad + (x1 === x0 ? 0.5 : (x - x0) / (x1 - x0)) * (width - pad - 10);
  const Y = (y) => height - pad + 10 - (y1 === y0 ? 0.5 : (y - y0) / (y1 - y0)) * (height - pad - 10);
  g.font = "10px sans-serif"; g.fillStyle = "#555"; g.strokeStyle = "#aaa";
  g.beginPath(); g.moveTo(pad, 10); g.lineTo(pad, height - pad + 10); g.lineTo(width - 10, height - pad + 10); g.stroke();
  g.fillText(y1.toPrecision(4), 2, 14); g.fillText(y0.toPrecision(4), 2, height - pad + 10);
  g.fillText(String(x0), pad, height - pad + 22); g.fillText(String(x1), width - 30, height - pad + 22);
  series.forEach((points, i) => {
    g.strokeStyle = g.fillStyle = COLORS[i % COLORS.length];
    g.beginPath();
    points.forEach(([x, y], j) => (j ? g.lineTo(X(x), Y(y)) : g.moveTo(X(x), Y(y))));
    g.stroke();
    for (const [x, y] of points) g.fillRect(X(x) - 1.5, Y(y) - 1.5, 3, 3);
    g.fillText(names[i], pad + 8, height - 4 - 12 * (series.length - 1 - i));
  });
  canvas.dataset.points = String(all.length);
  return canvas;
}

async function chatLoad() {
  $("chat_loaded").textContent = S.working;
  const result = await api("/api/chat/load", {model_name_or_path: $("chat_model").value, adapter_name_or_path: $("chat_adapter").value, template: $("chat_template").value});
  $("chat_loaded").textContent = `${result.loaded.model_name_or_path} (${result.template})`;
  history = []; $("messages").innerHTML = "";
}

function addMessage(role, text) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  div.innerHTML = `<b>${role}:</b> <span></span>`;
  div.querySelector("span").textContent = text;
  $("messages").appendChild(div);
  return div.querySelector("span");
}

function readDataUrl(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

async function chatSend() {
  const text = $("chat_input").value;
  if (!text) return;
  $("chat_input").value = "";
  const file = $("chat_media").files[0];
  // an attached image, video or audio file goes with this message as an image_url / video_url / audio_url part (a
  // data URL), as `lathe api` takes them; the file's type picks the part
  const kind = file ? (file.type.split("/")[0] === "video" ? "video_url" : file.type.split("/")[0] === "audio" ? "audio_url" : "image_url") : null;
  const content = file ? [{type: kind, [kind]: {url: await readDataUrl(file)}}, {type: "text", text}] : text;
  $("chat_media").value = "";
  history.push({role: "user", content});
  addMessage("user", file ? `[${file.name}] ${text}` : text);
  const span = addMessage("assistant", "");
  const response = await fetch("/api/chat", {method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify({messages: history})});
  if (!response.ok) { showError((await response.json()).error); return; }
  const reader = response.body.getReader(), decoder = new TextDecoder();
  for (;;) {
    const {done, value} = await reader.read();
    if (done) break;
    span.textContent += decoder.decode(value, {stream: true});
  }
  span.parentElement.dataset.done = "1";
  history.push({role: "assistant", content: span.textContent});
}

async function exportModel() {
  $("export_out").textContent = S.working;
  const result = await api("/api/export", {model_name_or_path: $("export_model").value, adapter_name_or_path: $("export_adapter").value,
    template: $("export_template").value, export_dir: $("export_dir").value, export_size: $("export_size").value,
    export_gguf: [...$("export_gguf").selectedOptions].map((o) => o.value).join(",")});
  $("export_out").textContent = result.output;
  $("export_files").innerHTML = (result.files || []).map((f) => {
    const path = encodeURIComponent(result.export_dir + "/" + f);
    return `<li><a href="/api/download?path=${path}">${escapeHtml(f)}</a></li>`;
  }).join("");
}

async function init() {
  META = await api("/api/strings");
  S = META.strings;
  for (const el of document.querySelectorAll("[data-s]")) el.textContent = S[el.dataset.s];
  $("stage").innerHTML = META.stages.map((s) => `<option>${s}</option>`).join("");
  $("export_gguf").innerHTML = META.gguf_types.map((t) => `<option value="${t}">${t}</option>`).join("");
  $("method").innerHTML = META.methods.map((m) => `<option ${m === "lora" ? "selected" : ""}>${m}</option>`).join("");
  hyperFields();
  for (const tab of document.querySelectorAll(".tab")) tab.onclick = () => showTab(tab.dataset.tab);
  $("method").onchange = () => { hyperFields(); changed(); };
  $("stage").onchange = () => { hyperFields(); changed(); };
  $("train").addEventListener("input", (e) => { if (e.target.id !== "method") changed(); });
  $("load_datasets").onclick = loadDatasets;
  $("suggest").onclick = suggestTemplate;
  // A model folder chosen with the template still empty: suggest one from its tokenizer's chat_template.
  $("model_name_or_path").addEventListener("change", () => { if (!$("template").value) suggestTemplate().catch(() => showError("")); });
  $("preview").onclick = runPreview;
  $("upload_file").onchange = upload;
  $("plan").onclick = runPlan;
  $("start").onclick = start;
  $("refresh").onclick = refreshRuns;
  $("chat_load").onclick = chatLoad;
  $("chat_send").onclick = chatSend;
  $("chat_clear").onclick = () => { history = []; $("messages").innerHTML = ""; };
  $("export_go").onclick = exportModel;
  const models = META.chat ? [] : (await api("/api/models")).models;
  $("models").innerHTML = models.map((m) => `<option value="${escapeHtml(m)}">`).join("");
  if (META.chat) { $("chat_loaded").textContent = META.chat.model_name_or_path; $("chat_model").value = META.chat.model_name_or_path || ""; $("chat_adapter").value = META.chat.adapter_name_or_path || ""; $("chat_template").value = META.chat.template || ""; }
  showTab(META.chat ? "chat" : "train");
  setInterval(() => { if (!$("watch").hidden) refreshRuns(); }, 2000);
}
init();
