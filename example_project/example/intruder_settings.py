"""The ``intruder`` project: the example project's settings with a spider that tries what a hostile egg would.

Baked into a node next to ``example`` with ``intruder = example.intruder_settings`` in ``[settings]`` (the tests
do). A project of its own, so that ``example`` keeps listing just ``quotes`` and ``sleeper``.
"""

from example.settings import *  # noqa: F403 - the same offline, lean settings

SPIDER_MODULES = ["example.intruder_spiders"]
NEWSPIDER_MODULE = "example.intruder_spiders"
