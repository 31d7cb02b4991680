#!/usr/bin/env node
// A continuous-batching scheduler in JavaScript behind the kit's exec: protocol, written from the
// specification alone (docs/exec-protocol.md for the wire, the README's trace and report formats and
// the contract for the meaning): the conformance test of the specification runs the contract on it.
//
//   pytest --cbatch-impl="exec:node tests/exec_node/scheduler.js"
//
// Reserve admission (every page of a request claimed at admission) and optimistic admission (pages on
// demand; the newest running request is preempted when a dispatch needs more pages than are free,
// and recomputes its rows when it is admitted again).  Exit 0 with the report on stdout, 2 with the
// reason on stderr for invalid input; it supports every setting, so it never exits 3.
"use strict";

const REFUSED = 2;
const SETTINGS = {  // name -> minimum of an integer setting, or the allowed values
  capacity: 1, block_size: 1, token_budget: 1, max_active: 1, prefill_chunk: 1, release_delay: 0,
  policy: ["continuous", "serial"], admission: ["reserve", "optimistic"],
};
const DEFAULTS = { capacity: 8, block_size: 4, token_budget: 4, max_active: 4, prefill_chunk: 2,
  release_delay: 1, policy: "continuous", admission: "reserve" };
const FIELDS = { arrival: ["time", "event", "id", "prompt_tokens", "output_tokens"], cancel: ["time", "event", "id"] };

class Invalid extends Error {}

const isObject = (v) => typeof v === "object" && v !== null && !Array.isArray(v);
const isInt = (v) => typeof v === "number" && Number.isInteger(v);
const ceilDiv = (a, b) => Math.floor((a + b - 1) / b);
const has = (obj, key) => Object.prototype.hasOwnProperty.call(obj, key);

function checkConfig(config) {
  if (!isObject(config)) throw new Invalid("config: expected a JSON object");
  for (const key of Object.keys(config)) {
    if (!has(SETTINGS, key)) throw new Invalid(`config: unknown setting ${JSON.stringify(key)}`);
    const rule = SETTINGS[key], value = config[key];
    if (Array.isArray(rule) ? !rule.includes(value) : !isInt(value) || value < rule) {
      throw new Invalid(`config: ${key}: invalid value ${JSON.stringify(value)}`);
    }
  }
  return { ...DEFAULTS, ...config };
}

function checkTrace(trace) {
  if (!Array.isArray(trace)) throw new Invalid("trace: expected a JSON array");
  const lines = trace.map((line, i) => {
    const where = `trace[${i}]`;
    if (!isObject(line) || !has(FIELDS, line.event)) throw new Invalid(`${where}: event: must be arrival or cancel`);
    const fields = FIELDS[line.event];
    for (const key of Object.keys(line)) if (!fields.includes(key)) throw new Invalid(`${where}: unknown field ${key}`);
    for (const key of fields) if (!has(line, key)) throw new Invalid(`${where}: ${key}: missing`);
    if (!isInt(line.time) || line.time < 0) throw new Invalid(`${where}: time: must be a nonnegative integer`);
    if (typeof line.id !== "string" || line.id === "") throw new Invalid(`${where}: id: must be a non-empty string`);
    for (const key of ["prompt_tokens", "output_tokens"]) {
      if (fields.includes(key) && (!isInt(line[key]) || line[key] < 1)) {
        throw new Invalid(`${where}: ${key}: must be a positive integer`);
      }
    }
    return { line, order: i };
  });
  // Stable by time, every arrival before every cancel of the same time.
  lines.sort((a, b) => a.line.time - b.line.time || (a.line.event === "cancel") - (b.line.event === "cancel")
    || a.order - b.order);
  const arrived = new Set();
  for (const { line } of lines) {
    if (line.event === "arrival") {
      if (arrived.has(line.id)) throw new Invalid(`id: duplicate request id ${JSON.stringify(line.id)}`);
      arrived.add(line.id);
    } else if (!arrived.has(line.id)) {
      throw new Invalid(`id: cancel names ${JSON.stringify(line.id)}, which has not arrived by then`);
    }
  }
  return lines.map(({ line }) => line);
}

class Scheduler {
  constructor(cfg) {
    this.cfg = cfg;
    this.optimistic = cfg.admission === "optimistic";
    this.limit = cfg.policy === "serial" ? 1 : cfg.max_active;
    this.now = 0;
    this.events = [];
    this.requests = new Map();   // id -> request, in arrival order
    this.waiting = [];
    this.active = [];            // admission order
    this.releases = [];          // [time, id], kept sorted
    this.free = Array.from({ length: cfg.capacity }, (_, i) => i);  // kept sorted: the lowest id goes first
    this.tables = new Map();     // id -> page ids, in creation order
    this.draining = 0;
    this.reserved = 0;
    this.decodeTurn = 0;
    this.prefillTurn = 0;
    this.dispatches = 0;
    this.inputTokens = 0;
  }

  emit(event) { this.events.push({ time: this.now, ...event }); }

