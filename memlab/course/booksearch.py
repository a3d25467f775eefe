"""Search with excerpts in a book opened from disk: a Sphinx extension of the memlab book (:mod:`memlab.course.book`).

Sphinx's search page (``searchtools.js``) finds the pages from ``searchindex.js`` and then, for each result's
excerpt, ``fetch``es the page itself and reads its ``[role="main"]`` text. A browser refuses that ``fetch`` under
``file://`` (Chromium: "Cross origin requests are only supported for protocol schemes: ... http, https"), so a book
opened from disk lists page titles only. This extension writes every page's main text into one script,
``_static/memlab-search-text.js``, loaded by the search page alone (about 0.6 MB for the thirteen chapters), which
answers those ``fetch`` calls from memory when the page is read from disk and leaves them to the browser otherwise.

It also names what an index hit points to: a glossary term's hit is listed as "Glossary: checkpointing" beside the
glossary page's own full-text hit "Glossary", which Sphinx shows under the same title (the page's).
"""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

SEARCH_TEXT_JS = "memlab-search-text.js"
"""The script, under ``_static/``, that holds the pages' texts and answers the search page's fetches from disk."""
SKIPPED_TAGS = {"script", "style"}
"""Elements whose content is no text of the page (Sphinx's ``htmlToText`` removes them too)."""

_RUNTIME = """
(() => {
  // Sphinx's searchtools fetches each result's page for its excerpt; under file:// the browser refuses, so the
  // page's text is served from MEMLAB_PAGE_TEXT instead (memlab.course.booksearch).
  const root = new URL(document.documentElement.dataset.content_root || "./", window.location.href).href;
  if (window.location.protocol === "file:") {
    const fetchFromDisk = window.fetch.bind(window);
    window.fetch = (resource, init) => {
      const url = new URL(String(resource), window.location.href);
      const name = decodeURIComponent(url.href.split("#")[0].slice(root.length)).replace(/\\.html$/, "");
      if (url.href.startsWith(root) && Object.hasOwn(MEMLAB_PAGE_TEXT, name)) {
        const main = document.createElement("div");
        main.setAttribute("role", "main");
        main.textContent = MEMLAB_PAGE_TEXT[name];
        for (const [target, entry] of Object.entries(MEMLAB_TERMS)) {  // an index hit's excerpt: its entry
          if (!target.startsWith(name + ".html#")) continue;
          const block = main.appendChild(document.createElement("div"));
          block.id = target.split("#")[1];
          block.textContent = entry.text;
        }
        return Promise.resolve(new Response("<!DOCTYPE html><html><body>" + main.outerHTML + "</body></html>",
                                            {headers: {"Content-Type": "text/html"}}));
      }
      return fetchFromDisk(resource, init);
    };
  }
  // An index hit (a glossary term) is shown with the page's title, like the page's own hit: name the term.
  const label = (item) => {
    const link = item.querySelector("a");
    const href = link && new URL(link.getAttribute("href"), window.location.href).href;
    const entry = href && MEMLAB_TERMS[decodeURIComponent(href.slice(root.length))];
    if (entry && !link.dataset.memlabTerm) {
      link.dataset.memlabTerm = entry.term;
      link.textContent = link.textContent + ": " + entry.term;
    }
  };
  new MutationObserver((changes) => changes.forEach((change) => change.addedNodes.forEach((node) => {
    if (node.nodeType !== 1) return;
    if (node.matches("li.kind-index")) label(node);
    node.querySelectorAll("li.kind-index").forEach(label);
  }))).observe(document.documentElement, {childList: true, subtree: true});
})();
"""


class _MainText(HTMLParser):
    """The text of an HTML fragment as Sphinx's ``htmlToText`` reads it: tags dropped, scripts, styles and the
    headings' "¶" links left out, whitespace collapsed."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skip: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        classes = (dict(attrs).get("class") or "").split()
        if self._skip or tag in SKIPPED_TAGS or "headerlink" in classes:
            self._skip.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if self._skip and self._skip[-1] == tag:
            self._skip.pop()

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.parts.append(data)

    def text(self) -> str:
        return re.sub(r"\s+", " ", " ".join(self.parts)).strip()


_VOID = re.compile(r"<(?:area|base|br|col|embed|hr|img|input|link|meta|source|track|wbr)\b[^>]*>", re.I)


def page_text(body: str) -> str:
    """The reader's text of a page's rendered body (Sphinx's ``body`` in the page context), as one line."""
    parser = _MainText()
    parser.feed(_VOID.sub(" ", body))  # a void element has no end tag: it must not open a skipped span
    parser.close()
    return parser.text()


def search_script(texts: dict[str, str], terms: dict[str, dict[str, str]]) -> str:
    """The script the search page loads: the page texts, the glossary entries by their link (``{"term": ...,
    "text": the term and its definition}``) and the runtime."""
    def dumped(value: dict[str, Any]) -> str:  # "</script>" and friends cannot end the data early
        return json.dumps(value, ensure_ascii=False, sort_keys=True).replace("</", "<\\/")

    return (f"// memlab: page texts for search excerpts from disk (generated by memlab.course.booksearch)\n"
            f"const MEMLAB_PAGE_TEXT = {dumped(texts)};\nconst MEMLAB_TERMS = {dumped(terms)};\n{_RUNTIME}")


def _terms(pagename: str, doctree: Any, suffix: str) -> dict[str, dict[str, str]]:
    """A page's glossary entries by their link: the term, and the term with its definition as one line."""
    from docutils import nodes

    return {f"{pagename}{suffix}#{target}": {"term": node.astext(),
                                             "text": " ".join(node.parent.astext().split())}
            for node in doctree.findall(nodes.term) for target in node["ids"]}


def setup(app: Any) -> dict[str, Any]:
    """Register the extension: collect each page's text as it is written, write the script when the build ends."""
    texts: dict[str, str] = {}
    terms: dict[str, dict[str, str]] = {}

    def collect(app: Any, pagename: str, templatename: str, context: dict[str, Any], doctree: Any) -> None:
        if pagename == "search":
            app.add_js_file(SEARCH_TEXT_JS)
        elif doctree is not None and context.get("body"):
            texts[pagename] = page_text(context["body"])
            terms.update(_terms(pagename, doctree, app.builder.link_suffix))

    def write(app: Any, exception: Exception | None) -> None:
        if exception is None and app.builder.format == "html":
            static = Path(app.outdir) / "_static"
            static.mkdir(parents=True, exist_ok=True)
            (static / SEARCH_TEXT_JS).write_text(search_script(texts, terms), encoding="utf-8")

    app.connect("html-page-context", collect)
    app.connect("build-finished", write)
    return {"parallel_read_safe": True, "parallel_write_safe": False}
