# Spider modules of the example project (listed by `scrapy list`).