  arrive(line) {
    const req = { id: line.id, prompt: line.prompt_tokens, output: line.output_tokens, arrival: this.now,
      status: "queued", admitted: null, end: null, tokens: [], written: 0, recomputeTo: 0, claim: 0, held: 0 };
    this.requests.set(req.id, req);
    this.waiting.push(req);
    this.emit({ event: "arrival", id: req.id });
  }

  cancel(id) {
    const req = this.requests.get(id);
    if (req.status === "queued" || req.status === "active") this.retire(req, "cancelled");
    else this.emit({ event: "cancel_ignored", id, status: req.status });
  }

  retire(req, status) {
    if (req.status === "active") {
      this.active.splice(this.active.indexOf(req), 1);
      this.reserved -= req.held;
      req.held = 0;
      this.draining += this.tables.get(req.id).length;
      this.releases.push([this.now + this.cfg.release_delay, req.id]);
      this.releases.sort((a, b) => a[0] - b[0] || (a[1] < b[1] ? -1 : a[1] > b[1] ? 1 : 0));
    } else {
      this.waiting.splice(this.waiting.indexOf(req), 1);
    }
    req.status = status;
    req.end = this.now;
    this.emit({ event: status, id: req.id });
  }

  freePages(pages) {
    this.free.push(...pages);
    this.free.sort((a, b) => a - b);
  }

  releaseDue() {
    while (this.releases.length && this.releases[0][0] <= this.now) {
      const [, id] = this.releases.shift();
      const pages = this.tables.get(id);
      this.tables.delete(id);
      this.freePages(pages);
      this.draining -= pages.length;
      this.emit({ event: "release", id });
    }
  }

  hold(req) {
    const held = Math.max(req.claim, this.tables.get(req.id).length);
    this.reserved += held - req.held;
    req.held = held;
  }

  admit() {
    const bs = this.cfg.block_size;
    while (this.waiting.length && this.active.length < this.limit) {
      const req = this.waiting[0];
      const whole = ceilDiv(req.prompt + req.output - 1, bs);  // the last sampled token is never fed back
      const need = this.optimistic ? ceilDiv(req.prompt + req.tokens.length, bs) : whole;
      if (whole > this.cfg.capacity) {
        this.retire(req, "rejected");
        continue;
      }
      if (need > this.cfg.capacity - this.reserved - this.draining) {
        this.emit({ event: "admission_blocked", id: req.id, required_blocks: need });
        return;
      }
      this.waiting.shift();
      req.status = "active";
      req.claim = need;
      if (req.admitted === null) req.admitted = this.now;
      this.active.push(req);
      this.tables.set(req.id, []);
      this.hold(req);
      this.emit({ event: "admit", id: req.id, reserved_blocks: need });
    }
  }

  nextRow(req, budget) {
    const chunk = this.cfg.prefill_chunk;
    if (req.written < req.recomputeTo) return ["recompute", Math.min(chunk, req.recomputeTo - req.written, budget)];
    if (req.written < req.prompt) return ["prefill", Math.min(chunk, req.prompt - req.written, budget)];
    return ["decode", 1];
  }

  plan() {
    let budget = this.cfg.token_budget;
    const decode = [], prefill = [];
    for (const req of this.active) (this.nextRow(req, budget)[0] === "decode" ? decode : prefill).push(req);
    const rows = [];
    let turnD = 0, turnP = 0;
    if (decode.length) {
      const start = this.decodeTurn % decode.length;
      for (const req of decode.slice(start).concat(decode.slice(0, start)).slice(0, budget)) rows.push([req, "decode", 1]);
      budget -= rows.length;
      turnD = Math.min(decode.length, this.cfg.token_budget);
    }
    if (prefill.length && budget > 0) {
      const start = this.prefillTurn % prefill.length;
      for (const req of prefill.slice(start).concat(prefill.slice(0, start))) {
        const [phase, n] = this.nextRow(req, budget);
        if (n === 0) break;
        rows.push([req, phase, n]);
        budget -= n;
        turnP += 1;
      }
    }
    return { rows, turnD, turnP };
  }

  newPages(rows) {
    const out = new Map();
    for (const [req, , n] of rows) out.set(req.id, ceilDiv(req.written + n, this.cfg.block_size) - this.tables.get(req.id).length);
    return out;
  }

  preempt(req) {
    this.active.splice(this.active.indexOf(req), 1);
    const pages = this.tables.get(req.id);
    this.tables.delete(req.id);
    this.freePages(pages);
    this.reserved -= req.held;
    req.recomputeTo = Math.max(req.recomputeTo, req.written);
    req.written = req.claim = req.held = 0;
    req.status = "queued";
    this.waiting.unshift(req);
    this.emit({ event: "preempted", id: req.id, released_blocks: pages.length });
  }

