// search-box.js - a type-ahead search box that stays responsive on slow networks.
//
// Three things go wrong with naive type-ahead: a request per keystroke floods
// the server, late responses overwrite newer ones, and a failed request leaves
// the list showing stale results. Debouncing fixes the first, an AbortController
// per request fixes the second, and an explicit status line fixes the third.

export function debounce(fn, waitMs) {
  let timer = null;
  const debounced = (...args) => {
    clearTimeout(timer);
    timer = setTimeout(() => {
      timer = null;
      fn(...args);
    }, waitMs);
  };
  debounced.cancel = () => {
    clearTimeout(timer);
    timer = null;
  };
  return debounced;
}

function escapeHtml(text) {
  return text
    .replaceAll("&", "&amp;")
    .replaceAll("<", "&lt;")
    .replaceAll(">", "&gt;")
    .replaceAll('"', "&quot;");
}

// Wrap each occurrence of the query in <mark>, case-insensitively, after escaping.
function highlight(text, query) {
  const safe = escapeHtml(text);
  if (!query) return safe;
  const pattern = new RegExp(query.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"), "gi");
  return safe.replace(pattern, (match) => `<mark>${match}</mark>`);
}

export class SearchBox {
  constructor(root, { endpoint, minChars = 2, waitMs = 200, limit = 8 } = {}) {
    this.input = root.querySelector("input[type=search]");
    this.list = root.querySelector("ul");
    this.status = root.querySelector("[role=status]");
    this.endpoint = endpoint;
    this.minChars = minChars;
    this.limit = limit;
    this.controller = null;
    this.cache = new Map();

    this.search = debounce((q) => this.run(q), waitMs);
    this.input.addEventListener("input", () => this.search(this.input.value.trim()));
    this.input.addEventListener("keydown", (event) => this.onKey(event));
  }

  async run(query) {
    if (query.length < this.minChars) {
      this.render([], query);
      this.setStatus("");
      return;
    }
    if (this.cache.has(query)) {
      this.render(this.cache.get(query), query);
      return;
    }

    // Only the newest request matters; cancel whatever is still in flight.
    this.controller?.abort();
    const controller = new AbortController();
    this.controller = controller;
    this.setStatus("Searching…");

    try {
      const url = `${this.endpoint}?q=${encodeURIComponent(query)}&limit=${this.limit}`;
      const response = await fetch(url, { signal: controller.signal });
      if (!response.ok) throw new Error(`server answered ${response.status}`);
      const { results } = await response.json();
      this.cache.set(query, results);
      this.render(results, query);
      this.setStatus(results.length ? `${results.length} results` : "No matches");
    } catch (error) {
      if (error.name === "AbortError") return; // superseded by a newer query
      this.render([], query);
      this.setStatus(`Search failed: ${error.message}. Keep typing to retry.`);
    } finally {
      if (this.controller === controller) this.controller = null;
    }
  }

  render(results, query) {
    this.list.innerHTML = results
      .map(
        (item, i) =>
          `<li id="result-${i}" role="option" data-url="${escapeHtml(item.url)}">` +
          `${highlight(item.title, query)}</li>`,
      )
      .join("");
    this.active = -1;
  }

  onKey(event) {
    const items = this.list.querySelectorAll("li");
    if (!items.length) return;
    if (event.key === "ArrowDown" || event.key === "ArrowUp") {
      event.preventDefault();
      const step = event.key === "ArrowDown" ? 1 : -1;
      this.active = (this.active + step + items.length) % items.length;
      items.forEach((li, i) => li.setAttribute("aria-selected", String(i === this.active)));
      this.input.setAttribute("aria-activedescendant", items[this.active].id);
    } else if (event.key === "Enter" && this.active >= 0) {
      window.location.assign(items[this.active].dataset.url);
    } else if (event.key === "Escape") {
      this.search.cancel();
      this.render([], "");
      this.setStatus("");
    }
  }

  setStatus(text) {
    this.status.textContent = text;
  }
}
