// DOM helpers the job page's panels share: element lookup, table rows made from cells, and rows
// patched in place by key.

export const $ = (id) => document.getElementById(id);

// A row of plain text cells: [[text, className], ...].
export function textRow(cells) {
  const tr = document.createElement("tr");
  for (const [text, cls] of cells) {
    const td = document.createElement("td");
    if (cls) td.className = cls;
    td.textContent = text;
    tr.append(td);
  }
  return tr;
}

// Rows keyed by ``keyOf``: a row whose data did not change is left alone (no new nodes, no layout
// of the whole table), a changed one is replaced, and rows are kept in ``items`` order.
export function patchRows(body, items, keyOf, render) {
  const existing = new Map([...body.children].map((tr) => [tr.dataset.key, tr]));
  const keep = new Set();
  let previous = null;
  for (const item of items) {
    const key = String(keyOf(item));
    const signature = JSON.stringify(item);
    let tr = existing.get(key);
    if (!tr || tr.dataset.signature !== signature) {
      const fresh = render(item);
      fresh.dataset.key = key;
      fresh.dataset.signature = signature;
      if (tr) tr.replaceWith(fresh);
      tr = fresh;
    }
    keep.add(tr);
    const wanted = previous ? previous.nextSibling : body.firstChild;
    if (wanted !== tr) body.insertBefore(tr, wanted);
    previous = tr;
  }
  for (const tr of [...body.children]) if (!keep.has(tr)) tr.remove();
}
