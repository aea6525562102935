// The Events list: severity, kind and text filters; a rank failure's root cause links to its log
// lines.
import { timeOf } from "../format.js";
import { $ } from "./dom.js";

const MAX_EVENTS = 2000;

function eventCategory(kind) {
  return String(kind).split(".")[0].split("_")[0];
}

function eventVisible(li) {
  const severity = $("event-severity").value;
  const category = $("event-category").value;
  const text = $("event-search").value.trim().toLowerCase();
  if (severity === "warning" && li.dataset.severity === "info") return false;
  if (severity === "error" && li.dataset.severity !== "error") return false;
  if (category && li.dataset.category !== category) return false;
  if (text && !li.textContent.toLowerCase().includes(text)) return false;
  return true;
}

export class EventList {
  // onRootCause(cause): the root-cause link was clicked (the log panel shows the failure).
  constructor({ onRootCause }) {
    this.list = $("events");
    this.lastSeq = 0;
    this.onRootCause = onRootCause;
    const filter = () => {
      for (const li of this.list.children) if (li.dataset.seq !== undefined) li.hidden = !eventVisible(li);
    };
    ["event-severity", "event-category"].forEach((id) => $(id).addEventListener("change", filter));
    $("event-search").addEventListener("input", filter);
  }

  add(event, fresh) {
    if (event.seq && event.seq <= this.lastSeq) return;
    if (event.seq) this.lastSeq = event.seq;
    $("events-empty")?.remove();
    const li = document.createElement("li");
    li.className = `event sev-${event.severity || "info"}${fresh ? " fresh" : ""}`;
    li.dataset.seq = event.seq || "";
    li.dataset.severity = event.severity || "info";
    li.dataset.category = eventCategory(event.kind);
    li.dataset.round = event.round ?? "";
    const time = document.createElement("time");
    time.dateTime = event.at || new Date().toISOString();
    time.textContent = timeOf(time.dateTime);
    const kind = document.createElement("span");
    kind.className = "kind";
    kind.textContent = event.kind;
    const msg = document.createElement("span");
    msg.className = "msg";
    msg.textContent = event.message;
    li.append(time, kind, msg);
    const cause = event.kind === "rank.failed" && event.data && event.data.cause;
    if (cause) {
      // The round's first failing rank: what broke it. Its log lines are one click away.
      li.classList.add("root-cause");
      const tag = document.createElement("strong");
      tag.className = "chip bad";
      tag.textContent = "root cause";
      const link = document.createElement("button");
      link.type = "button";
      link.className = "linkbutton root-cause-link";
      link.textContent = `Show rank ${cause.rank}'s log at the failure`;
      link.addEventListener("click", () => this.onRootCause(cause));
      msg.append(" ", tag, " ", link);
      this.list.querySelectorAll(".root-cause.latest").forEach((el) => el.classList.remove("latest"));
      li.classList.add("latest");
    }
    this.list.append(li);
    li.hidden = !eventVisible(li);
    while (this.list.children.length > MAX_EVENTS) this.list.firstElementChild.remove();
    if (fresh && !li.hidden) this.list.scrollTop = this.list.scrollHeight;
  }

  scrollToEnd() {
    this.list.scrollTop = this.list.scrollHeight;
  }
}
