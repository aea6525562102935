// A virtualized log view: only the rows in sight exist in the DOM (a spacer gives the scrollbar
// its full height), so 100,000 lines scroll as smoothly as 100. Lines are kept in id order;
// history pages go before, live lines after. Filters (rank, round, search) select indices into
// that array; follow keeps the newest line in view until the reader scrolls up or pauses.

export const ROW_HEIGHT = 18;
const OVERSCAN = 10;
const RANK_COLORS = 8;

export class LogView {
  constructor(viewport, { onChange } = {}) {
    this.viewport = viewport;
    this.onChange = onChange || (() => {});
    this.lines = [];
    this.ids = new Set();
    this.ranks = new Set();
    this.visible = [];
    this.filter = { rank: "", round: "", query: "" };
    this.highlight = new Set();
    this.follow = true;
    this.spacer = document.createElement("div");
    this.spacer.className = "log-spacer";
    this.rows = document.createElement("div");
    this.rows.className = "log-rows";
    viewport.replaceChildren(this.spacer, this.rows);
    this.pending = false;
    this.lastFirst = -1;
    this.lastKey = "";
    viewport.addEventListener("scroll", () => {
      const atBottom = viewport.scrollTop + viewport.clientHeight >= viewport.scrollHeight - ROW_HEIGHT * 2;
      if (!atBottom && this.follow && !this.programmatic) this.setFollow(false);
      this.programmatic = false;
      this.schedule();
    });
  }

  get lastId() {
    return this.lines.length ? this.lines[this.lines.length - 1].id : 0;
  }

  get firstId() {
    return this.lines.length ? this.lines[0].id : 0;
  }

  matches(line) {
    const f = this.filter;
    if (f.rank !== "" && line.rank !== Number(f.rank)) return false;
    if (f.round !== "" && line.round !== undefined && line.round !== Number(f.round)) return false;
    if (f.query && !line.lower.includes(f.query)) return false;
    return true;
  }

  // Lines newer than what the view has (live frames, polling, a refetched gap).
  append(lines) {
    const fresh = [];
    for (const line of lines) {
      if (this.ids.has(line.id)) continue;
      line.lower = line.text.toLowerCase();
      this.ids.add(line.id);
      this.ranks.add(line.rank);
      fresh.push(line);
    }
    if (!fresh.length) return 0;
    const inOrder = fresh[0].id > this.lastId;
    if (inOrder) {
      for (const line of fresh) {
        this.lines.push(line);
        if (this.matches(line)) this.visible.push(this.lines.length - 1);
      }
    } else {
      // A refetched range in the middle: rare, so a full sort is fine.
      this.lines = this.lines.concat(fresh).sort((a, b) => a.id - b.id);
      this.refilter(false);
    }
    this.changed();
    return fresh.length;
  }

  // Older lines (history paging): prepended, keeping what the reader looks at in place.
  prepend(lines) {
    const older = lines.filter((l) => !this.ids.has(l.id));
    if (!older.length) return 0;
    for (const line of older) {
      line.lower = line.text.toLowerCase();
      this.ids.add(line.id);
      this.ranks.add(line.rank);
    }
    const before = this.visible.length;
    this.lines = older.concat(this.lines);
    this.refilter(false);
    if (!this.follow) {
      this.programmatic = true;
      this.viewport.scrollTop += (this.visible.length - before) * ROW_HEIGHT;
    }
    this.changed();
    return older.length;
  }

  setFilter(filter) {
    this.filter = { ...this.filter, ...filter, query: (filter.query ?? this.filter.query).toLowerCase() };
    this.refilter(true);
  }

  refilter(render = true) {
    const visible = [];
    for (let i = 0; i < this.lines.length; i++) if (this.matches(this.lines[i])) visible.push(i);
    this.visible = visible;
    this.lastKey = "";
    if (render) this.changed();
  }

  setFollow(on) {
    this.follow = on;
    this.onChange();
    if (on) this.schedule();
  }

  // Shows these line ids (e.g. a failed rank's last stderr lines): highlighted, centred, paused.
  focusLines(ids) {
    this.highlight = new Set(ids);
    this.setFollow(false);
    this.lastKey = "";
    const first = this.visible.findIndex((i) => this.highlight.has(this.lines[i].id));
    if (first >= 0) {
      this.programmatic = true;
      this.viewport.scrollTop = Math.max(0, first * ROW_HEIGHT - this.viewport.clientHeight / 2);
    }
    this.schedule();
    return first >= 0;
  }

  changed() {
    this.onChange();
    this.schedule();
  }

  schedule() {
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => {
      this.pending = false;
      this.render();
    });
  }

  render() {
    const total = this.visible.length;
    this.spacer.style.height = `${total * ROW_HEIGHT}px`;
    if (this.follow && total) {
      const bottom = total * ROW_HEIGHT - this.viewport.clientHeight;
      if (Math.abs(this.viewport.scrollTop - bottom) > 1) {
        this.programmatic = true;
        this.viewport.scrollTop = Math.max(0, bottom);
      }
    }
    const height = this.viewport.clientHeight || 400;
    const count = Math.ceil(height / ROW_HEIGHT) + OVERSCAN * 2;
    // scrollTop may still be past a list that a filter just shortened.
    const first = Math.min(Math.max(0, Math.floor(this.viewport.scrollTop / ROW_HEIGHT) - OVERSCAN), Math.max(0, total - count));
    const last = Math.min(total, first + count);
    const key = `${first}:${last}:${total}`;
    if (key === this.lastKey) return;
    this.lastKey = key;
    this.rows.style.transform = `translateY(${first * ROW_HEIGHT}px)`;
    // Reuse row elements: scrolling changes text, not the DOM's shape.
    while (this.rows.childElementCount < last - first) {
      const row = document.createElement("div");
      row.className = "log-line";
      const rank = document.createElement("span");
      rank.className = "log-rank";
      const text = document.createElement("span");
      text.className = "log-text";
      row.append(rank, text);
      this.rows.append(row);
    }
    while (this.rows.childElementCount > last - first) this.rows.lastElementChild.remove();
    for (let i = first; i < last; i++) {
      const line = this.lines[this.visible[i]];
      const row = this.rows.children[i - first];
      row.className = `log-line rank-c${line.rank % RANK_COLORS}${line.stream === "stderr" ? " stderr" : ""}${this.highlight.has(line.id) ? " failing" : ""}`;
      row.dataset.id = line.id;
      row.firstChild.textContent = `r${line.rank}`;
      row.lastChild.textContent = line.text;
    }
  }

  text() {
    return this.visible
      .map((i) => {
        const l = this.lines[i];
        return `${l.time || ""} rank ${l.rank} ${l.stream}: ${l.text}`;
      })
      .join("\n");
  }
}
