"""The frontier suite's table and plot."""

from __future__ import annotations

from pathlib import Path

from bench import report

LABELS = {
    "scrapy_scheduler_1": "Scrapy's scheduler, 1 worker",
    "frontier_1": "frontier, 1 worker",
    "scrapy_redis_4": "scrapy-redis, 4 workers",
    "frontier_4": "frontier, 4 workers",
    "scrapy_redis_4_killed": "scrapy-redis, 4 workers, 1 killed",
    "frontier_4_killed": "frontier, 4 workers, 1 killed",
    "frontier_1_slow": "frontier, 1 worker, 200 ms pages",
    "frontier_4_slow": "frontier, 4 workers, 200 ms pages",
}


def _row(name: str, data: dict) -> list[str]:
    if data.get("missing"):
        return [LABELS[name], "missing", "", "", "", "", "", ""]
    runs = data["runs"]
    if not runs:
        return [LABELS[name], "-", "", "", "", "", "", ""]
    return [LABELS[name], report.number(data["pages_per_s"], 1),
            " / ".join(report.number(run["pages_per_s"], 1) for run in runs),
            " / ".join(report.number(run["all_fetching_pages_per_s"], 1) for run in runs),
            " / ".join(report.number(run["gate_to_end_s"], 1) for run in runs),
            f"{runs[0]['pages_parsed']:,}/{runs[0]['site_pages']:,}",
            " / ".join(str(run["never_fetched"]) for run in runs),
            " / ".join(str(run["fetched_twice"]) for run in runs)]


def format_table(result: dict) -> str:
    parameters = result["parameters"]
    lines = [
        report.heading("One crawl on many workers: the frontier"),
        f"{parameters['pages']:,} pages answered at once, {parameters['slow_pages']:,} pages answered after "
        f"{parameters['slow_delay_s'] * 1000:.0f} ms (CONCURRENT_REQUESTS=4), {parameters['hosts']} hosts",
        report.format_rows(["series", "pages/s (median)", "pages/s per round", "all fetching", "gate -> end s",
                            "parsed/site", "never fetched", "fetched twice"],
                           [_row(name, data) for name, data in result["series"].items()]),
        "",
        report.format_ratios(result),
        "",
    ]
    return report.table_text(result, lines)


@report.plotting
def plot(plt, result: dict, directory: Path) -> list[Path]:
    figure, (rates, lost) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [3, 1]})
    names = [name for name, data in result["series"].items() if data["pages_per_s"] is not None]
    rates.barh([LABELS[name] for name in names], [result["series"][name]["pages_per_s"] for name in names])
    rates.invert_yaxis()
    rates.set_xlabel("pages per second, first page parsed to last (median)")
    rates.grid(True, axis="x", alpha=0.3)
    killed = [name for name in ("scrapy_redis_4_killed", "frontier_4_killed") if result["series"][name]["runs"]]
    lost.bar([LABELS[name].split(",")[0] for name in killed],
             [max(run["never_fetched"] for run in result["series"][name]["runs"]) for name in killed],
             color="tab:red")
    lost.set_ylabel("pages never fetched, 1 worker SIGKILLed")
    figure.suptitle("One crawl on many workers: the frontier against its references")
    return [report.save_figure(plt, figure, directory / "frontier.png")]
