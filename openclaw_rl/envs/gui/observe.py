"""Turning a live page into compact text a language model can act on, and saying what changed.

A snapshot walks the DOM in document order (one ``page.evaluate`` of :data:`SNAPSHOT_JS`) and
keeps what a person would read or use:

* *controls* — links, buttons, text boxes, check boxes, radios, drop-downs — with their
  accessible role and name (``aria-label``, ``<label for>``, wrapping label, placeholder, text),
  value / checked state and options; each gets an id;
* *text* — headings, table rows (cells joined by ``|``), alerts and status messages, and other
  short text blocks, without ids (nothing to act on).

**Stable ids.** An element's id is keyed by its signature ``(role, name, k)`` (the k-th control
with that role and name on the page) and kept for the whole episode, so the nav bar's ``Todos``
link has the same number on every page and a button keeps its number after the page reloads.

**Changes.** :func:`diff` compares the previous and new snapshot by those keys and lists the
URL / title change, added and removed lines and controls whose value or state changed — the
"next state" of the step made explicit rather than left for the reader to spot.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

# Text longer than this is cut: a page that dumps an essay into one node should not flood the
# model's context.
MAX_TEXT_CHARS = 160

SNAPSHOT_JS = r"""
() => {
  const MAX = %(max_text)d;
  const clean = (t) => (t || '').replace(/\s+/g, ' ').trim();
  const cut = (t) => t.length > MAX ? t.slice(0, MAX - 1) + '…' : t;
  const CONTROL = 'a[href],button,input,select,textarea,[role=button],[role=link],[role=checkbox],' +
                  '[role=radio],[role=tab],[role=menuitem],[role=switch],[contenteditable=""],[contenteditable=true]';
  const BLOCK = new Set(['P','DIV','LI','UL','OL','TABLE','TBODY','THEAD','TR','TD','TH','SECTION','ARTICLE',
    'MAIN','NAV','HEADER','FOOTER','FORM','FIELDSET','H1','H2','H3','H4','H5','H6','DL','DT','DD','ASIDE','PRE',
    'BLOCKQUOTE','FIGURE','FIGCAPTION','CAPTION','LEGEND','DETAILS','SUMMARY']);
  const SKIP = new Set(['SCRIPT','STYLE','NOSCRIPT','TEMPLATE','HEAD','OPTION','DATALIST','svg']);
  document.querySelectorAll('[data-oc-idx]').forEach(e => e.removeAttribute('data-oc-idx'));
  const visible = (el) => {
    const s = getComputedStyle(el);
    if (s.display === 'none' || s.visibility === 'hidden' || s.visibility === 'collapse') return false;
    const r = el.getClientRects();
    return r.length > 0;
  };
  // Text of a node without the text of controls inside it (a row's "Delete" buttons are
  // listed as controls; repeating their text in the row would be noise).
  const textWithout = (root) => {
    let out = [];
    const rec = (n) => {
      if (n.nodeType === 3) { out.push(n.textContent); return; }
      if (n.nodeType !== 1 || SKIP.has(n.tagName)) return;
      if (n !== root && n.matches(CONTROL)) return;
      if (n !== root && !visible(n)) return;
      for (const c of n.childNodes) rec(c);
      if (BLOCK.has(n.tagName)) out.push(' ');
    };
    rec(root);
    return clean(out.join(''));
  };
  const roleOf = (el) => {
    const r = el.getAttribute('role');
    if (r) return r;
    const t = el.tagName;
    if (t === 'A') return 'link';
    if (t === 'BUTTON') return 'button';
    if (t === 'SELECT') return el.multiple ? 'listbox' : 'combobox';
    if (t === 'TEXTAREA') return 'textbox';
    if (t === 'INPUT') {
      const ty = (el.type || 'text').toLowerCase();
      if (ty === 'checkbox') return 'checkbox';
      if (ty === 'radio') return 'radio';
      if (['submit','button','reset','image'].includes(ty)) return 'button';
      if (ty === 'search') return 'searchbox';
      if (ty === 'range') return 'slider';
      if (ty === 'number') return 'spinbutton';
      if (ty === 'file') return 'file';
      return 'textbox';
    }
    if (el.isContentEditable) return 'textbox';
    return 'generic';
  };
  const nameOf = (el) => {
    const aria = el.getAttribute('aria-label');
    if (aria && clean(aria)) return clean(aria);
    const by = el.getAttribute('aria-labelledby');
    if (by) {
      const t = by.split(/\s+/).map(id => document.getElementById(id)).filter(Boolean)
        .map(n => clean(n.textContent)).join(' ');
      if (t) return t;
    }
    if (el.labels && el.labels.length) {
      const t = Array.from(el.labels).map(l => textWithout(l)).join(' ');
      if (clean(t)) return clean(t);
    }
    const t = el.tagName;
    if (t === 'INPUT' && ['submit','button','reset'].includes((el.type || '').toLowerCase()))
      return clean(el.value) || 'Submit';
    if (t === 'A' || t === 'BUTTON' || el.getAttribute('role')) {
      const txt = clean(el.innerText);
      if (txt) return txt;
      const img = el.querySelector('img[alt]');
      if (img) return clean(img.alt);
    }
    return clean(el.getAttribute('placeholder') || el.getAttribute('title') || el.getAttribute('name') || '');
  };
  const items = [];
  const pushText = (kind, text, el) => {
    text = cut(text);
    if (!text) return;
    const r = el.getBoundingClientRect();
    items.push({kind, text, y: r.top + window.scrollY});
  };
  const hasControlOrBlock = (el) => {
    for (const d of el.querySelectorAll('*')) {
      if (d.matches(CONTROL) || BLOCK.has(d.tagName)) return true;
    }
    return false;
  };
  const walk = (el, textOk) => {
    for (const c of el.children) {
      if (SKIP.has(c.tagName)) continue;
      if (c.tagName === 'INPUT' && (c.type || '').toLowerCase() === 'hidden') continue;
      if (!visible(c)) continue;
      if (c.matches(CONTROL)) {
        const role = roleOf(c);
        const item = {kind: 'control', role, name: cut(nameOf(c)), y: c.getBoundingClientRect().top + window.scrollY,
                      disabled: !!(c.disabled || c.getAttribute('aria-disabled') === 'true')};
        const tgt = (c.getAttribute('target') || '').toLowerCase();
        if (c.tagName === 'A' && tgt && !['_self', '_parent', '_top'].includes(tgt)) item.newTab = true;
        if (role === 'checkbox' || role === 'radio' || role === 'switch') {
          item.checked = c.tagName === 'INPUT' ? c.checked : c.getAttribute('aria-checked') === 'true';
        } else if (c.tagName === 'SELECT') {
          item.options = Array.from(c.options).map(o => clean(o.textContent));
          item.value = c.selectedIndex >= 0 ? clean(c.options[c.selectedIndex].textContent) : '';
        } else if (c.tagName === 'TEXTAREA' || (c.tagName === 'INPUT')) {
          item.value = c.value;
          if ((c.type || '').toLowerCase() === 'password') item.value = '*'.repeat(c.value.length);
        } else if (c.isContentEditable) {
          item.value = clean(c.innerText);
        }
        c.setAttribute('data-oc-idx', String(items.length));
        items.push(item);
        continue;  // a control's inner text is its name
      }
      const tag = c.tagName;
      if (tag === 'LABEL' && c.control) { walk(c, false); continue; }  // text is the control's name
      if (tag === 'TR') {
        const cells = Array.from(c.cells).map(td => textWithout(td)).filter(Boolean);
        if (textOk && cells.length) pushText('row', cells.join(' | '), c);
        walk(c, false);
        continue;
      }
      const role = c.getAttribute('role');
      const kind = /^H[1-6]$/.test(tag) ? 'heading' : (role === 'alert' ? 'alert' : (role === 'status' ? 'status' : 'text'));
      if (kind !== 'text' || !hasControlOrBlock(c)) {
        if (textOk) pushText(kind, textWithout(c), c);
        walk(c, false);
        continue;
      }
      // A container: its own loose text nodes (rare) and then its children.
      if (textOk) {
        const loose = clean(Array.from(c.childNodes).filter(n => n.nodeType === 3).map(n => n.textContent).join(' '));
        if (loose) pushText('text', loose, c);
      }
      walk(c, textOk);
    }
  };
  if (document.body) walk(document.body, true);
  return {url: location.href, title: document.title, items,
          scrollY: window.scrollY, viewport: window.innerHeight,
          height: document.documentElement.scrollHeight};
}
""".replace("%(max_text)d", str(MAX_TEXT_CHARS))


@dataclass(frozen=True)
class Item:
    """One line of a snapshot: a control (with id) or a piece of text."""

    kind: str  # control | heading | row | alert | status | text
    text: str = ""  # for text kinds
    role: str = ""  # for controls
    name: str = ""
    value: str | None = None
    checked: bool | None = None
    options: tuple[str, ...] | None = None
    disabled: bool = False
    new_tab: bool = False  # a link with target=_blank (or another named window)
    y: float = 0.0

    @property
    def is_control(self) -> bool:
        """True for something the agent can act on."""
        return self.kind == "control"

    def state(self) -> tuple[Any, ...]:
        """What may change about a control without it becoming a different element."""
        return (self.value, self.checked, self.options, self.disabled)


@dataclass
class Snapshot:
    """A page as the agent sees it; ``ids[i]`` is the stable id of ``items[i]`` (None for text)."""

    url: str
    title: str
    items: list[Item]
    ids: list[int | None]
    keys: list[tuple[Any, ...]]
    scroll_y: float = 0.0
    viewport: float = 0.0
    height: float = 0.0
    index_of_id: dict[int, int] = field(default_factory=dict)

    def control(self, element_id: int) -> tuple[int, Item] | None:
        """(DOM index, item) of the control with this id on this page, or None."""
        idx = self.index_of_id.get(element_id)
        return None if idx is None else (idx, self.items[idx])

    def find(self, role: str, name: str) -> int | None:
        """Id of the first control with this role and (case-insensitive) name, or None."""
        for item, eid in zip(self.items, self.ids, strict=True):
            if eid is not None and item.role == role and item.name.lower() == name.lower():
                return eid
        return None


class IdRegistry:
    """Episode-long map from element signature to id (ids start at 1 and are never reused)."""

    def __init__(self) -> None:
        self._ids: dict[tuple[Any, ...], int] = {}
        self.last_seen: dict[int, str] = {}  # id -> how it was last rendered (for error messages)

    def id_for(self, key: tuple[Any, ...]) -> int:
        """The id of this signature, allocating the next one the first time it is seen."""
        if key not in self._ids:
            self._ids[key] = len(self._ids) + 1
        return self._ids[key]


def _item_from_js(raw: dict[str, Any]) -> Item:
    opts = raw.get("options")
    value = raw.get("value")
    return Item(
        kind=str(raw.get("kind", "text")),
        text=str(raw.get("text", "")),
        role=str(raw.get("role", "")),
        name=str(raw.get("name", "")),
        value=None if value is None else str(value),
        checked=raw.get("checked"),
        options=None if opts is None else tuple(map(str, opts)),
        disabled=bool(raw.get("disabled", False)),
        new_tab=bool(raw.get("newTab", False)),
        y=float(raw.get("y") or 0.0),
    )


def build_snapshot(raw: dict[str, Any], registry: IdRegistry) -> Snapshot:
    """Turn the JS result into a :class:`Snapshot`, assigning stable ids through ``registry``."""
    items = [_item_from_js(r) for r in raw.get("items", [])]
    seen: dict[tuple[Any, ...], int] = {}
    ids: list[int | None] = []
    keys: list[tuple[Any, ...]] = []
    index_of_id: dict[int, int] = {}
    for i, item in enumerate(items):
        base = (item.role, item.name) if item.is_control else (item.kind, item.text)
        k = seen.get(base, 0)
        seen[base] = k + 1
        key = (item.is_control, *base, k)
        keys.append(key)
        if item.is_control:
            eid = registry.id_for(key)
            ids.append(eid)
            index_of_id[eid] = i
            registry.last_seen[eid] = render_item(item, eid)
        else:
            ids.append(None)
    return Snapshot(
        url=str(raw.get("url", "")),
        title=str(raw.get("title", "")),
        items=items,
        ids=ids,
        keys=keys,
        scroll_y=float(raw.get("scrollY") or 0),
        viewport=float(raw.get("viewport") or 0),
        height=float(raw.get("height") or 0),
        index_of_id=index_of_id,
    )


def _q(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def render_item(item: Item, element_id: int | None) -> str:
    """One observation line, e.g. ``[5] textbox "Email" value=""`` or ``heading "Todo list"``."""
    if not item.is_control:
        return f"{item.kind} {_q(item.text)}"
    parts = [f"[{element_id}] {item.role} {_q(item.name)}"]
    if item.checked is not None:
        parts.append(f"checked={'true' if item.checked else 'false'}")
    if item.value is not None:
        parts.append(f"value={_q(item.value)}")
    if item.options is not None:
        parts.append("options=[" + ", ".join(_q(o) for o in item.options) + "]")
    if item.disabled:
        parts.append("disabled")
    return " ".join(parts)


def render_page(snap: Snapshot, max_lines: int) -> str:
    """Title, URL and the element list; long pages show a window that follows the scroll position."""
    lines = [render_item(it, eid) for it, eid in zip(snap.items, snap.ids, strict=True)]
    header = [f"Page: {snap.title or '(no title)'}", f"URL: {snap.url}"]
    total = len(lines)
    if total <= max_lines:
        return "\n".join(header + ["Elements:"] + (lines or ["(the page shows nothing)"]))
    # Start at the first line inside the viewport, so scrolling moves the window.
    start = next((i for i, it in enumerate(snap.items) if it.y >= snap.scroll_y - 1), total - max_lines)
    start = max(0, min(start, total - max_lines))
    end = start + max_lines
    note = f"Elements (lines {start + 1}-{end} of {total}"
    more = []
    if start > 0:
        more.append("scroll up for earlier ones")
    if end < total:
        more.append("scroll down for more")
    return "\n".join(header + [note + ("; " + ", ".join(more) if more else "") + "):"] + lines[start:end])


def diff(before: Snapshot | None, after: Snapshot, max_each: int = 8) -> list[str]:
    """What changed between two snapshots, one line per kind of change; empty when nothing did."""
    if before is None:
        return []
    out: list[str] = []
    if before.url != after.url:
        out.append(f"URL changed: {before.url} -> {after.url}")
    if before.title != after.title:
        out.append(f"Title changed: {_q(before.title)} -> {_q(after.title)}")
    old = {k: (it, eid) for k, it, eid in zip(before.keys, before.items, before.ids, strict=True)}
    new = {k: (it, eid) for k, it, eid in zip(after.keys, after.items, after.ids, strict=True)}
    added = [render_item(it, eid) for k, (it, eid) in new.items() if k not in old]
    removed = [render_item(it, eid) for k, (it, eid) in old.items() if k not in new]
    changed = []
    for k, (it, eid) in new.items():
        if k in old and it.is_control and old[k][0].state() != it.state():
            changed.append(f"{render_item(old[k][0], eid)}  ->  {render_item(it, eid).split(' ', 1)[1]}")

    def block(label: str, lines: list[str]) -> None:
        if not lines:
            return
        shown = lines[:max_each]
        extra = f", first {max_each} shown" if len(lines) > max_each else ""
        out.append(f"{label} ({len(lines)}{extra}):")
        out.extend(
            f"  + {ln}" if label == "Added" else f"  - {ln}" if label == "Removed" else f"  ~ {ln}"
            for ln in shown
        )

    block("Added", added)
    block("Removed", removed)
    block("Changed", changed)
    if before.scroll_y != after.scroll_y and before.url == after.url:
        out.append(f"Scrolled: y={before.scroll_y:.0f} -> {after.scroll_y:.0f} of {after.height:.0f}")
    return out
