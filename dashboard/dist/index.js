(function () {
  "use strict";
  // crash-recovery: a page of the Hermes dashboard for the people who settle
  // protected tool calls whose outcome nobody knows (docs/dashboard.md).
  // Hand-written, no build step: React comes from the dashboard
  // (window.__HERMES_PLUGIN_SDK__).  Every rule (evidence, a running owner,
  // integrity) is the operator commands'; this page shows their answers.
  const SDK = window.__HERMES_PLUGIN_SDK__;
  const PLUGINS = window.__HERMES_PLUGINS__;
  if (!SDK || !PLUGINS) return;

  const React = SDK.React;
  const h = React.createElement;
  const { useState, useEffect, useCallback, useRef } = SDK.hooks;
  const C = SDK.components || {};
  const NAME = "crash-recovery";
  const TAB_PATH = "/crash-recovery";
  const POLL_MS = 5000;          // the page
  const BANNER_POLL_MS = 15000;  // every other page
  const BASE = (function () {
    const base = window.__HERMES_BASE_PATH__ || "";
    return base ? ("/" + base.replace(/^\/+|\/+$/g, "")) : "";
  })();
  const API = BASE + "/api/plugins/" + NAME;

  // ------------------------------------------------------------- the API --

  // Every answer is a JSON document with "ok"; a refusal keeps the CLI's
  // error code, message and hint, whatever the HTTP status.
  async function call(path, options) {
    const headers = Object.assign({}, (options && options.headers) || {});
    const token = window.__HERMES_SESSION_TOKEN__;
    if (token) headers["X-Hermes-Session-Token"] = token;
    let response;
    try {
      response = await fetch(API + path, Object.assign({}, options, { headers, credentials: "include" }));
    } catch (error) {
      return { ok: false, error: { code: "dashboard_unreachable", message: String(error) } };
    }
    let document = null;
    try { document = await response.json(); } catch (error) { document = null; }
    if (document && typeof document === "object" && "ok" in document) return document;
    return { ok: false, error: { code: "http_" + response.status,
      message: (document && document.detail) || ("the dashboard answered HTTP " + response.status) } };
  }

  // Inside a frame another page could lay over the buttons (clickjacking):
  // the page then shows what it knows but settles nothing.
  function framed() {
    try { return window.top !== window.self; } catch (error) { return true; }
  }
  const FRAMED_ANSWER = { ok: false, error: { code: "framed", message:
    "this page is shown inside another page's frame, so it settles nothing: open the dashboard itself" } };

  function post(path, body) {
    if (framed()) return Promise.resolve(FRAMED_ANSWER);
    return call(path, { method: "POST", headers: { "Content-Type": "application/json" },
                        body: JSON.stringify(body) });
  }

  async function downloadCheckpoint() {
    const headers = {};
    const token = window.__HERMES_SESSION_TOKEN__;
    if (token) headers["X-Hermes-Session-Token"] = token;
    const response = await fetch(API + "/checkpoint", { headers, credentials: "include" });
    if (!response.ok) {
      let document = null;
      try { document = await response.json(); } catch (error) { document = null; }
      return document || { ok: false, error: { code: "http_" + response.status, message: "download refused" } };
    }
    const disposition = response.headers.get("Content-Disposition") || "";
    const match = /filename="([^"]+)"/.exec(disposition);
    const url = URL.createObjectURL(await response.blob());
    const link = document.createElement("a");
    link.href = url;
    link.download = match ? match[1] : "crash-recovery-checkpoint.json";
    document.body.appendChild(link);
    link.click();
    link.remove();
    setTimeout(function () { URL.revokeObjectURL(url); }, 10000);
    return { ok: true, downloaded: link.download };
  }

  // ------------------------------------------------------------ wording --

  function describeAge(seconds) {
    if (typeof seconds !== "number") return "-";
    if (seconds < 90) return Math.round(seconds) + " s";
    if (seconds < 5400) return Math.round(seconds / 60) + " min";
    if (seconds < 172800) return (seconds / 3600).toFixed(1) + " h";
    return (seconds / 86400).toFixed(1) + " days";
  }

  function ownerText(operation) {
    if (operation.owner === "running") return "running (pid " + operation.owner_pid + ")";
    return operation.owner || "unknown";
  }

  // What needs a person: the reasons of `status --check` (docs/cli.md §status).
  function reasonsOf(status) {
    return (status && status.check && status.check.reasons) || [];
  }

  // An operation brought back for a lost event has no start of its own: the
  // window in which its call, if any, happened (docs/cli.md, lost_after/lost_before).
  const WINDOW_STARTS = { last_verified_event: "the last verified event", journal_created: "the journal's creation",
                          marker_written: "the journal's marker was written" };
  function lostWindowText(op) {
    const after = op.lost_after ? "after " + op.lost_after + " UTC (" + (WINDOW_STARTS[op.lost_after_source] || "recorded") + ")"
                                : "at a time nothing recorded bounds";
    return "a call lost in a crash: if it happened, it started " + after + " and before " + op.lost_before +
      " UTC (when it was brought back); its tool, session and tool call are unknown: check the services for any call in that window";
  }

  // open / busy / closed / untrusted, a sentence saying why, and whether a
  // person is needed (then the page is as loud as for a closed gate).
  function gateOf(status) {
    if (!status) return { state: "loading", why: "reading the journal...", loud: false };
    if (!status.ok) {
      const error = status.error || {};
      if (status.integrity && status.integrity !== "ok")
        return { state: "untrusted", loud: true, why: "the journal cannot be trusted (" + status.integrity + "): " + (error.message || "") };
      return { state: "closed", loud: true, why: (error.code || "error") + ": " + (error.message || "") };
    }
    const needed = reasonsOf(status).length > 0;
    const waiting = (status.unresolved || []).filter(function (op) {
      return !(op.state === "pending" && op.owner === "running"); });
    if (status.gate === "closed")
      return { state: "closed", loud: true, why: waiting.length ? waiting.length + " protected call(s) with an unknown outcome block every protected tool in this profile until a person settles them" : "every protected call is refused" };
    const forcedRunning = (status.resolved_running || []).length;
    const alsoNeeded = (forcedRunning ? "; a call resolved with force still runs (below)" : "") +
      (needed ? "; but something needs a person (below)" : "");
    if (status.gate === "busy")
      return { state: "busy", loud: needed, forcedRunning: forcedRunning, why: "a protected call is running now; other protected calls are refused until it ends" + alsoNeeded };
    if (status.journal === "absent")
      return { state: "open", loud: needed, why: "no protected call has run in this profile yet (the first one creates the journal)" + alsoNeeded };
    return { state: "open", loud: needed, forcedRunning: forcedRunning, why: (needed ? "protected calls may run" : "nothing unresolved") + "; the journal verified (" + ((status.checkpoint || {}).count || 0) + " events)" + alsoNeeded };
  }

  const GATE_COLOURS = { open: "#2e7d32", busy: "#b26a00", closed: "#c62828", untrusted: "#8e0000", loading: "#666" };
  const GATE_WORDS = { open: "OPEN", busy: "BUSY", closed: "CLOSED", untrusted: "CANNOT BE TRUSTED", loading: "..." };
  const LOUD = "#c62828";  // a person is needed: as loud as a closed gate

  // A person is needed: red (dark red for an untrusted journal); a call
  // resolved with force still running: the colour of a busy gate.
  function gateColour(gate) {
    if (gate.loud) return gate.state === "untrusted" ? GATE_COLOURS.untrusted : LOUD;
    return gate.forcedRunning ? GATE_COLOURS.busy : GATE_COLOURS[gate.state];
  }

  // ------------------------------------------------------------- pieces --

  function Section(props) {
    const Card = C.Card, CardHeader = C.CardHeader, CardTitle = C.CardTitle, CardContent = C.CardContent;
    if (Card && CardHeader && CardTitle && CardContent) {
      return h(Card, { "data-testid": props.testid },
        h(CardHeader, null, h(CardTitle, null, props.title)),
        h(CardContent, null, props.children));
    }
    return h("section", { "data-testid": props.testid, style: { border: "1px solid #8884", padding: 12 } },
      h("h3", null, props.title), props.children);
  }

  function Btn(props) {
    const Button = C.Button || "button";
    return h(Button, Object.assign({ type: "button" }, props));
  }

  function Answer(props) {
    const answer = props.answer;
    if (!answer) return null;
    if (answer.ok) {
      return h("div", { "data-testid": props.testid, "data-ok": "true", style: { color: GATE_COLOURS.open, marginTop: 6 } },
        props.success || "done");
    }
    const error = answer.error || {};
    return h("div", { "data-testid": props.testid, "data-ok": "false", "data-code": error.code || "",
                      role: "alert", style: { color: GATE_COLOURS.closed, marginTop: 6, whiteSpace: "pre-wrap" } },
      h("strong", null, error.code || "error"), ": ", error.message || "",
      error.hint ? h("div", { style: { opacity: 0.85 } }, "next step: ", error.hint) : null,
      error.next ? h("div", { style: mono }, "next command: ", error.next) : null,
      answer.integrity && answer.integrity !== "ok" ? h("div", null, "integrity: ", answer.integrity) : null);
  }

  const cell = { padding: "4px 8px", verticalAlign: "top", textAlign: "left" };
  const mono = { fontFamily: "ui-monospace, monospace", fontSize: "0.85em", wordBreak: "break-all" };
  const fieldStyle = { width: "100%", minHeight: 60, fontFamily: "inherit", padding: 6,
                       background: "transparent", color: "inherit", border: "1px solid #8886" };

  // Settle one open operation: outcome, evidence, and --force with a reason.
  function SettleForm(props) {
    const op = props.operation;
    const [outcome, setOutcome] = useState("");
    const [evidence, setEvidence] = useState("");
    const [force, setForce] = useState(false);
    const [busy, setBusy] = useState(false);
    const [answer, setAnswer] = useState(null);
    const submit = useCallback(async function () {
      setBusy(true);
      const result = await post("/operations/" + encodeURIComponent(op.operation_id) + "/resolve",
                                { outcome: outcome, evidence: evidence, force: force });
      setBusy(false);
      setAnswer(result);
      props.onDone();
    }, [op.operation_id, outcome, evidence, force]);
    const id = op.operation_id;
    const running = op.owner === "running";
    return h("div", { "data-testid": "cr-settle-" + id, style: { padding: 8, borderLeft: "3px solid #c62828", margin: "6px 0" } },
      running ? h("div", { "data-testid": "cr-force-needed-" + id, style: { marginBottom: 6, fontWeight: "bold" } },
        "This call is still running (pid " + op.owner_pid + "): it records its own outcome when it ends, so it can only be resolved by force. ",
        "Do that only if its worker hangs and cannot be stopped; protected calls then run again while it still may act.") : null,
      h("div", { style: { marginBottom: 6 } },
        "Stop every worker of this profile, check the real service for this call (",
        op.lost_before ? h("span", { "data-testid": "cr-lost-window-" + id }, lostWindowText(op)) : [
          "tool ", h("code", { key: "t" }, op.tool), ", session ", h("code", { key: "s" }, String(op.session_id)), ", tool call ",
          h("code", { key: "c" }, String(op.tool_call_id)), ", started ", op.started_at],
        "), then record what you found. ",
        "Cannot tell? Do not settle: the gate stays closed, which is safe."),
      h("label", { style: { marginRight: 12 } },
        h("input", { type: "radio", name: "outcome-" + id, value: "completed", "data-testid": "cr-outcome-completed-" + id,
                     checked: outcome === "completed", onChange: function () { setOutcome("completed"); } }),
        " completed (the side effect happened)"),
      h("label", null,
        h("input", { type: "radio", name: "outcome-" + id, value: "not_applied", "data-testid": "cr-outcome-not_applied-" + id,
                     checked: outcome === "not_applied", onChange: function () { setOutcome("not_applied"); } }),
        " not_applied (it did not; nothing is retried)"),
      h("textarea", { "data-testid": "cr-evidence-" + id, placeholder: "evidence: what you checked in the real service (receipt, ledger row, log line)",
                      value: evidence, onChange: function (event) { setEvidence(event.target.value); }, style: fieldStyle }),
      running ? h("label", { style: { display: "block", margin: "4px 0" } },
        h("input", { type: "checkbox", "data-testid": "cr-force-" + id, checked: force,
                     onChange: function (event) { setForce(event.target.checked); } }),
        " force: its worker still runs (pid " + op.owner_pid + "); settle anyway only if it can no longer act, and say why in the evidence") : null,
      h(Btn, { "data-testid": "cr-submit-" + id, disabled: busy || !outcome || (running && !force), onClick: submit },
        busy ? "settling..." : running && !force ? "Record the outcome (tick force first)" : "Record the outcome"),
      h(Answer, { answer: answer, testid: "cr-answer-" + id, success: "settled: " + (answer && answer.outcome) + (answer && answer.forced ? " (forced)" : "") }));
  }

  function AcknowledgeForm(props) {
    const op = props.operation;
    const [evidence, setEvidence] = useState("");
    const [busy, setBusy] = useState(false);
    const [answer, setAnswer] = useState(null);
    const submit = useCallback(async function () {
      setBusy(true);
      const result = await post("/operations/" + encodeURIComponent(op.operation_id) + "/acknowledge", { evidence: evidence });
      setBusy(false);
      setAnswer(result);
      props.onDone();
    }, [op.operation_id, evidence]);
    const id = op.operation_id;
    return h("div", { "data-testid": "cr-ack-form-" + id, style: { padding: 8, borderLeft: "3px solid #b26a00", margin: "6px 0" } },
      h("textarea", { "data-testid": "cr-ack-evidence-" + id, placeholder: "what you did about the late outcome (compared it with your resolution, fixed the real world)",
                      value: evidence, onChange: function (event) { setEvidence(event.target.value); }, style: fieldStyle }),
      h(Btn, { "data-testid": "cr-ack-submit-" + id, disabled: busy, onClick: submit }, busy ? "acknowledging..." : "Acknowledge"),
      h(Answer, { answer: answer, testid: "cr-ack-answer-" + id, success: "acknowledged" }));
  }

  function History(props) {
    const [shown, setShown] = useState(null);
    useEffect(function () {
      let live = true;
      setShown(null);
      call("/operations/" + encodeURIComponent(props.operationId)).then(function (result) { if (live) setShown(result); });
      return function () { live = false; };
    }, [props.operationId, props.version]);
    if (!shown) return h("div", null, "reading the history...");
    if (!shown.ok) return h(Answer, { answer: shown, testid: "cr-history-error" });
    return h("div", { "data-testid": "cr-history" },
      h("div", null, "Operation ", h("code", { style: mono }, props.operationId), ": ", shown.operation.state,
        shown.archive ? " (in archive " + shown.archive + ")" : ""),
      h("table", { style: { borderCollapse: "collapse", width: "100%" } },
        h("thead", null, h("tr", null, ["seq", "at (UTC)", "kind", "detail"].map(function (name) {
          return h("th", { key: name, style: cell }, name); }))),
        h("tbody", null, (shown.events || []).map(function (event) {
          const detail = event.kind === "started" ? event.tool :
            event.kind === "resolved" ? event.outcome + ": " + event.evidence + (event.operator ? " (" + (event.operator.user || "?") + (event.operator.via ? " via " + event.operator.via : "") + ")" : "") :
            event.kind === "acknowledged" ? event.evidence : (event.reason || "");
          return h("tr", { key: event.seq, "data-testid": "cr-event-" + event.kind },
            h("td", { style: cell }, event.seq), h("td", { style: cell }, event.at),
            h("td", { style: cell }, event.kind), h("td", { style: Object.assign({}, cell, { whiteSpace: "pre-wrap" }) }, detail));
        }))));
  }

  function runningNow(op) { return op.state === "pending" && op.owner === "running"; }

  function Operations(props) {
    const status = props.status;
    const [open, setOpen] = useState(null);
    const unresolved = (status && status.ok && status.unresolved) || [];
    if (!unresolved.length) return h("div", { "data-testid": "cr-no-unresolved" }, "No unresolved operation.");
    return h("div", null, unresolved.map(function (op) {
      const id = op.operation_id;
      return h("div", { key: id, "data-testid": "cr-op-" + id, "data-state": op.state, "data-owner": op.owner || "",
                        style: { borderTop: "1px solid #8883", padding: "8px 0" } },
        h("div", null, h("strong", null, op.tool), " - ", h("span", { "data-testid": "cr-op-state-" + id }, op.state),
          op.reason ? " (" + op.reason + ")" : "",
          op.lost_before ? [", ", h("span", { key: "w", "data-testid": "cr-op-window-" + id }, lostWindowText(op)), ", recorded ",
                            op.recorded_at, " UTC, "]
                         : [", started ", op.started_at, " UTC, "],
          describeAge(op.age_seconds),
          op.clock_ahead_seconds ? " in the future (its process's clock was ahead)" : " ago", ", owner ",
          h("span", { "data-testid": "cr-op-owner-" + id }, ownerText(op))),
        h("div", { style: mono }, "operation ", id, op.lost_before ? " | session and tool call unknown"
                                                    : " | session " + String(op.session_id) + " | tool call " + String(op.tool_call_id)),
        runningNow(op) ? h("div", { "data-testid": "cr-op-running-" + id, style: { marginTop: 4 } },
          "Running now: nothing to settle while it runs (other protected calls wait for it). It can only be forced, if its worker hangs.") : null,
        h("div", { style: { marginTop: 4, display: "flex", gap: 8 } },
          h(Btn, { "data-testid": "cr-settle-open-" + id, onClick: function () { setOpen(open === id ? null : id); } },
            open === id ? "Close" : runningNow(op) ? "Force a resolution..." : "Settle..."),
          h(Btn, { "data-testid": "cr-history-open-" + id, onClick: function () { props.onHistory(id); } }, "History")),
        open === id ? h(SettleForm, { operation: op, onDone: props.onChanged }) : null);
    }));
  }

  function Attention(props) {
    const attention = (props.status && props.status.ok && props.status.attention) || [];
    if (!attention.length) return h("div", { "data-testid": "cr-no-attention" }, "No late outcome awaits acknowledgement.");
    return h("div", null, attention.map(function (op) {
      return h("div", { key: op.operation_id, "data-testid": "cr-late-" + op.operation_id, style: { padding: "6px 0" } },
        h("div", null, h("strong", null, op.tool), " ended (", op.late_reason, ") after it was resolved",
          op.outcome ? "; you resolved it as " + op.outcome : "", ". Compare the two; fix the real world if they disagree (history: ",
          h("a", { href: "#", onClick: function (event) { event.preventDefault(); props.onHistory(op.operation_id); } }, "show"), ")."),
        h("div", { style: mono }, op.operation_id),
        h(AcknowledgeForm, { operation: op, onDone: props.onChanged }));
    }));
  }

  // Every reason `status --check` gives, in its words.
  function NeedsPerson(props) {
    const reasons = reasonsOf(props.status);
    if (!reasons.length || !props.status.ok) return null;
    return h("ul", { "data-testid": "cr-needs-person", role: "alert", style: { color: LOUD, margin: "6px 0", paddingLeft: 18 } },
      reasons.map(function (reason, index) {
        return h("li", { key: index, "data-code": reason.code }, h("strong", null, reason.code), ": ", reason.message);
      }));
  }

  // Calls resolved with force whose worker still runs: their late outcome may arrive.
  function ResolvedRunning(props) {
    const running = (props.status && props.status.resolved_running) || [];
    if (!running.length) return null;
    return h("div", { "data-testid": "cr-resolved-running", style: { marginTop: 6, color: GATE_COLOURS.busy } },
      h("strong", null, running.length + " call(s) resolved with force still run"),
      ": each may yet record a late outcome, and archiving waits for them. Stop the worker when it can no longer act.",
      h("ul", { style: { margin: "4px 0", paddingLeft: 18 } }, running.map(function (entry) {
        return h("li", { key: entry.operation_id, style: mono }, "operation " + entry.operation_id + ", pid " + entry.pid);
      })));
  }

  // The workers of this profile the status knows to be alive, and how.
  const KNOWN_AS = { running_call: "its protected call is running", resolved_call: "it still runs a call resolved with force",
                     owner: "it holds an open operation", journal_open: "it has the journal open", recorded_first_call: "the last worker to start here" };
  function WorkersRunning(props) {
    const known = (props.status && props.status.workers_running) || [];
    if (!known.length) return null;
    return h("div", { "data-testid": "cr-workers-running", style: { marginTop: 6, opacity: 0.85 } },
      "Workers of this profile known to run (stop them before any repair): ",
      known.map(function (entry) { return "pid " + entry.pid + " (" + (KNOWN_AS[entry.known_as] || entry.known_as) + ")"; }).join("; "));
  }

  function Settings(props) {
    const settings = props.status && props.status.settings;
    if (!settings) return h("div", null, "-");
    const rest = Object.keys(settings).filter(function (key) { return key !== "problem"; });
    const reaching = settings.agent_reaches_journal || [];
    const unmatched = settings.unmatched_tools || [];
    return h("div", { "data-testid": "cr-settings" },
      settings.problem ? h("div", { "data-testid": "cr-settings-problem", role: "alert", style: { color: GATE_COLOURS.closed } },
        "SETTINGS PROBLEM (every tool is protected until fixed): ", settings.problem) : null,
      reaching.length ? h("div", { "data-testid": "cr-agent-reaches-journal", role: "alert", style: { color: GATE_COLOURS.closed } },
        "THE AGENT CAN REACH THE JOURNAL: while the gate is closed it may still run ", reaching.join(", "),
        ", which may change the journal's files and the plugin's settings (allowed_while_closed or read_only_tools)") : null,
      unmatched.length ? h("div", { "data-testid": "cr-unmatched-tools", role: "alert", style: { color: settings.mode === "protected_tools" ? GATE_COLOURS.closed : "inherit" } },
        "No tool of this host has the name ", unmatched.join(", "), settings.mode === "protected_tools" ?
          ": it protects nothing, and the real tool runs unrecorded. Fix the spelling in protected_tools, then restart the workers." :
          ": listing it changes nothing.") : null,
      settings.recorded_at ? h("div", { style: { opacity: 0.75 } }, "as a worker (pid " + settings.recorded_by_pid + ") read them at " + settings.recorded_at) : null,
      h("table", null, h("tbody", null, rest.map(function (key) {
        return h("tr", { key: key }, h("td", { style: cell }, key),
          h("td", { style: Object.assign({}, cell, mono) }, JSON.stringify(settings[key])));
      }))));
  }

  function Integrity(props) {
    const status = props.status;
    const [verified, setVerified] = useState(null);
    const [download, setDownload] = useState(null);
    const checkpoint = status && status.checkpoint;
    const error = status && !status.ok ? status.error || {} : null;
    return h("div", { "data-testid": "cr-integrity", "data-integrity": (status && status.integrity) || "" },
      h("div", null, "Verdict: ", h("strong", null, (status && status.integrity) || "-"),
        status && status.journal === "absent" ? " (no journal yet: the profile's first protected call creates it)" : null),
      error ? h("div", { style: { color: GATE_COLOURS.closed } }, error.message,
        error.hint ? h("div", null, "Next step: ", error.hint) : null,
        error.next ? h("div", { style: mono }, "Next command: ", error.next) : null) : null,
      checkpoint ? h("div", { style: mono }, "journal ", checkpoint.journal_id, " | ", checkpoint.count, " events | head ", checkpoint.head) : null,
      h("div", { style: { display: "flex", gap: 8, marginTop: 6 } },
        h(Btn, { "data-testid": "cr-verify", onClick: async function () { setVerified({ pending: true }); setVerified(await call("/verify")); } }, "Verify now (full)"),
        h(Btn, { "data-testid": "cr-download-checkpoint", onClick: async function () { setDownload(await downloadCheckpoint()); } }, "Download checkpoint")),
      verified && verified.pending ? h("div", null, "verifying...") : null,
      verified && !verified.pending ? h(Answer, { answer: verified, testid: "cr-verify-answer",
        success: "verified: " + verified.count + " events, " + verified.unresolved_count + " unresolved, " + (verified.repairs || []).length + " past repair(s)" }) : null,
      h(Answer, { answer: download, testid: "cr-download-answer", success: "saved " + (download && download.downloaded) + ": keep it where the agent's host cannot write" }));
  }

  function Archives(props) {
    const archives = props.archives;
    if (!archives) return h("div", null, "-");
    if (!archives.ok) return h(Answer, { answer: archives, testid: "cr-archives-error" });
    if (!archives.archives.length) return h("div", { "data-testid": "cr-archives" }, "No archive: the whole history is in the live segment.");
    return h("table", { "data-testid": "cr-archives" }, h("tbody", null, archives.archives.map(function (anchor) {
      return h("tr", { key: anchor.journal_id }, h("td", { style: Object.assign({}, cell, mono) }, anchor.file),
        h("td", { style: cell }, anchor.count + " events"), h("td", { style: Object.assign({}, cell, mono) }, anchor.head));
    })));
  }

  // ------------------------------------------------------------ the page --

  // Settling on the page tells every other part (the banner) to read again.
  const CHANGED_EVENT = "crash-recovery-changed";

  function usePolled(path, everyMs) {
    const [document, setDocument] = useState(null);
    const [version, setVersion] = useState(0);
    const timer = useRef(null);
    useEffect(function () {
      let live = true;
      async function tick() {
        clearTimeout(timer.current);
        const result = await call(path);
        if (!live) return;
        setDocument(result);
        timer.current = setTimeout(tick, everyMs);  // the next read starts after this one ended
      }
      tick();
      return function () { live = false; clearTimeout(timer.current); };
    }, [path, everyMs, version]);
    useEffect(function () {
      const again = function () { setVersion(function (v) { return v + 1; }); };
      window.addEventListener(CHANGED_EVENT, again);
      return function () { window.removeEventListener(CHANGED_EVENT, again); };
    }, []);
    return [document];
  }

  // The profile Hermes' own pages show: the header's selector writes it into
  // the address (?profile=); before it does, the dashboard's sticky profile.
  function useHermesProfile() {
    const [sticky, setSticky] = useState(null);
    useEffect(function () {
      let live = true;
      const headers = {};
      const token = window.__HERMES_SESSION_TOKEN__;
      if (token) headers["X-Hermes-Session-Token"] = token;
      fetch(BASE + "/api/profiles/active", { headers, credentials: "include" })
        .then(function (response) { return response.ok ? response.json() : null; })
        .then(function (found) { if (live && found && found.active) setSticky(found.active); })
        .catch(function () {});
      return function () { live = false; };
    }, []);
    return new URLSearchParams(window.location.search).get("profile") || sticky;
  }

  function Page() {
    const [status] = usePolled("/status", POLL_MS);
    const [archives, setArchives] = useState(null);
    const [historyOf, setHistoryOf] = useState(null);
    const [changes, setChanges] = useState(0);
    const journalId = status && status.checkpoint ? status.checkpoint.journal_id : null;
    useEffect(function () { call("/archives").then(setArchives); }, [journalId]);
    const onChanged = function () {
      setChanges(function (n) { return n + 1; });
      window.dispatchEvent(new Event(CHANGED_EVENT));
    };
    const gate = gateOf(status);
    const profile = (status && status.profile) || {};
    const hermesShows = useHermesProfile();
    const otherProfile = hermesShows && profile.name && hermesShows !== profile.name ? hermesShows : null;
    return h("div", { "data-testid": "cr-page", style: { display: "flex", flexDirection: "column", gap: 16 } },
      framed() ? h("div", { "data-testid": "cr-framed", role: "alert", style: { color: GATE_COLOURS.closed } },
        FRAMED_ANSWER.error.message) : null,
      h("div", null,
        h("h2", { style: { margin: 0 } }, "Crash recovery: profile ", h("code", { "data-testid": "cr-profile" }, profile.name || "?")),
        h("div", { "data-testid": "cr-profile-served" }, "This tab serves profile ", h("strong", null, profile.name || "?"),
          ", the profile this dashboard was started with."),
        otherProfile ? h("div", { "data-testid": "cr-profile-other", role: "note", style: { color: GATE_COLOURS.busy, fontWeight: "bold" } },
          "Hermes' own pages here show profile " + otherProfile + " (the profile selector in the header); this tab and its banner always serve profile " +
          profile.name + ". For profile " + otherProfile + "'s journal, run its dashboard (hermes -p " + otherProfile + " dashboard --isolated) or " +
          (profile.command || "hermes crash-recovery").replace(/-p \S+ /, "-p " + otherProfile + " ") + " status.") : null,
        profile.name === "custom" ? h("div", { style: mono }, "a Hermes home outside the profiles: run its commands with HERMES_HOME=", profile.home) : null,
        h("div", { style: Object.assign({ opacity: 0.75 }, mono) }, "data directory ", (status && status.data_dir) || "-",
          " | the same commands in a shell: ", profile.command || "hermes crash-recovery"),
        h("div", { style: { opacity: 0.75 } }, "Refreshes every " + POLL_MS / 1000 + " s. Settling here follows the same rules as the CLI and is recorded with your dashboard identity. ",
          h(Btn, { "data-testid": "cr-refresh", onClick: function () { window.dispatchEvent(new Event(CHANGED_EVENT)); } }, "Refresh now"))),
      h("div", { "data-testid": "cr-gate", "data-gate": gate.state, "data-needs-person": gate.loud ? "true" : "false",
                 style: { border: (gate.loud ? "4px" : "2px") + " solid " + gateColour(gate), padding: 12,
                          background: gate.loud ? gateColour(gate) + "18" : "transparent" } },
        h("div", { style: { fontSize: "1.4em", color: gateColour(gate) } }, "Gate ", GATE_WORDS[gate.state],
          gate.loud && gate.state !== "closed" && gate.state !== "untrusted" ? " - NEEDS A PERSON" : ""),
        h("div", { "data-testid": "cr-gate-why" }, gate.why),
        h(NeedsPerson, { status: status }),
        h(ResolvedRunning, { status: status }),
        h(WorkersRunning, { status: status }),
        status && (status.next || (status.error && status.error.next)) ?
          h("div", { style: mono }, "next command: ", status.next || status.error.next) : null),
      h(Section, { title: "Unresolved operations", testid: "cr-unresolved" },
        h(Operations, { status: status, onChanged: onChanged, onHistory: setHistoryOf })),
      h(Section, { title: "Late outcomes awaiting acknowledgement", testid: "cr-attention" },
        h(Attention, { status: status, onChanged: onChanged, onHistory: setHistoryOf })),
      historyOf ? h(Section, { title: "History", testid: "cr-history-section" },
        h(History, { operationId: historyOf, version: changes })) : null,
      h(Section, { title: "Integrity", testid: "cr-integrity-section" }, h(Integrity, { status: status })),
      h(Section, { title: "Settings as read", testid: "cr-settings-section" }, h(Settings, { status: status })),
      h(Section, { title: "Archives", testid: "cr-archives-section" }, h(Archives, { archives: archives })));
  }

  // A banner on every dashboard page while a person is needed: the gate is
  // closed, or anything else `status --check` names (a late outcome, settings).
  function Banner() {
    const [status] = usePolled("/status", BANNER_POLL_MS);
    const gate = gateOf(status);
    if (!gate.loud) return null;
    const profile = (status && status.profile && status.profile.name) || "?";
    const blocked = gate.state === "closed" || gate.state === "untrusted";
    const reasons = reasonsOf(status);
    return h("div", { "data-testid": "cr-banner", "data-gate": gate.state, role: "alert",
                      style: { background: gateColour(gate), color: "#fff", padding: "6px 16px", zIndex: 30, position: "relative" } },
      blocked ? ["crash-recovery: protected tools are blocked in profile ", h("strong", { key: "p" }, profile), ": ", gate.why, ". "]
        : ["crash-recovery needs a person in profile ", h("strong", { key: "p" }, profile), ": ",
           reasons.map(function (reason) { return reason.code; }).join(", "), " (", (reasons[0] || {}).message, "). "],
      h("a", { href: BASE + TAB_PATH, "data-testid": "cr-banner-link", style: { color: "#fff", textDecoration: "underline" } },
        "Open the Crash recovery page"));
  }

  PLUGINS.register(NAME, Page);
  if (typeof PLUGINS.registerSlot === "function") PLUGINS.registerSlot(NAME, "header-banner", Banner);
})();
