"""The package's former paths, kept importable: every module that moved and every module of names that moved.

A configuration file, a deployed project or a script may name a path of an earlier release
(``scrapyd_pgqueue.webservice.Schedule``, ``scrapyd_pgqueue.db``). Each such path still imports, warns with its new
path (``DeprecationWarning``) and is the very object of the new one. A moved module warns when it is imported; a
module of names stays silent on import (Scrapyd imports whatever its configuration names), and each name warns when
it is taken. Nothing inside the package uses a former path.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings

_PACKAGE = "scrapyd_pgqueue"

# Former module -> where it lives now.
MOVED_MODULES = {
    **{f"{_PACKAGE}.{name}": f"{_PACKAGE}.store.{name}"
       for name in ("db", "pool", "sql", "waits", "roles", "statuses", "throttled_log", "job_requests")},
    f"{_PACKAGE}.models": f"{_PACKAGE}.migrations.models",
    f"{_PACKAGE}.answers": f"{_PACKAGE}.services.answers",
    **{f"{_PACKAGE}.{name}": f"{_PACKAGE}.web.{name}"
       for name in ("offload", "stored_logs", "request_gate", "request_limits", "log_files")},
    f"{_PACKAGE}.node.metrics": f"{_PACKAGE}.web.metrics",
    **{f"{_PACKAGE}.{name}": f"{_PACKAGE}.crawl_process.{name}"
       for name in ("warm_process", "crawl_node", "job_stats", "stats_extension")},
}


def _names(module: str, *names: str) -> dict[str, str]:
    return {name: f"{_PACKAGE}.{module}.{name}" for name in names}


# Former module of names -> each name's new path (the services and pages as earlier configurations name them).
MOVED_NAMES = {
    f"{_PACKAGE}.webservice": {
        **_names("services.jobs", "Alive", "Cancel", "DaemonStatus", "ListJobs", "Logs", "Schedule", "Status"),
        **_names("services.batches", "ScheduleBatch"),
        "ClusterResource": f"{_PACKAGE}.services.resource.DatabaseService",  # the services' base, renamed
    },
    f"{_PACKAGE}.schedule_services": _names("services.schedules", "AddPeriodic", "DelPeriodic", "ListPeriodic",
                                            "PausePeriodic", "ResumePeriodic"),
    f"{_PACKAGE}.tree_services": _names("services.trees", "Tree"),
    f"{_PACKAGE}.egg_services": _names("services.eggs", "AddVersion", "DeleteProject", "DeleteVersion", "ListSpiders",
                                       "ListVersions"),
    f"{_PACKAGE}.website": _names("web.root", "Home", "Root"),
}


def deprecated_names(module: str, new_paths: dict[str, str]):
    """A ``__getattr__`` (PEP 562) for ``module``'s former names: each, taken, warns with its new path and is the same
    object. Importing the module stays silent, so a configuration that names a former path still loads."""

    def __getattr__(name):
        if name not in new_paths:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        new_module, _, new_name = new_paths[name].rpartition(".")
        warnings.warn(f"{module}.{name} is deprecated: use {new_paths[name]}", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(new_module), new_name)

    return __getattr__


class FormerPathFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the former paths (on ``sys.meta_path``): a moved module is its new module, a module of names is made
    here with ``deprecated_names``."""

    def __init__(self):
        self._own_specs: dict[str, importlib.machinery.ModuleSpec] = {}

    def find_spec(self, fullname, path=None, target=None):
        if fullname in MOVED_MODULES or fullname in MOVED_NAMES:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        if spec.name not in MOVED_MODULES:
            return None  # a module of names: a new, empty module (exec_module fills it)
        warnings.warn(f"{spec.name} is deprecated: use {MOVED_MODULES[spec.name]}", DeprecationWarning, stacklevel=2)
        module = importlib.import_module(MOVED_MODULES[spec.name])
        self._own_specs[module.__name__] = module.__spec__  # the import system sets the former one on it next
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        if module.__name__ in self._own_specs:  # a moved module: its own spec back
            module.__spec__ = self._own_specs[module.__name__]
        elif module.__name__ in MOVED_NAMES:
            new_paths = MOVED_NAMES[module.__name__]
            module.__doc__ = f"Deprecated: the former path of {', '.join(sorted(new_paths))}."
            module.__getattr__ = deprecated_names(module.__name__, new_paths)
            module.__all__ = list(new_paths)


def install() -> None:
    if not any(isinstance(finder, FormerPathFinder) for finder in sys.meta_path):
        sys.meta_path.append(FormerPathFinder())  # last: the package's own modules are found first
