/* toolq console: live updates without reloading. No dependencies, nothing fetched from elsewhere.
 *
 * - Countdowns (time[data-due-ms]) and ages (time[data-since-ms]) tick every second,
 *   on the server's clock (body[data-now-ms] says what it was when the page was made).
 * - The overview and the lists fetch their live part ([data-live-url]) every
 *   body[data-refresh-ms], keeping what is ticked and focused.
 * - The operation page (#op) follows the API's event stream for the operation and
 *   fetches the parts of the page that changed on each event; once the operation
 *   waits on a person it polls instead, until it moves on.
 * - When the server does not answer, #connection says so, and every part carries on by
 *   itself once it answers again (EventSource reconnects; polling resumes).
 */
(() => {
  "use strict";
  const body = document.body;
  const base = body.dataset.base || "";
  const refreshMs = Math.max(500, Number(body.dataset.refreshMs) || 3000);
  const offset = (Number(body.dataset.nowMs) || Date.now()) - Date.now();
  const now = () => Date.now() + offset;
  const RETRY_MS = 2000;

  // ------------------------------------------------------------------ the connection notice

  const connection = document.getElementById("connection");
  const down = new Set();
  function setDown(part, isDown) {
    if (isDown) down.add(part); else down.delete(part);
    if (connection) connection.hidden = down.size === 0;
  }

  // ------------------------------------------------------------------ times

  function duration(seconds) {
    const s = Math.max(0, Math.floor(seconds));
    if (s < 60) return `${s} s`;
    if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
    if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
    return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
  }

  function tick() {
    for (const el of document.querySelectorAll("time[data-due-ms]")) {
      const left = Number(el.dataset.dueMs) - now();
      el.textContent = left > 0 ? `in ${duration(Math.ceil(left / 1000))}` : "due now";
    }
    for (const el of document.querySelectorAll("time[data-since-ms]")) {
      el.textContent = duration((now() - Number(el.dataset.sinceMs)) / 1000);
    }
  }
  setInterval(tick, 1000);

  // ------------------------------------------------------------------ fragments

  const loginUrl = () =>
    `${base}/login?next=${encodeURIComponent(location.pathname + location.search)}`;

  class Gone extends Error {}

  async function fetchFragment(url) {
    const r = await fetch(url, {
      credentials: "same-origin",
      cache: "no-store",
      headers: { "X-Requested-With": "fetch" },
    });
    if (r.status === 401) {
      location.assign(loginUrl());
      throw new Gone("log in again");
    }
    if (r.status === 404) throw new Gone("not found");
    if (!r.ok) throw new Error(`HTTP ${r.status}`);
    const token = r.headers.get("X-CSRF-Token");
    if (token) {
      // A restarted server without tokens signs with a new key: forms take the new token.
      for (const input of document.querySelectorAll("input[name=csrf]")) input.value = token;
    }
    const t = document.createElement("template");
    t.innerHTML = await r.text();
    return t.content;
  }

  function replaceKeeping(target, nodes) {
    const ticked = new Set(
      [...target.querySelectorAll("input[type=checkbox][name=ref]:checked")].map((c) => c.value),
    );
    const active = document.activeElement;
    const focusId = active && target.contains(active) ? active.id : "";
    target.replaceChildren(...nodes);
    for (const c of target.querySelectorAll("input[type=checkbox][name=ref]")) {
      c.checked = ticked.has(c.value);
    }
    if (focusId) document.getElementById(focusId)?.focus();
    tick();
  }

  function say(level, text) {
    const flash = document.getElementById("flash");
    if (!flash) return;
    const p = document.createElement("p");
    p.className = `flash ${level}`;
    const strong = document.createElement("strong");
    strong.textContent = level === "ok" ? "Done:" : "Problem:";
    p.append(strong, ` ${text}`);
    flash.replaceChildren(p);
  }

  // ------------------------------------------------------------------ overview and lists

  function poll(el) {
    const url = el.dataset.liveUrl;
    const part = el.id || url;
    const run = async () => {
      let delay = refreshMs;
      if (!document.hidden) {
        try {
          replaceKeeping(el, [...(await fetchFragment(url)).childNodes]);
          setDown(part, false);
        } catch (err) {
          if (err instanceof Gone) return;
          setDown(part, true);
          delay = Math.min(refreshMs, RETRY_MS);
        }
      }
      setTimeout(run, delay);
    };
    setTimeout(run, refreshMs);
  }

  // ------------------------------------------------------------------ one operation

  function followOperation(op) {
    const liveUrl = op.dataset.liveUrl;
    const eventsUrl = op.dataset.eventsUrl;
    const head = () => document.getElementById("op-head");
    let stream = null;
    let watch = null;
    let retry = null;
    let busy = false;
    let again = false;

    function showState(state) {
      const badge = document.querySelector("#op-state .state");
      if (!badge) return;
      badge.textContent = state;
      badge.className = `state state-${state}`;
    }

    function closeStream() {
      if (stream) stream.close();
      stream = null;
    }

    function openStream() {
      const url = `${eventsUrl}&after=${encodeURIComponent(head().dataset.seen || "0")}`;
      const es = new EventSource(url);
      stream = es;
      es.addEventListener("open", () => setDown("op", false));
      es.addEventListener("state", (e) => {
        showState(JSON.parse(e.data).state);
        refresh();
      });
      es.addEventListener("envelope", () => {
        // The stream ends here; left open, EventSource would connect again.
        closeStream();
        refresh();
      });
      es.addEventListener("error", () => {
        if (stream !== es) return;
        setDown("op", true);
        if (es.readyState === EventSource.CLOSED) {
          // An HTTP error (not a dropped connection): the browser does not retry those.
          closeStream();
          later();
        }
      });
    }

    function later() {
      if (!retry) retry = setTimeout(() => { retry = null; refresh(); }, RETRY_MS);
    }

    // Follow the stream while the runtime still has work; poll while a person has.
    function follow() {
      const h = head();
      if (h.dataset.settled !== "yes") {
        if (watch) clearInterval(watch);
        watch = null;
        if (!stream) openStream();
      } else {
        closeStream();
        if (h.dataset.terminal === "yes") {
          if (watch) clearInterval(watch);
          watch = null;
        } else if (!watch) {
          watch = setInterval(refresh, refreshMs);
        }
      }
    }

    async function refresh() {
      if (busy) {
        again = true;
        return;
      }
      busy = true;
      try {
        const frag = await fetchFragment(liveUrl);
        setDown("op", false);
        const actions = document.getElementById("op-actions");
        const fresh = frag.querySelector("#op-actions");
        for (const id of ["op-head", "op-body"]) {
          const el = frag.querySelector(`#${id}`);
          if (el) document.getElementById(id).replaceWith(el);
        }
        // The actions (and a half-filled input form) change only when the state does.
        if (fresh && actions && fresh.dataset.state !== actions.dataset.state) actions.replaceWith(fresh);
        tick();
        follow();
      } catch (err) {
        if (!(err instanceof Gone)) {
          setDown("op", true);
          later();
        }
      } finally {
        busy = false;
        if (again) {
          again = false;
          refresh();
        }
      }
    }

    // Actions from this page are sent by script, so the page (and its stream) stays.
    document.addEventListener("submit", async (ev) => {
      const form = ev.target;
      if (!(form instanceof HTMLFormElement) || !form.matches("form[data-enhance]")) return;
      ev.preventDefault();
      const button = form.querySelector("button");
      if (button) button.disabled = true;
      try {
        const r = await fetch(form.action, {
          method: "POST",
          body: new URLSearchParams(new FormData(form)),
          credentials: "same-origin",
          headers: { "X-Requested-With": "fetch" },
        });
        if (r.status === 401) {
          location.assign(loginUrl());
          return;
        }
        const answer = await r.json();
        say(answer.ok ? "ok" : "error", answer.message);
        // Straight back to the stream: the action's own transition is its first event.
        if (answer.ok && !stream) {
          if (watch) clearInterval(watch);
          watch = null;
          openStream();
        }
        refresh();
      } catch {
        say("error", "The server did not answer; try again.");
      } finally {
        if (button) button.disabled = false;
      }
    });

    follow();
  }

  // ------------------------------------------------------------------ start

  document.addEventListener("change", (ev) => {
    const box = ev.target;
    if (box instanceof HTMLInputElement && box.matches("[data-select-all]") && box.form) {
      for (const c of box.form.querySelectorAll("input[type=checkbox][name=ref]")) {
        c.checked = box.checked;
      }
    }
  });

  const op = document.getElementById("op");
  if (op) followOperation(op);
  for (const el of document.querySelectorAll("[data-live-url]")) {
    if (el !== op) poll(el);
  }
  tick();
})();
