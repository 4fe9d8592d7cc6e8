# Standard scrapyd-deploy style setup.py: Scrapyd's runner activates the egg and
# reads the "settings" entry point of the "scrapy" group to find the settings module.
from setuptools import find_packages, setup

setup(
    name="example",
    version="1.0",
    packages=find_packages(),
    entry_points={"scrapy": ["settings = example.settings"]},
)
