// The course's scheduler in JavaScript, graded through the kit's exec: protocol (see cbatch.toml).
//
// stdin: {"trace": [...], "config": {...}}; stdout: the report. Exit 2 refuses invalid input,
// exit 3 names a setting it does not support (optimistic admission). The policy is the course's
// (reserve admission, FIFO, decode rows first with a rotation counter that advances by the rows it
// could serve, prefill chunks rotated by one per row); the freedoms are taken as
// examples/course_scheduler.py takes them (impossible requests rejected at arrival, no release for
// a request holding no pages, snapshots only before dispatches).
"use strict";

const DEFAULTS = { capacity: 8, block_size: 4, token_budget: 4, max_active: 4, prefill_chunk: 2,
                   release_delay: 1, policy: "continuous", admission: "reserve" };
const LOWEST = { capacity: 1, block_size: 1, token_budget: 1, max_active: 1, prefill_chunk: 1, release_delay: 0 };
const FIELDS = { arrival: ["event", "id", "output_tokens", "prompt_tokens", "time"], cancel: ["event", "id", "time"] };

function fail(code, message) {
  process.stderr.write(message + "\n");
  process.exit(code);
}

const whole = (v) => Number.isInteger(v);

function checked(input) {
  if (input === null || typeof input !== "object" || !Array.isArray(input.trace) ||
      input.config === null || typeof input.config !== "object" || Array.isArray(input.config)) {
    fail(2, "stdin: expected {\"trace\": [...], \"config\": {...}}");
  }
  const cfg = { ...DEFAULTS };
  for (const [key, value] of Object.entries(input.config)) {
    if (!(key in DEFAULTS)) fail(3, `unsupported setting ${key}`);
    cfg[key] = value;
  }
  for (const [key, low] of Object.entries(LOWEST)) {
    if (!whole(cfg[key]) || cfg[key] < low) fail(2, `config: ${key} must be an integer >= ${low}`);
  }
  if (cfg.policy !== "continuous" && cfg.policy !== "serial") fail(2, "config: policy must be continuous or serial");
  if (cfg.admission === "optimistic") fail(3, "admission=optimistic: only the course's reserve admission");
  if (cfg.admission !== "reserve") fail(2, "config: admission must be reserve or optimistic");
  const lines = input.trace.map((line, n) => {
    if (line === null || typeof line !== "object" || !(line.event in FIELDS)) fail(2, `trace line ${n}: not an event`);
    if (Object.keys(line).sort().join() !== FIELDS[line.event].join()) fail(2, `trace line ${n}: wrong fields`);
    if (!whole(line.time) || line.time < 0) fail(2, `trace line ${n}: time must be an integer >= 0`);
    if (typeof line.id !== "string" || line.id === "") fail(2, `trace line ${n}: id must be a non-empty string`);
    for (const key of ["prompt_tokens", "output_tokens"]) {
      if (key in line && (!whole(line[key]) || line[key] < 1)) fail(2, `trace line ${n}: ${key} must be >= 1`);
    }
    return { ...line, n };
  });
  lines.sort((a, b) => a.time - b.time || (a.event === "cancel") - (b.event === "cancel") || a.n - b.n);
  const seen = new Set();
  for (const line of lines) {
    if (line.event === "arrival") {
      if (seen.has(line.id)) fail(2, `trace: id ${line.id} arrives twice`);
      seen.add(line.id);
    } else if (!seen.has(line.id)) {
      fail(2, `trace: cancel of ${line.id} before its arrival`);
    }
  }
  return [lines, cfg];
}

