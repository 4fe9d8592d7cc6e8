"""Small offline Scrapy project used by the end-to-end tests and the Docker image."""