  // Releases, admission, planning (preempting while the dispatch does not fit) and the snapshot.
  boundary() {
    this.releaseDue();
    this.admit();
    let plan, planned;
    for (;;) {
      plan = this.plan();
      planned = this.newPages(plan.rows);
      let needed = 0;
      for (const n of planned.values()) needed += n;
      if (needed <= this.free.length) break;
      if (!this.optimistic) throw new Error(`t=${this.now}: a reserved dispatch needs more pages than are free`);
      if (this.active.length === 1) {  // the oldest waits for draining pages; it yields to nobody
        plan = { rows: [], turnD: 0, turnP: 0 };
        planned = new Map();
        break;
      }
      this.preempt(this.active[this.active.length - 1]);
    }
    this.decodeTurn += plan.turnD;
    this.prefillTurn += plan.turnP;
    let reserved = this.reserved;
    if (this.optimistic) {  // pages the coming dispatch claims beyond a request's credit count as reserved
      for (const [req] of plan.rows) {
        reserved += Math.max(req.claim, this.tables.get(req.id).length + planned.get(req.id)) - req.held;
      }
    }
    const free = this.free.length, capacity = this.cfg.capacity;
    const tables = Object.create(null);
    for (const [id, pages] of this.tables) tables[id] = pages.slice();
    this.emit({
      event: "snapshot", active: this.active.map((r) => r.id), queued: this.waiting.map((r) => r.id),
      reserved_blocks: reserved, draining_blocks: this.draining, allocated_blocks: capacity - free,
      free_blocks: free, admission_headroom: Math.max(0, capacity - reserved - this.draining), block_tables: tables,
    });
    return plan.rows;
  }

  dispatch(rows) {
    let used = 0;
    for (const [, , n] of rows) used += n;
    this.emit({ event: "dispatch", work: rows.map(([req, phase, n]) => ({ id: req.id, phase, input_tokens: n })),
      unused_budget: this.cfg.token_budget - used });
    this.dispatches += 1;
    this.inputTokens += used;
    this.now += 1;
    for (const [req, phase, n] of rows) {
      req.written += n;
      const table = this.tables.get(req.id);
      const grow = ceilDiv(req.written, this.cfg.block_size) - table.length;
      if (grow > 0) {
        table.push(...this.free.splice(0, grow));
        if (table.length > req.claim) this.hold(req);
      }
      if (phase === "recompute" || req.written !== req.prompt + req.tokens.length) continue;
      req.tokens.push(this.now);
      this.emit({ event: "token", id: req.id, output_index: req.tokens.length });
      if (req.tokens.length === req.output) this.retire(req, "finished");
    }
  }

  busy() { return this.waiting.length > 0 || this.active.length > 0 || this.releases.length > 0; }

  run(trace) {
    let i = 0;
    while (i < trace.length || this.busy()) {
      while (i < trace.length && trace[i].time === this.now) {
        const line = trace[i++];
        if (line.event === "arrival") this.arrive(line);
        else this.cancel(line.id);
      }
      const rows = this.boundary();
      if (rows.length) {
        this.dispatch(rows);
        continue;
      }
      const upcoming = [];
      if (i < trace.length) upcoming.push(trace[i].time);
      if (this.releases.length) upcoming.push(this.releases[0][0]);
      if (!upcoming.length) break;
      this.now = Math.min(...upcoming);
    }
  }

  report(asked) {
    const requests = Object.create(null);
    const counts = { finished: 0, cancelled: 0, rejected: 0 };
    for (const req of this.requests.values()) {
      if (has(counts, req.status)) counts[req.status] += 1;
      const t = req.tokens;
      requests[req.id] = {
        status: req.status, arrival: req.arrival, admitted: req.admitted, end: req.end, output_tokens: t.length,
        token_times: t, queue_ticks: req.admitted === null ? null : req.admitted - req.arrival,
        ttft_ticks: t.length ? t[0] - req.arrival : null, itl_ticks: t.slice(1).map((x, k) => x - t[k]),
      };
    }
    const config = {};
    for (const key of Object.keys(SETTINGS)) if (key !== "admission" || has(asked, key)) config[key] = this.cfg[key];
    return {
      schema_version: 1, time_unit: "synthetic_tick", config, requests, events: this.events,
      summary: { drained_at_tick: this.now, dispatches: this.dispatches, processed_input_tokens: this.inputTokens,
        free_blocks: this.free.length, ...counts },
    };
  }
}

function main(text) {
  let request;
  try {
    request = JSON.parse(text);
  } catch (err) {
    throw new Invalid(`stdin: not JSON: ${err.message}`);
  }
  if (!isObject(request) || !has(request, "trace") || !has(request, "config")) {
    throw new Invalid('stdin: expected a JSON object with "trace" and "config"');
  }
  const cfg = checkConfig(request.config);
  const trace = checkTrace(request.trace);
  const sched = new Scheduler(cfg);
  sched.run(trace);
  return sched.report(request.config);
}

const chunks = [];
process.stdin.on("data", (chunk) => chunks.push(chunk));
process.stdin.on("end", () => {
  try {
    process.stdout.write(JSON.stringify(main(Buffer.concat(chunks).toString("utf8"))) + "\n");
  } catch (err) {
    process.stderr.write(`error: ${err.message}\n`);
    process.exitCode = err instanceof Invalid ? REFUSED : 1;
  }
});
