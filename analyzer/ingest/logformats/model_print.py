"""What a log says the model is made of: Lightning's model summary and a printed module.

Two descriptions name each module with its class, which is more than a parameter's name
can tell (a module called ``norm`` may be a ``Linear``):

- Lightning's ``ModelSummary`` table, printed at the start of ``fit``: plain (``  | Name |
  Type | Params | Mode``, a rule of dashes, one row per module, a closing rule) or, with
  ``rich`` installed, ``RichModelSummary``'s box (``┃ Name ┃ Type ┃``, rows ``│ 0 │ net │
  Sequential │``, closed by ``└``). A cell that rich wrapped onto a row of its own (an
  empty index) is joined to the row above it; a row whose name or class rich cut short
  (``MultiheadAtt…``) is left out.
- A module's ``repr`` (``print(model)``; detectron2 and fairseq log it at start-up): a
  line ``Net(``, then per module ``(norm): LayerNorm((64,), eps=0.0, ...)`` two spaces
  deeper than its parent, a container's ``(layers): ModuleList(`` closed by ``)`` at its own
  indent, repeated children collapsed as ``(0-1): 2 x Block(``. The ``eps=`` of a module's
  arguments is kept.

A description becomes one ``model_description`` event at its first line, once it is
complete (the table's closing rule, the repr's last ``)``), with detail ``format``
(``lightning_summary`` or ``module_repr``) and ``modules``: per module its dotted ``name``,
``class``, ``line``, ``leaf`` (no module below it in the description) and ``eps`` where
its arguments give one. Policy for bad input, one rule: a description that breaks off (a
row or line out of shape, a gap of more than MAX_GAP lines, the end of the file before it
closes) is dropped whole and reported nowhere, as what it named may not be the model;
nothing is raised. Every line is looked at once, so reading stays linear in the log.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from analyzer.ingest.logformats.context import Context
from analyzer.ingest.logformats.numbers import to_float

MAX_GAP = 8
"""Lines a description may skip (a module's multi-line extra repr, a stray line)."""
MAX_MODULES = 4096
"""Modules kept per description; a larger one is dropped (no model prints so many lines
that are all different modules, and the event must stay small)."""
MAX_DESCRIPTIONS = 16
"""Descriptions kept per file (a restarted fit prints its summary again)."""

_HEADER = re.compile(r"(?:^|\s)([A-Za-z_][\w.]{0,127}+)\($")
_MODULE = re.compile(
    r"( *+)\(([^()\s]{1,128}+)\): (?:\d{1,9}+ x )?([A-Za-z_][\w.]{0,127}+)\((.*+)$")
_CLOSE = re.compile(r"( *+)\)\s*+$")
_EPS = re.compile(r"\beps=([-+0-9.eE]{1,32}+|inf|nan)")
_RULE = re.compile(r"\s*+-{8,}+\s*+$")
_CONTAINERS = frozenset({"Sequential", "ModuleList", "ModuleDict", "ParameterList",
                         "ParameterDict"})
"""Classes that only hold other modules: never a leaf, whatever a table shows below them."""


@dataclass
class _Open:
    """A description being read: its format, first line, last line read and modules."""

    format: str
    start: int
    last: int
    modules: list[dict[str, Any]] = field(default_factory=list)
    stack: list[tuple[int, str, int]] = field(default_factory=list)
    """The repr's open containers: indent, dotted name, index in ``modules`` (-1: root)."""
    shift: int | None = None
    """Spaces a prefix took from the repr's module lines (0 or 1), once its first is read."""
    columns: tuple[int, int] | None = None
    """The table's Name and Type column indices, once its header is read."""
    cells: int = 0
    body: bool = False
    """The table's rows have begun (the rule or box line under its header was read)."""


class ModelPrintParser:
    framework = "pytorch"
    repeats = False
    triggers: tuple[str, ...] = ("(", ")", " | ", "| Name", "┃", "│", "└", "┡", "---")

    def __init__(self) -> None:
        self.open: dict[int | None, _Open] = {}
        """One description per rank: ranks may print theirs at once."""
        self.emitted = 0

    def parse(self, text: str, ctx: Context) -> bool:
        current = self.open.get(ctx.rank)
        if current is not None and ctx.line - current.last > MAX_GAP + 1:
            self._drop(ctx)
            current = None
        if current is None or self._header(text):
            # A header while one is open: the open one broke off, a new one starts.
            return self._start(text, ctx)
        took = (self._repr_line(current, text, ctx) if current.format == "module_repr"
                else self._table_line(current, text, ctx))
        if took:
            current.last = ctx.line
            if len(current.modules) > MAX_MODULES:
                self._drop(ctx)
        return took

    def _drop(self, ctx: Context) -> None:
        self.open.pop(ctx.rank, None)

    @staticmethod
    def _header(text: str) -> bool:
        """Whether ``text`` may start a description (cheap tests only)."""
        return (text.endswith("(") and "): " not in text) or (
            "| Name" in text or "┃ Name" in text)

    def _start(self, text: str, ctx: Context) -> bool:
        self._drop(ctx)
        if text.endswith("(") and "): " not in text:
            m = _HEADER.search(text)
            if m is not None:
                # A header after a logging prefix (fairseq's) starts the repr at indent 0.
                alone = text.strip() == m.group(1) + "("
                indent = len(text) - len(text.lstrip(" ")) if alone else 0
                self.open[ctx.rank] = _Open("module_repr", ctx.line, ctx.line,
                                            stack=[(indent, "", -1)])
                return True
            return False
        if "Name" in text and "Type" in text:
            box = text.lstrip().startswith("┃")
            cells = _cells(text, "┃" if box else "|")
            if cells is not None and "Name" in cells and "Type" in cells:
                table = _Open("lightning_summary", ctx.line, ctx.line,
                              columns=(cells.index("Name"), cells.index("Type")),
                              cells=len(cells))
                self.open[ctx.rank] = table
                return True
        return False

    # The repr ---------------------------------------------------------------------------

    def _repr_line(self, state: _Open, text: str, ctx: Context) -> bool:
        close = _CLOSE.match(text)
        if close is not None:
            indent, _, _ = state.stack[-1]
            if len(close.group(1)) != indent:
                self._drop(ctx)
                return False
            state.stack.pop()
            if not state.stack:
                self._emit(state, ctx)
            return True
        m = _MODULE.match(text)
        if m is None:
            return False  # an extra repr line, or a line printed in between: a gap
        indent, name, cls, rest = len(m.group(1)), m.group(2), m.group(3), m.group(4)
        parent_indent, parent, index = state.stack[-1]
        expected = parent_indent + 2
        if index < 0:
            # A rank prefix stripped with the space after it ('[rank0]:  (fc): ...') takes
            # one space from every line but the header: the first child says which.
            if state.shift is None and indent in (expected - 1, expected):
                state.shift = expected - indent
            expected -= state.shift or 0
        if indent != expected:
            self._drop(ctx)
            return False
        if index >= 0:
            state.modules[index]["leaf"] = False
        path = f"{parent}.{name}" if parent else name
        module: dict[str, Any] = {"name": path, "class": cls, "line": ctx.line, "leaf": True}
        if rest:
            if not rest.endswith(")") or rest.count(")") != rest.count("(") + 1:
                self._drop(ctx)
                return False
            eps = _EPS.search(rest)
            value = None if eps is None else to_float(eps.group(1))
            if value is not None:
                module["eps"] = value
        else:
            state.stack.append((indent, path, len(state.modules)))
            if cls in _CONTAINERS:
                module["leaf"] = False
        state.modules.append(module)
        return True

    # The table --------------------------------------------------------------------------

    def _table_line(self, state: _Open, text: str, ctx: Context) -> bool:
        body = text.strip()
        if not state.body:
            if _RULE.match(text) is not None or body.startswith("┡"):
                state.body = True
                return True
            self._drop(ctx)
            return False
        if _RULE.match(text) is not None or body.startswith("└"):
            self._emit(state, ctx)
            return True
        box = body.startswith("│")
        cells = _cells(text, "│" if box else "|")
        if cells is None or len(cells) != state.cells or state.columns is None:
            self._drop(ctx)
            return False
        name_at, type_at = state.columns
        index, name, cls = cells[0], cells[name_at], cells[type_at]
        if box and not index and not name and state.modules:  # rich wrapped a Type cell
            state.modules[-1]["class"] += cls
            return True
        if (not index and name) or "…" in name or "…" in cls:
            # Lightning's last row (the parameters no module holds), or a cell rich cut
            # short to fit the console: a cut class or name is no module's.
            return True
        if not index.isdigit() or not name or not cls:
            self._drop(ctx)
            return False
        state.modules.append({"name": name, "class": cls, "line": ctx.line, "leaf": True})
        return True

    def _emit(self, state: _Open, ctx: Context) -> None:
        self._drop(ctx)
        if not state.modules or self.emitted >= MAX_DESCRIPTIONS:
            return
        if state.format == "lightning_summary":
            by_name = {m["name"]: m for m in state.modules}
            for m in state.modules:
                head = m["name"].rpartition(".")[0]
                while head and head not in by_name:
                    head = head.rpartition(".")[0]
                if head:
                    by_name[head]["leaf"] = False
                if m["class"] in _CONTAINERS:
                    m["leaf"] = False
        self.emitted += 1
        here = ctx.line
        ctx.line = state.start  # the event is where the description starts
        what = "model summary" if state.format == "lightning_summary" else "printed model"
        ctx.event("model_description", None, f"{what}: {len(state.modules)} modules",
                  {"format": state.format, "modules": state.modules})
        ctx.line = here


def _cells(text: str, bar: str) -> list[str] | None:
    """The stripped cells of a table line split at ``bar`` (a plain table's first cell is
    the index; a box's border cells are left out), or None when it holds none."""
    parts = text.strip().split(bar)
    if len(parts) < 3:
        return None
    if bar != "|":
        parts = parts[1:-1]
    return [p.strip() for p in parts]
