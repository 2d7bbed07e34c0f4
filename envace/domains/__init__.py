"""Tool domains — the built-in ones and the user's own, through one registry.

`collect.domains` names each domain by
- a built-in name (`bank`, `files`, `trading`: the single list is `BUILTINS`),
- `package.module:OBJECT`, a `Domain` object in the user's code, or
- a folder: a declarative domain (tools.json, episodes.jsonl, optional policy.md and
  backend.json; see `envace.domains.folder`).
`use_domains` loads them once per process; `get_domain(name)` finds a domain by the name its
tasks carry (a built-in is loaded on first use).
"""

from __future__ import annotations

from dataclasses import replace
from importlib import import_module
from pathlib import Path

from envace.domains.base import Backend, Checklist, Domain, Mistakes, NoBackend, Task, Tool  # noqa: F401

BUILTINS = {name: f"envace.domains.{name}:DOMAIN" for name in ("bank", "files", "trading")}
DOMAINS = tuple(BUILTINS)  # the built-in names, in their default order

_loaded: dict[str, Domain] = {}


class DomainError(ValueError):
    """A domain spec or a domain's files are invalid; the message names the file (and line)."""


def load_domain(spec: str, root: str | Path = ".") -> Domain:
    """The domain a `collect.domains` entry names (paths are relative to the project `root`)."""
    path = Path(root) / spec
    if spec in BUILTINS:
        spec = BUILTINS[spec]
    elif path.is_dir():
        from envace.domains.folder import load_folder

        return load_folder(path)
    if ":" not in spec:
        raise DomainError(f"collect.domains: {spec!r} is not a built-in domain ({', '.join(BUILTINS)}), "
                          f"a package.module:OBJECT, or a folder (no folder {path})")
    module_name, _, attr = spec.partition(":")
    try:
        domain = getattr(import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise DomainError(f"collect.domains: cannot load {spec!r}: {err}") from None
    if not isinstance(domain, Domain):
        raise DomainError(f"collect.domains: {spec!r} is a {type(domain).__name__}, not an envace Domain")
    return domain


def use_domains(specs: list[str], root: str | Path = ".", real_backends: bool = True) -> list[Domain]:
    """Load the configured domains and make them known to `get_domain` by name (without their
    real backends when `real_backends` is False: logs only)."""
    domains = [load_domain(spec, root) for spec in specs]
    if not real_backends:
        domains = [replace(d, backend=None, backend_kind="none", declared_tools=d.tools) for d in domains]
    names = [d.name for d in domains]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise DomainError(f"collect.domains: two domains are named {', '.join(twice)}")
    _loaded.update(zip(names, domains))
    return domains


def get_domain(name: str) -> Domain:
    if name not in _loaded and name in BUILTINS:
        _loaded[name] = load_domain(name)
    if name not in _loaded:
        raise KeyError(f"unknown domain {name!r}; known: {', '.join(sorted({*BUILTINS, *_loaded}))} "
                       "(a plug-in domain is loaded from params.yaml's collect.domains)")
    return _loaded[name]
