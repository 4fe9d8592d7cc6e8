"""Benchmark of scrapyd_pgqueue against the seed article's design, Scrapyd's sqlite queue and the bare claim.

Run ``python -m bench --help``; see bench/README.md.
"""
