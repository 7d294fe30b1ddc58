#!/usr/bin/env python3
"""Cut the charts out of a `gpuq sim replay --out DIR` report as standalone
SVG files, for docs: report-svg.py DIR/report.html PREFIX writes
PREFIX-1.svg, PREFIX-2.svg, ... (one per chart, in the report's order) and
prints each file with its chart's title."""
import html
import re
import sys


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: report-svg.py REPORT.html PREFIX")
    text = open(sys.argv[1], encoding="utf-8").read()
    style = re.search(r"<style>(.*?)</style>", text, re.S)
    # The report's chart rules, scoped to the svg so they apply standalone.
    rules = " ".join(
        r.replace("svg ", "", 1) + "}"
        for r in (style.group(1) if style else "").split("}")
        if r.startswith("svg")
    )
    charts = re.findall(r"<svg.*?</svg>", text, re.S)
    if not charts:
        sys.exit(f"{sys.argv[1]}: no charts found; is it a gpuq replay report?")
    for i, svg in enumerate(charts, 1):
        path = f"{sys.argv[2]}-{i}.svg"
        head = svg.index(">") + 1
        with open(path, "w", encoding="utf-8") as f:
            f.write(svg[:head] + f"<style>{rules}</style>" + svg[head:] + "\n")
        title = re.search(r"<title>(.*?)</title>", svg)
        print(path, html.unescape(title.group(1)) if title else "")


main()