function simulate(lines, cfg) {
  const limit = cfg.policy === "serial" ? 1 : cfg.max_active;
  const log = [], req = new Map(), tables = new Map(), free = new Set();
  for (let p = 0; p < cfg.capacity; p++) free.add(p);
  let queue = [], running = [], due = [];
  const turn = { decode: 0, prefill: 0 };
  let dispatches = 0, fedTotal = 0, drained = 0;
  const need = (id) => Math.ceil((req.get(id).prompt + req.get(id).output - 1) / cfg.block_size);
  const emit = (time, event, fields) => log.push({ time, event, ...fields });
  const held = () => due.reduce((sum, [, id]) => sum + tables.get(id).length, 0);

  function end(now, id, status) {
    const r = req.get(id);
    if (running.includes(id)) {
      running = running.filter((x) => x !== id);
      if (tables.get(id).length) due.push([now + cfg.release_delay, id]);
      else tables.delete(id);
    } else {
      queue = queue.filter((x) => x !== id);
    }
    r.status = status;
    r.end = now;
    drained = Math.max(drained, now);
    emit(now, status, { id });
  }

  function boundary(now, line) {
    const id = line.id;
    if (line.event === "cancel") {
      const r = req.get(id);
      if (["finished", "cancelled", "rejected"].includes(r.status)) emit(now, "cancel_ignored", { id, status: r.status });
      else end(now, id, "cancelled");
      return;
    }
    req.set(id, { prompt: line.prompt_tokens, output: line.output_tokens, arrival: now, status: "queued",
                  admitted: null, end: null, fed: 0, times: [], blocked: false });
    emit(now, "arrival", { id });
    if (need(id) > cfg.capacity) {
      Object.assign(req.get(id), { status: "rejected", end: now });
      drained = Math.max(drained, now);
      emit(now, "rejected", { id });
    } else {
      queue.push(id);
    }
  }

  function admit(now) {
    while (queue.length && running.length < limit) {
      const id = queue[0];
      const room = cfg.capacity - running.reduce((sum, r) => sum + need(r), 0) - held();
      if (need(id) > room) {
        if (!req.get(id).blocked) {
          req.get(id).blocked = true;
          emit(now, "admission_blocked", { id, required_blocks: need(id) });
        }
        return;
      }
      queue.shift();
      running.push(id);
      tables.set(id, []);
      Object.assign(req.get(id), { status: "admitted", admitted: now });
      emit(now, "admit", { id, reserved_blocks: need(id) });
    }
  }

  function plan() {
    const rotate = (list, k) => list.slice(k % list.length).concat(list.slice(0, k % list.length));
    const decoding = running.filter((id) => req.get(id).fed >= req.get(id).prompt);
    const filling = running.filter((id) => req.get(id).fed < req.get(id).prompt);
    const rows = [];
    if (decoding.length) {
      for (const id of rotate(decoding, turn.decode).slice(0, cfg.token_budget)) rows.push([id, "decode", 1]);
      turn.decode += Math.min(decoding.length, cfg.token_budget);
    }
    let left = cfg.token_budget - rows.length;
    if (filling.length && left) {
      for (const id of rotate(filling, turn.prefill)) {
        const r = req.get(id);
        const size = Math.min(cfg.prefill_chunk, r.prompt - r.fed, left);
        if (!size) break;
        rows.unshift([id, "prefill", size]);
        left -= size;
        turn.prefill += 1;
      }
    }
    for (const [id, , size] of rows) {
      const want = Math.ceil((req.get(id).fed + size) / cfg.block_size) - tables.get(id).length;
      for (let i = 0; i < want; i++) {
        const page = Math.max(...free);
        free.delete(page);
        tables.set(id, tables.get(id).concat([page]));
      }
    }
    return rows;
  }

  function snapshot(now) {
    const reserved = running.reduce((sum, r) => sum + need(r), 0), draining = held();
    emit(now, "snapshot", { active: running.length, queued: queue.length, reserved_blocks: reserved,
      draining_blocks: draining, allocated_blocks: cfg.capacity - free.size, free_blocks: free.size,
      admission_headroom: cfg.capacity - reserved - draining, block_tables: Object.fromEntries(tables) });
  }

  function dispatch(now, rows) {
    const used = rows.reduce((sum, [, , n]) => sum + n, 0);
    emit(now, "dispatch", { work: rows.map(([id, phase, n]) => ({ id, phase, input_tokens: n })),
                            unused_budget: cfg.token_budget - used });
    dispatches += 1;
    fedTotal += used;
    for (const [id, phase, size] of rows) {
      const r = req.get(id);
      r.fed += size;
      if (phase === "prefill" && r.fed < r.prompt) continue;
      r.times.push(now + 1);
      emit(now + 1, "token", { id, output_index: r.times.length });
      if (r.times.length === r.output) end(now + 1, id, "finished");
    }
  }

  let now = 0, i = 0;
  while (i < lines.length || queue.length || running.length || due.length) {
    while (i < lines.length && lines[i].time === now) boundary(now, lines[i++]);
    for (const [when, id] of due.filter(([t]) => t <= now).sort((a, b) => a[0] - b[0] || (a[1] < b[1] ? -1 : 1))) {
      due = due.filter(([t, x]) => !(t === when && x === id));
      for (const page of tables.get(id)) free.add(page);
      tables.delete(id);
      drained = Math.max(drained, now);
      emit(now, "release", { id });
    }
    admit(now);
    const rows = plan();
    if (rows.length) {
      snapshot(now);
      dispatch(now, rows);
      now += 1;
      continue;
    }
    const upcoming = due.map(([t]) => t).concat(i < lines.length ? [lines[i].time] : []);
    if (!upcoming.length) break;
    now = Math.min(...upcoming);
  }

  const requests = {}, counts = { finished: 0, cancelled: 0, rejected: 0 };
  for (const [id, r] of req) {
    counts[r.status] += 1;
    requests[id] = { status: r.status, arrival: r.arrival, admitted: r.admitted, end: r.end,
      output_tokens: r.times.length, token_times: r.times,
      queue_ticks: r.admitted === null ? null : r.admitted - r.arrival,
      ttft_ticks: r.times.length ? r.times[0] - r.arrival : null,
      itl_ticks: r.times.slice(1).map((t, k) => t - r.times[k]) };
  }
  const { admission, ...config } = cfg;
  return { schema_version: 1, time_unit: "synthetic_tick", config, requests, events: log,
           summary: { drained_at_tick: drained, dispatches, processed_input_tokens: fedTotal,
                      free_blocks: free.size, ...counts } };
}

let text = "";
process.stdin.setEncoding("utf8");
process.stdin.on("data", (chunk) => { text += chunk; });
process.stdin.on("end", () => {
  let input;
  try {
    input = JSON.parse(text);
  } catch (err) {
    fail(2, `stdin is not JSON: ${err.message}`);
  }
  const [lines, cfg] = checked(input);
  process.stdout.write(JSON.stringify(simulate(lines, cfg)));
});
