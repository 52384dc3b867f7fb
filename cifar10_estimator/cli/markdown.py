"""A Markdown table: what the commands print for a person to paste."""


def markdown_table(header, rows):
    """A Markdown table: the header's cells, then a line per row; a `|` in a cell is
    escaped, so that it does not end the cell."""
    def line(cells):
        return "| %s |" % " | ".join(str(cell).replace("|", "\\|") for cell in cells)
    return "\n".join([line(header), "|" + "---|" * len(header)] + [line(row) for row in rows])
