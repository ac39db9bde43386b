"""Kernels from other distributions: the entry-point group ``kerneltune.kernels``.

A distribution registers kernels with an entry point whose value names a `KernelSpec`, or a
list or tuple of them::

    [project.entry-points."kerneltune.kernels"]
    layernorm = "kerneltune.kernels.layernorm_spec:SPECS"

Each spec joins `kerneltune.kernels.REGISTRY` under its `name` when the package is imported, and
is then tuned, stored, served and resolved as a built-in one. kerneltune's own plug-ins
(`OWN`, what its pyproject.toml declares) load the same way from a source checkout on
PYTHONPATH too, which has no installed metadata and so no entry points. Loading never stops the
import: an entry point that fails to load, or names anything else, is skipped with one warning
naming it; so is a spec whose name a built-in kernel, or a spec registered before it, already
has.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, MutableMapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from kerneltune.kernels._spec import KernelSpec

#: The entry-point group a distribution registers its kernels in.
GROUP = "kerneltune.kernels"
#: kerneltune's own entry points, as its pyproject.toml declares them (a test holds the two
#: equal).
OWN = {
    "layernorm": "kerneltune.kernels.layernorm_spec:SPECS",
    "rmsnorm_group_quant": "kerneltune.kernels.rmsnorm_group_quant_spec:SPECS",
}


class KernelPluginWarning(UserWarning):
    """A kernel plug-in was skipped: it failed to load, or its kernels could not be registered."""


def _warn(entry: EntryPoint, why: str) -> None:
    warnings.warn(f"kerneltune: kernel plug-in {entry.name!r} ({entry.value}) skipped: {why}",
                  KernelPluginWarning, stacklevel=3)


def specs_of(entry: EntryPoint) -> list[KernelSpec] | None:
    """The specs an entry point names, or None, with one warning, where it fails to load or
    names anything else."""
    try:
        loaded: Any = entry.load()
    except Exception as e:  # any error of someone else's module: never the import's
        _warn(entry, f"it failed to load ({type(e).__name__}: {e})")
        return None
    specs = list(loaded) if isinstance(loaded, list | tuple) else [loaded]
    wrong = [s for s in specs if not isinstance(s, KernelSpec)
             or not isinstance(getattr(s, "name", None), str) or not s.name]
    if not specs or wrong:
        what = type(wrong[0] if wrong else loaded).__name__
        _warn(entry, f"it names a {what}, not a KernelSpec with a name, or a list of them")
        return None
    return specs


def installed_entries() -> list[EntryPoint]:
    """The `GROUP` entry points of the installed distributions, and kerneltune's own (`OWN`)
    where its distribution is not installed."""
    entries = list(entry_points(group=GROUP))
    values = {e.value for e in entries}
    return entries + [EntryPoint(name, value, GROUP) for name, value in OWN.items()
                      if value not in values]


def register_plugins(registry: MutableMapping[str, KernelSpec], builtins: Iterable[str],
                     entries: Iterable[EntryPoint] | None = None) -> None:
    """Add the kernels of the `GROUP` entry points (`installed_entries()` by default) to
    `registry`, skipping, with one warning per entry point, those that cannot be registered:
    the built-in kernels' names are never taken, nor a name registered before."""
    builtin = set(builtins)
    for entry in installed_entries() if entries is None else entries:
        specs = specs_of(entry)
        if specs is None:
            continue
        for spec in specs:
            known = registry.get(spec.name)
            if known is spec:  # the same entry point seen twice (two copies of a distribution)
                continue
            if spec.name in builtin:
                _warn(entry, f"its kernel {spec.name!r} has the name of a built-in kernel")
            elif known is not None:
                _warn(entry, f"its kernel {spec.name!r} is already registered, by "
                             f"{type(known).__module__}")
            else:
                registry[spec.name] = spec
