import base64

import scrapy

from example.recording import RecordingSpider

QUOTES = [
    [("The only way out is through.", "Robert Frost"),
     ("Simplicity is prerequisite for reliability.", "Edsger Dijkstra")],
    [("Talk is cheap. Show me the code.", "Linus Torvalds"),
     ("Premature optimization is the root of all evil.", "Donald Knuth")],
    [("Make it work, make it right, make it fast.", "Kent Beck")],
]


def data_url(html):
    return "data:text/html;charset=utf-8;base64," + base64.b64encode(html.encode()).decode()


def build_pages():
    """Return the data: URL of the first of the in-memory quote pages.

    Each page links to the next one with <a class="next">; a data: URL cannot be
    relative, so the pages are built last to first, each embedding the full URL
    of its successor.
    """
    next_url = None
    for number in range(len(QUOTES), 0, -1):
        quotes = "".join(
            f'<div class="quote"><span class="text">{text}</span>'
            f'<small class="author">{author}</small></div>'
            for text, author in QUOTES[number - 1]
        )
        link = f'<a class="next" href="{next_url}">next</a>' if next_url else ""
        next_url = data_url(f"<html><body><h1>Page {number}</h1>{quotes}{link}</body></html>")
    return next_url


class QuotesSpider(RecordingSpider):
    """Scrape quotes from in-memory pages, or from ``-a start_url=...``.

    A start_url page should use the same markup: div.quote > span.text and
    small.author, and an optional a.next link to the next page.
    """

    name = "quotes"

    async def start(self):
        yield scrapy.Request(getattr(self, "start_url", None) or build_pages())

    def parse(self, response):
        for quote in response.css("div.quote"):
            yield {
                "job": self.job,
                "text": quote.css("span.text::text").get(),
                "author": quote.css("small.author::text").get(),
                "page": response.css("h1::text").get(),
            }
        next_href = response.css("a.next::attr(href)").get()
        if next_href:
            yield response.follow(next_href)
