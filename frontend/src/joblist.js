// The jobs list's comparison picks: tick jobs (kept across pages of the list in this tab), then
// "Compare selected" opens /compare/?jobs=... with them.
const KEY = "trainyard.compare";
const button = document.getElementById("compare-selected");
const count = document.getElementById("compare-count");

function picked() {
  try {
    return new Set(JSON.parse(sessionStorage.getItem(KEY) || "[]").map(String));
  } catch {
    return new Set();
  }
}

function save(set) {
  sessionStorage.setItem(KEY, JSON.stringify([...set]));
}

function refresh() {
  const set = picked();
  if (button) button.disabled = set.size < 1;
  if (count) count.textContent = set.size ? `${set.size} job${set.size === 1 ? "" : "s"} picked (#${[...set].join(", #")})` : "Tick jobs to compare them.";
}

for (const box of document.querySelectorAll(".compare-pick")) {
  box.checked = picked().has(box.value);
  box.addEventListener("change", () => {
    const set = picked();
    if (box.checked) set.add(box.value);
    else set.delete(box.value);
    save(set);
    refresh();
  });
}

button?.addEventListener("click", () => {
  const ids = [...picked()];
  if (!ids.length) return;
  sessionStorage.removeItem(KEY);
  location.assign(`/compare/?jobs=${ids.join(",")}`);
});

refresh();
