"""`dvc plots show` offline.

DVC's page loads Vega, Vega-Lite and vega-embed from a CDN, so without a network it renders
blank. This writes the HTML template `.dvc/config` points DVC at (`plots.html_template`,
relative to `.dvc/`), with the three libraries inlined from the vl-convert-python wheel, and
the plots drawn as SVG (their titles and legends are text in the page). `make install` runs
it: `python -m envace.offline_plots [project dir]`.
"""

from __future__ import annotations

import sys
from pathlib import Path

TEMPLATE = Path(".dvc/plots/offline.html")  # .dvc/config: plots.html_template = plots/offline.html

# DVC fills {plot_divs} with one <div> per plot and an inline `vegaEmbed('#id', spec)` call each;
# `vegaEmbed` here is the inlined one, made to draw SVG.
PAGE = """<!DOCTYPE html>
<html>
<head>
    {refresh_tag}
    <meta charset="utf-8">
    <title>envace plots</title>
    <script>%s</script>
    <style>table { border-spacing: 15px; }</style>
</head>
<body>
    {plot_divs}
</body>
</html>
"""
EXPORTS = ("const embed = vegaEmbed; window.vegaEmbed = (el, spec, opts) => embed(el, spec, {renderer: 'svg', ...opts});"
           " window.vega = vega; window.vegaLite = vegaLite;")


def write_template(root: Path = Path(".")) -> Path:
    import vl_convert

    from envace.io import write_text

    bundle = vl_convert.javascript_bundle(EXPORTS, vl_version="5.20")  # DVC's specs are Vega-Lite 5
    path = root / TEMPLATE
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, PAGE % bundle.replace("</script>", "<\\/script>"))
    return path


if __name__ == "__main__":
    print(f"offline plots template: {write_template(Path(sys.argv[1]) if len(sys.argv) > 1 else Path('.'))}")
