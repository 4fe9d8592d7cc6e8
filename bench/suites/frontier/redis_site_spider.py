"""The example project's ``site`` spider on scrapy-redis: the reference the frontier suite runs against.

Run as a worker with ``scrapy runspider`` (the suite sets ``SCRAPY_SETTINGS_MODULE=example.settings``, the example
project on ``PYTHONPATH``, the scrapy-redis settings with ``-s``). Its parsing is ``SiteSpider``'s own, records
included (pages.jsonl); only where requests come from differs: the start URL is read from redis
(``site_redis:start_urls``), as scrapy-redis spiders start, instead of being yielded by every worker.
"""

from scrapy_redis.spiders import RedisMixin

from example.spiders.site import SiteSpider


class RedisSiteSpider(RedisMixin, SiteSpider):
    name = "site_redis"

    @classmethod
    def from_crawler(cls, crawler, *args, **kwargs):
        spider = super().from_crawler(crawler, *args, **kwargs)
        spider.setup_redis(crawler)  # what scrapy-redis's RedisSpider.from_crawler does
        return spider

    async def start(self):
        for request in self.start_requests():  # RedisMixin's: a batch of start URLs read from redis
            yield request
