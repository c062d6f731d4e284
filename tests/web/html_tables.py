"""Reading a page's tables in plain-HTTP tests (the standard library's HTML parser, no extra package)."""

from __future__ import annotations

from html.parser import HTMLParser


class _Tables(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, dict[str, list[list[str]]]] = {}
        self.attrs: dict[str, dict[str, str]] = {}
        self._table: str | None = None
        self._section = "tbody"
        self._row: list[str] | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {name: value or "" for name, value in attrs}
        if "id" in values:
            self.attrs[values["id"]] = values
        if tag == "table":
            self._table = values.get("id", f"table{len(self.tables)}")
            self.tables[self._table] = {"thead": [], "tbody": [], "tfoot": []}
        elif tag in ("thead", "tbody", "tfoot"):
            self._section = tag
        elif tag == "tr" and self._table is not None:
            self._row = []
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "tr" and self._row is not None and self._table is not None:
            self.tables[self._table][self._section].append(self._row)
            self._row = None
        elif tag == "table":
            self._table, self._section = None, "tbody"

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def parse(html: str) -> _Tables:
    parser = _Tables()
    parser.feed(html)
    return parser


def rows(html: str, table_id: str, section: str = "tbody") -> list[list[str]]:
    return parse(html).tables[table_id][section]


def attribute(html: str, element_id: str, name: str) -> str:
    return parse(html).attrs[element_id][name]


def plain(cell: str) -> str:
    """A number as the CSV writes it: no thousands separators, no dollar sign."""
    return cell.replace(",", "").replace("$", "")
