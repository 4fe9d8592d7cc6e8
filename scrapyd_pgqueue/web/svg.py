"""A per-minute column chart as inline SVG: drawn on the server, no script and no CDN."""

from __future__ import annotations

import datetime

from scrapyd_pgqueue.web.page import esc

WIDTH, HEIGHT, LEFT, BOTTOM, TOP = 760, 150, 44, 22, 10


def minute_chart(title: str, counts: dict[datetime.datetime, int], start: datetime.datetime,
                 end: datetime.datetime, color: str, element_id: str) -> str:
    """Columns of jobs per minute from ``start`` to ``end`` (minutes with no job are empty), with its axes."""
    minutes = max(1, int((end - start).total_seconds() // 60) + 1)
    peak = max(counts.values(), default=0)
    scale = max(peak, 1)
    plot_width, plot_height = WIDTH - LEFT - 4, HEIGHT - BOTTOM - TOP
    step = plot_width / minutes
    columns = []
    for minute, jobs in sorted(counts.items()):
        index = int((minute - start).total_seconds() // 60)
        if not 0 <= index < minutes or jobs <= 0:
            continue
        height = plot_height * jobs / scale
        x, y = LEFT + index * step, TOP + plot_height - height
        columns.append(
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(step - 0.5, 0.8):.1f}" height="{height:.1f}" '
            f'fill="{color}"><title>{minute:%H:%M}: {jobs} jobs</title></rect>'
        )
    axis_y = TOP + plot_height
    return f"""<figure class="chart">
<figcaption>{esc(title)}: {sum(counts.values()):,} jobs, at most {peak:,} a minute</figcaption>
<svg id="{esc(element_id)}" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" role="img"
     aria-label="{esc(title)}" data-total="{sum(counts.values())}">
<line x1="{LEFT}" y1="{axis_y}" x2="{WIDTH - 4}" y2="{axis_y}" stroke="#777"/>
<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{axis_y}" stroke="#777"/>
<text x="{LEFT - 4}" y="{TOP + 8}" text-anchor="end" font-size="11">{scale}</text>
<text x="{LEFT - 4}" y="{axis_y}" text-anchor="end" font-size="11">0</text>
<text x="{LEFT}" y="{HEIGHT - 6}" font-size="11">{start:%H:%M}</text>
<text x="{WIDTH - 4}" y="{HEIGHT - 6}" text-anchor="end" font-size="11">{end:%H:%M}</text>
{"".join(columns)}
</svg>
</figure>"""
